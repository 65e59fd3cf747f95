"""Predict a job's peak training memory before launch, as a breakdown the form and CLI show.

Input: a `JobSpec`, the model's config (never its weights) and the `DeviceFacts` of the worker
that will run it. Output: a `Prediction` with seven parts (weights, adapter, gradients,
optimizer, activations, logits, overhead) whose sum is the predicted peak, each with the formula
that produced it. docs/memory.md explains every part; `bench/memory_truth.py` checks the
prediction against counted (CPU) or measured (CUDA) peaks.

    arch = arch_for(spec.model)                      # None when no config.json is readable here
    p = predict(spec, arch, facts)
    p.total_bytes, p.verdict, p.parts_dict()
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from jobs.config.mapping import QUANTIZED_METHODS, resolve_precision
from jobs.devices.facts import DeviceFacts
from jobs.memory.params import _targeted, trainable_params
from jobs.memory.parts import (
    ActivationPlan,
    Arch,
    adafactor_state_bytes,
    adam8bit_state_bytes,
    block_elements,
    head_bytes,
    int8_bytes,
    nf4_bytes_per_param,
)
from jobs.spec.enums import LORA_FAMILY, PROMPT_FAMILY, Method, Optim, Precision, Trainer
from jobs.spec.job import JobSpec
from jobs.units import human_bytes, human_count  # noqa: F401 - re-exported for callers

PART_NAMES = ("weights", "adapter", "gradients", "optimizer", "activations", "logits", "overhead")
TIGHT_ABOVE = 0.90  # share of the device's memory above which the verdict is "tight"
GIB = 1024**3
# CUDA context + cuBLAS/cuDNN workspaces, outside torch's allocator (NVML sees them, torch does not).
# Per device name; to be measured with `bench/memory_truth.py --device cuda` (NVML used minus
# max reserved) and replaced by measured figures as they come in. docs/memory.md "Overhead".
CUDA_CONTEXT_BYTES: dict[str, int] = {
    "default": 600 * 1024**2,
    "H100": 600 * 1024**2,
    "H200": 600 * 1024**2,
    "A100": 550 * 1024**2,
    "V100": 1343 * 1024**2,  # HF docs' bert-large table, older CUDA
}
# torch's caching allocator rounds blocks and keeps freed ones: reserved runs a few % above allocated.
ALLOCATOR_SLACK = 0.05


class Verdict(str, Enum):
    FITS = "fits"
    TIGHT = "tight"
    WILL_NOT_FIT = "will not fit"


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    formula: str


@dataclass(frozen=True)
class Prediction:
    """A predicted peak: parts that add up to it, the phase it happens in, the device it is for."""

    parts: tuple[Part, ...]
    phase: str  # "backward" (activations alive) or "optimizer step" (all gradients alive)
    device: DeviceFacts
    trainable_params: int
    total_params: int
    precision: str
    notes: tuple[str, ...] = field(default=())

    @property
    def total_bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def part(self, name: str) -> int:
        return next(p.bytes for p in self.parts if p.name == name)

    def parts_dict(self) -> dict[str, int]:
        return {p.name: p.bytes for p in self.parts}

    @property
    def share(self) -> float:
        """Predicted peak over the device's memory."""
        return self.total_bytes / self.device.total_bytes if self.device.total_bytes else float("inf")

    @property
    def verdict(self) -> Verdict:
        if self.share > 1.0:
            return Verdict.WILL_NOT_FIT
        return Verdict.TIGHT if self.share > TIGHT_ABOVE else Verdict.FITS

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`tunedeck plan --json`, stored with the run)."""
        from dataclasses import asdict

        return {
            "total_bytes": self.total_bytes,
            "parts": self.parts_dict(),
            "verdict": self.verdict.value,
            "phase": self.phase,
            "device": asdict(self.device),
            "trainable_params": self.trainable_params,
            "total_params": self.total_params,
            "precision": self.precision,
            "formulas": {p.name: p.formula for p in self.parts},
            "notes": list(self.notes),
            "cuda_context_bytes": context_bytes(self.device),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def context_bytes(device: DeviceFacts) -> int:
    """The CUDA context of this kind of GPU (0 on the CPU)."""
    if device.kind != "cuda":
        return 0
    for key, value in CUDA_CONTEXT_BYTES.items():
        if key != "default" and key.lower() in device.name.lower():
            return value
    return CUDA_CONTEXT_BYTES["default"]


def _trainable_shapes(spec: JobSpec, arch: Arch) -> list[tuple[int, ...]]:
    """Shapes of the tensors the optimizer updates (for per-tensor optimizer rules)."""
    from jobs.config.mapping import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return list(arch.param_shapes)
    if m in LORA_FAMILY:
        kwargs = peft_kwargs(spec, arch.model_type)[1]  # type: ignore[index]
        out: list[tuple[int, ...]] = []
        for lin in _targeted(spec, arch.shape, kwargs["target_modules"]):
            out += [(spec.lora_r, lin.in_features), (lin.out_features, spec.lora_r)]
            if m is Method.DORA:
                out.append((lin.out_features,))
        return out
    count = trainable_params(spec, arch.shape).trainable
    if m is Method.PROMPT_TUNING:
        return [(spec.num_virtual_tokens, arch.hidden)]
    return [(count,)]


def _plan(spec: JobSpec, arch: Arch) -> ActivationPlan:
    from jobs.config.mapping import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return ActivationPlan(weights_train=True)
    if m in LORA_FAMILY:
        kwargs = peft_kwargs(spec, arch.model_type)[1]  # type: ignore[index]
        targets = {lin.name.split(".")[-1] for lin in _targeted(spec, arch.shape, kwargs["target_modules"])}
        return ActivationPlan(
            weights_train=False,
            adapters=tuple(x for x in arch.block_linears if x.name in targets),
            lora_r=spec.lora_r,
            dropout=spec.lora_dropout > 0,
            dora=m is Method.DORA,
            adapter_elem=2 if m in QUANTIZED_METHODS else None,
        )
    if m is Method.IA3:
        kwargs = peft_kwargs(spec, arch.model_type)[1]  # type: ignore[index]
        targets = set(kwargs["target_modules"])
        return ActivationPlan(
            weights_train=False,
            ia3=tuple(x for x in arch.block_linears if x.name in targets),
            ia3_feedforward=frozenset(kwargs["feedforward_modules"]),
        )
    return ActivationPlan(weights_train=False)


def predict(spec: JobSpec, arch: Arch, device: DeviceFacts) -> Prediction:
    """The predicted peak of one training step of `spec` on `device` (see docs/memory.md)."""
    cuda = device.kind == "cuda"
    precision = resolve_precision(spec, device.device())
    half = precision in (Precision.BF16, Precision.FP16)
    elem = 2 if half else 4  # activations and matmul outputs under autocast
    mask_bytes = 1 if cuda else elem  # dropout masks: bool on CUDA, the input's dtype on the CPU
    m = spec.method
    count = trainable_params(spec, arch.shape)
    p = count.trainable
    n = arch.total_params
    notes: list[str] = []

    # ---- weights (docs/memory.md "Weights")
    if m is Method.FULL:
        weights = 4.0 * n
        wf = (
            f"{n:,} params x 4 B (fp32 masters; autocast computes in 16 bits)" if half else f"{n:,} params x 4 B (fp32)"
        )
        if half:  # autocast keeps one 16-bit copy of each trained linear weight for the step
            weights += 2.0 * arch.linear_params
            wf += f" + 16-bit autocast copies of {arch.linear_params:,} linear weights x 2 B"
    elif m is Method.QLORA:
        per = nf4_bytes_per_param(spec.bnb_4bit_use_double_quant)
        rest = n - arch.linear_params
        weights = arch.linear_params * per + rest * 4.0
        wf = (
            f"{arch.linear_params:,} block linear weights x {per:.4f} B ({spec.bnb_4bit_quant_type.value}"
            f"{' + double quant' if spec.bnb_4bit_use_double_quant else ''}) + {rest:,} embeddings/head/norms/biases "
            "x 4 B (prepare_model_for_kbit_training upcasts them to fp32)"
        )
    elif m is Method.LORA_8BIT:
        rest = n - arch.linear_params
        weights = int8_bytes(arch) + rest * 4.0
        wf = f"{arch.linear_params:,} block linear weights x 1 B + fp32 row scales + {rest:,} other params x 4 B (fp32 upcast)"
    else:
        base = 2 if half else 4
        weights = float(n * base)
        wf = f"{n:,} frozen params x {base} B"
    if m is Method.FULL and (spec.trainer is Trainer.DPO or (spec.trainer is Trainer.GRPO and spec.beta > 0)):
        weights += 4.0 * n  # trl loads a second copy as the frozen reference, in the model's dtype
        wf += f" + reference model {n:,} x 4 B"
    # ---- adapter, gradients, optimizer (docs/memory.md "Trainable parameters")
    # peft keeps adapters in fp32; for a quantized base trl casts them to bf16 (QLoRA paper s.3),
    # all but DoRA's magnitudes, and the gradients and AdamW's moments follow the weights' dtype.
    a_elem = 2 if m in QUANTIZED_METHODS else 4
    adapter = 0.0 if m is Method.FULL else float(a_elem * p)
    af = (
        "none (full fine-tune)"
        if m is Method.FULL
        else f"{p:,} trainable params x {a_elem} B ({'bf16: trl casts adapters on a quantized base' if a_elem == 2 else 'peft keeps adapters in fp32'})"
    )
    grads = float(a_elem * p) if m is not Method.FULL else 4.0 * p
    shapes = _trainable_shapes(spec, arch)
    largest = max((_numel(s) for s in shapes), default=0)
    opt_state, opt_temp, of = _optimizer(spec.optim, p, shapes, largest, cuda, a_elem if m is not Method.FULL else 4)
    # ---- activations (docs/memory.md "Activations")
    rows = spec.per_device_train_batch_size * (2 if spec.trainer is Trainer.DPO else 1)
    length = spec.max_length + (spec.num_virtual_tokens if m in PROMPT_FAMILY else 0)
    if spec.trainer is Trainer.GRPO:
        # An approximation: each row is one prompt (taken as max_length tokens; grpo does not truncate prompts)
        # plus one completion of max_completion_length tokens. Generation's KV cache is freed before the
        # training pass, and a reward run's model (reward_model_run) is not counted.
        length += spec.max_completion_length
        kv = 2 * arch.layers * arch.kv_dim * elem * spec.effective_batch_size * length
        notes.append(
            f"grpo: rows taken as max_length prompt + max_completion_length tokens; generation's KV cache "
            f"(~{kv / 2**20:,.0f} MiB for {spec.effective_batch_size} completions) and any reward model "
            "are not counted"
        )
    tokens = rows * length
    plan = _plan(spec, arch)
    per_block = block_elements(arch, plan, mask_bytes, elem)
    # ---- logits (docs/memory.md "Logits and loss")
    fused_kernel = cuda  # trl folds tiles in a Triton kernel on CUDA; torch ops elsewhere
    head_rows = rows * (length - 1)
    logits, lf = head_bytes(arch, head_rows, elem, mask_bytes, m is Method.FULL, fused_kernel)
    if spec.gradient_checkpointing:
        # Only each block's input stays; one block is recomputed at a time, after the head's
        # backward has finished, so the larger of the two transients counts, not both.
        acts = tokens * arch.layers * arch.hidden * elem + max(0.0, tokens * per_block - logits)
        actf = (
            f"{tokens:,} tokens x {arch.layers} block inputs x {arch.hidden} x {elem} B "
            f"+ one recomputed block ({per_block:,.0f} B/token) beyond the head's transient"
        )
    else:
        acts = tokens * arch.layers * per_block
        actf = f"{tokens:,} tokens x {arch.layers} layers x {per_block:,.0f} B/token/layer"
    acts += tokens * arch.hidden * (3 if plan.weights_train else 2) * elem  # final norm and the head's input copy
    if m in (Method.QLORA, Method.LORA_8BIT):
        big = max(lin.in_features * lin.out_features for lin in arch.block_linears)
        acts += big * elem * 2  # one de-quantized weight (and its transpose) at a time
        actf += " + one de-quantized weight"
    # ---- the peak: in the backward (activations alive) or at the optimizer step (all gradients alive)
    accumulated = grads if spec.gradient_accumulation_steps > 1 else 0.0
    backward = weights + adapter + opt_state + acts + logits + accumulated
    step = weights + adapter + opt_state + grads + opt_temp
    if backward >= step:
        phase, g, gf = "backward", accumulated, ("earlier micro-batches' gradients, " if accumulated else "none yet; ")
        gf += f"{p:,} x 4 B once the backward ends"
        a, lg, o = acts, logits, opt_state
    else:
        phase, g, gf = "optimizer step", grads, f"{p:,} trainable params x 4 B (fp32)"
        a, lg, o = 0.0, 0.0, opt_state + opt_temp
        notes.append("the peak is at the optimizer step: activations are freed by then")
    overhead = 0.0
    ovf = "none on the CPU (tensors only)"
    if cuda:
        ctx = context_bytes(device)
        subtotal = weights + adapter + g + o + a + lg
        overhead = ctx + ALLOCATOR_SLACK * subtotal
        ovf = f"CUDA context {ctx / 2**20:.0f} MiB ({device.name}) + {ALLOCATOR_SLACK:.0%} allocator slack"
    if spec.optim in (Optim.PAGED_ADAMW_8BIT, Optim.PAGED_ADAMW_32BIT) and cuda:
        notes.append("paged optimizer: its state can move to CPU RAM under pressure, so the peak may be lower")
    parts = (
        Part("weights", int(weights), wf),
        Part("adapter", int(adapter), af),
        Part("gradients", int(g), gf),
        Part("optimizer", int(o), of),
        Part("activations", int(a), actf),
        Part("logits", int(lg), lf),
        Part("overhead", int(overhead), ovf),
    )
    return Prediction(
        parts, phase, device, p, count.total if m is not Method.FULL else n, precision.value, tuple(notes)
    )


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _optimizer(
    optim: Optim, p: int, shapes: list[tuple[int, ...]], largest: int, cuda: bool, elem: int = 4
) -> tuple[float, float, str]:
    """(state bytes kept between steps, extra bytes during the step, formula); `elem`: the trained weights' bytes."""
    if optim in (Optim.ADAMW, Optim.PAGED_ADAMW_32BIT):
        # torch AdamW keeps two moments in the parameters' dtype. On CUDA it updates all tensors at
        # once (foreach): one temporary per parameter; on the CPU it loops tensor by tensor: two
        # temporaries of the largest tensor.
        temp = elem * p if cuda and optim is Optim.ADAMW else 2.0 * elem * largest
        kind = "fp32" if elem == 4 else "bf16"
        return 2.0 * elem * p, temp, f"{p:,} x {2 * elem} B (two {kind} moments)"
    if optim in (Optim.ADAMW_8BIT, Optim.PAGED_ADAMW_8BIT):
        state = adam8bit_state_bytes([_numel(s) for s in shapes])
        return state, 4.0 * largest, f"{p:,} x ~2 B (two 8-bit moments + block scales; tensors < 4096 values keep fp32)"
    if optim is Optim.ADAFACTOR:
        state = adafactor_state_bytes(shapes)
        return state, 12.0 * largest, "fp32 row + column second moments per matrix, full per vector (factored)"
    raise ValueError(f"no memory rule for optimizer {optim}")  # pragma: no cover - the enum is closed


