"""Specs read back from the store: it keeps each run's spec as JSON text, and jobs parse it here.

    spec = read_spec(run.spec_json)        # strict, for training: SpecError naming each field it cannot read
    problem = spec_problem(run.spec_json)  # the same check as one line: why it cannot be trained (None: it can)
    spec = spec_of(run)                    # lenient, for display only: a JobSpec even from another version
    finished_problem(run, 7, "export")     # (problem, fix) when run 7 has no finished result
    result_folder(store, 7, "adapter", "adapter_config.json")  # its newest saved adapter folder

A spec written by an older or newer tunedeck, or edited by hand, must neither crash the worker
nor hide the run from the dashboard, nor be trained as something else: the worker and the
training child read it strictly (`read_spec`) and fail such a run with `spec_problem`'s reason,
naming the fields; only the dashboard and the CLI's listings show what `spec_of` can read
(unknown fields dropped, defaults shown).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from jobs.errors import Problem
from jobs.spec.job import JobSpec, SpecError
from storage.models import RunStatus
from storage.roles import ArtifactReader


class StoredRun(Protocol):
    @property
    def spec_json(self) -> str: ...


def read_spec(spec_json: str) -> JobSpec:
    """The stored spec parsed strictly, as training needs it; raises SpecError naming each field it cannot read."""
    try:
        return JobSpec.from_json(spec_json)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever is stored, the caller gets the one error type
        problem = Problem("spec", f"cannot be read ({type(exc).__name__}: {exc})", "submit the job again")
        raise SpecError([problem]) from exc


def unreadable_summary(exc: SpecError) -> str:
    """The one line a run fails with when its stored spec cannot be read: every field, problem and fix."""
    problems = "; ".join(f"{p.field}: {p.problem} ({p.fix})" for p in exc.problems)
    return f"the stored job spec is not valid for this tunedeck version: {problems}"


def spec_problem(spec_json: str) -> str | None:
    """Why a stored spec cannot be trained (None when it parses and validates): `read_spec`'s problems in one line."""
    try:
        read_spec(spec_json)
    except SpecError as exc:
        return unreadable_summary(exc)
    return None


def finished_problem(run: Any, run_id: int, doing: str) -> tuple[str, str] | None:
    """(problem, fix) when run `run_id` (`run`: its record, None if missing) has no finished result
    to `doing` ("chat with", "export"); None when it succeeded. Chat, export and push share it."""
    if run is None:
        return f"run {run_id} does not exist", "list finished runs with `tunedeck runs --status succeeded`"
    if run.status is not RunStatus.SUCCEEDED:
        return (
            f"run {run_id} is {run.status.value}; only a finished run has a result to {doing}",
            "wait for it to succeed, or pick a succeeded run (`tunedeck runs --status succeeded`)",
        )
    return None


def result_folder(store: ArtifactReader, run_id: int, kind: str, marker: str) -> Path | None:
    """The run's newest artifact folder of `kind` ("adapter", "model"), if it still holds `marker`."""
    folders = [Path(a.path) for a in store.artifacts(run_id) if a.kind == kind]
    return folders[-1] if folders and (folders[-1] / marker).is_file() else None


def spec_of(run: StoredRun) -> JobSpec:
    """The run's spec for display only; for a spec this version cannot read, the readable part (never train it)."""
    return stored_spec(run.spec_json)


@lru_cache(maxsize=1024)
def stored_spec(spec_json: str) -> JobSpec:
    """Stored spec JSON for display only: lenient, never raises (training reads `read_spec`).

    JobSpec is frozen, so one parsed copy per text is shared."""
    try:
        return JobSpec.from_json(spec_json)
    except SpecError:  # JobSpec.from_json refuses bad text only this way; listing runs must go on
        return _lenient_spec(spec_json)


def _lenient_spec(spec_json: str) -> JobSpec:
    """The stored spec for display only: fields this version cannot read are dropped (defaults shown)."""
    try:
        data = json.loads(spec_json)
    except (TypeError, ValueError):
        data = {}
    data = dict(data) if isinstance(data, dict) else {}
    for _ in range(len(data) + 1):
        try:
            return JobSpec.from_dict(data)
        except SpecError as exc:
            bad = {p.field for p in exc.problems} & set(data)
            if not bad:
                break
            for key in bad:
                data.pop(key)
    return JobSpec()
