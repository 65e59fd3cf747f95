"""Pure-Python references for the SQL bucketing of `app.ui.series` (the tests compare the two)."""

from __future__ import annotations

from dataclasses import replace

from app.ui.series import MAX_POINTS, merge_metric, pow2_at_least
from storage.store import MetricBucket


def downsample_minmax(points: list[tuple[int, float]], max_points: int = MAX_POINTS) -> list[MetricBucket]:
    """Reference (pure Python) version of the SQL bucketing, for tests: same widths, same buckets."""
    if not points:
        return []
    hi = max(p[0] for p in points)
    width = int(pow2_at_least((hi + 1) / max(1, max_points // 2)))
    out: dict[int, MetricBucket] = {}
    for step, value in points:
        b = MetricBucket(step, step, value, value, value, 1)
        k = step // width
        out[k] = merge_metric(out[k], b) if k in out else b
    return [replace(b) for _, b in sorted(out.items())]


def same_buckets(a: list[MetricBucket], b: list[MetricBucket], rel: float = 1e-9) -> bool:
    """Equal bucket lists, sums compared to `rel` (rollups add partial sums, so the last bits may differ)."""
    return len(a) == len(b) and all(
        (x.first_step, x.last_step, x.min, x.max, x.count) == (y.first_step, y.last_step, y.min, y.max, y.count)
        and abs(x.total - y.total) <= rel * max(1.0, abs(x.total), abs(y.total))
        for x, y in zip(a, b)
    )
