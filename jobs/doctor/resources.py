"""The training doctor's rules over the run's speed and memory: tokens/s dropping, memory creeping up.

Same shape as `jobs.doctor.rules` (pure, `rule(curves, ctx, since) -> Finding | None`). Memory is the torch
allocator's `torch_allocated` (sampled at each log, on a GPU), which the watcher puts on the step it was
taken at (`jobs.doctor.watch`); a run on the CPU has none, so the rule stays quiet there.
"""

from __future__ import annotations

from statistics import median

from jobs.doctor.findings import Curves, Finding, RunContext, Severity, curve
from jobs.doctor.rules import finite
from jobs.spec.doctor_codes import RuleCode

THROUGHPUT_MIN_POINTS = 30  # tokens/s is judged after this many points
THROUGHPUT_SKIP = 3  # the first points left out of the baseline (compilation, caches warming up)
THROUGHPUT_BASELINE = 20  # the points after those whose median is the run's usual speed
THROUGHPUT_RECENT = 10  # the recent points whose median is the speed now (one slow eval step does not count)
THROUGHPUT_DROP = 0.6  # a drop: the speed now below this share of the usual speed
MEMORY_MIN_POINTS = 30  # memory is judged over the last this many samples
MEMORY_RISING_SHARE = 0.8  # a creep: at least this share of step-to-step changes are rises ...
MEMORY_GROWTH = 0.05  # ... adding up to this share of the allocation


def throughput_drop(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """Tokens per second well below the run's usual speed (another process, swapping, thermal throttling)."""
    points = finite(curves.get("tokens_per_second", ()))
    if len(points) < THROUGHPUT_MIN_POINTS or points[-1][0] <= since:
        return None
    usual = median(v for _, v in points[THROUGHPUT_SKIP : THROUGHPUT_SKIP + THROUGHPUT_BASELINE])
    now = median(v for _, v in points[-THROUGHPUT_RECENT:])
    if usual <= 0 or now >= THROUGHPUT_DROP * usual:
        return None
    step = points[-1][0]
    return Finding(
        RuleCode.THROUGHPUT_DROP,
        step,
        Severity.INFO,
        f"training slowed to {now:.4g} tokens/s, {now / usual:.0%} of its usual {usual:.4g}: something else is "
        "using the device or the host (another process, memory swapping, thermal throttling)",
        "look at the GPU panel and nvidia-smi for other processes, at the host's free memory, and at the GPU's "
        "clocks and temperature; nothing in the spec causes this",
        {"tokens_per_second": now, "usual": usual, "curve": curve(points, len(points) - 1)},
    )


def memory_creep(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The allocated memory rising from step to step (something keeps tensors alive; it ends out of memory)."""
    points = finite(curves.get("torch_allocated", ()))
    if len(points) < MEMORY_MIN_POINTS or points[-1][0] <= since:
        return None
    window = points[-MEMORY_MIN_POINTS:]
    rises = sum(b[1] > a[1] for a, b in zip(window, window[1:]))
    first, last = window[0][1], window[-1][1]
    if first <= 0 or rises < MEMORY_RISING_SHARE * (len(window) - 1) or last - first < MEMORY_GROWTH * first:
        return None
    step = window[-1][0]
    return Finding(
        RuleCode.MEMORY_CREEP,
        step,
        Severity.WARNING,
        f"allocated memory rose in {rises} of the last {len(window) - 1} logged steps, from {first / 2**20:.0f} "
        f"to {last / 2**20:.0f} MiB: something keeps tensors alive between steps, and the run will run out of memory",
        "look for code that keeps outputs across steps (a custom reward function, callback or metric); a fixed "
        "max_length also keeps the allocation steady",
        {"first_bytes": first, "last_bytes": last, "rises": rises, "curve": curve(points, len(points) - 1)},
    )
