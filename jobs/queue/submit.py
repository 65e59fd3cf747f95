"""Queue a job once the one check (`jobs.checks.pipeline.check`) finds nothing wrong with it.

    from jobs.queue.submit import submit
    run_id = submit(store, JobSpec.from_yaml(text))   # raises SpecError with every problem

The check runs before anything is queued, its problems reported together: access, fields, model,
data, what the workers' device can do (the facts they published, `jobs.devices.target`; this
machine's when none has), the predicted peak memory (`ignore_memory_prediction: true` overrides
it) and a grpo `reward_model_run`. The prediction it made is saved with the run as
`prediction.json` in its run folder (`jobs.queue.saved_prediction`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.checks.access import AccessPolicy
from jobs.checks.pipeline import Checked, check
from jobs.queue.saved_prediction import save_prediction
from jobs.spec.job import JobSpec
from storage.roles_queue import Submitting


def submit(store: Submitting, spec: JobSpec | Mapping[str, Any], policy: AccessPolicy | None = None) -> int:
    """Check the spec (or values still to parse) against the workers' device and queue it; raises SpecError
    with every problem."""
    return enqueue(store, check(spec, policy=policy, store=store))


def enqueue(store: Submitting, checked: Checked) -> int:
    """Queue a checked spec and keep its prediction (the run page compares it with the measured peak);
    SpecError when the check found problems."""
    run_id = store.create_run(checked.accepted())
    save_prediction(store, run_id, checked.prediction)
    return run_id
