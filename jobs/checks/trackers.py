"""The submit check of `report_to`: each tracker's package is installed, else the run is refused before it queues.

The mirrors (`jobs.train.mirrors`) import the tracker's package in the training child; a run that
asked for W&B on a host without `wandb` would train and then fail, or silently mirror nothing. The check
runs where the run is submitted, which is where the workers are installed from in the usual set-up
(one venv, `./dev.sh`); the fix names the pinned package for the workers too.

    tracker_problems(spec)   # [Problem("report_to", "`wandb` is not installed ...", "pip install 'wandb==0.31.0' ...")]
"""

from __future__ import annotations

import importlib.util

from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.trackers import PACKAGES


def tracker_problems(spec: JobSpec) -> list[Problem]:
    """A problem for each tracker in `report_to` whose package this machine cannot import."""
    out = []
    for tracker in spec.tracker_list:
        module, requirement = PACKAGES[tracker]
        if importlib.util.find_spec(module) is None:
            out.append(
                Problem(
                    "report_to",
                    f"`{tracker.value}` needs the `{module}` package, which is not installed here",
                    f"pip install '{requirement}' (on the workers too), or remove {tracker.value} from report_to",
                )
            )
    return out
