"""Graph downsampling: rollup tables == raw aggregation, spikes survive, incremental == cold, v1 upgrade."""

from __future__ import annotations

import math
import random
import sqlite3

import pytest
from series_reference import downsample_minmax, same_buckets
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from app.ui import series
from jobs.spec.job import JobSpec
from storage import models as m
from storage.store import MEMORY_LEVELS, METRIC_LEVELS, MemoryBucket, MemoryPoint, MetricPoint, Store


def _add_in_batches(store: Store, run_id: int, points: list[MetricPoint], rng: random.Random) -> None:
    i = 0
    while i < len(points):
        n = rng.choice([1, 7, 50, 500, 5000])
        store.add_metrics(run_id, points[i : i + n])
        i += n


def _memory_reference(samples: list[MemoryPoint], width: float) -> list[MemoryBucket]:
    """Pure-Python grouping of samples per (floor(time / width), source), like the SQL."""
    groups: dict[tuple[int, str], list[MemoryPoint]] = {}
    for p in samples:
        groups.setdefault((math.floor(p.time / width), p.source), []).append(p)

    def agg(fn, xs):
        xs = [x for x in xs if x is not None]
        return fn(xs) if xs else None

    out = []
    for key in sorted(groups):
        g = groups[key]
        out.append(
            MemoryBucket(
                key[1],
                min(p.time for p in g),
                max(p.time for p in g),
                agg(min, [p.used_bytes for p in g]),
                agg(max, [p.used_bytes for p in g]),
                agg(max, [p.total_bytes for p in g]),
                agg(max, [p.utilization for p in g]),
                agg(max, [p.torch_allocated for p in g]),
                agg(max, [p.torch_reserved for p in g]),
                agg(min, [p.process_rss for p in g]),
                agg(max, [p.process_rss for p in g]),
                len(g),
            )
        )
    return out


def _memory_samples(run_id: int, n: int, t0: float = 1_700_000_000.0) -> list[MemoryPoint]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        t = t0 + i * 0.37
        if i % 3 == 0:
            out.append(MemoryPoint(t, "nvml", run_id, 0, rng.randrange(1 << 30, 1 << 33), 80 << 30, rng.random() * 100))
        elif i % 3 == 1:
            out.append(
                MemoryPoint(
                    t,
                    "torch",
                    run_id,
                    0,
                    torch_allocated=rng.randrange(1 << 30, 1 << 32),
                    torch_reserved=rng.randrange(1 << 32, 1 << 33),
                )
            )
        else:
            out.append(MemoryPoint(t, "host", run_id, process_rss=rng.randrange(1 << 29, 1 << 31)))
    return out


