"""The store's roles for the queue and the search: submit, the run actions, a task checked like a run, the
search driver and its pages (each a `Protocol` `Store` plays, checked by mypy in `storage.roles_played`).
The smaller roles they combine are in `storage.roles`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from storage.roles import CheckReader, MetricReader, QueueReader, RunEvents, RunFolders, RunReader, TaskQueue

if TYPE_CHECKING:  # annotations only (a module that asks for a role must not import the database layer)
    from storage.models import RunStatus
    from storage.records import QueueableSpec
    from storage.store_search import SearchRecord, TrialRecord


class Submitting(CheckReader, RunFolders, Protocol):
    """Submit (`jobs.queue.submit`): the check pipeline's reads, the new queued run, its saved prediction."""

    def create_run(self, spec: QueueableSpec) -> int: ...


class CheckTasks(CheckReader, TaskQueue, Protocol):
    """A task checked like a run and queued without one (`jobs.queue.trial`: "Try rewards")."""


class RunActing(Submitting, RunEvents, TaskQueue, Protocol):
    """What can be done to a run (`jobs.queue.run_actions`): cancel, resume, delete, tag, clone."""

    def request_cancel(self, run_id: int) -> RunStatus | None: ...

    def requeue(self, run_id: int) -> bool: ...

    def delete_run(self, run_id: int) -> bool: ...

    def change_tags(
        self, run_id: int, add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> tuple[str, ...] | None: ...

    def set_note(self, run_id: int, note: str | None) -> bool: ...


class SearchReader(RunReader, Protocol):
    """A search's row and its trials (`jobs.search.report`)."""

    def get_search(self, search_id: int) -> SearchRecord | None: ...

    def search_trials(self, search_id: int) -> list[TrialRecord]: ...


class StudyHome(Protocol):
    """Where Optuna keeps a search's study: the store's own database (`jobs.search.study`)."""

    @property
    def study_url(self) -> str: ...

    def study_engine_kwargs(self) -> dict[str, Any]: ...


class SearchDriving(SearchReader, StudyHome, RunActing, MetricReader, Protocol):
    """The search driver's turn (`jobs.search.driver`): ask, check and queue trials, follow their runs, end it."""

    def create_search(self, name: str, plan_json: str) -> SearchRecord: ...

    def active_search_ids(self) -> list[int]: ...

    def end_search(self, search_id: int, state: str) -> bool: ...

    def take_search_turn(self, search_id: int, driver_id: str, stale_after_s: float) -> bool: ...

    def release_search(self, search_id: int, driver_id: str) -> None: ...

    def add_trial(
        self,
        search_id: int,
        number: int,
        optuna_trial_id: int,
        params: dict[str, Any],
        state: str = "asked",
        reason: str | None = None,
    ) -> int: ...

    def queue_trial(self, trial_id: int, spec_json: str, name: str, tag: str) -> int | None: ...

    def update_trial(self, trial_id: int, *, only_from: tuple[str, ...] = ..., **values: Any) -> bool: ...


class SearchPages(SearchDriving, Protocol):
    """The Search tab: the searches, a search's trials and runs; a search started or its best launched."""

    def list_searches(self, limit: int = 50) -> list[SearchRecord]: ...


class QueueOrder(QueueReader, RunReader, Protocol):
    """The queue's order, and a queued run moved in it (`tunedeck move`)."""

    def move_queued(self, run_id: int, position: int) -> bool: ...
