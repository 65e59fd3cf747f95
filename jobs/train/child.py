"""The training child: one run, one process. The worker spawns it; it is also runnable by hand.

    python -m jobs.train.child --run-id 7        # reads the spec from the store, trains, records

It loads the run's `JobSpec` from the store (TUNEDECK_DATABASE_URL / TUNEDECK_HOME), maps it to
trl/peft/bitsandbytes configs with the pure `jobs.config.mapping`, trains with trl's SFTTrainer or
DPOTrainer plus `StoreCallback`, evaluates, answers a few held-out prompts with the base (before
training) and the result (after: `jobs.train.before_after`), writes the bundle (`jobs.train.artifacts`) and marks the
run succeeded; any exception marks it failed with a one-line summary and the traceback (exit 1).
SIGTERM stops training at the next step boundary, saves a checkpoint there and marks the run
cancelled (exit 0). A run put back in the queue (`tunedeck resume`) continues from its last
complete checkpoint (`jobs.train.checkpoints`) with optimizer, scheduler and RNG state; its metric
rows after that step are deleted first, so none is duplicated. A non-finite loss fails the run
("non-finite loss at step N") and keeps the last good checkpoint; a full disk while saving
fails it with the folder named and the half-written checkpoint removed. A CUDA out-of-memory
error in training, with `on_oom: recover`, records the next memory trick as a run event and exits
with `jobs.train.oom.EXIT_OOM_RECOVER`; the worker starts the run again with that change (`jobs.train.oom`).
Output goes to stdout, which the worker sends to the run's train.log.

`train_spec(spec, output_dir, callbacks)` does the training without any store (tests, bench).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import resource
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from jobs.config.mapping import (
    QUANTIZED_METHODS,
    capability_problems,
    capability_warnings,
    peft_config,
    quantization_config,
    resolve_precision,
    resolved_config,
    torch_dtype_name,
    training_config,
)
from jobs.devices.facts import Device
from jobs.devices.probe import detect_device
from jobs.errors import Problem, ProblemError
from jobs.memory.flops import FlopsRate
from jobs.spec.enums import Method, Precision, Trainer
from jobs.spec.job import JobSpec, SpecError
from jobs.train import before_after, figures, oom
from jobs.train.callbacks import STOP_REQUESTED, StoreCallback
from jobs.train.readback import final_micro_batch, trainer_readback
from jobs.train.trainers import build_trainer, perplexity

log = logging.getLogger("jobs.train.child")


@dataclass
class TrainResult:
    """What a finished (or stopped) training produced."""

    model: Any
    tokenizer: Any
    trainer: Any
    metrics: dict[str, float]
    resolved: dict[str, Any]
    stopped: bool = False
    log_history: list[dict[str, Any]] = field(default_factory=list)


def peak_memory(device: Device) -> tuple[int, str]:
    """Peak torch reserved memory on CUDA, else the process's peak RSS: (bytes, source)."""
    if device.cuda:
        import torch

        return int(torch.cuda.max_memory_reserved()), "torch"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "host"  # Linux: KiB


