"""Every rule of the training doctor in one table, and `examine`, which runs them over a run's curves.

    examine(curves, ctx, since=40, found={RuleCode.LOSS_SPIKE})   # the new findings after step 40

Pure: `jobs.doctor.watch` feeds it the rows the store holds and stores what it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from jobs.doctor import grpo, preference, resources, rules
from jobs.doctor.findings import Curves, Finding, RunContext
from jobs.spec.doctor_codes import RuleCode

Rule = Callable[[Curves, RunContext, int], Finding | None]

RULES: dict[RuleCode, Rule] = {
    RuleCode.NONFINITE_LOSS: rules.nonfinite_loss,
    RuleCode.LOSS_SPIKE: rules.loss_spike,
    RuleCode.GRAD_NORM_EXPLOSION: rules.grad_norm_explosion,
    RuleCode.LOSS_FLAT: rules.loss_flat,
    RuleCode.LOSS_NEAR_ZERO: rules.loss_near_zero,
    RuleCode.OVERFITTING: rules.overfitting,
    RuleCode.THROUGHPUT_DROP: resources.throughput_drop,
    RuleCode.MEMORY_CREEP: resources.memory_creep,
    RuleCode.REWARD_SATURATED: preference.reward_saturated,
    RuleCode.CHOSEN_LOGPS_FALLING: preference.chosen_logps_falling,
    RuleCode.GRPO_NO_SIGNAL: grpo.grpo_no_signal,
    RuleCode.COMPLETIONS_CLIPPED: grpo.completions_clipped,
    RuleCode.KL_UNBOUNDED: grpo.kl_unbounded,
    RuleCode.ENTROPY_COLLAPSE: grpo.entropy_collapse,
    RuleCode.FORGETTING: rules.forgetting,
}


def examine(curves: Curves, ctx: RunContext, since: int = -1, found: Collection[RuleCode] = ()) -> list[Finding]:
    """The findings of every rule not in `found` (each rule speaks once per run) over points after step `since`."""
    out = []
    for code, rule in RULES.items():
        if code in found:
            continue
        finding = rule(curves, ctx, since)
        if finding is not None:
            out.append(finding)
    return out
