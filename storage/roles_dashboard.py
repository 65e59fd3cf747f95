"""The store's roles for the dashboard's run page, its live stream, the launch form and the server's file list
(`app.ui.run`, `app.ui.live`, `app.ui.form`, `app.server`), each a `Protocol` `Store` plays, checked by mypy in
`storage.roles_played`. The smaller roles they combine are in `storage.roles`, `storage.roles_queue` and
`storage.roles_pages`. The whole dashboard (`app.ui.dashboard.build_ui`) takes the whole `Store` the server made:
it hands each tab its role."""

from __future__ import annotations

from typing import Any, Protocol

from storage.roles import MetricReader, RunEvents, RunLister, RunReader, WorkerDirectory
from storage.roles_pages import DeviceMemory, RunText, SeriesReader
from storage.roles_queue import RunActing


class LiveStamps(Protocol):
    """What changed since the live stream last looked: a run's rows, the runs table, the devices."""

    def live_stamps(self, run_id: int | None) -> tuple[tuple[Any, ...] | None, tuple[int | None, int | None]]: ...

    def runs_stamp(self) -> tuple[Any, ...]: ...

    def devices_stamp(self) -> tuple[Any, ...]: ...


class LiveFeed(RunReader, LiveStamps, DeviceMemory, Protocol):
    """One page's live stream (`app.ui.live.Feed`): what changed, the run's row, the GPU tab's window."""


class RunPageReads(RunText, RunActing, MetricReader, RunEvents, SeriesReader, Protocol):
    """The run page (`app.ui.run.RunPageData`): its charts in one read of their extents, text panels, findings,
    bundle, and the run cancelled or resumed."""

    def run_extents(
        self, run_id: int, names: tuple[str, ...]
    ) -> tuple[dict[str, tuple[int, int] | None], tuple[float, float] | None]: ...


class LivePages(RunPageReads, LiveFeed, Protocol):
    """The live route (`app.ui.live_route.add_live_route`): every page's stream over the run page's series."""


class FormDevice(WorkerDirectory, RunLister, Protocol):
    """The launch form's reads (`app.ui.form.wire`): the workers' published device its predictions are for, and
    the runs its memory panel measures against."""


class BundlePaths(Protocol):
    """The recorded files of a kind (`app.server`: the bundles the dashboard may serve)."""

    def artifact_paths(self, kind: str) -> list[str]: ...
