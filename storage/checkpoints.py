"""A run's checkpoint folders on disk: which ones are complete, which one to resume from.

The HF Trainer writes `output/checkpoint-N/` file by file (weights or adapter, optimizer.pt,
scheduler.pt, rng_state.pth, trainer_state.json) and then calls `on_save`; `StoreCallback`
writes the metric rows it buffered to the store and then `COMPLETE_MARKER`, so a complete checkpoint
also means the store has every step's metrics up to it. A process killed mid-save (SIGKILL, disk full)
leaves a folder without the marker: it is never resumed from and is removed at the next start.

optimizer.pt / scheduler.pt / rng_state.pth are torch pickles, but ours: written by this run's
own trainer, and transformers 5.24 reads them with `torch.load(..., weights_only=True)`.

Files only, no store and no torch: the training child writes the marker (`jobs.train.callbacks`), the
worker and the run commands (`jobs.queue.run_actions.resume`) read which checkpoint is the last whole one.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

COMPLETE_MARKER = "tunedeck-complete.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dirs(output_dir: Path | str) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint folder, complete or not, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(int(mt.group(1)), p) for p in root.iterdir() if p.is_dir() and (mt := _CHECKPOINT.match(p.name))]
    return sorted(found)


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file() and (folder / "trainer_state.json").is_file()


def mark_complete(folder: Path | str, step: int) -> None:
    """Written last, after the trainer saved every file of the checkpoint."""
    folder = Path(folder)
    tmp = folder / (COMPLETE_MARKER + ".tmp")
    tmp.write_text(json.dumps({"step": step}))
    tmp.rename(folder / COMPLETE_MARKER)  # atomic: the marker is there whole or not at all


def last_complete(output_dir: Path | str) -> tuple[int, Path] | None:
    """The newest checkpoint that was saved completely, or None."""
    for step, folder in reversed(checkpoint_dirs(output_dir)):
        if is_complete(folder):
            return step, folder
        log.warning("skipping incomplete checkpoint %s (the process died while saving it)", folder)
    return None


def remove_incomplete(output_dir: Path | str) -> list[Path]:
    """Delete half-written checkpoint folders (they can only mislead, and they take disk space)."""
    removed = []
    for _step, folder in checkpoint_dirs(output_dir):
        if not is_complete(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
