"""Pure mapping from a `JobSpec` (our intent) to library configs (trl, peft, bitsandbytes).

Spec in, library config out, in the manner of trl's `get_peft_config` / `get_quantization_config`.
Nothing here touches a GPU, a file, a setting or the database: the facts a mapping depends on
(the device, the model's layer shapes) come in as arguments, found by the callers
(`jobs.devices.probe`, `jobs.checks.pipeline`). Each memory trick's memory/speed trade-off is
written next to the code that maps it.

    problems = capability_problems(spec, device)          # [] or reasons to refuse
    args = training_config(spec, device, "out/", has_eval=True)
    record = resolved_config(spec, device, "out/", has_eval=True)   # JSON for the run row
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from jobs.config.evaluation import early_stopping_kwargs
from jobs.config.methods import method_problems, targets
from jobs.config.peft import peft_config, peft_kwargs  # noqa: F401 - part of this module's API
from jobs.config.trainers import (  # noqa: F401
    config_class_name,
    drop_unsupported,
    loss_type_name,
    task_type,
    trainer_kwargs,
    trl_module,
)
from jobs.config.vllm import vllm_device_problems, vllm_method_problems
from jobs.devices.facts import Device
from jobs.errors import Problem
from jobs.spec.enums import LORA_FAMILY, ComputeDtype, LoraInit, Method, Optim, Precision
from jobs.spec.job import JobSpec
from jobs.spec.trainer_records import record_for
from jobs.spec.tricks import checkpointing
from jobs.spec.tricks.registry import trick_combination_problems, trick_device_problems, trick_kwargs, trick_warnings

PAGED_OPTIMS = {Optim.PAGED_ADAMW_8BIT, Optim.PAGED_ADAMW_32BIT}
QUANTIZED_METHODS = {Method.QLORA, Method.LORA_8BIT}
# Methods whose refusals depend on the model's architecture: the checks pass its layer shapes
# (`jobs.memory.shape.ModelShape`, read from its config, no weights) as `shape`.
MODEL_CHECKED_METHODS = {Method.ADAPTION_PROMPT}


# ---------------------------------------------------------------------- precision
# Mixed precision (bf16/fp16) runs matmuls in 16 bits under autocast: activations take about
# half the memory and tensor cores run several times faster than fp32. Weights being trained
# keep an fp32 master copy, so a full fine-tune saves little weight memory; a frozen base
# (LoRA family) is loaded directly in 16 bits and halves the base's footprint. bf16 has fp32's
# range (no loss scaling); fp16 needs a GradScaler, which only exists on CUDA.
def resolve_precision(spec: JobSpec, device: Device) -> Precision:
    """auto -> bf16 on CUDA with bf16, fp16 on older CUDA, fp32 on CPU; else the spec's choice."""
    if spec.precision is not Precision.AUTO:
        return spec.precision
    if device.cuda:
        return Precision.BF16 if device.bf16 else Precision.FP16
    return Precision.FP32


def capability_problems(spec: JobSpec, device: Device, shape: Any = None) -> list[Problem]:
    """Reasons this spec cannot honestly run on `device`; `shape` (the model's layer shapes, for the
    methods in MODEL_CHECKED_METHODS) enables the checks that depend on the architecture."""
    return device_problems(spec, device) + combination_problems(spec, shape)


def device_problems(spec: JobSpec, device: Device) -> list[Problem]:
    """What this device cannot do with the spec (fp16 without CUDA, bf16 on an old GPU, LoftQ on the CPU)."""
    out: list[Problem] = []
    if spec.precision is Precision.FP16 and not device.cuda:
        out.append(
            Problem(
                "precision",
                "fp16 needs CUDA: on the CPU trl would silently train in fp32 without loss scaling",
                "use precision: auto (fp32 on CPU) or bf16",
            )
        )
    if spec.precision is Precision.BF16 and device.cuda and not device.bf16:
        out.append(
            Problem(
                "precision",
                f"this GPU ({device.name}) does not support bf16",
                "use precision: auto (fp16 with loss scaling) or fp32",
            )
        )
    if spec.lora_init is LoraInit.LOFTQ and not device.cuda:
        # peft's replace_lora_weights_loftq computes on "cuda" unconditionally:
        # AssertionError "Torch not compiled with CUDA enabled" on a CPU-only machine.
        out.append(
            Problem(
                "lora_init",
                "loftq needs CUDA (peft runs its LoftQ quantizer on the GPU)",
                "use lora_init: default or eva on this machine, or run on a GPU worker",
            )
        )
    return out + trick_device_problems(spec, device) + vllm_device_problems(spec, device)


