"""What the trainer really runs with, read back from it after the libraries resolved the config.

trl and transformers change some of what they are given: packing with trl's default "bfd"
strategy turns padding-free on whatever `padding_free` said (the trainer keeps its own
`padding_free`, not the config's), `auto_find_batch_size` shrinks the micro-batch after an
out-of-memory error, and deprecated names are mirrored onto new ones. A run record must say what
ran, so `jobs.train.training.prepare` replaces the requested trainer kwargs with this read-back and keeps the
differences beside it:

    effective, changed = trainer_readback(trainer, requested_kwargs)
    changed == {"padding_free": {"requested": False, "effective": True}}
"""

from __future__ import annotations

from enum import Enum
from typing import Any


def plain(value: Any) -> Any:
    """A JSON-able form of a config value (enums by value, tuples as lists, dicts recursively)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _same(requested: Any, effective: Any) -> bool:
    requested, effective = plain(requested), plain(effective)
    if isinstance(effective, list) and not isinstance(requested, list):
        # report_to="none" becomes [], loss_type="nll" becomes ["nll"]: the same request.
        return effective == ([] if requested == "none" else [requested])
    return requested == effective


def trainer_readback(trainer: Any, requested: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(each requested key as the trainer holds it, {key: {requested, effective}} for those that differ)."""
    args = trainer.args
    effective = {key: plain(getattr(args, key, value)) for key, value in requested.items()}
    # trl decides padding-free in the trainer (packing with "bfd" implies it), not in its config.
    if hasattr(trainer, "padding_free") and "padding_free" in requested:
        effective["padding_free"] = bool(trainer.padding_free)
    changed = {
        key: {"requested": plain(requested[key]), "effective": effective[key]}
        for key in requested
        if not _same(requested[key], effective[key])
    }
    return effective, changed


def final_micro_batch(trainer: Any) -> int:
    """The micro-batch the training loop ended with (smaller than asked after auto_find_batch_size)."""
    total = getattr(trainer, "_train_batch_size", None) or trainer.args.per_device_train_batch_size
    return int(total) // max(1, int(getattr(trainer.args, "n_gpu", 1) or 1))
