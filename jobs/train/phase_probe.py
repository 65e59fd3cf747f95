"""Measure memory at the named points of a run's first optimizer step: load, forward, backward, optimizer.

    probe = PhaseProbe(cuda=device.cuda, on_record=lambda data: phases.record(store, run_id, data))
    train_spec(spec, out, [probe, ...])     # probe.record(): {"source", "device", "phases", "note"}
    probe.meter.run_peaks()                  # the whole run's peaks, undoing the probe's resets

Each phase is a window; its "peak_bytes" is the highest point inside it, its "bytes" the level
when it ended. The windows follow each other, so every moment up to the end of the first step is in one:
- load: from the process's start to `on_train_begin` (model, adapter, data, the "before" samples;
  a resumed run's optimizer state read from its checkpoint);
- forward: to the end of the model's first forward call (a forward hook set at the first
  `on_step_begin` and removed as it fires; the loss is inside the model's forward);
- backward: to just before the first optimizer step (its backward, gradient clipping and, with
  gradient accumulation, the step's other micro-batches);
- optimizer: to just after it (the gradients still alive, the optimizer's state now allocated).
On CUDA the figures are torch's reserved bytes, allocated beside them; each window starts with
`torch.cuda.reset_peak_memory_stats`. On the CPU they are the process's RSS and its peak (VmRSS,
VmHWM of /proc/self/status); a window starts by writing "5" to /proc/self/clear_refs (Linux >= 4.0),
and where that write is refused each later peak is the RSS at the window's end, as the record's note says.

Cost: only the first optimizer step is measured. Then the hook is gone and every method returns at its
first line: no reading, no write in the steps that follow. The readings are host-side (the caching
allocator's counters: no CUDA sync; /proc/self/status: a few microseconds), and `phases.json` is
written once per phase, four times in all.

Resetting the peak counters also resets what the whole-run figure reads (`max_memory_reserved`; on
Linux the reset lowers getrusage's ru_maxrss too), so `MemoryMeter` keeps every peak it erases and
`run_peaks()` gives the whole run's (`jobs.train.results.peak_memory` reads it).
"""

from __future__ import annotations

import logging
import re
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from jobs.train.phases import PHASES
from jobs.units import human_bytes

log = logging.getLogger(__name__)

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
_FIELD = re.compile(r"^(VmRSS|VmHWM):\s+(\d+) kB", re.M)


def _rss_and_peak() -> tuple[int, int | None]:
    """(RSS, peak RSS) of this process in bytes; the peak is None where /proc/self/status is missing."""
    try:
        found = {k: int(v) * 1024 for k, v in _FIELD.findall(STATUS.read_text())}
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss), None
    return found["VmRSS"], found.get("VmHWM")


class MemoryMeter:
    """This process's memory now and its peak since the last `reset`: torch's allocator on CUDA, RSS on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.source = "torch" if cuda else "rss"
        self.note: str | None = None  # set when a peak could not be measured as such
        self._peak_since_reset = True  # CPU: False once clear_refs was refused (the peak is then the current RSS)
        self._erased: dict[str, int] = {}  # the highest peaks a reset wiped out

    def read(self) -> dict[str, int]:
        """{"bytes", "peak_bytes"} (CUDA: reserved, plus "allocated_bytes", "peak_allocated_bytes")."""
        if self.cuda:
            import torch

            return {
                "bytes": int(torch.cuda.memory_reserved()),
                "peak_bytes": int(torch.cuda.max_memory_reserved()),
                "allocated_bytes": int(torch.cuda.memory_allocated()),
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            }
        rss, peak = _rss_and_peak()
        if peak is None:
            self.note = "no /proc/self/status here: each phase's peak is its RSS when it ended"
        return {"bytes": rss, "peak_bytes": max(rss, peak) if peak is not None and self._peak_since_reset else rss}

    def reset(self) -> None:
        """Start a new window: the peak drops to the current level (the peak it erases is kept for `run_peaks`)."""
        if self.cuda:
            import torch

            self._keep("reserved", torch.cuda.max_memory_reserved())
            self._keep("allocated", torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            return
        if not self._peak_since_reset:
            return
        rss, peak = _rss_and_peak()
        self._keep("rss", max(rss, peak or 0))
        try:
            CLEAR_REFS.write_text("5")
        except OSError as exc:  # an old kernel, or a sandbox that refuses it: say so in the record
            self._peak_since_reset = False
            self.note = (
                f"could not reset the peak RSS ({CLEAR_REFS}: {exc}): later phases' peaks are their RSS when they ended"
            )

    def _keep(self, name: str, value: int) -> None:
        self._erased[name] = max(self._erased.get(name, 0), int(value))

    def run_peaks(self) -> dict[str, int]:
        """The process's peaks so far with the resets undone: {"reserved", "allocated"} on CUDA, {"rss"} on the CPU."""
        if self.cuda:
            import torch

            return {
                "reserved": max(self._erased.get("reserved", 0), int(torch.cuda.max_memory_reserved())),
                "allocated": max(self._erased.get("allocated", 0), int(torch.cuda.max_memory_allocated())),
            }
        rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
        return {"rss": max(self._erased.get("rss", 0), rss)}


