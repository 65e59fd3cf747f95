"""The training doctor's rules on synthetic curves: each finds its failure at the right step, with evidence
and a fix, and stays quiet on a normal noisy run and on a tiny one (`jobs.doctor`)."""

from __future__ import annotations

import math
import random

import pytest

from jobs.doctor import preference, resources, rules
from jobs.doctor.findings import Curves, Finding, RunContext, Severity, findings_of
from jobs.doctor.rulebook import RULES, examine
from jobs.spec.doctor_codes import RuleCode, stop_codes, stop_severities
from jobs.spec.job import JobSpec

CTX = RunContext(learning_rate=2e-4, warmup_steps=5, max_grad_norm=1.0, num_train_epochs=3.0, beta=0.1)


def decreasing(n: int, seed: int = 0, noise: float = 0.05) -> list[tuple[int, float]]:
    """A normal training loss: falls from ~2.5 towards 0.5, with noise."""
    rng = random.Random(seed)
    return [(s, 2.0 * math.exp(-s / 150) + 0.5 + rng.gauss(0, noise)) for s in range(1, n + 1)]


def noisy(n: int, level: float, spread: float, seed: int = 1) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(s, level + rng.gauss(0, spread)) for s in range(1, n + 1)]


def normal_run(n: int) -> dict[str, list[tuple[int, float]]]:
    """Every curve a healthy SFT run logs, noisy as real ones are (eval every 50 steps, still falling)."""
    return {
        "loss": decreasing(n),
        "grad_norm": noisy(n, 1.5, 0.4, seed=2),
        "learning_rate": [(s, 2e-4 * (1 - s / n)) for s in range(1, n + 1)],
        "tokens_per_second": noisy(n, 3000.0, 300.0, seed=3),
        "torch_allocated": [(s, 1e9 + (s % 3) * 1e6) for s in range(1, n + 1)],
        "eval_loss": [(s, 2.0 * math.exp(-s / 150) + 0.6) for s in range(50, n + 1, 50)],
    }


def incrementally(curves: Curves, chunk: int = 7, ctx: RunContext = CTX) -> list[Finding]:
    """What the worker does: examine after each chunk of steps, each rule speaking once."""
    last = max(s for pts in curves.values() for s, _ in pts)
    found: list[Finding] = []
    for upto in range(chunk, last + chunk, chunk):
        seen = {name: [p for p in pts if p[0] <= upto] for name, pts in curves.items()}
        found += examine(seen, ctx, since=upto - chunk, found={f.code for f in found})
    return found


def test_a_loss_spike_at_step_40_is_found_at_40_with_its_evidence_and_fix() -> None:
    loss = decreasing(100)
    loss[39] = (40, 9.0)
    (found,) = [f for f in incrementally({"loss": loss}) if f.code is RuleCode.LOSS_SPIKE]
    assert found.step == 40 and found.severity is Severity.WARNING
    assert found.evidence["value"] == 9.0 and 1.5 < found.evidence["median"] < 2.5 and found.evidence["ratio"] > 3
    assert [40, 9.0] in found.evidence["curve"] and found.evidence["curve"][0][0] < 40
    assert found.spec_change["learning_rate"] == pytest.approx(1e-4) and "learning_rate" in found.fix


def test_a_flat_noisy_loss_and_a_normal_noisy_run_raise_no_spike() -> None:
    assert rules.loss_spike({"loss": noisy(300, 2.0, 0.1)}, CTX, -1) is None
    for seed in range(5):
        run = normal_run(400)
        run["loss"] = decreasing(400, seed=seed, noise=0.08)
        assert incrementally(run) == [], seed


def test_a_spike_during_warm_up_or_in_a_tiny_run_is_not_a_finding() -> None:
    loss = decreasing(100)
    loss[39] = (40, 9.0)
    assert rules.loss_spike({"loss": loss}, RunContext(warmup_steps=50), -1) is None
    tiny = {
        "loss": [(1, 2.0), (2, 9.0), (3, 0.0), (4, 3.0), (5, 0.001)] * 2,
        "grad_norm": [(s, 10.0**s) for s in range(12)],
    }
    assert examine(tiny, CTX) == []