def test_metric_rollup_equals_raw_aggregation_at_every_width(store):
    rng = random.Random(1)
    a, b = store.create_run(JobSpec()), store.create_run(JobSpec())
    points = [
        MetricPoint(s, name, rng.uniform(-3, 3), float(s)) for s in range(30_000) for name in ("loss", "learning_rate")
    ]
    points += [MetricPoint(s, "loss", 5.0, float(s)) for s in range(0, 30_000, 4099)]  # duplicate steps
    _add_in_batches(store, a, points, rng)
    store.add_metrics(b, [MetricPoint(s, "loss", 100.0, 0.0) for s in range(0, 30_000, 3)])  # another run
    for k in range(0, 17):
        width = 1 << k
        for name in ("loss", "learning_rate"):
            raw = store.metric_buckets(a, name, width)
            assert same_buckets(store.metric_series(a, name, width), raw), (name, width)
            start = (20_000 // width) * width
            assert same_buckets(
                store.metric_series(a, name, width, from_step=start), [x for x in raw if x.first_step >= start]
            ), (name, width, "from")


def test_memory_rollup_equals_raw_aggregation_at_every_width(store):
    run_id = store.create_run(JobSpec())
    samples = _memory_samples(run_id, 8_000)
    for i in range(0, 600, 3):  # sampler-sized batches, then bigger ones
        store.add_memory_samples(samples[i : i + 3])
    for i in range(600, len(samples), 700):
        store.add_memory_samples(samples[i : i + 700])
    store.add_memory_samples([MemoryPoint(1_700_000_000.0 + 5, "host", None, process_rss=1 << 40)])  # no run
    for k in range(0, 18):
        width = 2**k / 16
        assert store.memory_series(run_id, width) == _memory_reference(samples, width), width
        start = math.floor((samples[0].time + 2000) / width) * width
        assert store.memory_series(run_id, width, from_time=start) == _memory_reference(
            [p for p in samples if p.time >= start], width
        ), (width, "from")
    assert MEMORY_LEVELS[0] <= 4 and METRIC_LEVELS[0] <= 4  # the loop above crosses raw and rollup reads


def test_spikes_survive_a_coarse_rollup_read(store):
    run_id = store.create_run(JobSpec())
    n = 100_000
    points = [MetricPoint(i, "loss", 1.0 + (i % 13) * 0.01, float(i)) for i in range(n)]
    points[73_457] = MetricPoint(73_457, "loss", 99.0, 0.0)
    points[90_001] = MetricPoint(90_001, "loss", -7.0, 0.0)
    for i in range(0, n, 20_000):
        store.add_metrics(run_id, points[i : i + 20_000])
    buckets = series.MetricSeriesCache(store, max_points=400).get(run_id, "loss")  # width 512: level 8
    assert len(buckets) <= 200 and sum(b.count for b in buckets) == n
    frame = series.metric_frame({"train": buckets})
    assert len(frame) <= 400 and frame["value"].max() == 99.0 and frame["value"].min() == -7.0
    assert same_buckets(buckets, downsample_minmax([(p.step, p.value) for p in points], 400))

    samples = [MemoryPoint(1e9 + i, "nvml", run_id, 0, 1 << 30, 80 << 30) for i in range(40_000)]
    samples[31_337] = MemoryPoint(1e9 + 31_337, "nvml", run_id, 0, 70 << 30, 80 << 30)
    store.add_memory_samples(samples)
    origin, mem = series.MemorySeriesCache(store, max_points=400).get(run_id)  # width 128 s: level 8 + 3
    frame = series.memory_frame(mem, origin)
    assert origin == 1e9 and len(mem) <= 201 and frame["GiB"].max() == 70.0


def test_incremental_metric_refresh_equals_cold_through_widening(store):
    rng = random.Random(3)
    run_id = store.create_run(JobSpec())
    warm = series.MetricSeriesCache(store, max_points=64)
    step = 0
    while step < 40_000:
        n = rng.choice([1, 7, 100, 2_000])
        store.add_metrics(
            run_id, [MetricPoint(s, "loss", float(rng.randrange(1000)), 0.0) for s in range(step, step + n)]
        )
        step += n
        got = warm.get(run_id, "loss")
        cold = series.MetricSeriesCache(store, max_points=64).get(run_id, "loss")
        assert got == cold, step  # integer values: sums are exact, so equality is exact
        assert len(got) <= 32


def test_incremental_memory_refresh_equals_cold_with_late_samples(store):
    run_id = store.create_run(JobSpec())
    samples = _memory_samples(run_id, 12_000)
    warm = series.MemorySeriesCache(store, max_points=200)
    rng = random.Random(5)
    i = 0
    while i < len(samples):
        n = rng.choice([3, 3, 30, 600])
        batch = samples[i : i + n]
        rng.shuffle(batch)  # two writers: a batch is not in time order
        store.add_memory_samples(batch)
        i += n
        assert warm.get(run_id) == series.MemorySeriesCache(store, max_points=200).get(run_id), i
    origin, buckets = warm.get(run_id)
    assert len({b.source for b in buckets}) == 3 and max(b.count for b in buckets) > 1


def test_deleting_a_run_deletes_its_rollups(store):
    run_id = store.create_run(JobSpec())
    store.add_metrics(run_id, [MetricPoint(s, "loss", 1.0, 0.0) for s in range(100)])
    store.add_memory_samples([MemoryPoint(1e9 + i, "host", run_id, process_rss=1) for i in range(100)])
    store.delete_run(run_id)
    assert store.metric_series(run_id, "loss", 16) == [] and store.memory_series(run_id, 1.0) == []


def test_a_version_1_database_is_upgraded_and_its_series_backfilled(tmp_path):
    """A database as tunedeck schema 1 left it (no rollup tables), built by hand with sqlite3."""
    path = tmp_path / "v1.db"
    later = {"metric_rollups", "memory_rollups", "run_tags"}  # tables, and below columns, added after schema 1
    v1_tables = [t for t in m.Base.metadata.sorted_tables if t.name not in later]
    con = sqlite3.connect(path)
    for table in v1_tables:
        con.execute(str(CreateTable(table).compile(dialect=sqlite_dialect.dialect())))
        for index in table.indexes:
            con.execute(str(CreateIndex(index).compile(dialect=sqlite_dialect.dialect())))
    con.execute("ALTER TABLE runs DROP COLUMN note")
    con.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '1')")
    con.execute(
        "INSERT INTO runs (id, name, spec_json, status, created_at, queue_order, cancel_requested, "
        "current_step) VALUES (1, 'old', ?, 'succeeded', 1.0, 1.0, 0, 0)",
        (JobSpec().to_json(),),
    )
    rng = random.Random(11)
    values = [(1, s, "loss", float(rng.randrange(100)), float(s)) for s in range(30_000)]
    values[20_000] = (1, 20_000, "loss", 1000.0, 20_000.0)
    con.executemany("INSERT INTO metrics (run_id, step, name, value, time) VALUES (?, ?, ?, ?, ?)", values)
    con.executemany(
        "INSERT INTO memory_samples (run_id, time, source, process_rss) VALUES (1, ?, 'host', ?)",
        [(1e9 + i, (1 << 30) + (i == 5_000) * (8 << 30)) for i in range(20_000)],
    )
    con.commit()
    con.close()

    store = Store(f"sqlite:///{path}")
    try:
        assert store.schema_version == m.SCHEMA_VERSION >= 2
        buckets = series.MetricSeriesCache(store).get(1, "loss")  # width 32: a rollup read
        assert buckets == store.metric_buckets(1, "loss", 32)
        assert max(b.max for b in buckets) == 1000.0 and sum(b.count for b in buckets) == 30_000
        origin, mem = series.MemorySeriesCache(store).get(1)
        assert origin == 1e9 and series.memory_frame(mem, origin)["GiB"].max() == 9.0
        assert sum(b.count for b in mem) == 20_000
        # New rows land in the backfilled rollups.
        store.add_metrics(1, [MetricPoint(30_000, "loss", -50.0, 0.0)])
        assert store.metric_series(1, "loss", 32) == store.metric_buckets(1, "loss", 32)
    finally:
        store.dispose()
    assert Store(f"sqlite:///{path}").schema_version == m.SCHEMA_VERSION  # reopening migrates nothing twice


def test_unknown_memory_width_is_refused(store):
    with pytest.raises(ValueError):
        store.memory_series(1, 0.3)


def test_a_bucket_of_non_finite_values_merges_with_its_neighbours() -> None:
    """Raw-row buckets whose every value was NaN come back with min/max/total None (stored NULL)."""
    from app.ui.series import merge_metric
    from storage.records import MetricBucket

    nan_only = MetricBucket(1, 2, None, None, None, 2)
    valued = MetricBucket(3, 4, 0.5, 1.5, 2.0, 2)
    for merged in (merge_metric(nan_only, valued), merge_metric(valued, nan_only)):
        assert (merged.first_step, merged.last_step, merged.min, merged.max, merged.total) == (1, 4, 0.5, 1.5, 2.0)
    assert merge_metric(nan_only, nan_only).min is None
