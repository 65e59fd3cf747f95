"""What a search found: its trials as rows, the best so far, Optuna's parameter importances, and the best
settings as a full run's spec.

    report = search_report(store, search_id)    # SearchReport: rows, best, importances (the CLI, API, page)
    spec = best_spec(store, search_id)          # the base spec with the best values, at its own step budget

A row's `state` is the trial's: `complete`, `pruned` (stopped early by the pruner or the time budget: its
run ended cancelled, the page says pruned), `failed`, `infeasible` (refused before queueing: `reason`
says why), or still `running`/`pruning`/`asked`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobs.errors import Problem, ProblemError
from jobs.search.plan import SearchPlan

if TYPE_CHECKING:
    from jobs.spec.job import JobSpec
    from storage.roles_queue import SearchReader


class SearchNotFound(ProblemError):
    subject = "in the search"


@dataclass(frozen=True)
class SearchReport:
    search_id: int
    name: str
    state: str
    plan: SearchPlan
    rows: list[dict[str, Any]]
    best: dict[str, Any] | None  # the best complete trial's row
    importances: dict[str, float]  # field -> Optuna's importance (sums to 1); {} before two trials complete

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.search_id,
            "name": self.name,
            "state": self.state,
            "objective": self.plan.objective,
            "direction": self.plan.direction,
            "trials": self.plan.trials,
            "parallel": self.plan.parallel,
            "space": self.plan.space.describe(),
            "rows": self.rows,
            "best": self.best,
            "importances": self.importances,
        }


def _search(store: SearchReader, search_id: int) -> Any:
    search = store.get_search(search_id)
    if search is None:
        raise SearchNotFound([Problem("search", f"no search {search_id}", "list searches: tunedeck search list")])
    return search


def search_report(store: SearchReader, search_id: int, importance: bool = True) -> SearchReport:
    search = _search(store, search_id)
    plan = SearchPlan.from_dict(search.plan)
    rows: list[dict[str, Any]] = []
    for t in store.search_trials(search_id):
        run = store.get_run(t.run_id) if t.run_id is not None else None
        rows.append(
            {
                "trial": t.number,
                "state": t.state,
                "params": t.params,
                "value": t.value,
                "run_id": t.run_id,
                "run_status": run.status.value if run is not None else None,
                "reason": t.reason,
            }
        )
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    pick = min if plan.direction == "minimize" else max
    best = pick(done, key=lambda r: float(r["value"])) if done else None
    found = param_importances(store, search) if importance and len(done) >= 2 else {}
    return SearchReport(search.id, search.name, search.state, plan, rows, best, found)


def param_importances(store: SearchReader, search: Any) -> dict[str, float]:
    """optuna.importance's figures for the search's study ({} when Optuna cannot tell yet: too few trials,
    or a space of one value)."""
    import optuna

    from jobs.search.study import rdb_storage

    study = optuna.load_study(study_name=search.study_name, storage=rdb_storage(store))
    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ValueError, RuntimeError):
        return {}
    return {name: float(value) for name, value in found.items()}


def best_spec(store: SearchReader, search_id: int) -> JobSpec:
    """The base spec with the best trial's values, trained in full (the base's own max_steps); SearchNotFound
    when no trial has completed yet."""
    report = search_report(store, search_id, importance=False)
    if report.best is None:
        raise SearchNotFound(
            [Problem("search", f"search {search_id} has no complete trial yet", "wait for a trial to finish")]
        )
    name = f"best of search {search_id}: {report.plan.base.display_name}"
    return report.plan.base.replace(**report.best["params"], run_name=name[:200])


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def format_report(report: SearchReport) -> str:
    """The search as text (CLI): its plan, one line per trial, the best and the importances."""
    head = [
        f"search {report.search_id} ({report.state}): {report.name}",
        f"objective: {report.plan.direction} {report.plan.objective}; space: {report.plan.space.describe()}; "
        f"{len(report.rows)}/{report.plan.trials} trials, {report.plan.parallel} at once",
    ]
    cols = ("trial", "state", "run", report.plan.objective, "values", "note")
    body = [
        (
            str(r["trial"]),
            r["state"],
            str(r["run_id"] or "-"),
            _value(r["value"]) if r["value"] is not None else "-",
            ", ".join(f"{k}={_value(v)}" for k, v in r["params"].items()),
            (r["reason"] or "")[:100],
        )
        for r in report.rows
    ]
    widths = [max(len(x) for x in col) for col in zip(cols, *body)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in (cols, *body)]
    tail = []
    if report.best is not None:
        best = report.best
        values = ", ".join(f"{k}={_value(v)}" for k, v in best["params"].items())
        tail.append(
            f"best: trial {best['trial']} (run {best['run_id']}): {report.plan.objective} {best['value']:.4g}; {values}"
        )
    if report.importances:
        tail.append("importance: " + ", ".join(f"{k} {v:.2f}" for k, v in report.importances.items()))
    return "\n".join(head + [""] + lines + ([""] + tail if tail else []))
