"""Early stopping on a benchmark task's score: the live model scored at every evaluation.

When `metric_for_best_model` names a task score (`task:tag-format-questions/exact_match`), this callback
scores the model being trained on that task (`jobs.data.bench_score`, the same scoring as the harness
after training) each time the trainer evaluates, and adds the score to the evaluation's metrics as
`eval_task/<task>/<metric>` before anyone else reads them: the store writes it as a metric row (charted
and shown like eval loss), the trainer keeps the best checkpoint by it, `EarlyStoppingCallback` counts
the evaluations without improvement.

    callback = task_watch_callback(spec)     # None unless the spec watches a task score
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

from jobs.spec.evaluation import task_metric_key, watched_task
from jobs.spec.job import JobSpec

log = logging.getLogger(__name__)


class TaskWatchCallback(TrainerCallback):
    """Scores the live model on one task at each evaluation and logs `eval_task/<task>/<metric>`."""

    def __init__(self, eval_tasks: str, task: str, metric: str) -> None:
        self.eval_tasks, self.task, self.metric = eval_tasks, task, metric
        self.key = task_metric_key(task, metric)
        self._scorer: Any = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """An evaluation's log (it has `eval_runtime`) gets the task score, in the same dict the trainer reads."""
        if logs is None or "eval_runtime" not in logs or self.key in logs:
            return
        model, tokenizer = kwargs.get("model"), kwargs.get("processing_class")
        if model is None or tokenizer is None:
            return
        value = self._score(model, tokenizer)
        logs[self.key] = value
        if state.log_history and state.log_history[-1].get("eval_runtime") == logs["eval_runtime"]:
            state.log_history[-1][self.key] = value  # the trainer copied the log before the callbacks saw it
        log.info("step %s: %s %s = %.4g", state.global_step, self.task, self.metric, value)

    def close(self) -> None:
        """Remove the task's folder (kept through the final evaluation after training)."""
        if self._scorer is not None:
            self._scorer.close()
            self._scorer = None

    def _score(self, model: Any, tokenizer: Any) -> float:
        from jobs.data.bench_score import TaskScorer
        from jobs.data.bench_tasks import task_refs

        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a vision model's processor holds its tokenizer
        if self._scorer is None:
            refs = [r for r in task_refs(self.eval_tasks) if r.name == self.task]
            # No standard errors: only the value is watched.
            self._scorer = TaskScorer(refs, tokenizer=tokenizer, bootstrap_iters=0)
        training = model.training
        try:
            with _training_kept():
                scores = self._scorer.score(model, tokenizer).get(self.task, [])
        finally:
            model.train(training)
        found = next((s.value for s in scores if s.metric == self.metric), None)
        if found is None:
            raise ValueError(f"task {self.task} gave no {self.metric} score (it gave {[s.metric for s in scores]})")
        return float(found)


@contextlib.contextmanager
def _training_kept() -> Iterator[None]:
    """Scoring as if it had not happened for the training around it: lm-eval seeds Python's, numpy's and torch's
    random generators (their states are put back, so the data order and dropout go on as without a watch), and its
    per-call notices (about the model handed in, the seeds, the task) stay out of the run's log; errors still show."""
    import random

    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    quiet = logging.getLogger("lm_eval")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def task_watch_callback(spec: JobSpec) -> TaskWatchCallback | None:
    """The callback for a spec whose early stopping watches a task score (None otherwise)."""
    task = watched_task(spec.metric_for_best_model)
    if task is None or spec.early_stopping_patience is None or not spec.eval_tasks:
        return None
    return TaskWatchCallback(spec.eval_tasks, *task)


def close_watches(callbacks: Any) -> None:
    """Remove the task folders of the watching callbacks among `callbacks` (after the final evaluation)."""
    for callback in callbacks:
        if isinstance(callback, TaskWatchCallback):
            callback.close()
