"""One run's page: status, progress and ETA, the doctor's findings, live graphs, memory by phase, log tail, spec, cancel,
resume, download, clone (with a finding's fix).

Nothing here runs on a timer. The graphs are canvas charts the page draws from its live stream
(`app.ui.live`: only new points are sent, nothing for a finished run); the text is redrawn by
`RunPageData.refresh` when the run is opened and when the stream says the run's row moved (the page
presses the hidden `poll` button), and each refresh sends only the outputs whose value changed.
This module lays the page out and fills it (`RunPageData`); its text is `app.ui.run_text`, its files
`app.ui.served_files` (only ever from inside the data directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import gradio as gr
import pandas as pd

from app.ui import charts, series
from app.ui.findings_view import findings_html, fix_choices, marked_rows
from app.ui.run_text import (
    events_markdown,
    header_markdown,
    phases_markdown,
    progress_html,
    samples_markdown,
    scores_markdown,
    throughput_markdown,
)
from app.ui.served_files import LOG_LINES, bundle_files, bundle_path, log_tail, unreachable_files_note
from jobs.doctor.findings import findings_of
from jobs.queue import run_actions
from jobs.queue.run_actions import RunCommandError, resumable
from jobs.spec.stored import spec_of, stored_spec
from jobs.spec.trainer_records import RECORDS
from jobs.train import figures
from storage.models import RunStatus
from storage.roles import RunFolders
from storage.roles_dashboard import RunPageReads
from storage.store import MetricBucket, RunRecord

GRAPHS = (charts.RUN_MEMORY, charts.RUN_LOSS, charts.RUN_LR, charts.RUN_TOKENS, charts.RUN_TRAINER)  # `graphs`' order
# what the loss, lr and tokens/s plots draw; best_checkpoint: one point, the step an early-stopped bundle holds
RUN_METRICS = ("loss", "eval_loss", "best_checkpoint", "learning_rate", "tokens_per_second")
# The "Trainer metrics" plot: per trainer, {legend label: logged metric name} (its record's `metrics`).
TRAINER_SERIES: dict[str, dict[str, str]] = {t.value: dict(r.metrics) for t, r in RECORDS.items()}


def prediction_markdown(store: RunFolders, run: RunRecord) -> str:
    """' · memory: predicted 1.2 GiB, measured 1.1 GiB (-8%)' from the prediction saved at submit (jobs.memory.predict)."""
    from jobs.memory.breakdown import prediction_error_text
    from jobs.queue.saved_prediction import load_prediction

    text = prediction_error_text(
        load_prediction(store, run.id), run.peak_memory_bytes, run.peak_memory_source, run.current_step
    )
    return f" · memory {text}" if text else ""


@lru_cache(maxsize=256)
def spec_yaml(spec_json: str) -> str:
    """The Spec pane's text. A run's spec never changes, and dumping it was a third of a refresh's time."""
    return stored_spec(spec_json).to_yaml()


@dataclass
class RunPage:
    run_id: gr.Number
    header: gr.Markdown
    progress: gr.HTML
    cancel: gr.Button
    clone: gr.Button
    download: gr.DownloadButton
    files: gr.Dataframe
    error: gr.Markdown
    log: gr.Code
    spec: gr.Code
    drawn: gr.State  # what the page shows: {"run", "status", "sent": one signature per output}
    resume: gr.Button
    samples: gr.Markdown  # the before/after table (jobs.train.before_after)
    phases: gr.Markdown  # memory by phase, predicted against measured (jobs.train.phases)
    poll: gr.Button  # hidden; pressed by the page when its live stream says the run moved
    graphs: dict[str, gr.HTML]  # chart elem_id -> the block the page draws it in (GRAPHS)
    findings: gr.HTML  # the training doctor's banner and list (app.ui.findings_view)
    fix: gr.Dropdown  # which finding's spec change "Clone with fix" applies
    clone_fix: gr.Button

    @property
    def outputs(self) -> list[gr.Component]:
        """What `RunPageData.refresh` returns, in order (OUTPUTS of them)."""
        return [
            self.header,
            self.progress,
            self.cancel,
            self.download,
            self.files,
            self.error,
            self.samples,
            self.phases,
            self.log,
            self.spec,
            self.resume,
            self.findings,
            self.fix,
            self.clone_fix,
            self.drawn,
        ]


OUTPUTS = 15  # len(RunPage.outputs)


