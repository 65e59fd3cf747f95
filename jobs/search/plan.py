"""What a search is asked to do: the base spec, the space, the objective, the budget and how Optuna samples.

    plan = SearchPlan.build(spec, ["learning_rate=loguniform(1e-5,1e-3)", "lora_r=[8,16]"], trials=8)
    plan.trial_spec({"learning_rate": 3e-4, "lora_r": 16}, "search 1 trial 3")   # the run a trial queues

Every problem is reported at once (`SearchError`, each naming its field: `space.FIELD`, `trials`,
`objective`, ...). The objective is a metric name as the runs store it (`eval_loss` by default; a
benchmark task's `bench_<task>` score, a reward's mean, ...); its direction defaults to minimise for a
loss or perplexity and maximise for anything else. `steps` shortens every trial to that many optimizer
steps; `minutes` stops a trial that trains longer (it ends pruned, its last reported value kept).
`include_base` makes the first trial the base spec's own values (not with the grid sampler, which tries every
point anyway), so the table shows how far the search beat the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.errors import Problem, ProblemError
from jobs.search.space import Space, SpaceError, parse_space
from jobs.spec.job import JobSpec

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "none")
DIRECTIONS = ("minimize", "maximize")
MAX_TRIALS = 1000
MAX_PARALLEL = 16


class SearchError(ProblemError):
    subject = "in the search"


def default_direction(objective: str) -> str:
    return "minimize" if objective.endswith(("loss", "perplexity")) else "maximize"


@dataclass(frozen=True)
class SearchPlan:
    base: JobSpec
    space: Space
    objective: str = "eval_loss"
    direction: str = "minimize"
    trials: int = 8
    steps: int | None = None  # optimizer steps per trial (None: the base spec's)
    minutes: float | None = None  # wall time per trial
    parallel: int = 1
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int = 0
    include_base: bool = True
    notes: list[str] = field(default_factory=list)

    @staticmethod
    def build(
        base: JobSpec,
        space: Iterable[str] | Mapping[str, Any],
        *,
        objective: str = "eval_loss",
        direction: str | None = None,
        trials: int = 8,
        steps: int | None = None,
        minutes: float | None = None,
        parallel: int = 1,
        sampler: str = "tpe",
        pruner: str = "median",
        seed: int | None = None,
        include_base: bool = True,
    ) -> SearchPlan:
        """The plan, or SearchError with every problem (the space's too)."""
        problems: list[Problem] = []
        try:
            parsed: Space | None = parse_space(space, base)
        except SpaceError as exc:
            problems += exc.problems
            parsed = None
        objective = (objective or "").strip()
        if not objective:
            problems.append(Problem("objective", "empty", "name a metric as the runs store it, e.g. eval_loss"))
        direction = direction or default_direction(objective)
        problems += _choice("direction", direction, DIRECTIONS)
        problems += _choice("sampler", sampler, SAMPLERS) + _choice("pruner", pruner, PRUNERS)
        problems += _range("trials", trials, 1, MAX_TRIALS) + _range("parallel", parallel, 1, MAX_PARALLEL)
        if steps is not None:
            problems += _range("steps", steps, 1, 10**9)
        if minutes is not None and not minutes > 0:
            problems.append(Problem("minutes", f"{minutes} is not above 0", "give the minutes each trial may train"))
        if sampler == "grid" and parsed is not None and any(d.kind != "choice" for d in parsed.dimensions):
            problems.append(Problem("sampler", "grid needs every field of the space as a list", "list values: F=[A,B]"))
        if pruner != "none" and objective.startswith("eval_") and base.eval_steps is None:
            problems.append(
                Problem(
                    "eval_steps",
                    f"the {pruner} pruner reads {objective} at each evaluation, and the base spec never evaluates",
                    "set eval_steps (and eval data: eval_split or eval_dataset), or --pruner none",
                )
            )
        if problems or parsed is None:
            raise SearchError(problems)
        if sampler == "grid":  # the grid's size is the budget when it is smaller
            trials = min(trials, math.prod(len(d.choices) for d in parsed.dimensions))
        plan = SearchPlan(
            base, parsed, objective, direction, trials, steps, minutes, parallel, sampler, pruner,
            base.seed if seed is None else seed, include_base,
        )  # fmt: skip
        return plan

    def trial_spec(self, params: Mapping[str, Any], run_name: str) -> JobSpec:
        """The spec of one trial: the base with the sampled values, its step budget and name (SpecError if refused)."""
        changes: dict[str, Any] = dict(params)
        if self.steps is not None:
            changes["max_steps"] = self.steps
        return self.base.replace(**changes, run_name=run_name[:200])

    def base_values(self) -> dict[str, Any] | None:
        """The base spec's values of the space's fields when each lies within its dimension (else None)."""
        out = {}
        for d in self.space.dimensions:
            value = self.base.to_dict()[d.field]
            inside = value in d.choices if d.kind == "choice" else d.low <= value <= d.high
            if value is None or not inside:
                return None
            out[d.field] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base.to_dict(),
            "space": self.space.to_list(),
            "objective": self.objective,
            "direction": self.direction,
            "trials": self.trials,
            "steps": self.steps,
            "minutes": self.minutes,
            "parallel": self.parallel,
            "sampler": self.sampler,
            "pruner": self.pruner,
            "seed": self.seed,
            "include_base": self.include_base,
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> SearchPlan:
        """A stored plan (already checked when the search started)."""
        rest = {k: v for k, v in data.items() if k not in ("base", "space")}
        return SearchPlan(JobSpec.from_dict(dict(data["base"])), Space.from_list(data["space"]), **rest)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> list[Problem]:
    if value in allowed:
        return []
    return [Problem(name, f"{value!r} is not one of {', '.join(allowed)}", f"use one of: {', '.join(allowed)}")]


def _range(name: str, value: Any, low: int, high: int) -> list[Problem]:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return []
    return [Problem(name, f"{value!r} is out of range", f"use a whole number from {low} to {high}")]
