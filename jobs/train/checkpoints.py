"""Resumable checkpoints of a run: the folder layout lives in `storage.checkpoints` (the run commands,
below the training, read it too); its names stay importable from here for the training child and the
worker. Resuming a run is a run command: `jobs.queue.commands.resume`.
"""

from __future__ import annotations

from storage.checkpoints import (  # noqa: F401 (re-exported)
    COMPLETE_MARKER,
    checkpoint_dirs,
    is_complete,
    last_complete,
    mark_complete,
    remove_incomplete,
)