def build() -> RunPage:
    """Lay out the run tab; call inside a gr.Blocks context."""
    with gr.Row():
        run_id = gr.Number(label="run id", precision=0, value=None, elem_id="run-id", scale=1)
        cancel = gr.Button("Cancel", variant="stop", visible=False, scale=0)
        resume = gr.Button("Resume", variant="primary", visible=False, scale=0, elem_id="resume-run")
        clone = gr.Button("Clone into form", scale=0)
        download = gr.DownloadButton("Download adapter", visible=False, scale=0, elem_id="download-adapter")
    header = gr.Markdown("Select a run in the Runs tab, or launch one.", elem_id="run-header")
    progress = gr.HTML()
    error = gr.Markdown(elem_id="run-error")
    findings = gr.HTML(elem_id="run-findings-block")
    with gr.Row():
        fix = gr.Dropdown(label="finding to fix", choices=[], visible=False, scale=3, elem_id="run-fix-choice")
        clone_fix = gr.Button("Clone with fix", visible=False, scale=0, elem_id="clone-with-fix")
    graphs: dict[str, gr.HTML] = {}
    for row in ((charts.RUN_MEMORY, charts.RUN_LOSS), (charts.RUN_LR, charts.RUN_TOKENS), (charts.RUN_TRAINER,)):
        with gr.Row():
            for chart in row:
                graphs[chart.elem_id] = chart.live()
    phases = gr.Markdown(elem_id="run-phases")
    samples = gr.Markdown(elem_id="run-samples")
    files = gr.Dataframe(label="Files in the bundle", interactive=False, visible=False)
    log = gr.Code(label=f"Log (last {LOG_LINES} lines)", language=None, interactive=False, max_lines=30)
    spec = gr.Code(label="Spec", language="yaml", interactive=False)
    poll = gr.Button("run changed", visible="hidden", elem_id="run-poll")
    return RunPage(
        run_id,
        header,
        progress,
        cancel,
        clone,
        download,
        files,
        error,
        log,
        spec,
        gr.State(None),
        resume,
        samples,
        phases,
        poll,
        graphs,
        findings,
        fix,
        clone_fix,
    )


def signature(value: Any) -> str:
    """A value's identity for "did this output change?": text as is, a component update by its arguments."""
    if isinstance(value, str) or value is None:
        return repr(value)
    args = getattr(value, "_constructor_args", None)
    if isinstance(args, list):  # gradio keeps the arguments of each constructor call in order
        args = {k: v for part in args for k, v in part.items()} if all(isinstance(a, dict) for a in args) else args
    if isinstance(args, dict):
        return type(value).__name__ + repr(
            sorted((k, v.to_csv() if isinstance(v, pd.DataFrame) else repr(v)) for k, v in args.items())
        )
    return repr(value)


