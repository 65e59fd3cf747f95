"""The memory prediction made at submit, kept next to the run (`prediction.json` in its run folder).

The run page, the compare tab and `tunedeck show` read it back to set it against the measured peak.

    save_prediction(store, run_id, checked.prediction)
    load_prediction(store, run_id)        # {"total_bytes": ..., "parts": ..., ...} or None
"""

from __future__ import annotations

import json
from typing import Any

PREDICTION_FILE = "prediction.json"


def save_prediction(store: Any, run_id: int, prediction: Any) -> None:
    """Keep `prediction` (a `jobs.memory.predict.Prediction`, or None: nothing to keep) with the run."""
    if prediction is not None:
        (store.run_dir(run_id) / PREDICTION_FILE).write_text(prediction.to_json())


def load_prediction(store: Any, run_id: int) -> dict | None:
    """The prediction saved at submit, or None."""
    try:
        return json.loads((store.run_path(run_id) / PREDICTION_FILE).read_text())
    except (OSError, ValueError):
        return None
