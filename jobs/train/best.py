"""The best checkpoint of a run that stops early: which step the bundle holds, and why training ended there.

transformers keeps the best evaluation in the trainer's state (`best_global_step`, `best_metric`,
`best_model_checkpoint`) and reloads that checkpoint at the end (`jobs.config.evaluation`);
`EarlyStoppingCallback` counts the evaluations without improvement. This module reads both after
training and words the outcome for the run's events (`jobs.train.recipe`):

    "eval loss did not improve for 3 evaluations after step 120 (best 1.234); training stopped at
     step 180; the bundle holds step 120"
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EVENT_KIND = "best_checkpoint"


@dataclass(frozen=True)
class BestCheckpoint:
    """The best evaluation of a run that watched a metric, and how training ended."""

    metric: str  # as logged: eval_loss
    value: float
    step: int  # the step whose checkpoint the bundle holds
    last_step: int  # the step training ended at
    stopped_early: bool
    patience: int

    @property
    def label(self) -> str:
        """How the end message names the metric: "eval loss", or a task score as "tag-format-questions exact_match"."""
        if self.metric.startswith("eval_task/"):
            return self.metric.removeprefix("eval_task/").replace("/", " ")
        return self.metric.replace("_", " ").replace("/", " ")

    def message(self) -> str:
        """One line for the run's events and `tunedeck show`."""
        best = f"(best {self.value:.4g})"
        if self.stopped_early:
            return (
                f"{self.label} did not improve for {self.patience} evaluation{'s' if self.patience != 1 else ''} "
                f"after step {self.step} {best}; training stopped at step {self.last_step}; "
                f"the bundle holds step {self.step}"
            )
        if self.step == self.last_step:
            return f"{self.label} was best at the last step, {self.step} {best}; the bundle holds step {self.step}"
        return (
            f"{self.label} was best at step {self.step} {best}; training ran to step {self.last_step}; "
            f"the bundle holds step {self.step}"
        )

    def data(self) -> dict[str, Any]:
        return asdict(self)


def best_checkpoint(trainer: Any) -> BestCheckpoint | None:
    """What the trainer kept as best (None when the run watched no metric or never evaluated)."""
    from transformers import EarlyStoppingCallback

    args, state = trainer.args, trainer.state
    if not args.load_best_model_at_end or state.best_global_step is None or state.best_metric is None:
        return None
    if state.best_model_checkpoint is None or not Path(state.best_model_checkpoint).is_dir():
        return None  # nothing was reloaded: the model is the last step's
    # Found by type: a resumed trainer replaces the callback with one restored from the checkpoint.
    stopper = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EarlyStoppingCallback)), None)
    patience = stopper.early_stopping_patience if stopper is not None else 0
    stopped = stopper is not None and stopper.early_stopping_patience_counter >= patience
    return BestCheckpoint(
        metric=str(args.metric_for_best_model),
        value=float(state.best_metric),
        step=int(state.best_global_step),
        last_step=int(state.global_step),
        stopped_early=stopped,
        patience=patience,
    )
