"""Recovery from CUDA out-of-memory errors (`on_oom: recover`, the default).

When a training step runs out of GPU memory, the training child (`jobs.train.recipe`) asks
`next_recovery` for the next rung of a fixed ladder, cheapest in speed first:

1. a smaller micro-batch with more accumulation steps (16 x 1 -> 8 x 2: same effective batch,
   so the optimisation is unchanged; smaller kernels cost a little speed);
2. gradient checkpointing (activations recomputed in the backward pass: ~20-30% slower);
3. the 8-bit AdamW optimizer (optimizer state ~2 B/param instead of 8; its state starts afresh,
   as the 32-bit state cannot be read into it).

A rung that does not apply (micro-batch already 1, checkpointing already on) is skipped. The
child records the change as a run event whose data holds the spec to continue with, then exits
with `EXIT_OOM_RECOVER`; the worker starts a fresh child (a clean CUDA context, no fragmented
allocator) for the same run, which reads that effective spec (`recovered_spec_data`) and resumes from
the last complete checkpoint, or starts over when there is none. At most `MAX_RECOVERIES`
changes per run; after that, or with `on_oom: fail`, the run fails with advice as before.

    plan = next_recovery(spec, done=0)      # Recovery(spec=..., notes=[...]) or None
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.spec.enums import OnOom
from jobs.spec.job import JobSpec
from jobs.spec.tricks import accumulation, checkpointing, optimizer_8bit
from jobs.spec.tricks.record import Applied
from storage.roles import RunEvents

log = logging.getLogger(__name__)

MAX_RECOVERIES = 3
EXIT_OOM_RECOVER = 75  # the child's exit code: "out of memory, recorded a change, start me again"
EVENT_KIND = "oom_recovery"
LADDER = (accumulation.smaller_micro_batch, checkpointing.step, optimizer_8bit.optimizer_8bit)


@dataclass(frozen=True)
class Recovery:
    spec: JobSpec
    note: str  # "micro-batch 16 x 1 -> 8 x 2"
    rung: int  # index into LADDER
    fresh_optimizer: bool  # the optimizer changed: its checkpointed state cannot be loaded


def next_recovery(spec: JobSpec, done: int, last_rung: int = -1) -> Recovery | None:
    """The next change to try after an OOM, or None (policy fail, limit reached, nothing left)."""
    if spec.on_oom is not OnOom.RECOVER or done >= MAX_RECOVERIES:
        return None
    for rung in range(last_rung + 1, len(LADDER)):
        found = LADDER[rung](spec)
        if isinstance(found, Applied):
            return Recovery(found.spec, found.note, rung, fresh_optimizer=found.spec.optim is not spec.optim)
    return None


def event_message(step: int, before: JobSpec, recovery: Recovery, resume_step: int | None) -> str:
    """'OOM at step 12 with micro-batch 16; continued with 8 x 2 from the checkpoint at step 10'."""
    after = recovery.spec
    shape = f"{after.per_device_train_batch_size} x {after.gradient_accumulation_steps}"
    change = {
        0: f"continued with {shape}",
        1: f"turned on gradient checkpointing ({shape})",
        2: f"switched to {after.optim.value} ({shape})",
    }[recovery.rung]
    where = (
        f"from the checkpoint at step {resume_step}" if resume_step is not None else "from step 0 (no checkpoint yet)"
    )
    fresh = "; optimizer state starts afresh" if recovery.fresh_optimizer and resume_step is not None else ""
    return f"OOM at step {step} with micro-batch {before.per_device_train_batch_size}; {change} {where}{fresh}"


def recoveries(store: RunEvents, run_id: int) -> list[dict[str, Any]]:
    """The run's recorded OOM recoveries, oldest first (each with its data: spec, rung, step)."""
    return [e for e in store.run_events(run_id) if e["kind"] == EVENT_KIND]


def effective_spec(store: RunEvents, run_id: int, original: JobSpec) -> JobSpec:
    """The spec the run continues with: the last recovery's, else the one submitted."""
    return effective_spec_from(store.run_events(run_id), original)


def effective_spec_from(events: list[dict[str, Any]], original: JobSpec) -> JobSpec:
    """effective_spec over events already read."""
    recovered = recovered_spec_data(events)
    return JobSpec.from_dict(recovered) if recovered is not None else original


def recovered_spec_data(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The spec the last recovery among `events` continues with, as stored (None: no recovery); the training
    child parses it, in place of the submitted one (`jobs.train.recipe.load_spec`)."""
    found = [e for e in events if e["kind"] == EVENT_KIND]
    return dict(found[-1]["data"]["spec"]) if found else None


SET_ASIDE = "optimizer.pt.before-oom-recovery"


def set_aside_optimizer_state(checkpoint: Path) -> Path | None:
    """Rename the checkpoint's optimizer state so the trainer starts the new optimizer afresh (kept, not deleted)."""
    state = checkpoint / "optimizer.pt"
    if not state.is_file():
        return None
    kept = checkpoint / SET_ASIDE
    state.rename(kept)
    return kept


def scheduler_restorer(resume_from: str | None) -> Any | None:
    """A trainer callback that loads the checkpoint's scheduler state after an optimizer change.

    Without optimizer.pt the HF Trainer skips scheduler.pt too, and the learning-rate schedule
    would start over (warm-up again) in the middle of the run. None when there is nothing to do."""
    folder = Path(resume_from) if resume_from else None
    if (
        folder is None
        or not (folder / SET_ASIDE).is_file()
        or (folder / "optimizer.pt").is_file()
        or not (folder / "scheduler.pt").is_file()
    ):
        return None
    scheduler_file = folder / "scheduler.pt"
    from transformers import TrainerCallback

    class RestoreScheduler(TrainerCallback):
        def on_train_begin(
            self, args: Any, state: Any, control: Any, optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any
        ) -> None:
            import torch

            lr_scheduler.load_state_dict(torch.load(scheduler_file, weights_only=True))
            for group, lr in zip(optimizer.param_groups, lr_scheduler.get_last_lr()):
                group["lr"] = lr  # the next step runs at the schedule's rate, not the initial one
            log.info("restored the learning-rate schedule from %s (optimizer state starts afresh)", folder)

    return RestoreScheduler()


def handle(store: RunEvents, run_id: int, spec: JobSpec, step: int, output_dir: Path) -> bool:
    """After an OOM: record the next change and return True (exit EXIT_OOM_RECOVER), or False (fail)."""
    from storage.checkpoints import last_complete

    past = recoveries(store, run_id)
    last_rung = past[-1]["data"]["rung"] if past else -1
    recovery = next_recovery(spec, len(past), last_rung)
    if recovery is None:
        return False
    last = last_complete(output_dir)
    if recovery.fresh_optimizer and last is not None:
        set_aside_optimizer_state(last[1])
    message = event_message(step, spec, recovery, last[0] if last else None)
    data = {
        "step": step,
        "rung": recovery.rung,
        "change": recovery.note,
        "per_device_train_batch_size": recovery.spec.per_device_train_batch_size,
        "gradient_accumulation_steps": recovery.spec.gradient_accumulation_steps,
        "resume_step": last[0] if last else None,
        "spec": recovery.spec.to_dict(),
    }
    store.add_run_event(run_id, EVENT_KIND, message, step=step, data=json.loads(json.dumps(data)))
    log.warning("run %s: %s", run_id, message)
    return True


def changes(original: JobSpec, effective: JobSpec) -> dict[str, Any]:
    """The fields a recovery changed: {name: (submitted, continued with)}."""
    before, after = original.to_dict(), effective.to_dict()
    return {k: (before[k], after[k]) for k in before if before[k] != after[k]}
