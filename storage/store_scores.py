"""Benchmark scores for `storage.store.Store`: each task's metrics with standard errors, for a run and its base.

    store.set_scores(run_id, "qa", [Score("run", "acc", 0.8, 0.1, 10), Score("base", "acc", 0.3, 0.15, 10)])
    store.scores(run_id)      # [ScoreRecord(task="qa", model="run", metric="acc", ...), ...]

A mixin: it uses the store's `_tx` and `_read`, and keeps all of its SQL here. What a task or a
metric means is `jobs.evaluate`'s business; the store keeps names and numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select

from storage import models as m
from storage.store_core import StoreCore


@dataclass(frozen=True)
class Score:
    """One metric of one model on one task (value and stderr None when not finite or not computed)."""

    model: str  # "run" | "base"
    metric: str
    value: float | None
    stderr: float | None
    samples: int | None = None


@dataclass(frozen=True)
class ScoreRecord:
    run_id: int
    task: str
    model: str
    metric: str
    value: float | None
    stderr: float | None
    samples: int | None
    created_at: float


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


class ScoresMixin(StoreCore):
    """Store methods over `eval_scores`."""

    def set_scores(self, run_id: int, task: str, scores: Sequence[Score]) -> None:
        """Replace the scores of one task of a run (both models) in one transaction."""
        now = time.time()
        with self._tx() as s:
            s.execute(delete(m.EvalScore).where(m.EvalScore.run_id == run_id, m.EvalScore.task == task))
            s.add_all(
                m.EvalScore(
                    run_id=run_id,
                    task=task,
                    model=x.model,
                    metric=x.metric,
                    value=_finite(x.value),
                    stderr=_finite(x.stderr),
                    samples=x.samples,
                    created_at=now,
                )
                for x in scores
            )

    def scores(self, run_id: int) -> list[ScoreRecord]:
        """A run's scores, by task, then metric, then model."""
        q = (
            select(m.EvalScore)
            .where(m.EvalScore.run_id == run_id)
            .order_by(m.EvalScore.task, m.EvalScore.metric, m.EvalScore.model)
        )
        with self._read() as s:
            return [
                ScoreRecord(r.run_id, r.task, r.model, r.metric, r.value, r.stderr, r.samples, r.created_at)
                for r in s.scalars(q)
            ]
