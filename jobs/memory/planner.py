"""Fit a job to a memory target: the fastest predicted variant of a spec whose peak fits.

The search keeps the effective batch (micro-batch x accumulation) and what the user asked to
train, and varies only the memory tricks: micro-batch / accumulation, gradient checkpointing,
16-bit precision (where the device has it), the 8-bit optimizer, activation offloading (CUDA) or the
CPU allocator that returns freed memory (CPU) and, when allowed, LoRA -> QLoRA. Each variant is predicted by `jobs.memory.predict.predict`; those under `margin` x the target
are ranked by a FLOPs speed model (docs/memory.md "Fit to GPU").

    plan = fit(spec, arch, facts, target_bytes=24 * 2**30)
    plan[0].spec, plan[0].changes, plan[0].prediction.total_bytes      # the pick; plan[1:] runners-up
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from jobs.config import vllm
from jobs.data.tokens.lengths import RowLengths
from jobs.devices.facts import DeviceFacts
from jobs.memory.breakdown import Prediction
from jobs.memory.parts import Arch
from jobs.memory.predict import predict
from jobs.spec.enums import OFFLOADING_ONLY, Method, Optim, Precision
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from jobs.spec.tricks import checkpointing, cpu_allocator, offloading
from jobs.spec.tricks.registry import SPEEDS, speed_fields

MARGIN = 0.90  # a pick must leave 10% of the target free (the "tight" verdict starts there)
# Relative matmul throughput by precision on a GPU (fp32 without TF32 runs on CUDA cores).
GPU_PRECISION_SPEED = {Precision.BF16: 1.0, Precision.FP16: 1.0, Precision.FP32: 0.1}
QUANTIZED_SLOWDOWN = {Method.QLORA: 0.75, Method.LORA_8BIT: 0.6}  # de-quantizing each layer per matmul
HALF_EFFICIENCY_TOKENS = 512  # a micro-batch of this many tokens runs at half the device's best rate (a guess)
# Tokens/s of a trick relative to without it: (field, applies on "cuda"/"cpu", factor, source), each trick's
# `speed` in its module (jobs.spec.tricks).
TRICK_SPEED = tuple((s.field, s.kind, s.factor, s.source) for s in SPEEDS)


@dataclass(frozen=True)
class Candidate:
    """One variant of the spec: its prediction, relative speed and what changed."""

    spec: JobSpec
    prediction: Prediction
    speed: float  # predicted tokens/s (relative unless calibrated by measured runs)
    calibrated: bool
    changes: tuple[str, ...]


def flops_per_token(spec: JobSpec, arch: Arch, trainable: int) -> float:
    """Training FLOPs per token: 6N for full fine-tuning; 4N + 6P when the base is frozen (no weight
    gradients for it); +2N when checkpointing recomputes the forward."""
    n = arch.total_params
    flops = 6.0 * n if spec.method is Method.FULL else 4.0 * n + 6.0 * trainable
    if checkpointing.on(spec):
        flops += 2.0 * n
    return flops


def relative_speed(spec: JobSpec, arch: Arch, prediction: Prediction) -> float:
    """Tokens per second up to a constant: device rate x micro-batch efficiency / FLOPs per token."""
    tokens = spec.per_device_train_batch_size * spec.max_length
    rate = GPU_PRECISION_SPEED.get(Precision(prediction.precision), 1.0) if prediction.device.kind == "cuda" else 1.0
    rate *= QUANTIZED_SLOWDOWN.get(spec.method, 1.0)
    efficiency = tokens / (tokens + HALF_EFFICIENCY_TOKENS)
    for name, kind, factor, _source in TRICK_SPEED:
        if getattr(spec, name) and (prediction.device.kind == "cuda") == (kind == "cuda"):
            rate *= factor
    return 1e12 * rate * efficiency / flops_per_token(spec, arch, prediction.trainable_params)


# The settings that decide a run's speed on a given model and device: runs that agree on all of
# them are the same setup, whose measured tokens/s stands in for the model's estimate.
SPEED_FIELDS = (
    "method",
    "per_device_train_batch_size",
    "precision",
    "optim",
    "max_length",
    "packing",
    "lora_r",
    "trainer",
    *speed_fields(),  # checkpointing, the CPU allocator, offloading, Liger, compile (jobs.spec.tricks)
)


def same_setup(a: JobSpec, b: JobSpec) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in SPEED_FIELDS)


def calibration(
    history: Sequence[tuple[JobSpec, float]], arch: Arch, device: DeviceFacts, like: JobSpec | None = None
) -> float | None:
    """Median measured / modelled tokens/s over earlier runs of this model on this device, if any;
    with `like`, over those of the same setup only (so a measured variant ranks by what it did)."""
    ratios = []
    for spec, tokens_per_s in history:
        if tokens_per_s > 0 and (like is None or same_setup(spec, like)):
            ratios.append(tokens_per_s / relative_speed(spec, arch, predict(spec, arch, device)))
    return statistics.median(ratios) if ratios else None


def measured_history(store: object, model: str, device: DeviceFacts, limit: int = 200) -> list[tuple[JobSpec, float]]:
    """(spec, measured tokens/s) of earlier succeeded runs of `model` on a device of this name."""
    from jobs.spec.stored import spec_of
    from storage.models import RunStatus

    out = []
    for run in store.list_runs(RunStatus.SUCCEEDED, limit=limit):  # type: ignore[attr-defined]
        spec = spec_of(run)
        ran_on = (run.resolved_config.get("device") or {}).get("name")
        tokens_per_s = run.final_metrics.get("tokens_per_second")
        if spec.model == model and ran_on == device.name and tokens_per_s:
            out.append((spec, float(tokens_per_s)))
    return out


def _divisors_down(batch: int, effective: int, least: int = 1) -> list[int]:
    """Micro-batches from `batch` down to `least` (the trainer's smallest: kto pairs rows within one) that divide
    the effective batch."""
    return [b for b in range(min(batch, effective), least - 1, -1) if effective % b == 0]


def variants(spec: JobSpec, device: DeviceFacts, allow_qlora: bool = True) -> list[JobSpec]:
    """Every combination of the memory tricks the planner may change."""
    effective = spec.effective_batch_size
    batches = _divisors_down(spec.per_device_train_batch_size, effective, record_for(spec.trainer).min_batch)
    ckpts = checkpointing.fit_choices(spec)
    precisions = [spec.precision]
    if device.kind == "cuda":
        half = Precision.BF16 if device.bf16 else Precision.FP16
        precisions = list(dict.fromkeys([spec.precision, half]))
    optims = list(dict.fromkeys([spec.optim, Optim.ADAMW_8BIT]))
    methods = [spec.method]
    refused = vllm.REFUSED_METHODS if spec.use_vllm else {}  # what vLLM's generation cannot run with
    if (
        allow_qlora
        and spec.method in (Method.LORA, Method.DORA)
        and device.kind == "cuda"
        and Method.QLORA not in refused
    ):
        methods.append(Method.QLORA)
    # The device's own memory trick: on CUDA, offloaded checkpointing (the checkpointed layer inputs in host
    # RAM: small, so the unknown host RAM holds them; offloading every activation could need more RAM than the
    # host has); on the CPU, the allocator that returns freed memory.
    name = offloading.FIELD if device.kind == "cuda" else cpu_allocator.FIELD
    offers = device.kind != "cuda" or spec.trainer in OFFLOADING_ONLY["trainer"]
    extras = sorted({getattr(spec, name), True}) if offers else [getattr(spec, name)]
    out = []
    for method in methods:
        for precision in precisions:
            for optim in optims:
                for ckpt in ckpts:
                    for b in batches:
                        for extra in extras:
                            if extra and name == offloading.FIELD and not ckpt:
                                continue
                            out.append(
                                spec.replace(
                                    method=method,
                                    precision=precision,
                                    optim=optim,
                                    **checkpointing.with_choice(ckpt),
                                    per_device_train_batch_size=b,
                                    gradient_accumulation_steps=effective // b,
                                    **{name: extra},
                                )
                            )
    return out


def describe_changes(old: JobSpec, new: JobSpec) -> tuple[str, ...]:
    """What a variant changes, in the spec's own field names."""
    out = []
    if new.per_device_train_batch_size != old.per_device_train_batch_size:
        out.append(
            f"per_device_train_batch_size {old.per_device_train_batch_size} -> {new.per_device_train_batch_size} "
            f"with gradient_accumulation_steps {new.gradient_accumulation_steps} (same effective batch)"
        )
    for name in (
        *checkpointing.FIELDS,
        "precision",
        "optim",
        "method",
        offloading.FIELD,
        cpu_allocator.FIELD,
    ):
        a, b = getattr(old, name), getattr(new, name)
        if a != b:
            out.append(f"{name}: {getattr(b, 'value', b)}".lower())
    return tuple(out)


def fit(
    spec: JobSpec,
    arch: Arch,
    device: DeviceFacts,
    target_bytes: int | None = None,
    *,
    allow_qlora: bool = True,
    history: Sequence[tuple[JobSpec, float]] = (),
    margin: float = MARGIN,
    lengths: RowLengths | None = None,
) -> list[Candidate]:
    """Variants that fit `margin` x target (default: the device's memory), fastest first; [] if none.
    `lengths`: the data's measured rows (each variant is predicted for its own worst micro-batch), else
    every row is taken at max_length."""
    target = target_bytes if target_bytes is not None else device.total_bytes
    facts = replace(device, total_bytes=target)
    scale = calibration(history, arch, facts)
    found = []
    seen: set[tuple] = set()
    for variant in variants(spec, facts, allow_qlora):
        prediction = predict(variant, arch, facts, lengths)
        key = (prediction.precision, replace(variant, precision=Precision.AUTO).to_json())  # a key, not a spec
        if prediction.total_bytes > margin * target or key in seen:
            continue  # too big, or the same run as one already found (auto resolves to the same precision)
        seen.add(key)
        own = calibration(history, arch, facts, like=variant) if history else None
        speed = relative_speed(variant, arch, prediction) * (own or scale or 1.0)
        found.append(Candidate(variant, prediction, speed, scale is not None, describe_changes(spec, variant)))
    found.sort(key=lambda c: (-round(c.speed, 6), len(c.changes), c.prediction.total_bytes))
    return found


def cheapest_change(spec: JobSpec, arch: Arch, device: DeviceFacts, lengths: RowLengths | None = None) -> str | None:
    """The pick's changes in words when the spec does not fit as it is; None when it fits or nothing does."""
    current = predict(spec, arch, device, lengths)
    if current.total_bytes <= MARGIN * device.total_bytes:
        return None
    plan = fit(spec, arch, device, lengths=lengths)
    if not plan:
        return None
    return "; ".join(plan[0].changes) or "no change"
