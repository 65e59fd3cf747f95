"""The spec's last section: where the run may go (host, device) and the before/after samples it ends with."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.field import Group, spec_field
from jobs.spec.trackers import Tracker, trackers


@dataclass(frozen=True)
class RunFields:
    """Placement pins and the prompts the base model and the result answer at the end."""

    pin_host: str | None = spec_field(
        None,
        Group.RUN,
        "Only a worker on this host (its hostname) takes the run; empty: any host.",
        label="Host",
        advanced=True,
    )
    pin_device: str | None = spec_field(
        None,
        Group.RUN,
        "Only the worker of this device (`tunedeck worker --device N`) takes the run; empty: any free worker.",
        label="Device",
        advanced=True,
    )
    share_device: bool = spec_field(
        False,
        Group.RUN,
        "May train at the same time as other sharing runs on one device, when a worker allows it (`tunedeck worker --share N`) and their predicted peaks plus a margin fit its memory; on a GPU the run is capped at its share and, if it outgrows it, queued again to run alone.",
        label="Share the device",
        advanced=True,
    )
    sample_prompts: str | None = spec_field(
        None,
        Group.RUN,
        "Prompts the base model and the result answer greedily at the end of the run (the run page's before/after table), one per line (in YAML also a list). Empty: the first prompts of the held-out eval rows, else a built-in set.",
        label="Before/after prompts",
        advanced=True,
    )
    sample_count: int = spec_field(
        3,
        Group.RUN,
        "How many prompts the before/after samples answer (0: take none).",
        ge=0,
        le=20,
        label="Before/after samples",
        advanced=True,
    )
    sample_new_tokens: int = spec_field(
        48,
        Group.RUN,
        "Most tokens each before/after answer may have.",
        ge=1,
        le=1024,
        label="Before/after answer length",
        advanced=True,
    )

    report_to: str | None = spec_field(
        None,
        Group.RUN,
        "Experiment trackers that also receive the run's metrics (every row the run page graphs), the spec as "
        "config and the run's tunedeck address, comma-separated (in YAML also a list): wandb, mlflow, tensorboard, "
        "trackio. Each reads its credentials and address from the worker's environment (WANDB_API_KEY, "
        "WANDB_MODE=offline, MLFLOW_TRACKING_URI, TRACKIO_DIR, ...); MLflow's store is "
        "sqlite:///$TUNEDECK_HOME/mlflow.db without MLFLOW_TRACKING_URI; TensorBoard event files go to the run's "
        "folder; a tracker that could not start (no W&B key online, an MLflow store it cannot open) is refused at "
        "submit. Empty: tunedeck's own graphs only.",
        label="Report to",
        advanced=True,
    )

    @property
    def tracker_list(self) -> list[Tracker]:
        """report_to as trackers, in order, once each (unknown names are a spec problem)."""
        return trackers(self.report_to)[0]

    @property
    def sample_prompt_list(self) -> list[str]:
        """sample_prompts as a list: one prompt per non-empty line."""
        return [line.strip() for line in (self.sample_prompts or "").splitlines() if line.strip()]
