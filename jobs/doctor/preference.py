"""The training doctor's rules for preference runs (DPO, KTO, ORPO): saturated rewards, chosen log-probs falling.

Same shape as `jobs.doctor.rules`. They read the metrics trl's preference trainers log (`rewards/accuracies`,
`rewards/margins`, `logps/chosen`); a run of another method has none of them, so they stay quiet there.
"""

from __future__ import annotations

from statistics import median

from jobs.doctor.findings import Curves, Finding, RunContext, Severity, curve
from jobs.doctor.rules import MIN_POINTS, finite
from jobs.spec.doctor_codes import RuleCode

SATURATED_WINDOW = 10  # reward accuracy read over the last this many points
SATURATED_ACCURACY = 0.999  # saturated: the mean accuracy over them at least this (every pair ranked right)
SATURATED_EARLY = 0.5  # "early": within this share of the run's steps (any time when the total is unknown)
MARGIN_GROWTH = 0.05  # margins still growing: the last 5 points' median this share above the 5 before
CHOSEN_EDGE = 10  # the points at each end of logps/chosen whose medians are compared
CHOSEN_DROP = 0.2  # falling: the chosen log-probability this share lower (more negative) than at the start
CHOSEN_MIN_NATS = 1.0  # ... and by at least this many nats


def reward_saturated(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """Reward accuracy at 1.0 early while the margins still grow: the policy is over-optimising the pairs."""
    acc = finite(curves.get("rewards/accuracies", ()))
    margins = finite(curves.get("rewards/margins", ()))
    if len(acc) < MIN_POINTS or len(margins) < MIN_POINTS or acc[-1][0] <= since:
        return None
    step = acc[-1][0]
    mean = sum(v for _, v in acc[-SATURATED_WINDOW:]) / SATURATED_WINDOW
    recent, before = median(v for _, v in margins[-5:]), median(v for _, v in margins[-10:-5])
    early = ctx.total_steps is None or step <= SATURATED_EARLY * ctx.total_steps
    if mean < SATURATED_ACCURACY or not early or recent <= 0 or recent < before * (1 + MARGIN_GROWTH):
        return None
    beta = ctx.beta * 2
    return Finding(
        RuleCode.REWARD_SATURATED,
        step,
        Severity.WARNING,
        f"every pair has been ranked right for {SATURATED_WINDOW} logged steps by step {step} and the reward margin "
        f"is still growing ({before:.3g} -> {recent:.3g}): the model is pushing the pairs apart rather than learning "
        "the preference, and drifts from its base",
        f"raise beta (to {beta:.3g}) to keep the model nearer its base, or lower learning_rate; use more pairs",
        {"accuracy": mean, "margin": recent, "margin_before": before, "curve": curve(margins, len(margins) - 1)},
        {"beta": beta},
    )


def chosen_logps_falling(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The chosen answers' log-probability falling: they become less likely too, only less than the rejected."""
    points = finite(curves.get("logps/chosen", ()))
    if len(points) < MIN_POINTS or points[-1][0] <= since:
        return None
    start = median(v for _, v in points[:CHOSEN_EDGE])
    now = median(v for _, v in points[-CHOSEN_EDGE:])
    drop = start - now
    if drop < CHOSEN_MIN_NATS or drop < CHOSEN_DROP * abs(start):
        return None
    step, lr = points[-1][0], ctx.learning_rate / 2
    return Finding(
        RuleCode.CHOSEN_LOGPS_FALLING,
        step,
        Severity.WARNING,
        f"the chosen answers' log-probability fell from {start:.4g} to {now:.4g}: they are becoming less likely "
        "as well, the rejected ones only faster, so the model unlearns the answers it should prefer",
        f"lower learning_rate (to {lr:.3g}) or raise beta (to {ctx.beta * 2:.3g}); fewer epochs over the pairs",
        {"start_median": start, "median": now, "curve": curve(points, len(points) - 1)},
        {"learning_rate": lr},
    )
