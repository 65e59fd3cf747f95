"""The run page's text: progress bar and ETA, header with the run's figures, throughput, events
and the before/after samples. Pure functions of a run record and store reads (the memory
prediction line is `app.ui.run.prediction_markdown`).

    progress_html(run, step_time)     # the orange bar and "step 5/20 · ETA 0m 12s"
    header_markdown(run, measured)    # "## Run 7: ...", status, model, method, measured figures
    phases_markdown(store, run)       # "### Memory by phase": predicted against measured (jobs.train.phases)
"""

from __future__ import annotations

import time
from typing import Any

from jobs.doctor.findings import finding_from_event
from jobs.memory.flops import FlopsRate
from jobs.spec.stored import spec_of
from jobs.train import figures
from storage.models import RunStatus
from storage.roles_pages import RunText
from storage.store import RunRecord


def eta_text(run: RunRecord, now: float | None = None, step_time: float | None = None) -> str:
    """ " · ETA 3m 05s" for a running run: steps left times the mean step time over the whole run.

    `step_time` is the run's mean measured `step_time` (jobs.train.figures), which spans every attempt of
    a resumed run; without it (before the first training log) the time since this attempt started
    over the steps taken in it stands in (a resumed run starts counting at its checkpoint's step, so
    its rate is only known once a step of this attempt is logged).
    """
    now = time.time() if now is None else now
    if run.status is not RunStatus.RUNNING or not run.total_steps or not run.started_at or run.current_step <= 0:
        return ""
    per_step = step_time if step_time and step_time > 0 else (now - run.started_at) / run.current_step
    left = max(0.0, (run.total_steps - run.current_step) * per_step)
    return f" · ETA {int(left // 60)}m {int(left % 60):02d}s"


def progress_html(run: RunRecord, step_time: float | None = None) -> str:
    total = run.total_steps or 0
    pct = 100.0 if run.status is RunStatus.SUCCEEDED else (100.0 * run.current_step / total if total else 0.0)
    label = f"step {run.current_step}/{total or '?'}{eta_text(run, step_time=step_time)}"
    return (
        f'<div id="run-progress" data-step="{run.current_step}" data-total="{total}">'
        f'<div style="background:#e5e7eb;border-radius:6px;height:14px;overflow:hidden">'
        f'<div style="background:#f97316;height:14px;width:{pct:.1f}%"></div></div>'
        f'<div style="font-size:0.9em;margin-top:4px">{label}</div></div>'
    )


def header_markdown(run: RunRecord, measured: figures.RunFigures | None = None) -> str:
    """Title, status, model and method, then the run's figures (jobs.train.figures) measured so far."""
    measured = measured or figures.RunFigures(
        peak_memory_bytes=run.peak_memory_bytes, peak_memory_source=run.peak_memory_source
    )
    # '1,074 tokens/s' names itself; the others get their label: 'step time 0.250 s'.
    shown = [
        text if f.unit == f.label else f"{f.label} {text}"
        for f, text in ((f, measured.text(f)) for f in figures.FIGURES)
        if text
    ]
    peak = "".join(f" · {text}" for text in shown)
    cancel = " · cancel requested" if run.cancel_requested and not run.status.finished else ""
    spec = spec_of(run)
    return (
        f"## Run {run.id}: {run.name}\n"
        f"Status: **<span id='run-status'>{run.status.value}</span>**{cancel}{engine_text(run)} · model `{spec.model}` · "
        f"{spec.method.value} / {spec.trainer.value}{peak}"
    )


def engine_text(run: RunRecord) -> str:
    """ " · Slurm job 123: RUNNING on node3" for a run handed to a cluster's scheduler ("" for a local one)."""
    if not run.engine:
        return ""
    job = f"job {run.engine_job_id}" if run.engine_job_id else "(not submitted)"
    return f" · {run.engine.capitalize()} {job}: <span id='run-engine'>{run.engine_state or '?'}</span>"


