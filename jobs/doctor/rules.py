"""The training doctor's rules over the loss curves: spike, grad-norm explosion, NaN/inf, flat, ~0, overfitting.

Each rule is a pure function `rule(curves, ctx, since) -> Finding | None`: `curves` the run's metric points
by name (`jobs.doctor.findings.Curves`), `ctx` the spec values it reads, `since` the last step already
evaluated (a point rule looks at later points only; a trend rule judges the curve as of its newest point,
when that point is new). Thresholds are the named constants below, documented in docs/runs.md ("The
training doctor"). No rule reads a curve shorter than MIN_POINTS: a test run of a dozen steps gets no finding.

    loss_spike({"loss": points}, RunContext(), since=-1)   # Finding(code=LOSS_SPIKE, step=40, ...) or None
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median

from jobs.doctor.findings import Curves, Finding, Point, RunContext, Severity, curve
from jobs.spec.doctor_codes import RuleCode

MIN_POINTS = 20  # a rule reads a curve only once it has this many points (tiny runs get no finding)
SPIKE_WINDOW = 20  # the recent points a step's loss is compared with
SPIKE_RATIO = 2.0  # a spike: the loss at least this many times the recent median ...
SPIKE_MADS = 10.0  # ... and this many median absolute deviations above it (noise is not a spike)
GRAD_RATIO = 10.0  # a grad-norm explosion: the norm at least this many times its recent median
FLAT_MIN_POINTS = 50  # a loss is judged flat only after this many points
FLAT_EDGE = 10  # the points at each end whose medians are compared
FLAT_REL_DROP = 0.02  # flat: the loss fell by less than this share of its first value
FLAT_HIGH_LR = 0.05  # ... at a learning rate this high or higher, it is stuck after too large updates, not too small
NEAR_ZERO_LOSS = 0.01  # memorising: the recent median training loss below this
NEAR_ZERO_WINDOW = 10  # the recent points whose median is read
OVERFIT_MIN_EVALS = 3  # overfitting is judged after this many evaluations
OVERFIT_RISE = 0.05  # the newest eval loss this share above the best, having risen twice in a row
OVERFIT_TRAIN_FALL = 0.02  # ... while the training loss fell by at least this share since the previous evaluation
FORGET_RISE = 0.10  # forgetting: the general text's perplexity at least this share above the base's
TRAIN_WINDOW = 5  # the training-loss points (up to an eval's step) whose median stands for it


def finite(points: Sequence[Point]) -> list[Point]:
    """The points whose value is a number (NaN and inf left out)."""
    return [p for p in points if math.isfinite(p[1])]


def _new(points: Sequence[Point], since: int) -> bool:
    return bool(points) and points[-1][0] > since


def loss_spike(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """A step's loss far above its recent median, after warm-up."""
    if ctx.generates:
        return None
    points = finite(curves.get("loss", ()))
    for i in range(MIN_POINTS, len(points)):
        step, value = points[i]
        if step <= since or step <= ctx.warmup_steps:
            continue
        window = [v for _, v in points[max(0, i - SPIKE_WINDOW) : i]]
        mid = median(window)
        mad = median(abs(v - mid) for v in window)
        if mid > 0 and value >= SPIKE_RATIO * mid and value - mid >= SPIKE_MADS * mad:
            lr = ctx.learning_rate / 2
            return Finding(
                RuleCode.LOSS_SPIKE,
                step,
                Severity.WARNING,
                f"the training loss jumped to {value:.4g} at step {step}, {value / mid:.1f}x its median of "
                f"{mid:.4g} over the {len(window)} logged steps before",
                f"lower learning_rate (to {lr:.3g}); keep gradient clipping on (max_grad_norm 1.0); more warm-up",
                {"value": value, "median": mid, "ratio": value / mid, "curve": curve(points, i)},
                {"learning_rate": lr, "max_grad_norm": min(ctx.max_grad_norm or 1.0, 1.0)},
            )
    return None


