"""What a model name answers as on the dashboard's OpenAI-compatible API, and which names a run may take.

A client names a model by a finished run's id, by a base model a finished run trained from, or by a
run's name, and they are read in that order: an id always wins (a run named `1` never hides run 1;
`3`, `#3`, `run:3` and the fine-tuning API's `ft:<base>:<suffix>:3` all name run 3), then a base model (a run named `tiny-llama` never hides the
base), then a run's name (the newest finished run of that name). `served_models` lists exactly that:
each finished run by its id, with its name only where the name answers as that run, then each base.
`run_name_problems` refuses, before queueing, a run name that looks like an id or is a base model's
name, so no new run is shadowed; a run stored before with such a name keeps it and answers by its id.

    served_model(store, "3", reachable)            # (3, "run"), whatever any run is named
    served_model(store, "tiny-llama", reachable)   # (a run trained from it, "base")
    run_name_problems(spec, store)                 # [Problem("run_name", ...)] for "7" or "tiny-llama"
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from jobs.errors import Problem
from jobs.models.registry import BUILTIN_MODELS
from jobs.spec.stored import spec_of
from storage.models import RunStatus
from storage.roles import RunLister, RunReader

if TYPE_CHECKING:
    from jobs.spec.job import JobSpec
    from storage.records import RunRecord

# "3", "#3", "run:3", "run 3", "run #3", "Run3": how people write a run's id (the judge's `run:N` too); and
# "ft:tiny-llama:my-suffix:3", the `fine_tuned_model` name the fine-tuning API gives run 3 (`app.openai_tuning`)
_RUN_ID = re.compile(r"(?:ft:\S*:|run\s*[:#]?\s*|#\s*)?(\d+)", re.IGNORECASE)
SERVED_RUNS = 200  # the newest finished runs whose names and bases are served (an id reaches any run)
NAMED_RUNS = 10_000  # the runs whose base models a new run's name is checked against


class ServedRuns(RunReader, RunLister, Protocol):
    """What the names are read from: one run by id, the newest runs by status."""


def run_id_in(text: str) -> int | None:
    """The run id `text` names when it looks like one ("3", "#3", "run:3"), else None."""
    found = _RUN_ID.fullmatch(text.strip())
    return int(found.group(1)) if found else None


def served_model(store: ServedRuns, name: str, reachable: Callable[[int], bool]) -> tuple[int, str] | None:
    """(run id, "run" or "base") that `name` answers as, or None: a finished run's id, else a base model a
    finished run trained from (answered through the earliest of them that `reachable` says a live worker can
    reach, else the earliest), else the newest finished run of that name."""
    wanted = name.strip()
    run_id = run_id_in(wanted)
    if run_id is not None:  # an id is only ever an id: never read as a name or a base
        run = store.get_run(run_id)
        return (run_id, "run") if run is not None and run.status is RunStatus.SUCCEEDED else None
    runs = store.list_runs(status=RunStatus.SUCCEEDED, limit=SERVED_RUNS)
    trained_from = [run for run in runs if spec_of(run).model == wanted]
    if trained_from:  # the same run each time, so a worker keeps it loaded; a newer run can be elsewhere
        return min([run for run in trained_from if reachable(run.id)] or trained_from, key=lambda r: r.id).id, "base"
    named = next((run for run in runs if run.name == wanted), None)  # newest first
    return (named.id, "run") if named is not None else None


def served_models(store: ServedRuns) -> list[dict[str, Any]]:
    """`/v1/models`: every finished run by its id (with its name where that name answers as this run), then each
    base model they trained from (except one whose reference reads as a run id)."""
    runs = store.list_runs(status=RunStatus.SUCCEEDED, limit=SERVED_RUNS)
    bases: dict[str, float] = {}
    for run in runs:
        bases.setdefault(spec_of(run).model, run.created_at)
    out: list[dict[str, Any]] = []
    named: set[str] = set()
    for run in runs:
        model = spec_of(run).model
        entry = {"id": str(run.id), "object": "model", "created": int(run.created_at), "owned_by": "tunedeck"}
        if _answers_as_itself(run, bases, named):
            entry["name"] = run.name
            named.add(run.name)
        out.append(entry | {"root": model, "parent": model})
    out += [
        {"id": base, "object": "model", "created": int(created), "owned_by": "tunedeck", "root": base}
        for base, created in bases.items()
        if run_id_in(base) is None
    ]
    return out


def _answers_as_itself(run: RunRecord, bases: dict[str, float], named: set[str]) -> bool:
    """Whether the run's name reaches this run: not an id, not a base, not taken by a newer run of that name."""
    return run_id_in(run.name) is None and run.name.strip() not in bases and run.name not in named


def run_name_problems(spec: JobSpec, store: RunLister | None) -> list[Problem]:
    """A run name that would not answer as its run on /v1: one that reads as a run id, or the name of a base
    model (a built-in, this spec's model, or a model another run in `store` trained from)."""
    name = spec.run_name
    if name is None or not name.strip():
        return []
    run_id = run_id_in(name)
    if run_id is not None:
        return [
            Problem(
                "run_name",
                f"`{name}` reads as run {run_id}'s id, and an id always comes first, so this run "
                "would never answer to its name (on /v1 and wherever a run is named)",
                f"give a name with words in it, e.g. `my-run-{run_id}`, or leave run_name empty",
            )
        ]
    if name in _base_models(name, spec.model, store):
        return [
            Problem(
                "run_name",
                f"`{name}` is the name of a base model the dashboard serves (GET /v1/models), and a base "
                "model comes before a run's name, so this run would not answer to it",
                f"give another name, e.g. `{name}-tuned`, or leave run_name empty",
            )
        ]
    return []


def _base_models(name: str, model: str, store: RunLister | None) -> set[str]:
    """The base models among which `name` could be: built-ins, `model`, and those of the stored runs whose spec
    holds `name` as text (the others cannot have it as their model; read without parsing every spec)."""
    found = set(BUILTIN_MODELS) | {model}
    if store is not None:
        needle = json.dumps(name)
        found |= {spec_of(run).model for run in store.list_runs(limit=NAMED_RUNS) if needle in run.spec_json}
    return found
