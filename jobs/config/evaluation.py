"""Early stopping, mapped to transformers: `load_best_model_at_end`, the watched metric, checkpoints at evaluations.

Pure, like `jobs.config.mapping`: spec in, `TrainingArguments` keyword arguments (or the
`EarlyStoppingCallback`) out. The trainer keeps the best evaluation's checkpoint out of the
rotation (`save_total_limit`), loads it back when training ends, and `jobs.train.artifacts` writes
that model into the bundle. A checkpoint is saved at every evaluation (save_steps = eval_steps
unless the spec sets a multiple of it), so the best one always exists on disk. The patience
counter is an `ExportableState` of the trainer's state: restoring callback states from the
checkpoint lets a resumed (or OOM-recovered) run count on from where it stopped.

    early_stopping_kwargs(spec, has_eval=True)
    # {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "save_strategy": "steps", ...}
"""

from __future__ import annotations

from typing import Any

from jobs.spec.evaluation import greater_is_better, watched_metric
from jobs.spec.job import JobSpec


def stops_early(spec: JobSpec, *, has_eval: bool) -> bool:
    """Whether this run watches a metric (asked for, with eval data and evaluations to watch)."""
    return spec.early_stopping_patience is not None and has_eval and spec.eval_steps is not None


def early_stopping_kwargs(spec: JobSpec, *, has_eval: bool) -> dict[str, Any]:
    """The TrainingArguments that keep and reload the best checkpoint ({} when the run does not stop early)."""
    if not stops_early(spec, has_eval=has_eval):
        return {}
    metric = watched_metric(spec)
    return {
        "load_best_model_at_end": True,
        "metric_for_best_model": metric,
        "greater_is_better": greater_is_better(metric),
        "save_strategy": "steps",
        "save_steps": spec.save_steps or spec.eval_steps,
        "restore_callback_states_from_checkpoint": True,
    }


def early_stopping_callback(spec: JobSpec, *, has_eval: bool) -> Any:
    """transformers' EarlyStoppingCallback for the spec's patience and threshold, or None."""
    if not stops_early(spec, has_eval=has_eval):
        return None
    from transformers import EarlyStoppingCallback

    return EarlyStoppingCallback(
        early_stopping_patience=spec.early_stopping_patience or 1,
        early_stopping_threshold=spec.early_stopping_threshold,
    )
