"""Change stamps (storage.store_watch): each moves when what a live page shows may have moved, and
`live_stamps` (a live page's one SELECT a tick) says what `run_stamp` and `series_stamp` say."""

from __future__ import annotations

import time

from jobs.spec.job import JobSpec
from storage.store import MemoryPoint, MetricPoint, Store

BACKENDS = ("sqlite", "postgresql")


def _both(store: Store, run_id: int | None) -> tuple[object, object]:
    return (store.run_stamp(run_id) if run_id is not None else None), store.series_stamp()


def test_live_stamps_are_the_run_and_series_stamps_in_one_read(store: Store) -> None:
    assert store.live_stamps(None) == (None, (None, None))
    assert store.live_stamps(7) == (None, (None, None))  # no such run
    run_id = store.create_run(JobSpec(run_name="watch"))
    seen = [store.live_stamps(run_id)]
    assert seen[0] == _both(store, run_id) and seen[0][0] is not None and seen[0][0][0] == "queued"
    assert store.claim_next_on_device("w", "0") is not None
    for change in (
        lambda: store.set_progress(run_id, 3, 10),
        lambda: store.add_metrics(run_id, [MetricPoint(3, "loss", 1.0, time.time())]),
        lambda: store.add_memory_samples([MemoryPoint(time=time.time(), source="host", run_id=run_id, used_bytes=1)]),
        lambda: store.set_note(run_id, "a note"),
        lambda: store.mark_succeeded(run_id, {}),
    ):
        change()
        now = store.live_stamps(run_id)
        assert now == _both(store, run_id) and now != seen[-1], now
        seen.append(now)
    run, series = seen[-1]
    assert run is not None and run[0] == "succeeded" and run[1] == 3 and None not in series
    assert store.live_stamps(None) == (None, series) and store.live_stamps(run_id + 1) == (None, series)


def test_run_extents_are_each_series_extent_in_one_read(store: Store) -> None:
    run_id = store.create_run(JobSpec(run_name="extents"))
    names = ("loss", "eval_loss", "rewards/margins")
    assert store.run_extents(run_id, names) == ({name: None for name in names}, None)
    store.add_metrics(run_id, [MetricPoint(s, "loss", 1.0, 1.0 + s) for s in (3, 1, 7)])
    store.add_metrics(run_id, [MetricPoint(5, "rewards/margins", 0.5, 6.0)])
    other = store.create_run(JobSpec(run_name="other"))
    store.add_metrics(other, [MetricPoint(99, "loss", 1.0, 2.0)])  # another run's rows are not this run's
    store.add_memory_samples([MemoryPoint(time=t, source="host", run_id=run_id, used_bytes=1) for t in (12.5, 10.0)])
    metrics, memory = store.run_extents(run_id, names)
    assert metrics == {"loss": (1, 7), "eval_loss": None, "rewards/margins": (5, 5)}
    assert metrics == {name: store.metric_extent(run_id, name) for name in names}
    assert memory == (10.0, 12.5) == store.memory_extent(run_id)
