"""Numbers past what the libraries and JSON take: refused at parse, naming the field; a stored one still shows.

Every numeric field of the spec (read from its own field table, `field_infos()`) is tried with values
past a 64-bit integer or not finite; each is refused when the spec is parsed, by a problem naming that
field, the problem and the fix. Step counts stop at 10**9 and the seed at 2**32 - 1 (issue #48: a seed of
1e23 failed in training, max_steps 1e18 trained until cancelled, and the run page of such a run failed
for good because orjson holds no integer past 64 bits).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson
import pytest

from jobs.spec.field import SEED_MAX, STEP_COUNT_MAX
from jobs.spec.field_info import field_infos
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.stored import spec_of, spec_problem

NUMERIC = [f.name for f in field_infos() if f.kind in ("int", "float")]
PAST = {"1e23": 1e23, "2**63": 2**63, "-2**63-1": -(2**63) - 1, "inf": math.inf, "-inf": -math.inf, "nan": math.nan}
VALUE_PROBLEM = re.compile(r"out of range|finite|expected a (whole )?number")


def test_the_field_table_has_the_numeric_fields() -> None:
    assert len(NUMERIC) >= 40 and {"seed", "max_steps", "learning_rate", "eval_split"} <= set(NUMERIC)


@pytest.mark.parametrize("value", list(PAST.values()), ids=list(PAST))
@pytest.mark.parametrize("name", NUMERIC)
def test_a_number_past_what_the_libraries_take_is_refused_at_parse(name: str, value: float) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({name: value})
    mine = [p for p in err.value.problems if p.field == name and VALUE_PROBLEM.search(p.problem)]
    assert mine, f"{name}={value!r} was not refused for its value: {err.value.problems}"
    assert all(p.fix.startswith(("use a value", "write a")) for p in mine), mine


@pytest.mark.parametrize(
    "name,highest",
    [
        ("max_steps", STEP_COUNT_MAX),
        ("warmup_steps", STEP_COUNT_MAX),
        ("logging_steps", STEP_COUNT_MAX),
        ("save_steps", STEP_COUNT_MAX),
        ("eval_steps", STEP_COUNT_MAX),
        ("seed", SEED_MAX),
    ],
)
def test_step_counts_and_the_seed_stop_at_their_bound(name: str, highest: int) -> None:
    assert getattr(JobSpec.from_dict({name: highest}), name) == highest
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({name: highest + 1})
    (problem,) = err.value.problems
    assert (problem.field, problem.problem) == (name, f"{highest + 1} is out of range")
    assert problem.fix.endswith(f"<= {highest}")


def test_a_field_without_an_upper_bound_stays_within_64_bits() -> None:
    """lora_alpha declares only its lower bound: a whole number past int64 is refused, int64's top is kept."""
    assert JobSpec.from_dict({"lora_alpha": 2**63 - 1}).lora_alpha == 2**63 - 1
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"lora_alpha": 2**63})
    (problem,) = err.value.problems
    assert problem.field == "lora_alpha" and "past a 64-bit integer" in problem.problem
    assert problem.fix == f"use a value >= 1 and <= {2**63 - 1}"


def test_yaml_as_the_issue_wrote_it_is_refused() -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_yaml("seed: 1e23\nwarmup_steps: 1e23\nlogging_steps: 1e23\nmax_steps: 1e18\n")
    assert sorted(p.field for p in err.value.problems) == ["logging_steps", "max_steps", "seed", "warmup_steps"]


# ---------------------------------------------------------------------- runs stored before the bounds
def _stored(store: Any, **values: Any) -> int:
    data = JobSpec(model="tiny-llama").to_dict() | values
    return int(store.create_run_unchecked(json.dumps(data), "stored-before"))


@pytest.mark.parametrize("name", ["seed", "warmup_steps", "logging_steps", "max_steps"])
def test_a_run_stored_with_a_number_past_64_bits_still_shows(store: Any, name: str) -> None:
    """Its page and the API's `run` serialise (gradio answers through orjson); training refuses it by name."""
    from app.api import detail
    from app.ui.run import RunPageData
    from storage.run_files import DiskUsage

    run_id = _stored(store, **{name: 10**23})
    run = store.get_run(run_id)
    orjson.dumps(detail(store, run, DiskUsage(store)))  # raised "Integer exceeds 64-bit range" before
    page = RunPageData(store).refresh(run_id, None)
    orjson.dumps([v for v in page if isinstance(v, (str, dict))])
    assert spec_of(run).model == "tiny-llama"  # the readable rest of the spec is shown
    problem = spec_problem(run.spec_json)
    assert problem is not None and f"{name}: 100000000000000000000000 is out of range" in problem
