"""The memory prediction made at submit, kept next to the run (`prediction.json` in its run folder).

The run page, the compare tab and `tunedeck show` read it back to set it against the measured peak.

    save_prediction(store, run_id, checked.prediction)
    load_prediction(store, run_id)        # {"total_bytes": ..., "parts": ..., ...} or None
    predicted_bytes(saved)                # the peak it names (what sharing reserves, what picks a GPU type)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jobs.devices.facts import RuntimeBaseline
from jobs.memory.breakdown import Prediction
from jobs.spec.enums import Trainer

if TYPE_CHECKING:
    from storage.roles import RunFolders

PREDICTION_FILE = "prediction.json"


def save_prediction(store: RunFolders, run_id: int, prediction: Prediction | None) -> None:
    """Keep `prediction` (None: nothing to keep) with the run."""
    if prediction is not None:
        (store.run_dir(run_id) / PREDICTION_FILE).write_text(prediction.to_json())


def load_prediction(store: RunFolders, run_id: int) -> dict | None:
    """The prediction saved at submit, or None."""
    try:
        return json.loads((store.run_path(run_id) / PREDICTION_FILE).read_text())
    except (OSError, ValueError):
        return None


def predicted_bytes(saved: dict | None) -> int | None:
    """The peak a saved prediction names: its data figure (the verdict's), else its total (the max_length bound)."""
    if not saved:
        return None
    value = saved.get("data_bytes") or saved.get("total_bytes")
    return int(value) if value else None


def with_runtime(saved: dict[str, Any], baseline: RuntimeBaseline, trainer: Trainer, worker: str) -> dict[str, Any]:
    """`saved` (a CPU prediction made while no worker had measured its runtime baseline) with the runtime part
    filled in: the baseline's runtime plus what `trainer`'s own trl classes add (`trainer_bytes`); every figure
    (total, data, worst case, phases) grows by as much (`Prediction.with_runtime`)."""
    return Prediction.from_dict(saved).with_runtime(baseline, trainer, f"worker {worker}").to_dict()


def add_runtime(store: RunFolders, run_id: int, baseline: RuntimeBaseline, trainer: Trainer, worker: str) -> bool:
    """Complete a run's saved CPU prediction with the claiming worker's runtime baseline when it lacks one
    (submitted before any worker on this host had measured it); `trainer`: the run's. True when it changed."""
    saved = load_prediction(store, run_id)
    if not saved or baseline.runtime_bytes <= 0 or (saved.get("device") or {}).get("kind") != "cpu":
        return False
    if int((saved.get("parts") or {}).get("runtime", 0)):
        return False
    changed = with_runtime(saved, baseline, trainer, worker)
    (store.run_dir(run_id) / PREDICTION_FILE).write_text(json.dumps(changed))
    return True