def grad_norm_explosion(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The gradient norm far above its recent median, or not a number."""
    points = list(curves.get("grad_norm", ()))
    for i in range(MIN_POINTS, len(points)):
        step, value = points[i]
        if step <= since or step <= ctx.warmup_steps:
            continue
        window = [v for _, v in finite(points[max(0, i - SPIKE_WINDOW) : i])]
        if not window:
            continue
        mid = median(window)
        if math.isfinite(value) and (mid <= 0 or value < GRAD_RATIO * mid):
            continue
        shown = f"{value / mid:.0f}x" if math.isfinite(value) and mid > 0 else "not a number, against"
        clip = ctx.max_grad_norm if 0 < ctx.max_grad_norm <= 1.0 else 1.0
        return Finding(
            RuleCode.GRAD_NORM_EXPLOSION,
            step,
            Severity.WARNING,
            f"the gradient norm at step {step} is {shown} its recent median of {mid:.4g}: the update is "
            "far larger than the steps before",
            f"clip gradients (max_grad_norm {clip}); lower learning_rate (to {ctx.learning_rate / 2:.3g})",
            {"value": value, "median": mid, "curve": curve(points, i)},
            {"max_grad_norm": clip, "learning_rate": ctx.learning_rate / 2},
        )
    return None


def nonfinite_loss(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The training loss became NaN or infinite (the run stops there: `jobs.train.callbacks`)."""
    points = list(curves.get("loss", ()))
    for i, (step, value) in enumerate(points):
        if step <= since or math.isfinite(value):
            continue
        good = finite(points[:i])
        grads = finite(curves.get("grad_norm", ()))
        before = [v for s, v in grads if s < step][-SPIKE_WINDOW:]
        last_grad = next((v for s, v in reversed(grads) if s <= step), None)
        why = "the loss was finite until then"
        if before and last_grad is not None and last_grad >= GRAD_RATIO * median(before):
            why = f"the gradient norm had risen to {last_grad:.4g}, {last_grad / median(before):.0f}x its median"
        return Finding(
            RuleCode.NONFINITE_LOSS,
            step,
            Severity.FATAL,
            f"the training loss became NaN or infinite at step {step} ({why}); the run stopped without saving, "
            "so its last checkpoint is the last good state",
            f"lower learning_rate (to {ctx.learning_rate / 4:.3g}), keep gradient clipping on (max_grad_norm 1.0), "
            "train in bf16 rather than fp16, and check the data for empty or broken rows",
            {"last_finite_loss": good[-1][1] if good else None, "grad_norm": last_grad, "curve": curve(points, i)},
            {"learning_rate": ctx.learning_rate / 4, "max_grad_norm": min(ctx.max_grad_norm or 1.0, 1.0)},
        )
    return None


def loss_flat(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """A loss that does not move: a learning rate too low, or no token trained (all masked)."""
    if ctx.generates:
        return None
    points = finite(curves.get("loss", ()))
    if len(points) < FLAT_MIN_POINTS or not _new(points, since):
        return None
    first = median(v for _, v in points[:FLAT_EDGE])
    last = median(v for _, v in points[-FLAT_EDGE:])
    step = points[-1][0]
    if max(abs(v) for _, v in points) == 0.0:
        why, fix, change = (
            "the training loss is exactly 0 at every step: no token is trained (every label is masked)",
            "check the mask: train on the answers of rows that have one (the data preview shows the trained tokens)",
            {},
        )
    elif first > 0 and (first - last) < FLAT_REL_DROP * first and ctx.learning_rate >= FLAT_HIGH_LR:
        lr = ctx.learning_rate / 100
        why, fix, change = (
            f"the training loss has not moved in {len(points)} logged steps ({first:.4g} then {last:.4g}) at a "
            f"learning rate of {ctx.learning_rate:.3g}: updates that large knock the model into a state it cannot "
            "learn from (often the same few tokens for everything)",
            f"lower learning_rate (to {lr:.3g})",
            {"learning_rate": lr},
        )
    elif first > 0 and (first - last) < FLAT_REL_DROP * first:
        lr = min(ctx.learning_rate * 10, 1e-3) if ctx.learning_rate < 1e-3 else ctx.learning_rate
        why, fix, change = (
            f"the training loss has not moved in {len(points)} logged steps ({first:.4g} then {last:.4g}): the "
            "learning rate is too low, or almost no token is trained",
            f"raise learning_rate (to {lr:.3g}); check that the mask leaves the answers trained",
            {"learning_rate": lr} if lr != ctx.learning_rate else {},
        )
    else:
        return None
    evidence = {"first_median": first, "last_median": last, "curve": curve(points, len(points) - 1)}
    return Finding(RuleCode.LOSS_FLAT, step, Severity.WARNING, why, fix, evidence, change)


def loss_near_zero(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The training loss fell to ~0: the model recites its training set (memorising), it no longer learns from it."""
    if ctx.generates:
        return None
    points = finite(curves.get("loss", ()))
    if len(points) < MIN_POINTS or not _new(points, since):
        return None
    recent = median(v for _, v in points[-NEAR_ZERO_WINDOW:])
    start = median(v for _, v in points[:NEAR_ZERO_WINDOW])
    if recent >= NEAR_ZERO_LOSS or start < 10 * NEAR_ZERO_LOSS:
        return None  # a loss that started at ~0 is the masked case (loss_flat)
    epochs = ctx.num_train_epochs
    change = {"num_train_epochs": max(1.0, epochs / 2)} if epochs > 1 else {}
    step = points[-1][0]
    return Finding(
        RuleCode.LOSS_NEAR_ZERO,
        step,
        Severity.WARNING,
        f"the training loss fell to {recent:.2g} (from {start:.3g}): the model is memorising its training rows, "
        "and will answer other prompts worse",
        "train for fewer epochs"
        + (f" (num_train_epochs {change['num_train_epochs']:g})" if change else "")
        + ", use more (or more varied) data, and hold out eval data to watch it",
        {"recent_median": recent, "start_median": start, "curve": curve(points, len(points) - 1)},
        change,
    )


def overfitting(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The eval loss rising while the training loss falls; names the best step so far. Each evaluation after
    `since` is judged as of its own step (a check may read several at once: the last may have turned down again)."""
    evals = finite(curves.get("eval_loss", ()))
    train = finite(curves.get("loss", ()))
    for i in range(OVERFIT_MIN_EVALS - 1, len(evals)):
        if evals[i][0] > since:
            found = _overfit_at(evals[: i + 1], train)
            if found is not None:
                return found
    return None


def _overfit_at(evals: Sequence[Point], train: Sequence[Point]) -> Finding | None:
    """The overfitting finding as of the newest of `evals` (the training points up to its step read), or None."""
    (prev_step, prev), (step, now) = evals[-2], evals[-1]
    train = [p for p in train if p[0] <= step]
    if len(train) < MIN_POINTS:
        return None
    best_i = min(range(len(evals)), key=lambda i: evals[i][1])
    best_step, best = evals[best_i]
    if best_i >= len(evals) - 2 or not (now > prev > best) or now < best * (1 + OVERFIT_RISE):
        return None
    # The training loss at the previous evaluation (after the best one), against now: the watcher keeps
    # the last TAIL_POINTS of it, so the best step's own may be gone on a long run; this one is recent.
    then_points = [v for s, v in train if best_step < s <= prev_step][-TRAIN_WINDOW:]
    later = median([v for _, v in train][-TRAIN_WINDOW:])
    if not then_points or not later < (1 - OVERFIT_TRAIN_FALL) * median(then_points):
        return None
    then = median(then_points)
    return Finding(
        RuleCode.OVERFITTING,
        step,
        Severity.WARNING,
        f"the eval loss rose from {best:.4g} (step {best_step}, the best so far) to {now:.4g} while the training "
        f"loss fell from {then:.4g} (step {prev_step}) to {later:.4g}: the model is fitting its training rows, not the task",
        f"stop at the best step: early_stopping_patience 2 keeps the checkpoint of step {best_step}; or train "
        "fewer steps, or with more data",
        {
            "best_step": best_step,
            "best_eval_loss": best,
            "eval_loss": now,
            "train_loss_before": then,
            "train_loss": later,
            "curve": [[s, v] for s, v in evals],
        },
        {"early_stopping_patience": 2},
    )


def forgetting(curves: Curves, ctx: RunContext, since: int) -> Finding | None:
    """The shipped general text's perplexity rose past FORGET_RISE from the base to the result (`jobs.train.forgetting`:
    `general_loss` at step 0 and at the last step; `task_loss` beside it)."""
    general = finite(curves.get("general_loss", ()))
    if len(general) < 2 or not _new(general, since):
        return None
    (_, before), (step, after) = general[0], general[-1]
    rise = math.exp(after - before) - 1
    if rise < FORGET_RISE:
        return None
    task = finite(curves.get("task_loss", ()))
    beside = ""
    if len(task) >= 2 and task[0][1] > 0:
        moved = task[-1][1] / task[0][1] - 1
        beside = f" while the eval loss {'fell' if moved < 0 else 'rose'} {abs(100 * moved):.0f}%"
    epochs = ctx.num_train_epochs
    change = {"num_train_epochs": max(1.0, epochs / 2)} if epochs > 1 else {"learning_rate": ctx.learning_rate / 2}
    # A note, not a warning: a fine-tune that teaches a narrow format always trades some general text for it (the
    # default example: +137% while its eval loss fell 96%); whether that trade is wanted is the user's call.
    return Finding(
        RuleCode.FORGETTING,
        step,
        Severity.INFO,
        f"the perplexity of ordinary text rose {100 * rise:.0f}% from the base model's{beside}: the fine-tune made "
        "the model worse at what it knew",
        "train less (fewer epochs or steps, a lower learning_rate), use LoRA with a smaller rank, or mix some "
        "general data into the training set",
        {"general_loss_before": before, "general_loss_after": after, "perplexity_rise": rise},
        change,
    )
