"""Trick sweeps: short probe runs of one spec with one memory trick each, and their comparison table.

`queue_sweep` applies each chosen trick (`jobs.spec.tricks.registry`) to the spec, shortens every probe to
`steps` optimizer steps (no checkpoints; `on_oom: fail`, so a probe measures the trick as asked
instead of recovering into another), and queues them as one sweep. `sweep_table` then answers
"what does each trick cost me in memory and time on my model and my device": peak memory and
seconds per optimizer step of each probe, and their ratio to the baseline probe.

Time per step is the median of the logged `step_time` values after the first step (which pays
for warm-up); peak memory is the run's recorded peak (torch reserved or NVML on a GPU, process
RSS on the CPU, where the interpreter and libraries (~0.5 GiB) narrow the ratios).

    queued = queue_sweep(store, spec, [Trick.BASELINE, Trick.GRADIENT_CHECKPOINTING], steps=10)
    rows = sweep_table(store, queued.sweep_id)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.tricks.record import NotApplicable
from jobs.spec.tricks.registry import Trick, apply
from storage.roles import MetricReader, Sweeps

# Every trick but torch.compile, whose compile (a minute or more) would dominate a short probe: ask for it.
DEFAULT_TRICKS = tuple(t for t in Trick if t is not Trick.COMPILE)
DEFAULT_STEPS = 10


@dataclass(frozen=True)
class SweepQueued:
    sweep_id: int
    run_ids: list[int]
    skipped: list[tuple[str, str]]  # (trick, why it was not queued)


def probe_spec(spec: JobSpec, trick: Trick, steps: int) -> JobSpec:
    """The short probe of one trick: `steps` optimizer steps, no checkpoints, no OOM recovery."""
    return spec.replace(
        max_steps=steps, save_steps=None, on_oom="fail", run_name=f"sweep {trick.value}: {spec.display_name}"[:200]
    )


def plan_probes(
    spec: JobSpec, chosen: Sequence[Trick], steps: int, device: Any
) -> tuple[list[tuple[str, str, JobSpec]], list[tuple[str, str]]]:
    """(probes to queue as (trick, note, spec), skipped as (trick, reason)); the baseline always comes first.

    `device`: the capability view (`jobs.devices.facts.Device`) of the device the probes will run on."""
    from jobs.checks.trick_packages import missing_package_problems
    from jobs.config.mapping import capability_problems

    order = [Trick.BASELINE] + [t for t in dict.fromkeys(chosen) if t is not Trick.BASELINE]
    probes, skipped = [], []
    for trick in order:
        found = apply(trick, spec, cuda=device.cuda, bf16=device.bf16)
        if isinstance(found, NotApplicable):
            skipped.append((trick.value, found.reason))
            continue
        probe = probe_spec(found.spec, trick, steps)
        # what the trick changed: precision, optimizer, a package it needs ...
        problems = capability_problems(probe, device) + missing_package_problems(probe, device)
        if problems:
            skipped.append((trick.value, "; ".join(str(p) for p in problems)))
            continue
        probes.append((trick.value, found.note, probe))
    return probes, skipped


def queue_sweep(
    store: Sweeps,
    spec: JobSpec,
    chosen: Sequence[Trick] = DEFAULT_TRICKS,
    steps: int = DEFAULT_STEPS,
    policy: AccessPolicy | None = None,
) -> SweepQueued:
    """Check the spec once (`jobs.checks.pipeline.check`: model, data, the workers' device) and queue one
    probe per applicable trick."""
    from jobs.checks.pipeline import check

    if steps < 1:
        raise SpecError([Problem("steps", f"{steps} is out of range", "use a value >= 1 (10 is usually enough)")])
    checked = check(spec, policy=policy, store=store)
    checked.accepted()
    probes, skipped = plan_probes(spec, chosen, steps, checked.device.device())
    sweep_id, run_ids = store.create_sweep(
        [(trick, note, probe.validate().display_name, probe.to_json()) for trick, note, probe in probes]
    )
    return SweepQueued(sweep_id, run_ids, skipped)


def step_time(store: MetricReader, run: Any) -> float | None:
    """Median seconds per optimizer step after the first; the run's mean when fewer were logged."""
    times = [p.value for p in store.metrics(run.id, ["step_time"]) if p.step > 1]
    if times:
        return statistics.median(times)
    return run.final_metrics.get("step_time_mean")


def sweep_table(store: Sweeps, sweep_id: int) -> list[dict[str, Any]]:
    """One row per probe: trick, run, status, peak bytes, s/step, and both as ratios to the baseline."""
    rows = []
    for member in store.sweep_runs(sweep_id):
        run = store.get_run(member["run_id"])
        if run is None:
            continue  # deleted
        rows.append(
            {
                "trick": member["trick"],
                "change": member["note"],
                "run_id": run.id,
                "status": run.status.value,
                "peak_bytes": run.peak_memory_bytes,
                "peak_source": run.peak_memory_source,
                "step_time": step_time(store, run),
            }
        )
    base = next((r for r in rows if r["trick"] == Trick.BASELINE.value), None)
    for row in rows:
        for key, ratio in (("peak_bytes", "memory_vs_baseline"), ("step_time", "time_vs_baseline")):
            of_base = base[key] if base is not None else None
            row[ratio] = row[key] / of_base if row[key] and of_base else None
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The sweep as a fixed-width text table (CLI)."""

    def gib(n: int | None) -> str:
        return f"{n / 1024**3:.2f} GiB" if n else "-"

    def ratio(x: float | None) -> str:
        return f"{x:.2f}x" if x is not None else "-"

    head = ("trick", "run", "status", "peak memory", "vs base", "s/step", "vs base", "change")
    body = [
        (
            r["trick"],
            str(r["run_id"]),
            r["status"],
            gib(r["peak_bytes"]),
            ratio(r["memory_vs_baseline"]),
            f"{r['step_time']:.3f}" if r["step_time"] else "-",
            ratio(r["time_vs_baseline"]),
            r["change"],
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in (head, *body))