def test_grad_norm_explosion() -> None:
    grads = noisy(80, 1.0, 0.2)
    grads[49] = (50, 40.0)
    (found,) = [f for f in incrementally({"grad_norm": grads}) if f.code is RuleCode.GRAD_NORM_EXPLOSION]
    assert found.step == 50 and found.evidence["value"] == 40.0 and found.spec_change["max_grad_norm"] == 1.0


def test_nan_loss_gets_a_fatal_finding_that_names_the_gradient_before_it() -> None:
    loss = decreasing(30)[:29] + [(30, math.nan)]
    grads = noisy(30, 1.0, 0.1)
    grads[29] = (30, 500.0)
    found = rules.nonfinite_loss({"loss": loss, "grad_norm": grads}, CTX, -1)
    assert found is not None and found.step == 30 and found.severity is Severity.FATAL
    assert "gradient norm had risen to 500" in found.diagnosis and found.evidence["last_finite_loss"] == loss[28][1]
    assert found.event_data()["evidence"]["curve"][-1] == [30, None]  # strict JSON: NaN stored as null


def test_a_loss_that_does_not_move_is_found_once_it_has_enough_points() -> None:
    found = incrementally({"loss": noisy(120, 2.0, 0.02)}, chunk=5)
    assert [(f.code, f.step) for f in found] == [(RuleCode.LOSS_FLAT, rules.FLAT_MIN_POINTS)]
    assert found[0].spec_change == {"learning_rate": 1e-3}  # ten times 2e-4, capped at 1e-3
    masked = rules.loss_flat({"loss": [(s, 0.0) for s in range(1, 61)]}, CTX, -1)
    assert masked is not None and "masked" in masked.diagnosis and masked.spec_change == {}


def test_a_training_loss_near_zero_is_memorising() -> None:
    loss = [(s, 2.0 * math.exp(-s / 8)) for s in range(1, 120)]
    (found,) = incrementally({"loss": loss})
    assert found.code is RuleCode.LOSS_NEAR_ZERO
    first = next(s for s in range(20, 120) if sorted(v for _, v in loss[s - 10 : s])[4:6][0] < rules.NEAR_ZERO_LOSS)
    assert first <= found.step < first + 7  # found within one check of the median crossing the threshold
    assert found.spec_change == {"num_train_epochs": 1.5}


def test_overfitting_names_the_best_step_so_far() -> None:
    loss = decreasing(200)
    evals = [(40, 1.8), (80, 1.5), (120, 1.6), (160, 1.75), (200, 1.9)]
    (found,) = incrementally({"loss": loss, "eval_loss": evals})
    assert found.code is RuleCode.OVERFITTING and found.step == 160
    assert found.evidence["best_step"] == 80 and "step 80" in found.fix
    assert found.spec_change == {"early_stopping_patience": 2}
    # an eval loss that rises while the training loss rises too is not overfitting
    assert rules.overfitting({"loss": noisy(200, 2.0, 0.01), "eval_loss": evals[:4]}, CTX, -1) is None


def test_overfitting_read_in_one_check_is_found_at_its_evaluation() -> None:
    """A check that reads several evaluations at once (the worker's last one, after a run's final stretch) finds
    the rise at the evaluation that showed it, though the eval loss turned down again after it."""
    evals = [(40, 1.8), (80, 1.5), (120, 1.6), (160, 1.75), (180, 1.7), (200, 1.65)]
    found = rules.overfitting({"loss": decreasing(200), "eval_loss": evals}, CTX, -1)
    assert found is not None and found.step == 160 and found.evidence["best_step"] == 80
    assert found.evidence["curve"] == [[s, v] for s, v in evals[:4]]  # the curve as of its step
    assert rules.overfitting({"loss": decreasing(200), "eval_loss": evals}, CTX, 160) is None  # judged already


