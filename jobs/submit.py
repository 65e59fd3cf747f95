"""Queue a job after checking everything that can be checked before training starts.

    from jobs.submit import submit
    run_id = submit(store, JobSpec.from_yaml(text))   # raises SpecError with every problem

Checks, all run before anything is queued, their problems reported together: the spec on its
own (`JobSpec.problems`), the model (`jobs.models.check_model`, no weights loaded), the train
and eval data (`jobs.data.check_dataset`), and what this machine can do with the spec
(`jobs.mapping`'s capability check, e.g. fp16 without CUDA).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from jobs.spec import JobSpec, Problem, SpecError
from storage.store import Store

log = logging.getLogger(__name__)

# Names the training helper may give its "can this machine run this spec" check.
_CAPABILITY_CHECKS = ("capability_problems", "check_capabilities", "device_problems", "check_device")


def _optional_module(name: str) -> ModuleType | None:
    """Import a module that may not exist yet in this checkout; real import errors propagate."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            log.warning("%s is not available; its checks are skipped", name)
            return None
        raise


def _problems_of(exc: BaseException) -> list[Problem] | None:
    problems = getattr(exc, "problems", None)
    if isinstance(problems, list) and all(isinstance(p, Problem) for p in problems):
        return problems
    return None


def model_problems(spec: JobSpec) -> list[Problem]:
    models = _optional_module("jobs.models")
    if models is None:
        return []
    try:
        return list(models.check_model(spec.model, trust_remote_code=spec.trust_remote_code))
    except Exception as exc:  # ModelError carries problems
        problems = _problems_of(exc)
        if problems is None:
            raise
        return problems


def dataset_problems(spec: JobSpec) -> list[Problem]:
    data = _optional_module("jobs.data")
    if data is None:
        return []
    out: list[Problem] = []
    for field, ref in (("dataset", spec.dataset), ("eval_dataset", spec.eval_dataset)):
        if not ref or not ref.strip():
            continue
        try:
            data.check_dataset(ref, spec.trainer, field=field)
        except Exception as exc:  # DataError carries problems
            problems = _problems_of(exc)
            if problems is None:
                raise
            out.extend(problems)
    return out


def capability_problems(spec: JobSpec) -> list[Problem]:
    mapping = _optional_module("jobs.mapping")
    if mapping is None:
        return []
    check: Callable[[JobSpec], Any] | None = next(
        (getattr(mapping, n) for n in _CAPABILITY_CHECKS if callable(getattr(mapping, n, None))), None)
    if check is None:
        return []
    try:
        return list(check(spec) or [])
    except Exception as exc:
        problems = _problems_of(exc)
        if problems is None:
            raise
        return problems


def check(spec: JobSpec) -> list[Problem]:
    """Every problem with the spec, its model, its data and this machine (empty: good to go)."""
    problems = list(spec.problems())
    # Field-level problems first; the model and data checks still run so one pass shows all.
    if not any(p.field == "model" for p in problems):
        problems.extend(model_problems(spec))
    if not any(p.field in ("dataset", "eval_dataset") for p in problems):
        problems.extend(dataset_problems(spec))
    problems.extend(capability_problems(spec))
    seen: set[tuple[str, str]] = set()
    unique = []
    for p in problems:
        if (p.field, p.problem) not in seen:
            seen.add((p.field, p.problem))
            unique.append(p)
    return unique


def submit(store: Store, spec: JobSpec) -> int:
    """Check the spec (model, data, device) and queue it; raises SpecError with every problem."""
    problems = check(spec)
    if problems:
        raise SpecError(problems)
    return store.create_run(spec)