class RunPageData:
    """Builds the page's values from the store; holds the series caches shared by all tabs."""

    def __init__(self, store: RunPageReads):
        self.store = store
        self.metrics = series.MetricSeriesCache(store)
        self.memory = series.MemorySeriesCache(store)

    def rows(self, run_id: int, trainer: str, watched: dict[str, str] | None = None) -> list[list[series.Row]]:
        """Each chart's points, in GRAPHS order (memory, loss, learning rate, tokens/s, trainer metrics),
        each <= ~2000 points per series; what the page's live stream sends (`app.ui.live`). `watched`: a task
        score early stopping watches ({label: metric}, `jobs.spec.evaluation.task_series`), drawn with the trainer's."""
        from app.ui.memory import with_predicted_line
        from jobs.queue.saved_prediction import load_prediction

        names = {**TRAINER_SERIES.get(trainer, {}), **(watched or {})}
        extents, memory_extent = self.store.run_extents(run_id, (*RUN_METRICS, *names.values()))  # one read

        def get(name: str) -> list[MetricBucket]:
            return self.metrics.at(run_id, name, extents[name])

        origin, mem = self.memory.at(run_id, memory_extent)
        memory = with_predicted_line(series.memory_rows(mem, origin), load_prediction(self.store, run_id))
        loss = series.metric_rows(
            {"train": get("loss"), "eval": get("eval_loss"), "best (in the bundle)": get("best_checkpoint")}
        ) + marked_rows(findings_of(self.store.run_events(run_id)))  # the stretch each loss finding saw
        lr = series.metric_rows({"learning rate": get("learning_rate")})
        tps = series.metric_rows({"tokens/s": get("tokens_per_second")})
        own = series.metric_rows({label: get(name) for label, name in names.items()})
        return [memory, loss, lr, tps, own]

    def frames(self, run_id: int, trainer: str, watched: dict[str, str] | None = None) -> list[pd.DataFrame]:
        """`rows` as typed frames (columns: each chart's x, y and series), for reading in tests and benches."""
        return [chart.frame(rows) for chart, rows in zip(GRAPHS, self.rows(run_id, trainer, watched))]

    def refresh(self, run_id: float | None, drawn: Any) -> list[Any]:
        """The page's text outputs (OUTPUTS of them), each gr.skip() where the page already shows it;
        all skipped for a finished run already drawn."""
        if run_id is None:
            return [gr.skip()] * OUTPUTS
        rid = int(run_id)
        run = self.store.get_run(rid)
        if run is not None and run.status.finished and isinstance(drawn, dict):
            if (drawn.get("run"), drawn.get("status")) == (rid, run.status.value):
                return [gr.skip()] * OUTPUTS
        values = self._values(rid, run)
        sent = [signature(v) for v in values]
        before = drawn.get("sent") if isinstance(drawn, dict) and drawn.get("run") == rid else None
        shown = [
            gr.skip() if before and i < len(before) and before[i] == sig else v
            for i, (v, sig) in enumerate(zip(values, sent))
        ]
        status = run.status.value if run is not None and run.status.finished else None
        return shown + [{"run": rid, "status": status, "sent": sent}]

    def _values(self, rid: int, run: RunRecord | None) -> list[Any]:
        """Every text output but `drawn`, in `RunPage.outputs` order."""
        if run is None:
            hidden = gr.Button(visible=False)
            return (
                [f"No run {rid}.", "", hidden, gr.DownloadButton(visible=False), gr.Dataframe(visible=False)]
                + [""] * 5
                + [gr.Button(visible=False), "", gr.Dropdown(choices=[], value=None, visible=False)]
                + [gr.Button(visible=False)]
            )
        bundle = bundle_path(self.store, rid) if run.status is RunStatus.SUCCEEDED else None
        files = gr.Dataframe(bundle_files(bundle), visible=True) if bundle else gr.Dataframe(visible=False)
        label = "Download model" if spec_of(run).method.value == "full" else "Download adapter"
        download = (
            gr.DownloadButton(label, value=str(bundle), visible=True) if bundle else gr.DownloadButton(visible=False)
        )
        error = ""
        if run.status in (RunStatus.FAILED, RunStatus.INTERRUPTED):
            error = f"### Run {run.status.value}\n{run.error_summary or 'no error summary recorded'}"
            if run.exit_code is not None:
                error += f" (exit code {run.exit_code})"
        elif run.status is RunStatus.SUCCEEDED and bundle is None:
            error = unreachable_files_note(self.store, rid)
        cancel = gr.Button(visible=run.status in (RunStatus.QUEUED, RunStatus.RUNNING))
        resume = gr.Button(visible=resumable(self.store, run))
        all_events = self.store.run_events(rid)
        events = events_markdown(run, all_events)
        found = findings_of(all_events)
        choices = fix_choices(found)
        measured = figures.run_figures(self.store, run)
        header = (
            header_markdown(run, measured)
            + prediction_markdown(self.store, run)
            + throughput_markdown(self.store, run)
            + events
        )
        return [
            header,
            progress_html(run, measured.step_time),
            cancel,
            download,
            files,
            error,
            samples_markdown(self.store, run) + scores_markdown(self.store, run),
            phases_markdown(self.store, run),
            log_tail(run),
            spec_yaml(run.spec_json),
            resume,
            findings_html(found),
            gr.Dropdown(choices=choices, value=choices[0][1] if choices else None, visible=bool(choices)),
            gr.Button(visible=bool(choices)),
        ]

    def cancel(self, run_id: float | None) -> None:
        if run_id is None:
            return
        try:
            done = run_actions.cancel(self.store, run_id, "run")
        except RunCommandError as exc:
            raise gr.Error(str(exc)) from None
        gr.Info(done.message[0].upper() + done.message[1:] + ".")

    def resume(self, run_id: float | None) -> None:
        """Queue the run again (same id); it continues from its last complete checkpoint."""
        if run_id is None:
            raise gr.Error("Open a run first.")
        try:
            gr.Info(run_actions.resume(self.store, run_id, "run").message)
        except RunCommandError as exc:
            raise gr.Error(str(exc)) from None
