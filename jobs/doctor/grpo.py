"""The training doctor's rules for GRPO runs: no learning signal, completions cut short, KL runaway, entropy collapse.

Same shape as `jobs.doctor.rules`. They read what trl's GRPO trainer logs (`frac_reward_zero_std`,
`completions/clipped_ratio`, `kl`, `entropy`, `reward`); a run of another method has none of the first
two, the KL rule reads only a generating trainer's `kl` (KTO logs a `kl` too: its batch estimate of the KL
between the policy and the reference on mismatched pairs, the reference point of its loss, which rises as any
KTO run learns: read as a runaway it was a false alarm on examples/smollm2-kto.yaml, 17 to 36 over 10 steps),
and the entropy rule waits for a `reward` curve, so an SFT run's entropy is left alone.
"""

from __future__ import annotations

from statistics import median

from jobs.doctor.findings import Curves, Finding, Point, RunContext, Severity, curve
from jobs.doctor.rules import MIN_POINTS, finite
from jobs.spec.doctor_codes import RuleCode

GRPO_WINDOW = 10  # the recent points whose median each GRPO rule reads
NO_SIGNAL_SHARE = 0.9  # no signal: at least this share of the groups have rewards that do not vary
CLIPPED_SHARE = 0.9  # cut short: at least this share of the completions hit max_completion_length
KL_RATIO = 2.0  # KL runaway: the recent median this many times the median of the points before ...
KL_MIN = 0.1  # ... and at least this high
ENTROPY_COLLAPSE_SHARE = 0.1  # collapse: the recent entropy below this share of its first points' median


def _recent(curves: Curves, name: str, since: int) -> tuple[list[Point], float] | None:
    """The finite points of `name` and the median of its last GRPO_WINDOW; None before MIN_POINTS or with nothing new."""
    points = finite(curves.get(name, ()))
    if len(points) < MIN_POINTS or points[-1][0] <= since:
        return None
    return points, median(v for _, v in points[-GRPO_WINDOW:])


def grpo_no_signal(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """Most groups with zero reward spread: every completion of a prompt scores the same, so nothing is learned."""
    got = _recent(curves, "frac_reward_zero_std", since)
    if got is None or got[1] < NO_SIGNAL_SHARE:
        return None
    points, share = got
    n = min(ctx.num_generations * 2, 64)
    return Finding(
        RuleCode.GRPO_NO_SIGNAL,
        points[-1][0],
        Severity.WARNING,
        f"in {share:.0%} of the groups every completion got the same reward: GRPO learns from the differences "
        "within a group, so these steps teach nothing",
        f"sample more completions per prompt (num_generations {n}) or at a higher temperature, and give the reward "
        "partial credit so that answers can differ in score",
        {"frac_reward_zero_std": share, "curve": curve(points, len(points) - 1)},
        {"num_generations": n},
    )


def completions_clipped(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """Almost every completion cut at max_completion_length: the reward judges unfinished answers."""
    got = _recent(curves, "completions/clipped_ratio", since)
    if got is None or got[1] < CLIPPED_SHARE:
        return None
    points, share = got
    longer = min(ctx.max_completion_length * 2, 8192)
    return Finding(
        RuleCode.COMPLETIONS_CLIPPED,
        points[-1][0],
        Severity.WARNING,
        f"{share:.0%} of the completions were cut at max_completion_length ({ctx.max_completion_length} tokens): "
        "the reward is scoring answers that never finished",
        f"raise max_completion_length (to {longer}), or reward shorter answers",
        {"clipped_ratio": share, "curve": curve(points, len(points) - 1)},
        {"max_completion_length": longer},
    )


def kl_unbounded(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The KL to the base model growing without bound: the policy runs away from the model it started as."""
    if not ctx.generates:  # KTO's `kl` is its loss's reference point, not a distance to guard (module docstring)
        return None
    got = _recent(curves, "kl", since)
    if got is None or len(got[0]) < 2 * GRPO_WINDOW:
        return None
    points, now = got
    before = median(v for _, v in points[-2 * GRPO_WINDOW : -GRPO_WINDOW])
    if now < KL_MIN or now < KL_RATIO * max(before, 1e-12):
        return None
    beta = max(ctx.beta * 2, 0.04)
    return Finding(
        RuleCode.KL_UNBOUNDED,
        points[-1][0],
        Severity.WARNING,
        f"the KL divergence to the base model rose from {before:.3g} to {now:.3g} in {GRPO_WINDOW} logged steps: "
        "the policy is drifting away from its base (often by exploiting the reward)",
        f"raise beta (to {beta:.3g}) to hold it nearer its base, or lower learning_rate",
        {"kl": now, "kl_before": before, "curve": curve(points, len(points) - 1)},
        {"beta": beta},
    )


def entropy_collapse(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The policy's entropy collapsing: it samples the same completion every time, so the group stops varying."""
    if not curves.get("reward"):
        return None
    got = _recent(curves, "entropy", since)
    if got is None:
        return None
    points, now = got
    start = median(v for _, v in points[:GRPO_WINDOW])
    if start <= 0 or now >= ENTROPY_COLLAPSE_SHARE * start:
        return None
    hotter = min(ctx.temperature + 0.3, 2.0)
    return Finding(
        RuleCode.ENTROPY_COLLAPSE,
        points[-1][0],
        Severity.WARNING,
        f"the policy's entropy fell from {start:.3g} to {now:.3g}: it writes nearly the same completion every "
        "time, so the groups stop varying and learning stalls",
        f"sample at a higher temperature (to {hotter:.2g}), lower learning_rate, or raise beta",
        {"entropy": now, "start": start, "curve": curve(points, len(points) - 1)},
        {"temperature": hotter},
    )
