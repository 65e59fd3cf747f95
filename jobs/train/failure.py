"""Why a training run failed, in one line a user can act on.

    summarize(exc, spec)   # 'CUDA out of memory. To use less memory try: ...', 'non-finite loss at step 7: ...'
    disk_full(exc)         # True for 'no space left on device', however torch or safetensors reported it

The training recipe (`jobs.train.recipe`) writes the summary to the run row (the run page and `tunedeck show` print it).
"""

from __future__ import annotations

import errno

from jobs.errors import ProblemError
from jobs.spec.enums import Method, Precision
from jobs.spec.job import JobSpec
from jobs.spec.tricks import checkpointing


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or inf."""

    def __init__(self, step: int):
        super().__init__(f"non-finite loss at step {step}")
        self.step = step


def oom_advice(spec: JobSpec) -> str:
    """Which memory tricks the spec could still turn on."""
    tips = []
    if spec.per_device_train_batch_size > 1:
        tips.append(
            f"per_device_train_batch_size {spec.per_device_train_batch_size} -> "
            f"{max(1, spec.per_device_train_batch_size // 2)} with gradient_accumulation_steps x2"
        )
    if (tip := checkpointing.oom_tip(spec)) is not None:
        tips.append(tip)
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