class PhaseProbe(TrainerCallback):
    """Records memory at the end of each phase of the first optimizer step, then does nothing."""

    def __init__(self, cuda: bool, on_record: Callable[[dict[str, Any]], None] | None = None):
        self.meter = MemoryMeter(cuda)
        self.on_record = on_record  # gets `record()` after each phase (jobs.train.recipe: phases.json)
        self.phases: dict[str, dict[str, int]] = {}
        self.done = False  # the first optimizer step was measured: nothing more to do
        self._notes: list[str] = []
        self._starts = 0
        self._hook: Any = None

    def record(self) -> dict[str, Any]:
        """What was measured so far, in the `phases.json` form (jobs.train.phases)."""
        data: dict[str, Any] = {
            "source": self.meter.source,
            "device": "cuda" if self.meter.cuda else "cpu",
            "phases": {name: self.phases[name] for name in PHASES if name in self.phases},
        }
        note = "; ".join(n for n in (*self._notes, self.meter.note) if n)
        if note:
            data["note"] = note
        return data

    # ------------------------------------------------------------------ trainer events
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The model and data are loaded: the load phase ends, the forward window starts."""
        if self.done:
            return
        self._remove_hook()
        self._starts += 1
        self.phases.clear()  # the trainer starts again (auto_find_batch_size after an OOM): measure afresh
        self._notes = []
        if state.global_step:
            self._notes.append(f"resumed at step {state.global_step}: load includes the checkpoint's optimizer state")
        if self._starts > 1:
            self._notes.append(f"measured at the trainer's start #{self._starts} (a smaller micro-batch after an OOM)")
        self._mark("load")

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Hook the model's forward just before the first micro-batch (after any evaluation at start)."""
        model = kwargs.get("model")
        if self.done or self._hook is not None or "forward" in self.phases or model is None:
            return
        self._hook = model.register_forward_hook(self._after_forward)

    def _after_forward(self, module: Any, inputs: Any, output: Any) -> None:
        self._remove_hook()
        if not self.done and "forward" not in self.phases:
            self._mark("forward")

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The step's forward and backward passes are done, the gradients alive: the backward phase ends."""
        if self.done:
            return
        self._remove_hook()  # a model whose forward never reached the hook has no forward reading
        self._mark("backward")

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The first optimizer step is done: the optimizer phase ends, and with it the probe's work."""
        if self.done:
            return
        self._mark("optimizer", last=True)
        self.done = True

    # ------------------------------------------------------------------ helpers
    def _mark(self, name: str, last: bool = False) -> None:
        """End phase `name`: read, start the next window (none after the last), hand the record on."""
        self.phases[name] = self.meter.read()
        if not last:
            self.meter.reset()
        if self.on_record is not None:
            try:
                self.on_record(self.record())
            except OSError:  # bookkeeping: a full disk must not stop the training here
                log.exception("could not save the memory of phase %s", name)
        reading = self.phases[name]
        log.info(
            "memory after %s: %s (peak %s)", name, human_bytes(reading["bytes"]), human_bytes(reading["peak_bytes"])
        )

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