PLAIN_NAMES = {
    "weights": "the model's weights",
    "adapter": "the adapter weights",
    "gradients": "the gradients",
    "optimizer": "the optimizer state",
    "activations": "the activations kept for the backward pass",
    "logits": "the output layer's scoring of the vocabulary",
    "overhead": "the CUDA context and allocator",
}


def explain(prediction: Prediction) -> str:
    """The verdict and its reason in plain words."""
    total, cap = prediction.total_bytes, prediction.device.total_bytes
    biggest = max(prediction.parts, key=lambda p: p.bytes)
    share = f"{100 * biggest.bytes / total:.0f}%" if total else "0%"
    where = (
        prediction.device.name if "GiB" in prediction.device.name else f"{prediction.device.name} ({human_bytes(cap)})"
    )
    head = {
        Verdict.FITS: f"Fits: {human_bytes(total)} of {where}, {100 * prediction.share:.0f}%.",
        Verdict.TIGHT: f"Tight: {human_bytes(total)} of {where}, {100 * prediction.share:.0f}% "
        f"(above {TIGHT_ABOVE:.0%}: fragmentation or a longer row may tip it over).",
        Verdict.WILL_NOT_FIT: f"Will not fit: {human_bytes(total)} needed, {100 * prediction.share:.0f}% of {where}.",
    }[prediction.verdict]
    return f"{head} The largest part is {PLAIN_NAMES[biggest.name]} ({share}); the peak is in the {prediction.phase}."


def prediction_error_text(predicted: dict[str, Any] | None, measured: int | None, source: str | None) -> str:
    """'predicted 1.2 GiB vs measured 1.1 GiB (torch): +9%' for a run, '' without a saved prediction.

    On CUDA the measured peak is torch's max reserved (the prediction's CUDA context is left out);
    on the CPU it is the process's peak RSS, which also holds the Python runtime and libraries."""
    if not predicted:
        return ""
    total = int(predicted.get("total_bytes", 0))
    text = f"predicted {human_bytes(total)}"
    if not measured:
        return text
    comparable = total - (int(predicted.get("cuda_context_bytes", 0)) if source == "torch" else 0)
    return f"{text} vs measured {human_bytes(measured)} ({source}): {100 * (comparable - measured) / measured:+.0f}%"
