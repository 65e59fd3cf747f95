"""The scripting API's search endpoints (the dashboard hands them to `app.api.wire`): start, show, best.

    client.predict(spec_yaml=..., space=["learning_rate=loguniform(1e-5,1e-3)"], trials=8, api_name="/search")
    client.predict(search_id=1, api_name="/search_show")      # trials, best, importances
    client.predict(search_id=1, launch=True, api_name="/search_best")

No `from __future__ import annotations` here: Gradio reads these functions' type hints at run time.
"""

from typing import Any, TypedDict

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem, ProblemError
from jobs.spec.job import JobSpec
from storage.roles_queue import SearchDriving

SEARCH_ENDPOINTS = ("search", "search_show", "search_best")  # app.api.ENDPOINTS lists them too (publish checks)


class SearchStarted(TypedDict):
    search_id: int | None
    problems: list[dict[str, str]]


class BestSettings(TypedDict):
    spec_yaml: str | None
    run_id: int | None
    problems: list[dict[str, str]]


def _problems(problems: list[Problem]) -> list[dict[str, str]]:
    return [{"field": p.field, "problem": p.problem, "fix": p.fix} for p in problems]


class SearchEndpoints:
    def __init__(self, store: SearchDriving, policy: AccessPolicy | None = None) -> None:
        self.store = store
        self.policy = policy

    def search(
        self,
        spec_yaml: str,
        space: list[str],
        trials: int = 8,
        objective: str = "eval_loss",
        direction: str = "",
        parallel: int = 1,
        steps: int = 0,
        sampler: str = "tpe",
        pruner: str = "median",
    ) -> SearchStarted:
        """Start a hyperparameter search of a spec; a worker runs its trials as ordinary runs tagged search-<id>.

        Parameters:
            spec_yaml: the base job spec as YAML text.
            space: the varied fields, each "FIELD=loguniform(a,b)", "FIELD=uniform(a,b)", "FIELD=int(a,b)" or "FIELD=[a,b,c]".
            trials: how many trials in all (points refused before queueing count).
            objective: a metric as the runs store it (eval_loss, a benchmark's bench_<task>, ...).
            direction: minimize or maximize ("": minimize a loss, maximize anything else).
            parallel: trials queued at once.
            steps: optimizer steps per trial (0: the spec's own).
            sampler: tpe, random or grid.
            pruner: median, hyperband or none.
        Returns:
            search_id: the new search's id, or null; problems: every problem as {field, problem, fix}.
        """
        from jobs.search.driver import start_search
        from jobs.search.plan import SearchPlan

        try:
            plan = SearchPlan.build(
                JobSpec.from_yaml(spec_yaml),
                space,
                objective=objective,
                direction=direction or None,
                trials=int(trials),
                steps=int(steps) or None,
                parallel=int(parallel),
                sampler=sampler,
                pruner=pruner,
            )
            record = start_search(self.store, plan, policy=self.policy)
        except ProblemError as exc:
            return SearchStarted(search_id=None, problems=_problems(exc.problems))
        return SearchStarted(search_id=record.id, problems=[])

    def search_show(self, search_id: int) -> dict[str, Any]:
        """A search: its plan, one row per trial (state, values, objective, run), the best so far and the
        parameter importances.

        Parameters:
            search_id: the search's id.
        Returns:
            id, name, state, objective, direction, trials, parallel, space, rows, best, importances.
        """
        import gradio as gr

        from jobs.search.report import search_report

        try:
            return search_report(self.store, int(search_id)).to_dict()
        except ProblemError as exc:
            raise gr.Error("; ".join(str(p) for p in exc.problems), title="tunedeck: bad input") from None

    def search_best(self, search_id: int, launch: bool = False) -> BestSettings:
        """The best settings a search found, as a full run's spec; `launch` queues it (checked like any submit).

        Parameters:
            search_id: the search's id.
            launch: queue the best settings as a run of the spec's own length.
        Returns:
            spec_yaml: the spec; run_id: the queued run's id (null unless launched); problems: why nothing was queued.
        """
        from jobs.queue.submit import submit
        from jobs.search.report import best_spec

        try:
            spec = best_spec(self.store, int(search_id))
            run_id = submit(self.store, spec, self.policy) if launch else None
        except ProblemError as exc:
            return BestSettings(spec_yaml=None, run_id=None, problems=_problems(exc.problems))
        return BestSettings(spec_yaml=spec.to_yaml(), run_id=run_id, problems=[])

    def functions(self) -> list[Any]:
        return [getattr(self, name) for name in SEARCH_ENDPOINTS]
