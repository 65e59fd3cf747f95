"""Hyperparameter searches and their trials for `storage.store.Store` (schema 13).

A mixin: it uses the store's `_tx`, `_read` and `_db_now`, and keeps all of its SQL here. The plan is
stored as JSON and given meaning by `jobs.search.plan`; a trial's run is an ordinary run, queued here in
the same transaction that links it to its trial and tags it with its search, so a trial never has two
runs and a queued run is never without its trial. The search's Optuna study lives in Optuna's own
tables of the same database (`study_url`): the store owns that URL.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update

from storage import models as m
from storage.lifecycle import new_run
from storage.store_core import StoreCore, rowcount

SEARCH_STATES = ("active", "finished", "stopped")
TRIAL_STATES = ("asked", "running", "pruning", "complete", "pruned", "failed", "infeasible")
OPEN_TRIAL_STATES = ("asked", "running", "pruning")  # not yet told to Optuna


@dataclass(frozen=True)
class SearchRecord:
    id: int
    name: str
    plan: dict[str, Any]
    study_name: str
    state: str
    created_at: float
    finished_at: float | None
    driver_id: str | None


@dataclass(frozen=True)
class TrialRecord:
    id: int
    search_id: int
    number: int
    optuna_trial_id: int
    run_id: int | None
    params: dict[str, Any]
    state: str
    value: float | None
    reported_step: int
    reason: str | None
    created_at: float
    finished_at: float | None

    @property
    def open(self) -> bool:
        return self.state in OPEN_TRIAL_STATES


def _search(row: m.Search) -> SearchRecord:
    return SearchRecord(
        row.id,
        row.name,
        json.loads(row.plan_json),
        row.study_name,
        row.state,
        row.created_at,
        row.finished_at,
        row.driver_id,
    )


def _trial(row: m.SearchTrial) -> TrialRecord:
    return TrialRecord(
        row.id,
        row.search_id,
        row.number,
        row.optuna_trial_id,
        row.run_id,
        json.loads(row.params_json),
        row.state,
        row.value,
        row.reported_step,
        row.reason,
        row.created_at,
        row.finished_at,
    )


class SearchMixin(StoreCore):
    """Store methods over `searches` and `search_trials`."""

    @property
    def study_url(self) -> str:
        """The database URL Optuna's RDB storage keeps the searches' studies in: this store's own."""
        return self.url

    def study_engine_kwargs(self) -> dict[str, Any]:
        """Engine settings for Optuna's RDB storage: on SQLite the store's busy timeout (writers queue, not fail)."""
        return {"connect_args": {"timeout": 30}} if self._sqlite else {"pool_pre_ping": True}

    def create_search(self, name: str, plan_json: str) -> SearchRecord:
        """A new active search; its study is named after its id (`tunedeck-search-<id>`)."""
        with self._tx() as s:
            row = m.Search(name=name[:256], plan_json=plan_json, study_name="", state="active", created_at=time.time())
            s.add(row)
            s.flush()
            row.study_name = f"tunedeck-search-{row.id}"
            return _search(row)

    def get_search(self, search_id: int) -> SearchRecord | None:
        with self._read() as s:
            row = s.get(m.Search, search_id)
            return _search(row) if row is not None else None

    def list_searches(self, limit: int = 50) -> list[SearchRecord]:
        """Newest first."""
        with self._read() as s:
            return [_search(r) for r in s.scalars(select(m.Search).order_by(m.Search.id.desc()).limit(limit))]

    def active_search_ids(self) -> list[int]:
        q = select(m.Search.id).where(m.Search.state == "active").order_by(m.Search.id)
        with self._read() as s:
            return [int(x) for x in s.scalars(q)]

    def end_search(self, search_id: int, state: str) -> bool:
        """Finish (its budget is spent) or stop (the user's word) an active search; False when it was not active."""
        assert state in ("finished", "stopped"), state
        with self._tx() as s:
            moved = s.execute(
                update(m.Search)
                .where(m.Search.id == search_id, m.Search.state == "active")
                .values(state=state, finished_at=time.time(), driver_id=None)
            )
            return rowcount(moved) == 1

    def take_search_turn(self, search_id: int, driver_id: str, stale_after_s: float) -> bool:
        """Whether `driver_id` may advance the search now: it drives it already, nobody does, or its driver
        has not taken a turn for `stale_after_s` (a dead worker's search is taken over). One UPDATE."""
        now = self._db_now()
        with self._tx() as s:
            moved = s.execute(
                update(m.Search)
                .where(
                    m.Search.id == search_id,
                    m.Search.state == "active",
                    or_(
                        m.Search.driver_id.is_(None),
                        m.Search.driver_id == driver_id,
                        m.Search.driver_at < now - stale_after_s,
                    ),
                )
                .values(driver_id=driver_id, driver_at=now)
            )
            return rowcount(moved) == 1

    def release_search(self, search_id: int, driver_id: str) -> None:
        """A stopping worker lets another take the search at once."""
        with self._tx() as s:
            s.execute(
                update(m.Search)
                .where(m.Search.id == search_id, m.Search.driver_id == driver_id)
                .values(driver_id=None, driver_at=None)
            )

    # ------------------------------------------------------------------ trials
    def search_trials(self, search_id: int) -> list[TrialRecord]:
        """The search's trials in Optuna's order."""
        q = select(m.SearchTrial).where(m.SearchTrial.search_id == search_id).order_by(m.SearchTrial.number)
        with self._read() as s:
            return [_trial(r) for r in s.scalars(q)]

    def trial_of_run(self, run_id: int) -> TrialRecord | None:
        with self._read() as s:
            row = s.scalars(select(m.SearchTrial).where(m.SearchTrial.run_id == run_id)).first()
            return _trial(row) if row is not None else None

    def add_trial(
        self,
        search_id: int,
        number: int,
        optuna_trial_id: int,
        params: dict[str, Any],
        state: str = "asked",
        reason: str | None = None,
    ) -> int:
        """Record a trial Optuna gave (`asked`: to be checked and queued; `infeasible`: refused, with the reason)."""
        assert state in ("asked", "infeasible"), state
        now = time.time()
        with self._tx() as s:
            row = m.SearchTrial(
                search_id=search_id,
                number=number,
                optuna_trial_id=optuna_trial_id,
                params_json=json.dumps(params),
                state=state,
                reason=reason,
                reported_step=-1,
                created_at=now,
                finished_at=now if state == "infeasible" else None,
            )
            s.add(row)
            s.flush()
            return row.id

    def queue_trial(self, trial_id: int, spec_json: str, name: str, tag: str) -> int | None:
        """Queue the run of an `asked` trial, tag it and link it, in one transaction; None when the trial was
        not `asked` any more (another turn queued or refused it)."""
        now = time.time()
        with self._tx() as s:
            trial = s.get(m.SearchTrial, trial_id)
            if trial is None or trial.state != "asked":
                return None
            row = new_run(
                id=self._unused_run_id(s),
                name=name[:256],
                spec_json=spec_json,
                created_at=now,
                queue_order=now,
                cancel_requested=0,
                current_step=0,
                run_alone=0,
            )
            s.add(row)
            s.flush()
            s.add(m.RunTag(run_id=row.id, tag=tag))
            trial.run_id = row.id
            trial.state = "running"
            return row.id

    def update_trial(self, trial_id: int, *, only_from: tuple[str, ...] = OPEN_TRIAL_STATES, **values: Any) -> bool:
        """Change a trial's state, value, reported step or reason, while it is in one of `only_from`."""
        allowed = {"state", "value", "reported_step", "reason", "finished_at"}
        assert set(values) <= allowed, set(values) - allowed
        assert values.get("state", "running") in TRIAL_STATES, values
        if values.get("state") in ("complete", "pruned", "failed", "infeasible"):
            values.setdefault("finished_at", time.time())
        with self._tx() as s:
            moved = s.execute(
                update(m.SearchTrial)
                .where(m.SearchTrial.id == trial_id, m.SearchTrial.state.in_(only_from))
                .values(**values)
            )
            return rowcount(moved) == 1
