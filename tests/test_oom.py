"""OOM recovery (issue 8 item 7): a real `torch.cuda.OutOfMemoryError` raised from the forward pass
above a batch size, through the real worker and real training processes, on the CPU."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import training_helpers

from jobs.spec.enums import Optim
from jobs.spec.job import JobSpec
from jobs.spec.stored import spec_of
from jobs.train import oom
from jobs.worker.loop import Worker
from storage.models import RunStatus
from storage.store import Store

ROOT = Path(__file__).resolve().parents[1]

# The training child, with a forward pre-hook that raises CUDA's OOM error when the micro-batch is
# above MAX_BATCH (from step FROM_STEP on), when gradient checkpointing is off (from NEED_GC_FROM), or
# when the optimizer is not 8-bit (from NEED_8BIT_FROM).
CHILD = """
import signal, sys
sys.path.insert(0, {root!r})
import torch
from transformers import TrainerCallback
from jobs.train import child as train

MAX_BATCH, FROM_STEP, NEED_GC_FROM, NEED_8BIT_FROM = {max_batch}, {from_step}, {need_gc_from}, {need_8bit_from}

class OomAbove(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        def hook(module, inputs):
            batch, step = inputs[0].shape[0], state.global_step
            print(f"forward batch={{batch}} step={{step + 1}} gc={{args.gradient_checkpointing}}", flush=True)
            if step >= FROM_STEP and batch > MAX_BATCH:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            if NEED_GC_FROM is not None and step >= NEED_GC_FROM and not args.gradient_checkpointing:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            if NEED_8BIT_FROM is not None and step >= NEED_8BIT_FROM and "8bit" not in getattr(args.optim, "value", ""):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
        model.get_input_embeddings().register_forward_pre_hook(hook)

train.setup_logging()
signal.signal(signal.SIGTERM, train._on_sigterm)
sys.exit(train.run(int(sys.argv[1]), callbacks=[OomAbove()]))
"""


def worker_with_oom(
    store: Store,
    tmp_path: Path,
    *,
    max_batch: int,
    from_step: int = 0,
    need_gc_from: int | None = None,
    need_8bit_from: int | None = None,
) -> Worker:
    script = tmp_path / "oom_child.py"
    script.write_text(
        textwrap.dedent(
            CHILD.format(
                root=str(ROOT),
                max_batch=max_batch,
                from_step=from_step,
                need_gc_from=need_gc_from,
                need_8bit_from=need_8bit_from,
            )
        )
    )
    return Worker(
        store, child_argv=lambda run_id: [sys.executable, str(script), str(run_id)], sample=False, poll_interval=0.2
    )


def loss_steps(store: Store, run_id: int) -> list[int]:
    return [p.step for p in store.metrics(run_id, ["loss"])]


# ---------------------------------------------------------------------- the ladder (pure)
def test_ladder_halves_then_checkpoints_then_8bit_then_gives_up() -> None:
    spec = JobSpec(per_device_train_batch_size=16, gradient_accumulation_steps=1)
    first = oom.next_recovery(spec, done=0)
    assert (first.spec.per_device_train_batch_size, first.spec.gradient_accumulation_steps) == (8, 2)
    assert first.spec.effective_batch_size == spec.effective_batch_size and first.rung == 0
    second = oom.next_recovery(first.spec, done=1, last_rung=first.rung)
    assert second.spec.gradient_checkpointing and second.spec.per_device_train_batch_size == 8
    third = oom.next_recovery(second.spec, done=2, last_rung=second.rung)
    assert third.spec.optim is Optim.ADAMW_8BIT and third.fresh_optimizer
    assert oom.next_recovery(third.spec, done=3, last_rung=third.rung) is None


def test_ladder_skips_rungs_that_do_not_apply_and_keeps_odd_effective_batches() -> None:
    one = JobSpec(per_device_train_batch_size=1, gradient_checkpointing=True)
    assert oom.next_recovery(one, done=0).spec.optim is Optim.ADAMW_8BIT
    odd = oom.next_recovery(JobSpec(per_device_train_batch_size=9, gradient_accumulation_steps=2), done=0).spec
    assert (odd.per_device_train_batch_size, odd.gradient_accumulation_steps) == (3, 6)
    assert oom.next_recovery(JobSpec.from_dict({"on_oom": "fail"}), done=0) is None
    nothing_left = JobSpec(per_device_train_batch_size=1, gradient_checkpointing=True, optim=Optim.ADAMW_8BIT)
    assert oom.next_recovery(nothing_left, done=0) is None


def test_event_message_names_step_batch_and_what_it_continued_with() -> None:
    spec = JobSpec(per_device_train_batch_size=16)
    msg = oom.event_message(12, spec, oom.next_recovery(spec, 0), resume_step=10)
    assert msg == "OOM at step 12 with micro-batch 16; continued with 8 x 2 from the checkpoint at step 10"


# ---------------------------------------------------------------------- through the real worker
@pytest.mark.integration
@pytest.mark.slow
def test_oom_recovers_through_the_worker_batch_then_checkpointing_then_8bit(
    store: Store, tiny_model: Path, tmp_path: Path
) -> None:
    spec = training_helpers.tiny_spec(
        tiny_model, max_steps=8, max_length=64, per_device_train_batch_size=4, save_steps=2, lr_scheduler_type="linear"
    )
    run_id = store.create_run(spec)
    worker = worker_with_oom(store, tmp_path, max_batch=2, from_step=3, need_gc_from=4, need_8bit_from=6)
    assert worker.work(burst=True) == 1
    run = store.get_run(run_id)
    log = Path(run.log_path).read_text()
    assert run.status is RunStatus.SUCCEEDED, (run.error_summary, log[-3000:])
    messages = [e["message"] for e in oom.recoveries(store, run_id)]
    assert messages == [
        "OOM at step 4 with micro-batch 4; continued with 2 x 2 from the checkpoint at step 2",
        "OOM at step 5 with micro-batch 2; turned on gradient checkpointing (2 x 2) from the checkpoint at step 4",
        "OOM at step 7 with micro-batch 2; switched to adamw_bnb_8bit (2 x 2) from the checkpoint at step 6; "
        "optimizer state starts afresh",
    ]
    # The original spec stays; the effective one is what trl got in the last process.
    assert (spec_of(run).per_device_train_batch_size, spec_of(run).gradient_accumulation_steps) == (4, 1)
    effective = oom.effective_spec(store, run_id, spec_of(run))
    assert (effective.per_device_train_batch_size, effective.gradient_accumulation_steps) == (2, 2)
    assert effective.gradient_checkpointing and effective.optim is Optim.ADAMW_8BIT
    assert effective.effective_batch_size == spec.effective_batch_size
    trainer_config = run.resolved_config["trainer_config"]
    assert (trainer_config["per_device_train_batch_size"], trainer_config["gradient_accumulation_steps"]) == (2, 2)
    assert trainer_config["activation_checkpointing"] is True and trainer_config["optim"] == "adamw_bnb_8bit"
    later = log.split("forward batch=4 step=4")[-1]  # what the later processes ran
    assert "forward batch=4" not in later and "forward batch=2 step=8 gc=True" in later
    assert loss_steps(store, run_id) == list(range(1, 9))  # resumed, nothing duplicated
    # The 32-bit optimizer state is kept aside, and the linear schedule went on where it was.
    assert (Path(run.log_path).parent / "output" / "checkpoint-6" / oom.SET_ASIDE).is_file()
    lrs = [p.value for p in store.metrics(run_id, ["learning_rate"])]
    assert len(lrs) == 8 and all(a > b for a, b in zip(lrs, lrs[1:])), lrs
    # Shown where a user looks: `tunedeck show` and the run page's header.
    from app.cli.show import show_text
    from app.ui.run import RunPageData

    shown = show_text(store, run)
    assert messages[0] in shown and "per_device_train_batch_size: 4 -> 2" in shown
    assert "gradient_checkpointing: False -> True" in shown and "optim: adamw_torch -> adamw_bnb_8bit" in shown
    header = RunPageData(store).refresh(run_id, None)[0]
    assert messages[2] in header and "`per_device_train_batch_size` 4 -> 2" in header


@pytest.mark.integration
def test_oom_with_on_oom_fail_fails_with_advice_and_no_events(store: Store, tiny_model: Path, tmp_path: Path) -> None:
    spec = training_helpers.tiny_spec(
        tiny_model, max_steps=4, max_length=64, per_device_train_batch_size=4, on_oom="fail"
    )
    run_id = store.create_run(spec)
    worker_with_oom(store, tmp_path, max_batch=2).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED and run.exit_code == 1
    assert run.error_summary.startswith("CUDA out of memory. To use less memory try:"), run.error_summary
    assert "per_device_train_batch_size 4 -> 2" in run.error_summary
    assert store.run_events(run_id) == []


@pytest.mark.integration
def test_oom_after_three_recoveries_fails_and_says_so(store: Store, tiny_model: Path, tmp_path: Path) -> None:
    spec = training_helpers.tiny_spec(tiny_model, max_steps=4, max_length=64, per_device_train_batch_size=4)
    run_id = store.create_run(spec)
    current: Any = spec
    for done in range(oom.MAX_RECOVERIES):  # as if three processes had already recovered
        found = oom.next_recovery(current, done, done - 1 if done else -1)
        current = found.spec
        store.add_run_event(
            run_id, oom.EVENT_KIND, f"recovery {done}", step=1, data={"rung": found.rung, "spec": current.to_dict()}
        )
    worker_with_oom(store, tmp_path, max_batch=0).work(burst=True)  # every forward runs out of memory
    run = store.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert "after 3 automatic recoveries" in run.error_summary
    assert len(oom.recoveries(store, run_id)) == 3
