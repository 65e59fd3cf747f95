"""Specs read back from the store: it keeps each run's spec as JSON text, and jobs parse it here.

    spec = spec_of(run)                    # a JobSpec for display, even from another version
    problem = spec_problem(run.spec_json)  # why the worker cannot train it (None: it can)
    finished_problem(run, 7, "export")     # (problem, fix) when run 7 has no finished result
    result_folder(store, 7, "adapter", "adapter_config.json")  # its newest saved adapter folder

A spec written by an older or newer tunedeck, or edited by hand, must neither crash the worker
nor hide the run from the dashboard: the worker fails such a run with `spec_problem`'s reason,
and the dashboard shows what `spec_of` can read (unknown fields dropped, defaults shown).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from jobs.spec.job import JobSpec, SpecError
from storage.models import RunStatus


class StoredRun(Protocol):
    spec_json: str


def spec_problem(spec_json: str) -> str | None:
    """Why a stored spec cannot be trained (None when it parses and validates)."""
    try:
        JobSpec.from_json(spec_json)
    except SpecError as exc:
        problems = "; ".join(f"{p.field}: {p.problem} ({p.fix})" for p in exc.problems)
        return f"the stored job spec is not valid for this tunedeck version: {problems}"
    except Exception as exc:  # noqa: BLE001 - whatever is stored, the queue must go on
        return f"the stored job spec cannot be read ({type(exc).__name__}: {exc})"
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


def result_folder(store: Any, run_id: int, kind: str, marker: str) -> Path | None:
    """The run's newest artifact folder of `kind` ("adapter", "model"), if it still holds `marker`."""
    folders = [Path(a.path) for a in store.artifacts(run_id) if a.kind == kind]
    return folders[-1] if folders and (folders[-1] / marker).is_file() else None


def spec_of(run: StoredRun) -> JobSpec:
    """The run's spec; for a spec this version cannot read, the readable part (see module docstring)."""
    return stored_spec(run.spec_json)


@lru_cache(maxsize=1024)
def stored_spec(spec_json: str) -> JobSpec:
    """Parse stored spec JSON (JobSpec is frozen, so one parsed copy per text is shared)."""
    try:
        return JobSpec.from_json(spec_json)
    except Exception:  # noqa: BLE001 - an unreadable stored spec must not break listing runs
        return _lenient_spec(spec_json)


def _lenient_spec(spec_json: str) -> JobSpec:
    """The stored spec for display: fields this version cannot read are dropped (defaults shown)."""
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
