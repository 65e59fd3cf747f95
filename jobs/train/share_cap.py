"""The training child's side of a shared device: its memory cap, and what it does when it outgrows it.

    apply_cap()          # torch.cuda.set_per_process_memory_fraction(0.2, device) when the worker gave 0.2

A worker that lets runs share a CUDA device (`jobs.worker.share`) starts each shared run's child
with `TUNEDECK_MEMORY_FRACTION` = (predicted peak + margin) / device memory. The cap makes an
under-predicted run run out of memory itself (and OOM recovery shrink it: `jobs.train.oom`)
instead of its neighbour. When it runs out of memory with no recovery left, the child exits with
`EXIT_OUTGREW_SHARE`: the worker puts the run back in the queue to run alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

MEMORY_FRACTION_ENV = "TUNEDECK_MEMORY_FRACTION"
EXIT_OUTGREW_SHARE = 76  # the child's exit code: "out of memory within my share: run me alone"


def memory_fraction(env: Mapping[str, str] | None = None) -> float | None:
    """The cap the worker gave this child (0 < f < 1), or None (not shared, or no cap to apply)."""
    text = (os.environ if env is None else env).get(MEMORY_FRACTION_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        log.warning("%s=%r is not a number: no memory cap", MEMORY_FRACTION_ENV, text)
        return None
    return value if 0 < value < 1 else None


def apply_cap(torch_module: Any = None, env: Mapping[str, str] | None = None) -> float | None:
    """Cap this process's CUDA memory at the fraction the worker gave; returns it (None: no cap applied)."""
    fraction = memory_fraction(env)
    if fraction is None:
        return None
    if torch_module is None:
        import torch as torch_module
    if not torch_module.cuda.is_available():
        return None  # a CPU child: the worker's reservation is the only limit
    device = torch_module.cuda.current_device()
    torch_module.cuda.set_per_process_memory_fraction(fraction, device)
    log.info("shared device: CUDA memory capped at %.1f%% of cuda:%s", 100 * fraction, device)
    return fraction


def capped(env: Mapping[str, str] | None = None) -> bool:
    """Whether this child runs under a share's cap (an OOM then means it outgrew its share)."""
    return memory_fraction(env) is not None