def throughput_markdown(store: RunText, run: RunRecord) -> str:
    """' · 1.23 TFLOP/s achieved · MFU 4.5% of H200 bf16 989 TFLOP/s' from the latest logged values (jobs.memory.flops)."""
    achieved = store.last_metric(run.id, "tflops")
    if achieved is None:
        return ""
    text = f" · <span id='run-tflops'>{achieved.value:.3g}</span> TFLOP/s achieved"
    mfu = store.last_metric(run.id, "mfu")
    rate = FlopsRate.for_run(run.resolved_config)
    if mfu is not None and rate is not None and rate.peak_label:
        return text + f" · MFU {100 * mfu.value:.1f}% of {rate.peak_label}"
    device = (run.resolved_config.get("device") or {}).get("name", "this device")
    return text + f" · MFU: no peak figure known for {device}"


def events_markdown(run: RunRecord, events: list[dict[str, Any]]) -> str:
    """The run's events (e.g. out-of-memory recoveries), one line each, and the spec fields it continued with."""
    if not events:
        return ""
    from jobs.train import oom

    lines = [f"- {time.strftime('%H:%M:%S', time.localtime(e['time']))} · {e['message']}{_fix(e)}" for e in events]
    changed = oom.changes(spec_of(run), oom.effective_spec_from(events, spec_of(run)))
    if changed:
        lines.append(
            "- continued with: "
            + ", ".join(f"`{k}` {a} -> {b}" for k, (a, b) in changed.items())
            + " (the Spec below is as submitted)"
        )
    return "\n\n**Events**\n" + "\n".join(lines)


def _fix(event: dict[str, Any]) -> str:
    """A training doctor's finding (`jobs.doctor`) also says what to change."""
    found = finding_from_event(event)
    return f" **Fix:** {found.fix}" if found else ""


def samples_markdown(store: RunText, run: RunRecord) -> str:
    """The "Before / after" section: prompt | base | this run, or a line saying why there is none."""
    from jobs.evaluate.card import judge_line
    from jobs.evaluate.judge import judge_file, verdict_cells
    from jobs.train import before_after

    data = before_after.samples_of(store, run.id)
    line = before_after.status_line(data, run.status.finished)
    judged = judge_file(store.run_path(run.id)) if run.status.finished else None
    table = (
        before_after.table_markdown(data, judged=verdict_cells(judged))
        if data and before_after.rows(data) and (data.get("before") is not None or data.get("after") is not None)
        else ""
    )
    verdict = f"**Judge**: {judge_line(judged)}." if judged else ""
    return "### Before / after\n" + "\n\n".join(x for x in (meter_line(store, run), line, verdict, table) if x)


def meter_line(store: RunText, run: RunRecord) -> str:
    """The forgetting meter (jobs.train.forgetting): base against result on tunedeck's general text."""
    from jobs.train import forgetting

    meter = forgetting.read(store, run.id)
    if meter is None:
        return ""
    return f"<span id='run-forgetting'>**Forgetting meter**: {meter.text()}</span> ({meter.detail()})."


def phases_markdown(store: RunText, run: RunRecord) -> str:
    """The "Memory by phase" section: predicted against measured per phase (jobs.train.phases), or why not."""
    from jobs.queue.saved_prediction import load_prediction
    from jobs.train.phases import load_phases, phase_notes, phase_rows, table_markdown

    predicted, measured = load_prediction(store, run.id), load_phases(store, run.id)
    rows = phase_rows(predicted, measured)
    notes = phase_notes(predicted, measured, run.status.finished)
    if not rows and not notes:
        return ""
    return "\n\n".join(["### Memory by phase", *([table_markdown(rows)] if rows else []), *notes])


def scores_markdown(store: RunText, run: RunRecord) -> str:
    """The "Benchmarks" section: each task's metrics, base beside run, with standard errors ("" without scores;
    the judge's verdict is beside the samples)."""
    from jobs.evaluate.card import benchmark_markdown

    table = benchmark_markdown(store.scores(run.id))
    return "\n\n### Benchmarks (base vs this run, ± standard error)\n" + table if table else ""
