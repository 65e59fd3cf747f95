"""The experiment trackers a run's metrics can be mirrored to (`report_to`), and how the field is read.

`report_to` is stored as one comma-separated text (in YAML also a list), like `lora_target_modules`;
`trackers(text)` reads it into `Tracker` members and the words that are none. Which package each
tracker needs is here too, so the submit check (`jobs.checks.trackers`) and the mirrors
(`jobs.train.mirrors`) name the same one. Imports nothing of the project.

    trackers("wandb, mlflow")   # ([Tracker.WANDB, Tracker.MLFLOW], [])
"""

from __future__ import annotations

from enum import Enum


class Tracker(str, Enum):
    WANDB = "wandb"
    MLFLOW = "mlflow"
    TENSORBOARD = "tensorboard"
    TRACKIO = "trackio"


# tracker -> (the module the mirror imports, the pinned requirement that provides it)
PACKAGES: dict[Tracker, tuple[str, str]] = {
    Tracker.WANDB: ("wandb", "wandb==0.31.0"),
    Tracker.MLFLOW: ("mlflow", "mlflow-skinny==3.18.0"),
    Tracker.TENSORBOARD: ("tensorboard", "tensorboard==2.21.0"),
    Tracker.TRACKIO: ("trackio", "trackio==0.43.0"),
}
NONE_WORDS = {"none", "no", ""}  # what the libraries' own report_to uses for "no tracker"


def report_to_text(raw: object) -> str | None:
    """A YAML/JSON list (or one word) as the stored form: names joined by commas; None for no tracker."""
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    names = [str(x).strip().lower() for x in items if x is not None]
    names = [n for part in names for n in part.split(",") if n.strip().lower() not in NONE_WORDS]
    return ",".join(n.strip() for n in names) or None


def trackers(text: str | None) -> tuple[list[Tracker], list[str]]:
    """(the trackers named in `text`, in order and once each; the names that are not a tracker)."""
    found: list[Tracker] = []
    unknown: list[str] = []
    for word in (text or "").split(","):
        word = word.strip().lower()
        if word in NONE_WORDS:
            continue
        try:
            tracker = Tracker(word)
        except ValueError:
            unknown.append(word)
            continue
        if tracker not in found:
            found.append(tracker)
    return found, unknown


CHOICES = ", ".join(t.value for t in Tracker)
