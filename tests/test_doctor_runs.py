"""The training doctor on real tiny runs (integration), each driven into one failure: a NaN run, a learning
rate far too high (a loss spike), a learning rate of about zero (a flat loss), a tiny repeated data set
trained for many epochs with evaluation (overfitting), a GRPO run whose reward cannot vary; each gets its
finding at the step the failure shows, with its fix. A normal run long enough for every rule to read it,
and the examples, get no warning."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import training_helpers
from test_faults import AtStep, poison
from transformers import TrainerCallback

from jobs.doctor.findings import Severity, findings_of
from jobs.doctor.watch import Doctor
from jobs.spec.doctor_codes import RuleCode
from storage.models import RunStatus
from storage.store import Store


@pytest.mark.integration
@pytest.mark.sqlite_only  # the training child's behaviour; the doctor's SQL is tested on both (test_doctor_watch)
def test_a_real_nan_run_gets_its_diagnosis_at_the_step_it_stopped(store: Store, tiny_model: Path) -> None:
    from jobs.train.child import run

    spec = training_helpers.tiny_spec(tiny_model, max_steps=10)
    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    assert run(run_id, store, callbacks=[AtStep(3, poison)]) == 1
    assert store.get_run(run_id).status is RunStatus.FAILED
    (found,) = Doctor(store, run_id, spec, interval_s=0.0).check(final=True)
    assert found.code is RuleCode.NONFINITE_LOSS and found.step == 4 and found.severity is Severity.FATAL
    (stored,) = findings_of(store.run_events(run_id))
    last_good = store.metrics(run_id, ["loss"])[2].value
    assert stored.evidence["last_finite_loss"] == last_good and math.isfinite(last_good)
    assert stored.spec_change["learning_rate"] == pytest.approx(spec.learning_rate / 4)


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_a_normal_real_run_gets_no_warning(store: Store, tiny_model: Path) -> None:
    """50 steps: every rule but the preference ones reads it (FLAT_MIN_POINTS); the loss falls steadily."""
    from jobs.train.child import run

    spec = training_helpers.tiny_spec(tiny_model, max_steps=50)
    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    doctor = Doctor(store, run_id, spec, interval_s=0.0)
    assert run(run_id, store) == 0
    found = doctor.check(final=True)
    assert len(store.metrics(run_id, ["loss"])) == 50
    # tokens/s (info) depends on what else the machine runs; nothing about the training itself is wrong
    assert [f.message for f in found if f.severity is not Severity.INFO] == []


class RaiseLearningRate(TrainerCallback):
    """At the end of optimizer step `step`, the learning rate becomes `lr` (the scheduler's base too): the
    next update is taken far too large, and the loss logged at the step after it shows it."""

    def __init__(self, step: int, lr: float):
        self.step, self.lr = step, lr

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step == self.step:
            lr_scheduler.base_lrs = [self.lr] * len(lr_scheduler.base_lrs)
            for group in optimizer.param_groups:
                group["lr"] = self.lr


def _trained(store: Store, spec, callbacks=()) -> tuple[int, list]:
    """Train `spec` in this process; (run id, the warnings and fatal findings of the doctor's final check)."""
    from jobs.train.child import run

    run_id = store.create_run(spec)
    store.claim_next_on_device("test", "0")
    run(run_id, store, callbacks=list(callbacks))
    found = Doctor(store, run_id, spec, interval_s=0.0).check(final=True)
    return run_id, [f for f in found if f.severity is not Severity.INFO]


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_a_learning_rate_far_too_high_gets_a_loss_spike_at_its_step(store: Store, tiny_model: Path) -> None:
    """Full fine-tuning of the tiny model on 4 rows: the loss falls steadily to ~1 by step 31; the learning rate
    raised to 1.0 after step 30 makes step 31's update far too large, and step 32's loss is ~20x its median.
    The gradient norm of that step explodes as well (the same event, seen in a second curve); the forgetting
    meter's rise at the run's end is a note (severity info), not a warning."""
    spec = training_helpers.tiny_spec(tiny_model, max_steps=32, learning_rate=3e-3, max_train_samples=4, method="full")
    _, found = _trained(store, spec, [RaiseLearningRate(30, 1.0)])
    assert {(f.code, f.step) for f in found} == {  # the forgetting meter's rise is a note (info): not counted
        (RuleCode.LOSS_SPIKE, 32),
        (RuleCode.GRAD_NORM_EXPLOSION, 32),
    }
    spike = next(f for f in found if f.code is RuleCode.LOSS_SPIKE)
    assert spike.evidence["ratio"] > 2 and [32, spike.evidence["value"]] in spike.evidence["curve"]
    assert spike.spec_change == {"learning_rate": pytest.approx(1.5e-3), "max_grad_norm": 1.0}


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_a_learning_rate_of_about_zero_gets_a_flat_loss_at_step_50(store: Store, tiny_model: Path) -> None:
    """lr 1e-9 on the same 4 rows every step: the loss does not move; judged once 50 points are logged."""
    spec = training_helpers.tiny_spec(tiny_model, max_steps=50, learning_rate=1e-9, max_train_samples=4)
    _, found = _trained(store, spec)
    assert [(f.code, f.step) for f in found] == [(RuleCode.LOSS_FLAT, 50)]
    assert "learning rate is too low" in found[0].diagnosis
    assert found[0].spec_change == {"learning_rate": pytest.approx(1e-8)}


@pytest.mark.integration
@pytest.mark.sqlite_only
def test_a_tiny_repeated_data_set_trained_many_epochs_gets_overfitting_naming_its_best_step(
    store: Store, tiny_model: Path
) -> None:
    """Full fine-tuning on 4 rows of the chat sample, one step an epoch for 28 epochs, evaluated every 3 steps on
    the sample's held-out rows: the eval loss is best at step 18 (3.81) and rises at 21, 24 and 27 (4.05, 6% above
    its best) while the training loss keeps falling. The finding comes at step 27 (step 24's rise, 4%, is within
    OVERFIT_RISE), names step 18, and its fix (early stopping) is what `tunedeck clone --fix` applies."""
    from jobs.queue.run_actions import clone

    spec = training_helpers.tiny_spec(
        tiny_model,
        max_steps=-1,
        num_train_epochs=28,
        max_train_samples=4,
        method="full",
        learning_rate=1e-2,
        eval_steps=3,
        sample_count=0,
    )
    run_id, found = _trained(store, spec)
    assert [(f.code, f.step) for f in found] == [(RuleCode.OVERFITTING, 27)]
    assert found[0].evidence["best_step"] == 18 and "(step 18, the best so far)" in found[0].diagnosis
    assert found[0].spec_change == {"early_stopping_patience": 2} and "fewer steps" in found[0].fix
    number = [f.code for f in findings_of(store.run_events(run_id))].index(RuleCode.OVERFITTING) + 1
    assert clone(store, run_id, fix=number).early_stopping_patience == 2


def _model_that_stops(tiny_model: Path, dest: Path) -> Path:
    """A copy of the tiny model that ends its answers within a few tokens, as a trained model does (the random one
    never writes its end token, so every completion would be cut at max_completion_length). Dimension 0 of the
    residual stream is held at 1 (every embedding has 1 there and no layer writes to it), and the end token's
    (tied) embedding has 1.5: its logit is about 4 above every other token's, ~1 in 3 by sampling."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(tiny_model, dest)
    eos = AutoTokenizer.from_pretrained(dest).eos_token_id
    model = AutoModelForCausalLM.from_pretrained(dest)
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight
        embedding[:, 0] = 1.0
        embedding[eos, 0] = 1.5
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
    model.save_pretrained(dest)
    return dest


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.sqlite_only
def test_a_grpo_reward_that_cannot_vary_gets_no_learning_signal_and_nothing_else(
    store: Store, tiny_model: Path, tmp_path: Path
) -> None:
    """GRPO whose only reward is a regex that matches nothing ("(?!)"): every completion scores 0, so every group's
    spread is 0 (frac_reward_zero_std 1.0 at each step) and nothing is learnt (loss and KL stay 0). Judged once
    MIN_POINTS (20) steps are logged. The completions end by themselves (`_model_that_stops`), so the only finding
    is the missing signal, with its fix: more completions per prompt."""
    spec = training_helpers.tiny_spec(
        _model_that_stops(tiny_model, tmp_path / "stops"),
        trainer="grpo",
        dataset="sample:prompt-format",
        rewards='[{"kind": "regex", "pattern": "(?!)"}]',
        max_steps=20,
        max_train_samples=8,
        num_generations=2,
        max_completion_length=8,
        per_device_train_batch_size=4,
        beta=0.1,
        eval_split=None,
        sample_count=0,
    )
    run_id, found = _trained(store, spec)
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED
    assert [(f.code, f.step) for f in found] == [(RuleCode.GRPO_NO_SIGNAL, 20)]
    assert found[0].evidence["frac_reward_zero_std"] == 1.0 and "num_generations 4" in found[0].fix
    assert found[0].spec_change == {"num_generations": 4}
