"""Memory tricks as pure spec changes: one function per trick, spec in, changed spec (or why not) out.

Both the out-of-memory recovery (`jobs.train.oom`) and the trick sweep (`jobs.queue.sweep`) apply these, so a
trick means the same thing wherever it is turned on. Each returns `Applied(spec, note)` or
`NotApplicable(reason)`; nothing here touches a device, a file or the database.

    found = apply(Trick.ACCUMULATION, spec)       # micro-batch 16 x 1 -> 8 x 2
    if isinstance(found, Applied): spec = found.spec
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from jobs.spec.enums import Method, Optim, Precision
from jobs.spec.job import JobSpec


class Trick(str, Enum):
    BASELINE = "baseline"
    GRADIENT_CHECKPOINTING = "gradient_checkpointing"
    ACCUMULATION = "accumulation"
    OPTIM_8BIT = "optim_8bit"
    BF16 = "bf16"
    FP16 = "fp16"
    LORA = "lora"
    QLORA = "qlora"
    # The newer tricks (jobs.config.tricks): the sweep's check drops the ones the worker's device cannot run.
    OFFLOADING = "activation_offloading"
    CPU_ALLOCATOR = "cpu_return_freed_memory"
    LIGER = "use_liger_kernel"
    GALORE = "galore"
    COMPILE = "torch_compile"


TRICK_HELP = {
    Trick.BASELINE: "the spec as written",
    Trick.GRADIENT_CHECKPOINTING: "recompute activations in the backward pass",
    Trick.ACCUMULATION: "smaller micro-batch, more accumulation steps (same effective batch)",
    Trick.OPTIM_8BIT: "8-bit AdamW (bitsandbytes)",
    Trick.BF16: "bf16 mixed precision",
    Trick.FP16: "fp16 mixed precision with loss scaling",
    Trick.LORA: "LoRA adapters on a frozen base",
    Trick.QLORA: "LoRA on a 4-bit NF4 base",
    Trick.OFFLOADING: "saved activations in host RAM (CUDA)",
    Trick.CPU_ALLOCATOR: "freed memory returned to the system (CPU workers)",
    Trick.LIGER: "Liger's Triton kernels (CUDA)",
    Trick.GALORE: "GaLore: low-rank optimizer state (full fine-tuning)",
    Trick.COMPILE: "torch.compile (CUDA; minutes of compiling on a CPU)",
}
# The boolean tricks: the spec field each turns on.
_FLAGS = {Trick.OFFLOADING: "activation_offloading", Trick.CPU_ALLOCATOR: "cpu_return_freed_memory",
          Trick.LIGER: "use_liger_kernel", Trick.COMPILE: "torch_compile"}  # fmt: skip

# The 8-bit counterpart of each 32-bit optimizer state.
_EIGHT_BIT = {Optim.ADAMW: Optim.ADAMW_8BIT, Optim.PAGED_ADAMW_32BIT: Optim.PAGED_ADAMW_8BIT}


@dataclass(frozen=True)
class Applied:
    spec: JobSpec
    note: str  # what changed, in words: "micro-batch 16 x 1 -> 8 x 2"


@dataclass(frozen=True)
class NotApplicable:
    reason: str


def _smallest_factor(n: int) -> int:
    """The smallest prime factor of n >= 2 (n itself when prime)."""
    f = 2
    while f * f <= n:
        if n % f == 0:
            return f
        f += 1
    return n


def smaller_micro_batch(spec: JobSpec) -> Applied | NotApplicable:
    """Divide the micro-batch by its smallest factor (2 when even), multiply accumulation by it."""
    mb, acc = spec.per_device_train_batch_size, spec.gradient_accumulation_steps
    if mb <= 1:
        return NotApplicable("the micro-batch is already 1")
    f = _smallest_factor(mb)
    changed = spec.replace(per_device_train_batch_size=mb // f, gradient_accumulation_steps=acc * f)
    return Applied(changed, f"micro-batch {mb} x {acc} -> {mb // f} x {acc * f}")


def checkpointing(spec: JobSpec) -> Applied | NotApplicable:
    if spec.gradient_checkpointing:
        return NotApplicable("gradient checkpointing is already on")
    if spec.method is Method.PREFIX_TUNING:
        return NotApplicable("prefix tuning fails with gradient checkpointing")
    return Applied(spec.replace(gradient_checkpointing=True), "gradient checkpointing on")


def optimizer_8bit(spec: JobSpec) -> Applied | NotApplicable:
    target = _EIGHT_BIT.get(spec.optim)
    if target is None:
        return NotApplicable(f"optimizer {spec.optim.value} has no 8-bit counterpart here (or is 8-bit already)")
    return Applied(spec.replace(optim=target), f"optimizer {spec.optim.value} -> {target.value}")


def precision(spec: JobSpec, wanted: Precision, cuda: bool, bf16: bool) -> Applied | NotApplicable:
    """Mixed precision where the target device supports it (fp16 needs CUDA; bf16 a GPU that has it)."""
    if spec.precision is wanted:
        return NotApplicable(f"precision is already {wanted.value}")
    if not cuda:
        return NotApplicable(f"{wanted.value} mixed precision needs a CUDA device; the worker has none")
    if wanted is Precision.BF16 and not bf16:
        return NotApplicable("the worker's GPU does not support bf16")
    return Applied(spec.replace(precision=wanted), f"precision {spec.precision.value} -> {wanted.value}")


def method(spec: JobSpec, wanted: Method) -> Applied | NotApplicable:
    order = {Method.FULL: 0, Method.LORA: 1, Method.QLORA: 2}
    if spec.method is wanted:
        return NotApplicable(f"the method is already {wanted.value}")
    if spec.method not in order or order[spec.method] > order[wanted]:
        return NotApplicable(f"{wanted.value} would not save memory over {spec.method.value}")
    return Applied(spec.replace(method=wanted), f"method {spec.method.value} -> {wanted.value}")


def flag(spec: JobSpec, name: str, cuda: bool) -> Applied | NotApplicable:
    """Turn a boolean trick on; torch.compile only on CUDA (the CPU's inductor compiles for minutes)."""
    if getattr(spec, name):
        return NotApplicable(f"{name} is already on")
    if name == "torch_compile" and not cuda:
        return NotApplicable("torch.compile on a CPU compiles for minutes (longer than a probe)")
    if name == "cpu_return_freed_memory" and cuda:
        return NotApplicable("it changes a CPU worker's allocator; a GPU run's memory is torch's")
    return Applied(spec.replace(**{name: True}), f"{name} on")


def galore(spec: JobSpec) -> Applied | NotApplicable:
    if spec.method is not Method.FULL:
        return NotApplicable(f"GaLore is for full fine-tuning; method {spec.method.value} trains adapters")
    if spec.optim is Optim.GALORE_ADAMW:
        return NotApplicable("the optimizer is already galore_adamw")
    return Applied(spec.replace(optim=Optim.GALORE_ADAMW), f"optimizer {spec.optim.value} -> galore_adamw")


def apply(trick: Trick, spec: JobSpec, *, cuda: bool = False, bf16: bool = False) -> Applied | NotApplicable:
    """Apply one trick; `cuda`/`bf16` describe the device that will run it (for precision tricks)."""
    if trick is Trick.BASELINE:
        return Applied(spec, "as written")
    if trick is Trick.GRADIENT_CHECKPOINTING:
        return checkpointing(spec)
    if trick is Trick.ACCUMULATION:
        return smaller_micro_batch(spec)
    if trick is Trick.OPTIM_8BIT:
        return optimizer_8bit(spec)
    if trick in (Trick.BF16, Trick.FP16):
        return precision(spec, Precision(trick.value), cuda, bf16)
    if trick in _FLAGS:
        return flag(spec, _FLAGS[trick], cuda)
    if trick is Trick.GALORE:
        return galore(spec)
    return method(spec, Method(trick.value))