def combination_problems(spec: JobSpec, shape: Any = None) -> list[Problem]:
    """Combinations trl/peft/bitsandbytes reject, found by trying each (see tests/test_matrix.py); with the
    model's `shape`, also what the method refuses for that architecture."""
    out: list[Problem] = []
    record = record_for(spec.trainer)
    if spec.padding_free and "packing" in record.kwargs and not spec.packing:
        # trl: "When `padding_free=True` without packing, `max_length` is not enforced."
        out.append(
            Problem(
                "padding_free",
                f"needs packing for {spec.trainer.value} (trl refuses padding-free rows without packing "
                "because max_length would not be enforced)",
                "set packing: true (it turns padding-free on by itself), or padding_free: false",
            )
        )
    for refusal in record.refuses:  # what the trainer fails with (each measured: see its record)
        value = getattr(spec, refusal.field).value
        if value in refusal.values:
            words = {"value": value, "trainer": spec.trainer.value}
            out.append(Problem(refusal.field, refusal.problem.format(**words), refusal.fix.format(**words)))
    if spec.method in LORA_FAMILY and "lm_head" in targets(spec):
        # trl (sft, dpo, kto, grpo): "Applying a PEFT adapter to `lm_head` is not supported: the log-probabilities
        # are computed from `lm_head.weight` directly, so the adapter would never be trained."
        out.append(
            Problem(
                "lora_target_modules",
                f"an adapter on lm_head is not trained by {spec.trainer.value} (trl "
                "computes log-probabilities from lm_head's weight directly, so trl refuses it)",
                "remove lm_head from lora_target_modules (all-linear already leaves it out)",
            )
        )
    out.extend(method_problems(spec, shape))
    return out + trick_combination_problems(spec) + vllm_method_problems(spec)


def capability_warnings(spec: JobSpec, device: Device) -> list[str]:
    """Things that will run on this device, but not the way the spec suggests."""
    out: list[str] = []
    if spec.optim in PAGED_OPTIMS and not device.cuda:
        out.append(
            f"optim {spec.optim.value}: paged optimizers need CUDA; bitsandbytes falls back to the "
            "non-paged optimizer on the CPU"
        )
    if spec.method in QUANTIZED_METHODS and not device.cuda:
        out.append(
            f"method {spec.method.value}: bitsandbytes' CPU backend runs quantized layers much slower than a GPU"
        )
    if resolve_precision(spec, device) is Precision.BF16 and not device.cuda:
        out.append("precision bf16 on the CPU: runs (use_cpu=True) but is usually slower than fp32 there")
    if spec.method is not Method.QLORA and (
        spec.bnb_4bit_quant_type.value != "nf4"
        or not spec.bnb_4bit_use_double_quant
        or spec.bnb_4bit_compute_dtype is not ComputeDtype.AUTO
    ):
        out.append(f"bnb_4bit_* settings only apply to method qlora; method {spec.method.value} ignores them")
    if spec.packing and spec.method in {Method.PROMPT_TUNING, Method.P_TUNING}:
        out.append(
            f"method {spec.method.value} with packing: the virtual tokens are prepended once per packed row, "
            "not once per example"
        )
    return out + trick_warnings(spec, device)


def torch_dtype_name(spec: JobSpec, precision: Precision) -> str:
    """dtype to load the model weights in: fp32 for trained weights, 16-bit for a frozen base."""
    if spec.method is Method.FULL or precision is Precision.FP32:
        return "float32"  # trained weights stay fp32 masters; autocast does the 16-bit compute
    return "bfloat16" if precision is Precision.BF16 else "float16"


# ---------------------------------------------------------------------- quantization
# QLoRA stores the frozen base in 4-bit NF4 (~0.5 B/param, ~0.52 with the quantization
# constants; double quantization squeezes the constants themselves), a 4x saving over 16-bit,
# and de-quantizes each layer on the fly to the compute dtype: ~10-40% slower than plain LoRA.
# lora_8bit (LLM.int8) stores ~1 B/param and is usually slower still, for outlier handling.
def quantization_kwargs(spec: JobSpec, precision: Precision) -> dict[str, Any] | None:
    """BitsAndBytesConfig keyword arguments (compute dtype as a name), or None."""
    if spec.method is Method.QLORA:
        chosen = (
            precision
            if spec.bnb_4bit_compute_dtype is ComputeDtype.AUTO
            else Precision(spec.bnb_4bit_compute_dtype.value)
        )
        compute = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}.get(chosen, "float32")
        return {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": spec.bnb_4bit_quant_type.value,
            "bnb_4bit_use_double_quant": spec.bnb_4bit_use_double_quant,
            "bnb_4bit_compute_dtype": compute,
        }
    if spec.method is Method.LORA_8BIT:
        return {"load_in_8bit": True}
    return None


def quantization_config(spec: JobSpec, precision: Precision = Precision.FP32) -> Any | None:
    """A transformers BitsAndBytesConfig for qlora / lora_8bit, else None."""
    kwargs = quantization_kwargs(spec, precision)
    if kwargs is None:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if "bnb_4bit_compute_dtype" in kwargs:
        kwargs = {**kwargs, "bnb_4bit_compute_dtype": getattr(torch, kwargs["bnb_4bit_compute_dtype"])}
    return BitsAndBytesConfig(**kwargs)


