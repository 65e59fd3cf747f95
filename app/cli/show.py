"""How the command line shows runs: the `tunedeck runs` table and the `tunedeck show` page.

    print(runs_table(store, store.list_runs()))   # ID STATUS NAME STEP LOSS CREATED TIME DISK TAGS [SHARES]
    print(show_text(store, run))                  # status, figures, memory (by phase), error, spec, findings, events, data, metrics, files

Pure reads of the store; `app.cli.runs` prints them.
"""

from __future__ import annotations

import time
from typing import Any

from app.cli.usage import UsageError
from jobs.doctor.findings import EVENT_KIND, findings_of
from jobs.errors import Problem
from jobs.spec.stored import spec_of
from jobs.train import figures, forgetting
from jobs.units import human_bytes
from storage.models import RunStatus
from storage.roles import RunReader
from storage.roles_pages import RunReport
from storage.roles_tasks import ScoreReport
from storage.store import RunRecord


def run_or_fail(store: RunReader, run_id: int) -> RunRecord:
    """The run, or a UsageError naming RUN_ID when there is none."""
    run = store.get_run(run_id)
    if run is None:
        raise UsageError([Problem("RUN_ID", f"run {run_id} does not exist", "list runs with `tunedeck runs`")])
    return run


def duration(run: RunRecord) -> str:
    if run.started_at is None:
        return "-"
    seconds = (run.finished_at or time.time()) - run.started_at
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _number(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def sharing(store: RunReport) -> dict[int, list[int]]:
    """Running runs that share a device: {run_id: the other runs training with it}. A worker owns one device,
    so the runs one worker trains at once share it (`tunedeck worker --share N`)."""
    by_worker: dict[str, list[int]] = {}
    for r in store.list_runs(status=RunStatus.RUNNING, limit=10_000):
        if r.engine:  # a cluster dispatcher's runs each have a GPU of their own
            continue
        by_worker.setdefault(r.worker_id or "", []).append(r.id)
    return {i: sorted(set(ids) - {i}) for ids in by_worker.values() if len(ids) > 1 for i in ids}


def runs_table(store: RunReport, runs: list[RunRecord]) -> str:
    from storage.run_files import DiskUsage

    shares = sharing(store)
    header: tuple[str, ...] = ("ID", "STATUS", "NAME", "STEP", "LOSS", "CREATED", "TIME", "DISK", "TAGS")
    header += ("SHARES",) if shares else ()  # the column appears while runs share a device
    rows = []
    disk = DiskUsage(store)
    for r in runs:
        loss = store.last_metric(r.id, "loss")
        step = f"{r.current_step}/{r.total_steps}" if r.total_steps else str(r.current_step)
        rows.append(
            (
                str(r.id),
                r.status.value,
                r.name[:40],
                step,
                f"{loss.value:.4f}" if loss else "-",
                _when(r.created_at),
                duration(r),
                human_bytes(disk.of(r)),
                ",".join(r.tags) or "-",
            )
            + ((("with " + ",".join(map(str, shares[r.id]))) if r.id in shares else "-",) if shares else ())
        )
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (header, *rows))


