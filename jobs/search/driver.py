"""Start a search, and advance it one turn at a time: report, prune, tell, ask, check, queue.

    search = start_search(store, plan)             # the record; its study is created on its first turn
    advance(store, search.id, studies)             # a worker's search service calls this every few seconds

One turn (only the worker holding the search's turn takes it: `Store.take_search_turn`):

1. every open trial's run is read: each new value of the objective it logged is reported to Optuna;
   the pruner's word to stop it goes through the normal cancel path (`Store.request_cancel`) and the trial
   becomes `pruning`; a run that trains past the plan's minutes is stopped the same way;
2. a trial whose run has ended is told: its objective (complete), pruned (a pruned run ends cancelled),
   or failed with the run's error; an interrupted run (its worker died) is queued again, the same run (it
   resumes from its last checkpoint), once its orphaned child has had the stop grace to end (`requeue_after_s`);
3. new trials are asked while fewer than `parallel` are open and the budget is not spent. Each sampled
   point goes through the one check (`jobs.checks.pipeline.check`: fields, data, the device, the memory
   prediction) before anything is queued: a point that will not fit is told to Optuna as failed, its
   reason kept on the trial (`infeasible`), and never queued. The trial is recorded (`asked`) before it is
   checked, and its run queued in the same transaction that links them, so a restart at any moment
   neither queues a trial twice nor loses one: an `asked` trial is checked and queued on the next turn,
   and a trial Optuna gave that was never recorded is told failed there.
4. when the budget is spent and no trial is open, the search is finished.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from jobs.checks.access import AccessPolicy
from jobs.errors import ProblemError
from jobs.search.plan import SearchPlan
from jobs.search.study import open_study
from storage.errors import StorageError
from storage.models import RunStatus

if TYPE_CHECKING:
    from storage.roles_queue import SearchDriving
    from storage.store import RunRecord, TrialRecord

log = logging.getLogger(__name__)


def requeue_after_s() -> float:
    """How long after its interruption a trial's run is queued again: the stop grace a worker gives the orphaned
    training child of a dead worker (TUNEDECK_CANCEL_GRACE_S, 20 s by default), and 10 s more. Queued sooner, the
    orphan's own end (it marks its run cancelled) could land on the queued run."""
    from storage.settings import stop_graces

    return stop_graces(20.0)[0] + 10.0


def search_tag(search_id: int) -> str:
    return f"search-{search_id}"


def start_search(
    store: SearchDriving, plan: SearchPlan, name: str | None = None, policy: AccessPolicy | None = None
) -> Any:
    """Check the base spec once (`policy`: what the caller may reach; every problem but a memory verdict, which
    the space may change) and record a new active search, which a worker's search service drives; its
    SearchRecord. SearchError with every problem."""
    from jobs.checks.pipeline import check
    from jobs.search.plan import SearchError

    first = plan.trial_spec(plan.base_values() or {}, "search")
    problems = [p for p in check(first, policy=policy, store=store).problems if p.field != "memory"]
    if problems:
        raise SearchError(problems)
    return store.create_search(name or f"search: {plan.base.display_name}", _plan_json(plan))


def _plan_json(plan: SearchPlan) -> str:
    import json

    return json.dumps(plan.to_dict())


def advance(store: SearchDriving, search_id: int, studies: dict[int, Any]) -> bool:
    """One turn of the search; True while it is still active. `studies` caches each search's open study."""
    search = store.get_search(search_id)
    if search is None or search.state != "active":
        studies.pop(search_id, None)
        return False
    plan = SearchPlan.from_dict(search.plan)
    if search_id not in studies:
        studies[search_id] = open_study(store, search, plan)
    study = studies[search_id]
    trials = store.search_trials(search_id)
    _tell_unrecorded(study, trials)
    for trial in trials:
        if trial.open:
            _follow(store, study, plan, trial)
    trials = store.search_trials(search_id)
    opened = sum(t.open for t in trials)
    while opened < plan.parallel and len(trials) < plan.trials:
        _ask(store, study, plan, search_id)
        trials = store.search_trials(search_id)
        opened = sum(t.open for t in trials)
    if len(trials) >= plan.trials and not opened:
        store.end_search(search_id, "finished")
        studies.pop(search_id, None)
        return False
    return True


def _tell_unrecorded(study: Any, trials: list[TrialRecord]) -> None:
    """Optuna trials still running that no trial row records (a restart between ask and record): failed."""
    from optuna.trial import TrialState

    known = {t.optuna_trial_id for t in trials}
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if frozen._trial_id not in known:
            study.tell(frozen.number, state=TrialState.FAIL, skip_if_finished=True)


def _ask(store: SearchDriving, study: Any, plan: SearchPlan, search_id: int) -> None:
    from jobs.search.space import suggest

    trial = study.ask()
    params = suggest(trial, plan.space)
    trial_id = store.add_trial(search_id, trial.number, trial._trial_id, params)
    record = next(t for t in store.search_trials(search_id) if t.id == trial_id)
    _queue(store, study, plan, record)