# ---------------------------------------------------------------------- training args
def training_kwargs(spec: JobSpec, device: Device, output_dir: str, *, has_eval: bool = False) -> dict[str, Any]:
    """Keyword arguments for SFTConfig / DPOConfig, every default that matters set explicitly."""
    precision = resolve_precision(spec, device)
    kw: dict[str, Any] = {
        "output_dir": str(output_dir),
        # Micro-batch x accumulation: activation memory scales with the micro-batch only, so a
        # small micro-batch with more accumulation reaches the same effective batch in less
        # memory, paying with smaller, less efficient kernels (and more optimizer-step latency).
        "per_device_train_batch_size": spec.per_device_train_batch_size,
        "per_device_eval_batch_size": spec.per_device_train_batch_size,
        "gradient_accumulation_steps": spec.gradient_accumulation_steps,
        # Gradient checkpointing keeps only each layer's input and recomputes the rest in the
        # backward pass: activation memory drops from O(layers x everything) to ~O(layers x
        # hidden), for roughly one extra forward (~20-30% slower). trl turns it on by default.
        # transformers 5 calls it activation_checkpointing (jobs.spec.tricks.checkpointing).
        **checkpointing.training_flag(spec),
        # Set explicitly: trl's configs default to bf16, which fails (or lies) on some devices.
        "bf16": precision is Precision.BF16,
        "fp16": precision is Precision.FP16,
        "use_cpu": not device.cuda,
        # 8-bit AdamW keeps its two moments in 8 bits (~2 B/param instead of 8) at nearly the same
        # speed; paged variants move optimizer state to CPU RAM under GPU pressure (CUDA only).
        "optim": spec.optim.value,
        "learning_rate": spec.learning_rate,
        "lr_scheduler_type": spec.lr_scheduler_type.value,
        "warmup_steps": spec.warmup_steps,
        "num_train_epochs": spec.num_train_epochs,
        "max_steps": spec.max_steps,
        "weight_decay": spec.weight_decay,
        "max_grad_norm": spec.max_grad_norm,
        "logging_steps": spec.logging_steps,
        "logging_nan_inf_filter": False,  # a NaN loss must reach the graphs, not be hidden
        "save_strategy": "steps" if spec.save_steps is not None else "no",
        "eval_strategy": "steps" if has_eval and spec.eval_steps is not None else "no",
        "seed": spec.seed,
        # Activations and the logits tensor grow linearly with max_length (attention itself
        # too with SDPA kernels); truncating long rows is the bluntest memory cap.
        "max_length": spec.max_length,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        # On a CUDA OOM, accelerate halves the micro-batch and restarts the loop: a run that would
        # crash finishes instead, slower and with a smaller batch than asked (logged, not hidden).
        "auto_find_batch_size": spec.auto_find_batch_size,
        # Padding-free flattens a batch into one row with position_ids: no pad tokens are computed
        # or stored. With trl's default "bfd" packing it is on whatever this flag says.
        "padding_free": spec.padding_free,
    }
    kw.update(checkpointing.training_options(spec))  # non-reentrant: works with frozen bases
    if spec.save_steps is not None:
        kw["save_steps"] = spec.save_steps
    # Rotation applies to every checkpoint, also the timed ones (`save_minutes`, jobs.train.callbacks).
    kw["save_total_limit"] = spec.save_total_limit
    kw.update(early_stopping_kwargs(spec, has_eval=has_eval))  # the best checkpoint kept (jobs.config.evaluation)
    if kw["eval_strategy"] == "steps":
        kw["eval_steps"] = spec.eval_steps
    kw.update(trick_kwargs(spec))  # Liger, offloading, GaLore/APOLLO, NEFTune, compile (jobs.spec.tricks.registry)
    kw.update(trainer_kwargs(spec))  # packing, loss masks, beta, loss_type, ... (jobs.config.trainers)
    return drop_unsupported(spec, kw)


def training_config(spec: JobSpec, device: Device, output_dir: str, *, has_eval: bool = False) -> Any:
    """The trl config (SFTConfig, DPOConfig, KTOConfig, ...) for the spec on this device."""
    import importlib

    module = importlib.import_module(trl_module(spec))
    return getattr(module, config_class_name(spec))(**training_kwargs(spec, device, output_dir, has_eval=has_eval))


def resolved_config(
    spec: JobSpec,
    device: Device,
    output_dir: str,
    *,
    has_eval: bool = False,
    model_type: str | None = None,
    moe: Any = None,
    vision: bool = False,
) -> dict[str, Any]:
    """A JSON-able record of exactly what the trl config, peft config and BitsAndBytesConfig received."""
    precision = resolve_precision(spec, device)
    peft_found = peft_kwargs(spec, model_type, moe, vision=vision)
    return {
        "device": {**asdict(device), "compute_capability": list(device.compute_capability or []) or None},
        "precision": precision.value,
        "torch_dtype": torch_dtype_name(spec, precision),
        "trainer_config_class": f"{trl_module(spec)}.{config_class_name(spec)}".removeprefix("trl."),
        "trainer_config": training_kwargs(spec, device, output_dir, has_eval=has_eval),
        "peft_config_class": peft_found[0] if peft_found else None,
        "peft_config": peft_found[1] if peft_found else None,
        "quantization_config": quantization_kwargs(spec, precision),
        "prepare_model_for_kbit_training": spec.method in QUANTIZED_METHODS,
        "warnings": capability_warnings(spec, device),
    }