def test_tokens_per_second_dropping() -> None:
    tps = noisy(100, 3000.0, 200.0)
    tps[70:] = noisy(30, 1200.0, 100.0)
    tps = [(s, v) for s, (_, v) in zip(range(1, 101), tps)]
    (found,) = incrementally({"tokens_per_second": tps})
    assert found.code is RuleCode.THROUGHPUT_DROP and 71 <= found.step <= 84
    assert found.evidence["usual"] == pytest.approx(3000, rel=0.1)


def test_memory_creeping_up_step_to_step() -> None:
    steady = [(s, 1e9 + (s % 2) * 1e6) for s in range(1, 61)]
    assert resources.memory_creep({"torch_allocated": steady}, CTX, -1) is None
    creeping = [(s, 1e9 + s * 5e6) for s in range(1, 61)]
    (found,) = incrementally({"torch_allocated": creeping})
    assert found.code is RuleCode.MEMORY_CREEP and found.step == 35  # the first check with MEMORY_MIN_POINTS samples


def test_preference_rewards_saturated_early_and_chosen_logps_falling() -> None:
    acc = [(s, min(1.0, 0.5 + s / 30)) for s in range(1, 61)]
    margins = [(s, 0.1 * s) for s in range(1, 61)]
    found = preference.reward_saturated(
        {"rewards/accuracies": acc, "rewards/margins": margins}, RunContext(beta=0.1, total_steps=200), -1
    )
    assert found is not None and found.step == 60 and found.spec_change == {"beta": 0.2}
    late = RunContext(total_steps=100)  # step 60 of 100 is not early
    assert preference.reward_saturated({"rewards/accuracies": acc, "rewards/margins": margins}, late, -1) is None
    falling = [(s, -80.0 - s) for s in range(1, 41)]
    chosen = preference.chosen_logps_falling({"logps/chosen": falling}, CTX, -1)
    assert chosen is not None and chosen.code is RuleCode.CHOSEN_LOGPS_FALLING and chosen.evidence["median"] < -110
    rising = [(s, -80.0 + s * 0.5) for s in range(1, 41)]
    assert preference.chosen_logps_falling({"logps/chosen": rising}, CTX, -1) is None


def test_every_rule_code_has_a_rule_and_findings_round_trip_through_an_event() -> None:
    assert set(RULES) == set(RuleCode)
    loss = decreasing(100)
    loss[39] = (40, 9.0)
    (found,) = examine({"loss": loss[:45]}, CTX)
    event = {"kind": "finding", "data": found.event_data(), "message": found.message}
    assert findings_of([event, {"kind": "oom_recovery", "data": {}}]) == [
        Finding(
            found.code,
            40,
            found.severity,
            found.diagnosis,
            found.fix,
            found.event_data()["evidence"],
            found.spec_change,
        )
    ]


def test_doctor_stop_on_names_rule_codes() -> None:
    assert stop_codes("loss_spike, NONFINITE_LOSS,loss_spike") == ([RuleCode.LOSS_SPIKE, RuleCode.NONFINITE_LOSS], [])
    assert stop_codes("fatal, overfitting") == ([RuleCode.OVERFITTING], []) and stop_severities("fatal,x") == {"fatal"}
    assert (
        JobSpec.from_dict({"doctor_stop_on": ["loss_spike", "overfitting"]}).doctor_stop_on == "loss_spike,overfitting"
    )
    (problem,) = JobSpec(doctor_stop_on="loss_spike,spikes").problems()
    assert problem.field == "doctor_stop_on" and "`spikes`" in problem.problem and "loss_spike" in problem.fix


def test_a_flat_loss_at_a_huge_learning_rate_is_stuck_not_too_slow() -> None:
    """What a real tiny run at learning_rate 1.0 does: one big jump, then a loss stuck near 6 for good."""
    stuck = rules.loss_flat({"loss": noisy(60, 6.05, 0.01)}, RunContext(learning_rate=1.0), -1)
    assert stuck is not None and "lower learning_rate" in stuck.fix and stuck.spec_change == {"learning_rate": 0.01}