def show_text(store: RunReport, run: RunRecord) -> str:
    lines = [
        f"run {run.id}: {run.name}",
        f"status:   {run.status.value}",
        f"created:  {_when(run.created_at)}   duration: {duration(run)}",
        f"progress: step {run.current_step}" + (f" of {run.total_steps}" if run.total_steps else ""),
    ]
    if run.engine:
        job = f"job {run.engine_job_id}" if run.engine_job_id else "(not submitted)"
        lines.append(f"engine:   {run.engine} {job}: {run.engine_state or '?'}")
    if run.exit_code is not None:
        lines.append(f"exit code: {run.exit_code}")
    measured = figures.run_figures(store, run)
    lines += [f"{f.label + ':':<13}{measured.text(f)}" for f in figures.FIGURES if measured.text(f)]
    from jobs.memory.breakdown import prediction_error_text
    from jobs.queue.saved_prediction import load_prediction

    predicted = prediction_error_text(
        load_prediction(store, run.id), run.peak_memory_bytes, run.peak_memory_source, run.current_step
    )
    if predicted:
        lines.append(f"{'memory:':<13}{predicted}")
    meter = forgetting.read(store, run.id)
    if meter is not None:
        lines.append(f"{'forgetting:':<13}{meter.text()} ({meter.detail()})")
    others = sharing(store).get(run.id) if run.status is RunStatus.RUNNING else None
    if others:
        lines.append(f"{'device:':<13}shared with run(s) {', '.join(map(str, others))} (worker {run.worker_id})")
    if run.error_summary:
        lines.append(f"error:    {run.error_summary}")
    if run.log_path:
        lines.append(f"log:      {run.log_path}")
    lines += phase_lines(store, run)
    lines += ["", "spec:", *("  " + ln for ln in spec_of(run).to_yaml().splitlines())]
    events = store.run_events(run.id)
    lines += findings_lines(events, run.id)
    lines += events_lines(store, run, [e for e in events if e["kind"] != EVENT_KIND])
    lines += score_lines(store, run)
    data = (run.resolved_config or {}).get("data")
    if data:
        lines += [
            "",
            "data:",
            *(
                f"  {name}: {d['ref']}: {d['rows']} rows, {d['format']}"
                + (f" ({d['conversion']})" if d.get("conversion") else "")
                for name, d in data.items()
                if isinstance(d, dict)
            ),
        ]
        lines.append(f"  rows used: {data.get('train_rows')} train, {data.get('eval_rows')} eval")
    if run.final_metrics:
        lines += ["", "final metrics:", *(f"  {k}: {_number(v)}" for k, v in run.final_metrics.items())]
    arts = store.artifacts(run.id)
    if arts:
        lines += ["", "artifacts:", *(f"  {a.kind}: {a.path} ({human_bytes(a.size)})" for a in arts)]
    if run.error_detail:
        lines += ["", "error detail:", *("  " + ln for ln in run.error_detail.splitlines())]
    return "\n".join(lines)


def phase_lines(store: RunReport, run: RunRecord) -> list[str]:
    """The "memory by phase" section: predicted against measured per phase (jobs.train.phases), or why not."""
    from jobs.queue.saved_prediction import load_prediction
    from jobs.train.phases import load_phases, phase_notes, phase_rows, table_lines

    predicted, measured = load_prediction(store, run.id), load_phases(store, run.id)
    rows = phase_rows(predicted, measured)
    notes = phase_notes(predicted, measured, run.status.finished)
    if not rows:
        return ["", "memory by phase: " + "; ".join(notes)] if notes else []
    return ["", "memory by phase:", *("  " + ln for ln in table_lines(rows)), *("  " + n for n in notes)]


def findings_lines(events: list[dict[str, Any]], run_id: int) -> list[str]:
    """The training doctor's findings (`jobs.doctor`): step, severity, diagnosis, and the fix with its spec change."""
    out = []
    for n, f in enumerate(findings_of(events), 1):
        change = ", ".join(f"{k}: {_number(v)}" for k, v in f.spec_change.items())
        out += [
            f"  {n}. step {f.step}  {f.severity.value}  {f.code.value}: {f.diagnosis}",
            f"     fix: {f.fix}" + (f" (spec change: {change}; `tunedeck clone {run_id} --fix {n}`)" if change else ""),
        ]
    return ["", "findings (training doctor):", *out] if out else []


def events_lines(store: RunReport, run: RunRecord, events: list[dict[str, Any]]) -> list[str]:
    """The run's other events (OOM recoveries) and the spec fields it continued with."""
    from jobs.train import oom

    if not events:
        return []
    out = ["", "events:", *(f"  {_when(e['time'])}  {e['message']}" for e in events)]
    changed = oom.changes(spec_of(run), oom.effective_spec(store, run.id, spec_of(run)))
    if changed:
        out += [
            "",
            "continued with (spec above as submitted):",
            *(f"  {k}: {before} -> {after}" for k, (before, after) in changed.items()),
        ]
    return out


def score_lines(store: ScoreReport, run: RunRecord) -> list[str]:
    """Benchmark scores, base beside run, each with its standard error, then the judge's verdict (`jobs.evaluate`)."""
    from jobs.evaluate.card import JUDGE_TASK, judge_line, scores_table
    from jobs.evaluate.judge import judge_file

    table = scores_table([s for s in store.scores(run.id) if s.task != JUDGE_TASK])
    out = ["", "benchmarks (base vs run, ± standard error):", *("  " + ln for ln in table)] if table else []
    judged = judge_line(judge_file(store.run_path(run.id)))
    return out + (["", f"judge: {judged}"] if judged else [])