def _queue(store: SearchDriving, study: Any, plan: SearchPlan, trial: TrialRecord) -> None:
    """Check the trial's spec (memory prediction included) and queue its run, or refuse it as infeasible."""
    from optuna.trial import TrialState

    from jobs.checks.pipeline import check
    from jobs.queue.saved_prediction import save_prediction

    name = f"search {trial.search_id} trial {trial.number}"
    try:
        checked = check(plan.trial_spec(trial.params, name), store=store)
        spec = checked.accepted()
    except ProblemError as exc:
        reason = "; ".join(str(p) for p in exc.problems)
        if store.update_trial(trial.id, only_from=("asked",), state="infeasible", reason=reason[:4000]):
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        log.info("search %s: trial %s refused before queueing: %s", trial.search_id, trial.number, reason)
        return
    run_id = store.queue_trial(trial.id, spec.to_json(), spec.display_name, search_tag(trial.search_id))
    if run_id is not None:
        save_prediction(store, run_id, checked.prediction)


def _follow(store: SearchDriving, study: Any, plan: SearchPlan, trial: TrialRecord) -> None:
    from optuna.trial import TrialState

    if trial.state == "asked":  # recorded, then the turn ended before its check: check and queue it now
        _queue(store, study, plan, trial)
        return
    run = store.get_run(trial.run_id) if trial.run_id is not None else None
    if run is None:
        if store.update_trial(trial.id, state="failed", reason="its run was deleted"):
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        return
    last = _report(store, study, plan, trial, run)
    if run.status is RunStatus.INTERRUPTED:  # its worker stopped or died: the same run trains again,
        if time.time() - (run.finished_at or 0.0) > requeue_after_s():  # once its orphaned child has surely ended
            store.requeue(run.id)
        return
    if not run.status.finished:
        return
    if trial.state == "pruning" and run.status is not RunStatus.SUCCEEDED:  # a run the cancel reached too late
        if store.update_trial(trial.id, state="pruned"):  # ran to its end: it is told complete below
            study.tell(trial.number, state=TrialState.PRUNED, skip_if_finished=True)
        return
    value = run.final_metrics.get(plan.objective, last) if run.status is RunStatus.SUCCEEDED else None
    if value is not None:
        if store.update_trial(trial.id, state="complete", value=float(value)):
            study.tell(trial.number, float(value), skip_if_finished=True)
        return
    reason = (
        f"the run reported no {plan.objective}"
        if run.status is RunStatus.SUCCEEDED
        else f"its run ended {run.status.value}" + (f": {run.error_summary}" if run.error_summary else "")
    )
    if store.update_trial(trial.id, state="failed", reason=reason[:4000]):
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)


def _report(store: SearchDriving, study: Any, plan: SearchPlan, trial: TrialRecord, run: RunRecord) -> float | None:
    """Report the objective's new values to Optuna; stop the run when the pruner (or the time budget) says so.
    The last value reported (None when there is none)."""
    import optuna

    points = [p for p in store.metrics(run.id, [plan.objective]) if p.value is not None and math.isfinite(p.value)]
    new = [p for p in points if p.step > trial.reported_step]
    last = points[-1].value if points else None
    if not new and trial.state != "running":
        return last
    handle = optuna.trial.Trial(study, trial.optuna_trial_id)
    for point in new:
        handle.report(float(point.value), int(point.step))
    if new:
        store.update_trial(trial.id, reported_step=int(new[-1].step), value=float(new[-1].value))
    if trial.state != "running" or run.status is not RunStatus.RUNNING:
        return last
    reason = None
    if new and plan.pruner != "none" and handle.should_prune():
        reason = f"pruned at step {new[-1].step}: {plan.objective} {new[-1].value:.4g} was worse than the others there"
    elif plan.minutes and run.started_at and time.time() - run.started_at > plan.minutes * 60:
        reason = f"stopped at its time budget ({plan.minutes:g} min)"
    if reason is not None and store.update_trial(trial.id, only_from=("running",), state="pruning", reason=reason):
        store.add_run_event(run.id, "pruned", f"search {trial.search_id}: {reason}")
        store.request_cancel(run.id)
    return last


class SearchService:
    """The worker's search service (`jobs.worker.services`): takes a turn of each active search every
    `interval` seconds while it holds that search's turn (`Store.take_search_turn`: one worker at a time; a
    dead worker's search is taken over after `stale_after` seconds). The runs it queues are trained by the
    worker like any other. A burst worker waits while a search is active (`pending`), so
    `tunedeck worker --burst` runs a search to its end.

        Worker(store, services=[lambda place: SearchService(place.store, place.worker_id)])   # app.cli.main
    """

    name = "search"

    def __init__(self, store: SearchDriving, worker_id: str, interval: float = 2.0, stale_after: float = 30.0):
        self.store = store
        self.worker_id = worker_id
        self.interval = interval
        self.stale_after = stale_after
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._studies: dict[int, Any] = {}  # each search's open Optuna study, by search id

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="search-service", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for search_id in list(self._studies):
            try:
                self.store.release_search(search_id, self.worker_id)
            except StorageError:
                log.warning("could not release search %s", search_id, exc_info=True)

    def pending(self) -> bool:
        return bool(self.store.active_search_ids())

    def turn(self) -> None:
        """One turn of every active search this worker may drive now."""
        for search_id in self.store.active_search_ids():
            if self._stop.is_set():
                return
            if self.store.take_search_turn(search_id, self.worker_id, self.stale_after):
                advance(self.store, search_id, self._studies)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.turn()
            except Exception:  # a turn that fails is logged with its traceback; the next one tries again
                log.exception("search service: a turn failed")
                self._studies.clear()
            self._stop.wait(self.interval)