def test_grpo_rules_no_signal_clipped_kl_runaway_and_entropy_collapse() -> None:
    from jobs.doctor import grpo
    from jobs.doctor.watch import context_of

    ctx = RunContext(num_generations=4, max_completion_length=64, temperature=0.7, beta=0.0, generates=True)
    zero_std = [(s, 0.5 if s < 30 else 1.0) for s in range(1, 61)]
    (found,) = incrementally({"frac_reward_zero_std": zero_std}, chunk=5, ctx=ctx)
    assert found.code is RuleCode.GRPO_NO_SIGNAL and found.step == 35 and found.spec_change == {"num_generations": 8}
    clipped = [(s, 0.95) for s in range(1, 41)]
    (found,) = incrementally({"completions/clipped_ratio": clipped}, chunk=5, ctx=ctx)
    assert found.code is RuleCode.COMPLETIONS_CLIPPED and found.step == 20
    assert found.spec_change == {"max_completion_length": 128}
    kl = [(s, 0.01 * 1.15**s) for s in range(1, 61)]
    (found,) = incrementally({"kl": kl}, chunk=5, ctx=ctx)
    assert found.code is RuleCode.KL_UNBOUNDED and found.spec_change == {"beta": 0.04}
    assert found.evidence["kl"] >= 2 * found.evidence["kl_before"] and found.evidence["kl"] >= grpo.KL_MIN
    # KTO's `kl` (its loss's reference point) rises as it learns: what examples/smollm2-kto.yaml logged, 17 to 36
    kto = context_of(JobSpec.from_dict({"trainer": "kto", "dataset": "sample:kto-format"}))
    assert not kto.generates and incrementally({"kl": kl}, chunk=5, ctx=kto) == []
    entropy = [(s, 2.0 * math.exp(-s / 8)) for s in range(1, 61)]
    reward = [(s, 0.5) for s in range(1, 61)]
    (found,) = incrementally({"entropy": entropy, "reward": reward}, chunk=5, ctx=ctx)
    assert found.code is RuleCode.ENTROPY_COLLAPSE and found.spec_change == {"temperature": 1.0}
    assert incrementally({"entropy": entropy}, ctx=ctx) == []  # an SFT run's entropy: no reward curve, not judged
    steady = {
        "frac_reward_zero_std": noisy(80, 0.3, 0.1),
        "completions/clipped_ratio": noisy(80, 0.2, 0.05),
        "kl": noisy(80, 0.05, 0.01),
        "entropy": noisy(80, 1.0, 0.1),
        "reward": noisy(80, 0.5, 0.2),
    }
    assert incrementally(steady, ctx=ctx) == []


def test_a_grpo_runs_surrogate_loss_is_not_read_as_a_fit() -> None:
    """GRPO's logged loss is a policy-gradient surrogate: ~0 (the advantages average 0) plus beta times the KL, so
    on a normal run it starts at ~0 and rises as the policy moves. Read as a fit it looks flat, or spiking; the
    loss rules leave a generating trainer's loss alone (the GRPO rules read its own metrics)."""
    from jobs.doctor.watch import context_of

    rng = random.Random(3)
    loss = [(s, 0.04 * (0.002 * s + abs(rng.gauss(0, 0.0005)))) for s in range(1, 61)]
    curves: Curves = {"loss": loss, "reward": [(s, -1 + s / 60) for s in range(1, 61)]}
    as_sft = {f.code for f in examine(curves, RunContext(learning_rate=5e-4))}
    assert {RuleCode.LOSS_FLAT, RuleCode.LOSS_SPIKE} & as_sft  # what a surrogate loss read as a fit gives
    grpo = context_of(
        JobSpec.from_dict({"trainer": "grpo", "dataset": "sample:prompt-format", "rewards": "repetition"})
    )
    assert grpo.generates and examine(curves, grpo) == []
    sft = context_of(JobSpec.from_dict({"trainer": "sft"}))
    assert not sft.generates