def count_params(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters; peft counts 4-bit weights at their real element count."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        return int(trainable), int(total)
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def trained_tokens(log_history: Sequence[dict[str, Any]]) -> float | None:
    """Non-pad tokens trained, as counted by trl (`num_tokens` of the last training log)."""
    for entry in reversed(log_history):
        if "num_tokens" in entry and "eval_loss" not in entry:
            return float(entry["num_tokens"])
    return None


def load_model(spec: JobSpec, device: Device) -> tuple[Any, Any]:
    """Resolve and load the spec's model (quantized when the method asks) and its tokenizer."""
    import torch

    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import resolve_model

    precision = resolve_precision(spec, device)
    resolved = resolve_model(spec.model, trust_remote_code=spec.trust_remote_code)
    model, tokenizer = load_model_and_tokenizer(
        resolved,
        torch_dtype=getattr(torch, torch_dtype_name(spec, precision)),
        quantization_config=quantization_config(spec, precision),
        trust_remote_code=spec.trust_remote_code,
        reward_head=spec.trainer is Trainer.REWARD,
    )
    return model, tokenizer


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or inf."""

    def __init__(self, step: int):
        super().__init__(f"non-finite loss at step {step}")
        self.step = step


def _checkpoint_step(resume_from: str | None) -> int:
    """The step of a `checkpoint-N` folder (0 without one)."""
    name = Path(resume_from).name if resume_from else ""
    return int(name.split("-")[-1]) if name.startswith("checkpoint-") and name.split("-")[-1].isdigit() else 0


def train_spec(
    spec: JobSpec,
    output_dir: Path | str,
    callbacks: Sequence[Any] = (),
    *,
    device: Device | None = None,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    model_and_tokenizer: tuple[Any, Any] | None = None,
    resume_from: str | None = None,
    before_training: Callable[[Any, Any, Any], None] | None = None,
    store: Any = None,
) -> TrainResult:
    """Train `spec` with trl, no store involved; `on_ready` gets the resolved config before training.

    `resume_from`: a checkpoint folder to continue from (optimizer, scheduler, RNG, step count).
    `before_training(model, tokenizer, eval_ds)`: called with the base model once the data is loaded,
    before any adapter or trainer touches it (the "before" samples).
    `store`: where a grpo spec's `reward_model_run` is looked up (default: `Store()` from the environment)."""
    from jobs.data.loading import load_data

    device = device or detect_device()
    problems = capability_problems(spec, device)
    if problems:
        raise SpecError(problems)
    for warning in capability_warnings(spec, device):
        log.warning("%s", warning)
    model, tokenizer = model_and_tokenizer or load_model(spec, device)
    loaded = load_data(spec)
    train_ds, eval_ds = loaded.train, loaded.eval
    for info in filter(None, (loaded.train_info, loaded.eval_info)):
        if info.conversion:
            log.info("data %s: %s", info.ref, info.conversion)
    log.info("data: %d training rows, %s eval rows", len(train_ds), len(eval_ds) if eval_ds is not None else "no")
    if before_training is not None:
        before_training(model, tokenizer, eval_ds)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    has_eval = eval_ds is not None
    args = training_config(spec, device, str(output_dir), has_eval=has_eval)
    resolved = resolved_config(spec, device, str(output_dir), has_eval=has_eval, model_type=model_type)
    resolved["data"] = loaded.record()  # which formats were detected and how they were converted
    peft_cfg = peft_config(spec, model_type)
    if spec.method in QUANTIZED_METHODS:
        # Casts norms/embeddings to fp32 and freezes the quantized base; trl does not do it itself.
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=spec.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    reward_model = None
    if spec.trainer is Trainer.GRPO and spec.reward_model_run is not None:
        import torch

        from jobs.train.reward_model import load_reward_model
        from storage.store import Store

        # The reward model only scores (frozen): it takes the run's compute precision.
        dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(
            resolve_precision(spec, device), torch.float32
        )
        reward_model = load_reward_model(store or Store(), spec.reward_model_run, dtype)
        log.info("reward model: run %s", spec.reward_model_run)
    trainer = build_trainer(spec, model, tokenizer, args, train_ds, eval_ds, peft_cfg, callbacks, reward_model)
    if spec.trainer is Trainer.REWARD and len(trainer.train_dataset) == 0:
        # trl's RewardTrainer drops rows over max_length; with none left it fails with "num_samples=0".
        raise SpecError(
            [
                Problem(
                    "max_length",
                    f"every training row is longer than {spec.max_length} tokens, and the "
                    "reward trainer drops such rows",
                    "raise max_length (the data preview counts long rows)",
                )
            ]
        )
    # Record what the trainer resolved (trl turns padding-free on with packing, for one), not what it was asked.
    resolved["trainer_config"], resolved["library_changes"] = trainer_readback(trainer, resolved["trainer_config"])
    if peft_cfg is not None:
        from jobs.train.adapter_setup import prepare_adapter

        prepare_adapter(spec, trainer, output_dir)
    trainable, total = count_params(trainer.model)
    resolved["trainable_params"], resolved["total_params"] = trainable, total
    log.info("trainable parameters: %d of %d (%.3f%%)", trainable, total, 100 * trainable / max(total, 1))
    if on_ready is not None:
        on_ready(resolved)
    output = trainer.train(resume_from_checkpoint=resume_from)
    final_batch = final_micro_batch(trainer) if spec.auto_find_batch_size else None
    if final_batch is not None and final_batch != spec.per_device_train_batch_size:
        # the loop halved the micro-batch after an out-of-memory error: the record says what ran
        resolved["trainer_config"]["per_device_train_batch_size"] = final_batch
        resolved["library_changes"]["per_device_train_batch_size"] = {
            "requested": spec.per_device_train_batch_size,
            "effective": final_batch,
        }
    nonfinite = [cb.nonfinite_step for cb in callbacks if getattr(cb, "nonfinite_step", None) is not None]
    if nonfinite:
        raise NonFiniteLoss(nonfinite[0])
    stopped = STOP_REQUESTED.is_set() or any(getattr(cb, "stop_reason", None) for cb in callbacks)
    metrics: dict[str, float] = {
        "train_loss": float(output.training_loss),
        "train_runtime": float(output.metrics.get("train_runtime", 0.0)),
        "global_step": float(output.global_step),
        "trainable_params": float(trainable),
        "total_params": float(total),
    }
    if eval_ds is not None and not stopped:
        metrics.update(
            {
                k: float(v)
                for k, v in trainer.evaluate().items()
                if k.startswith("eval_") and isinstance(v, (int, float))
            }
        )
        if "eval_loss" in metrics and spec.trainer.value == "sft":
            metrics["eval_perplexity"] = perplexity(metrics["eval_loss"])
    tokens = trained_tokens(trainer.state.log_history)
    if tokens is not None and metrics["train_runtime"] > 0:
        metrics["num_tokens"] = tokens
        metrics["tokens_per_second"] = tokens / metrics["train_runtime"]
    peak, source = peak_memory(device)
    metrics["peak_memory_bytes"] = float(peak)
    resolved["peak_memory_source"] = source
    if device.cuda:
        import torch

        metrics["peak_torch_allocated_bytes"] = float(torch.cuda.max_memory_allocated())
        metrics["peak_torch_reserved_bytes"] = float(torch.cuda.max_memory_reserved())
    else:
        metrics["peak_rss_bytes"] = float(peak)
    # A resumed trainer only timed the steps after its checkpoint: the mean is over those.
    timed_steps = metrics["global_step"] - _checkpoint_step(resume_from)
    if timed_steps > 0 and metrics["train_runtime"] > 0:
        # seconds per optimizer step from trl's clock; `run` replaces this and tokens_per_second with the
        # figures of jobs.train.figures (the store-less callers, benches and tests, keep these).
        metrics["step_time_mean"] = metrics["train_runtime"] / timed_steps
    if final_batch is not None:  # the micro-batch accelerate ended with after halving on OOM
        metrics["per_device_train_batch_size_final"] = float(final_batch)
        resolved["per_device_train_batch_size_final"] = final_batch
    return TrainResult(trainer.model, tokenizer, trainer, metrics, resolved, stopped, list(trainer.state.log_history))


# ---------------------------------------------------------------------- errors
def oom_advice(spec: JobSpec) -> str:
    """Which memory tricks the spec could still turn on."""
    tips = []
    if spec.per_device_train_batch_size > 1:
        tips.append(
            f"per_device_train_batch_size {spec.per_device_train_batch_size} -> "
            f"{max(1, spec.per_device_train_batch_size // 2)} with gradient_accumulation_steps x2"
        )
    if not spec.gradient_checkpointing and spec.method is not Method.PREFIX_TUNING:
        tips.append("gradient_checkpointing: true")
    tips.append(f"a shorter max_length (now {spec.max_length})")
    if spec.method is Method.FULL:
        tips.append("method: lora (or qlora)")
    elif spec.method in {Method.LORA, Method.DORA}:
        tips.append("method: qlora (4-bit base)")
    if spec.method is Method.FULL and spec.optim.value in {"adamw_torch", "adafactor"}:
        tips.append("optim: adamw_bnb_8bit")
    if spec.precision in {Precision.FP32}:
        tips.append("precision: auto (16-bit)")
    return "; ".join(tips)


def disk_full(exc: BaseException) -> bool:
    """Whether an error (or one it was raised from) is 'no space left on device'.

    torch.save reports it as RuntimeError 'file write failed', safetensors as 'StorageFull'."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        text = str(exc)
        if any(s in text for s in ("No space left on device", "StorageFull", "file write failed")):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def summarize(exc: BaseException, spec: JobSpec | None) -> str:
    """A one-line summary of why a run failed."""
    if isinstance(exc, NonFiniteLoss):
        return (
            f"{exc}: the last good checkpoint is kept; lower learning_rate, set max_grad_norm, "
            "or use bf16 rather than fp16"
        )
    if isinstance(exc, torch_oom()):
        advice = oom_advice(spec) if spec is not None else "smaller batch, gradient checkpointing, shorter max_length"
        return f"CUDA out of memory. To use less memory try: {advice}"
    if isinstance(exc, ProblemError) and exc.problems:
        return "; ".join(str(p) for p in exc.problems)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def torch_oom() -> type[BaseException]:
    """torch's out-of-memory error class (torch.cuda.OutOfMemoryError is the same class)."""
    import torch

    return torch.OutOfMemoryError


# ---------------------------------------------------------------------- entry point
def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Ask the training loop to stop at the next step boundary."""
    log.warning("received signal %s: stopping at the next step", signum)
    STOP_REQUESTED.set()


def setup_logging() -> None:
    """Log lines to stdout (the worker redirects it to the run's train.log)."""
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, force=True, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated.*", category=FutureWarning)
    import datasets
    import transformers

    datasets.disable_progress_bars()  # progress bars are carriage-return noise in a log file
    transformers.utils.logging.disable_progress_bar()


def resume_point(store: Any, run_id: int, output_dir: Path) -> str | None:
    """The checkpoint to continue from (None: start afresh); drops metric rows the resume redoes."""
    from jobs.train.checkpoints import last_complete, remove_incomplete

    for folder in remove_incomplete(output_dir):
        log.warning("removed incomplete checkpoint %s", folder)
    last = last_complete(output_dir)
    dropped = store.truncate_metrics(run_id, last[0] if last else -1)
    if last is None:
        if dropped:
            log.info("no complete checkpoint: starting over (%d metric rows of the earlier attempt removed)", dropped)
        return None
    log.info("resuming from %s (step %d); %d metric rows after it removed", last[1], last[0], dropped)
    return str(last[1])


def whole_run_mean(store: Any, run_id: int, name: str) -> float | None:
    """Mean of every stored value of one metric of a run (its rollups; None without rows)."""
    buckets = store.metric_series(run_id, name, 1 << 30)
    count = sum(b.count for b in buckets)
    return sum(b.total for b in buckets) / count if count else None


def run(run_id: int, store: Any | None = None, callbacks: Sequence[Any] = ()) -> int:
    """Train run `run_id` from the store; returns the process exit code.

    `callbacks`: extra trainer callbacks (tests inject faults through them)."""
    from jobs.spec.stored import stored_spec
    from jobs.train.artifacts import write_artifacts
    from jobs.train.checkpoints import checkpoint_dirs, is_complete, remove_incomplete
    from storage.store import Store

    store = store or Store()
    record = store.get_run(run_id)
    if record is None:
        log.error("run %s does not exist", run_id)
        return 1
    spec = oom.effective_spec(store, run_id, stored_spec(record.spec_json))  # after an OOM recovery: the changed spec
    log.info("run %s: %s\n%s", run_id, spec.display_name, spec.to_yaml())
    # Under a worker (it passes TUNEDECK_WORKER_ID) a cancel arrives as SIGTERM within the
    # worker's poll interval; asking the database as well would only cost the training time.
    worker_id = os.environ.get("TUNEDECK_WORKER_ID") or None
    callback = StoreCallback(
        store,
        run_id,
        save_interval_s=spec.save_minutes * 60 if spec.save_minutes else None,
        cancel_interval=None if worker_id else 2.0,
        worker_id=worker_id,
    )
    output_dir = store.run_dir(run_id) / "output"
    training = []  # set once the trainer is built: an OOM after that is one a smaller step can avoid

    def ready(cfg: dict[str, Any]) -> None:
        store.set_resolved_config(run_id, cfg)
        callback.flops = FlopsRate.for_run(cfg)
        training.append(True)

    try:
        device = detect_device()
        log.info("device: %s", device)
        resume_from = resume_point(store, run_id, output_dir)
        restore = [cb for cb in (oom.scheduler_restorer(resume_from),) if cb is not None]
        result = train_spec(
            spec,
            output_dir,
            [callback, *restore, *callbacks],
            device=device,
            resume_from=resume_from,
            on_ready=ready,
            store=store,
            before_training=lambda m, t, ev: before_after.record_before(store.run_dir(run_id), spec, m, t, ev),
        )
        callback.flush()  # eval metrics and the last steps land before the status changes
        if spec.auto_find_batch_size:  # the record gains the micro-batch training ended with
            store.set_resolved_config(run_id, result.resolved)
        store.set_peak_memory(run_id, int(result.metrics["peak_memory_bytes"]), result.resolved["peak_memory_source"])
        sampled = figures.sampled_peak(store, run_id)  # the sampler's readings so far (it records its own at the end)
        if sampled is not None:
            store.set_peak_memory(run_id, *sampled)
        if result.stopped:
            log.info("run %s stopped early (%s): marking cancelled", run_id, callback.stop_reason or "signal")
            store.mark_cancelled(run_id, exit_code=0)
            return 0
        # metrics.json, the model card and the final metrics carry the figures as the UI shows them.
        result.metrics.pop("step_time_mean", None)
        result.metrics.pop("tokens_per_second", None)
        result.metrics.update(figures.run_figures(store, store.get_run(run_id)).metrics())
        tps = result.metrics.get("tokens_per_second")
        if tps and callback.flops is not None:  # achieved TFLOP/s and MFU at the run's mean tokens/s
            result.metrics["tflops_mean"] = callback.flops.tflops(tps)
            mfu = callback.flops.mfu(tps)
            if mfu is not None:
                result.metrics["mfu_mean"] = mfu
        if resume_from is not None:
            # The trainer's train_loss covers only the steps after the resume; the stored loss rows
            # (kept up to the checkpoint, redone after it) cover the whole run.
            whole = whole_run_mean(store, run_id, "loss")
            if whole is not None:
                result.metrics["train_loss"] = whole
        samples = before_after.record_after(store, run_id, spec, result.model, result.tokenizer)
        write_artifacts(
            store, run_id, spec, result.model, result.tokenizer, result.metrics, **before_after.bundle_parts(samples)
        )
        store.mark_succeeded(run_id, result.metrics)
        log.info("run %s succeeded: %s", run_id, result.metrics)
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the run row
        try:
            callback.flush()
        except Exception:  # noqa: BLE001 - the failure itself matters more than its last metrics
            log.exception("could not write the last metrics")
        if isinstance(exc, KeyboardInterrupt) or STOP_REQUESTED.is_set():
            store.mark_cancelled(run_id, exit_code=0)
            log.info("run %s cancelled", run_id)
            return 0
        if isinstance(exc, torch_oom()) and training and oom.handle(store, run_id, spec, callback.step + 1, output_dir):
            log.warning("run %s: out of memory; the worker continues it with the change above", run_id)
            return oom.EXIT_OOM_RECOVER
        summary = summarize(exc, spec)
        past = len(oom.recoveries(store, run_id)) if isinstance(exc, torch_oom()) else 0
        if past:
            summary += f" (after {past} automatic recover{'y' if past == 1 else 'ies'}; see the run's events)"
        if disk_full(exc):
            partial = [f for _step, f in checkpoint_dirs(output_dir) if not is_complete(f)]
            what, where = ("checkpoint", partial[-1]) if partial else ("output", output_dir)
            summary = (
                f"disk full while saving {what} to {where}: free space or lower save frequency "
                f"(save_steps); earlier complete checkpoints are kept"
            )
            remove_incomplete(output_dir)  # give the space back; it could not be resumed from anyway
        log.error("run %s failed: %s\n%s", run_id, summary, traceback.format_exc())
        store.mark_failed(run_id, summary, traceback.format_exc(), exit_code=1)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `--run-id`, install the SIGTERM handler, train."""
    parser = argparse.ArgumentParser(description="Train one tunedeck run (spawned by the worker).")
    parser.add_argument("--run-id", type=int, required=True)
    ns = parser.parse_args(argv)
    setup_logging()
    signal.signal(signal.SIGTERM, _on_sigterm)
    return run(ns.run_id)


if __name__ == "__main__":
    sys.exit(main())
