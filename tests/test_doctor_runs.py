"""The training doctor on real tiny runs (integration): a NaN run gets its fatal finding at the step it
stopped, with the diagnosis; a normal run long enough for every rule to read it gets no warning."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import training_helpers
from test_faults import AtStep, poison

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
