"""Pure mapping of the newer memory tricks to trl/transformers keyword arguments, and what refuses them.

Liger kernels, activation offloading, GaLore/APOLLO, NEFTune and torch.compile are `TrainingArguments` /
trl config fields; LoRA+ is an optimizer built by peft (`loraplus_kwargs`, used by `jobs.train.loraplus`).
Spec in, kwargs or problems out: the facts a refusal depends on (the device; which packages the
worker has, `jobs.checks.tricks`) come in as arguments. Each trick's trade-off is written next to its mapping.

    kw.update(trick_kwargs(spec))                       # inside jobs.config.mapping.training_kwargs
    problems = trick_device_problems(spec, device) + trick_combination_problems(spec)
"""

from __future__ import annotations

from typing import Any

from jobs.devices.facts import Device
from jobs.errors import Problem
from jobs.spec.enums import LAYERWISE_OPTIMS, LORA_FAMILY, LOW_RANK_OPTIMS, OFFLOADING_ONLY, Method, Optim
from jobs.spec.job import JobSpec

OFFLOADING_TRAINERS = OFFLOADING_ONLY["trainer"]  # the trl configs that have `activation_offloading`
# Methods whose layers torch.compile cannot trace whole: bitsandbytes' quantized matmuls are opaque custom
# calls (graph breaks at every layer), and prompt methods pass a peft cache object through the model.
COMPILE_BREAKING = {Method.QLORA, Method.LORA_8BIT, Method.PREFIX_TUNING}
# What each trick needs installed on the worker: (python module, pip requirement).
PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "use_liger_kernel": (("liger_kernel", "liger-kernel"), ("triton", "triton")),  # extra: tunedeck[gpu]
    "galore": (("galore_torch", "galore-torch"),),
    "apollo": (("apollo_torch", "apollo-torch"),),
}


def optim_target_modules(spec: JobSpec) -> str | list[str]:
    """`all-linear`, a regex (kept as one string) or a comma-separated list of module names."""
    text = spec.optim_target_modules.strip()
    if text.replace("_", "-") == "all-linear" or "," not in text:
        return text
    return [name.strip() for name in text.split(",") if name.strip()]


def trick_kwargs(spec: JobSpec) -> dict[str, Any]:
    """TrainingArguments / trl config keyword arguments of the tricks that are on (none when all are off)."""
    kw: dict[str, Any] = {}
    if spec.use_liger_kernel:
        # Triton kernels for RMSNorm, SwiGLU, RoPE; trl 1.16 turns Liger's fused linear cross-entropy off
        # (it keeps its own chunked LM head, which already never materialises the logits).
        kw["use_liger_kernel"] = True
    if spec.activation_offloading:
        # Each saved activation is copied to pinned host memory after its forward and back before its
        # backward, on side streams: GPU memory for transfer time over PCIe.
        kw["activation_offloading"] = True
    if spec.optim in LOW_RANK_OPTIMS:
        # GaLore projects each targeted weight's gradient onto `rank` directions (an SVD every
        # update_proj_gap steps) and keeps AdamW's moments there; APOLLO uses a random projection and
        # only scales the full gradient by the projected moments' ratio. The other weights keep full AdamW.
        kw["optim_target_modules"] = optim_target_modules(spec)
        kw["optim_args"] = f"rank={spec.optim_rank},update_proj_gap={spec.optim_update_proj_gap}"
    if spec.neftune_noise_alpha is not None:
        # Noise on the input embeddings during training only: no memory, no time.
        kw["neftune_noise_alpha"] = spec.neftune_noise_alpha
    if spec.torch_compile:
        # inductor fuses elementwise ops (fewer intermediate tensors, fewer kernel launches) after a
        # compile of a minute or more; its own workspace and cache are not predicted.
        kw["torch_compile"] = True
    return kw


def loraplus_kwargs(spec: JobSpec) -> dict[str, Any] | None:
    """peft `create_loraplus_optimizer` arguments (besides the model and the optimizer class), or None when off."""
    if spec.loraplus_lr_ratio is None:
        return None
    # LoRA+ gives B a learning rate `ratio` times A's: the same memory, faster convergence (paper: ratio 16).
    return {
        "lr": spec.learning_rate,
        "loraplus_lr_ratio": spec.loraplus_lr_ratio,
        "loraplus_weight_decay": spec.weight_decay,
    }


def trick_device_problems(spec: JobSpec, device: Device) -> list[Problem]:
    """What the device cannot do with the spec's tricks."""
    out: list[Problem] = []
    if spec.use_liger_kernel and not device.cuda:
        out.append(
            Problem(
                "use_liger_kernel",
                "Liger's kernels are Triton kernels, which need a CUDA device; this one is a CPU",
                "set use_liger_kernel: false, or run on a GPU worker",
            )
        )
    if spec.activation_offloading and not device.cuda:
        out.append(
            Problem(
                "activation_offloading",
                "offloads from GPU memory to host memory; on a CPU the activations are in host memory already",
                "set activation_offloading: false (use gradient_checkpointing on the CPU), or run on a GPU worker",
            )
        )
    if spec.optim in (Optim.GALORE_ADAMW_8BIT, Optim.GALORE_ADAMW_8BIT_LAYERWISE) and not device.cuda:
        # galore_torch's GaLoreAdamW8bit.step calls torch.cuda.synchronize(): "Torch not compiled with CUDA enabled".
        out.append(
            Problem(
                "optim",
                f"{spec.optim.value} needs CUDA (galore-torch's 8-bit step synchronises the GPU)",
                "use optim: galore_adamw (or apollo_adamw) on the CPU, or run on a GPU worker",
            )
        )
    return out


def package_problems(spec: JobSpec, device: Device, missing: frozenset[str]) -> list[Problem]:
    """The tricks whose packages (pip names in `missing`) are not installed; Triton only matters on CUDA."""
    out: list[Problem] = []
    for name, needs in _needed(spec).items():
        for module, requirement in needs:
            if requirement in missing and not (module == "triton" and not device.cuda):
                out.append(
                    Problem(
                        name,
                        f"needs the Python package {requirement}, which is not installed where the run would start",
                        f"pip install {requirement} (or pip install 'tunedeck[gpu]'), or turn {name} off",
                    )
                )
    return out


def _needed(spec: JobSpec) -> dict[str, tuple[tuple[str, str], ...]]:
    """field -> the packages the spec's tricks need."""
    found: dict[str, tuple[tuple[str, str], ...]] = {}
    if spec.use_liger_kernel:
        found["use_liger_kernel"] = PACKAGES["use_liger_kernel"]
    if spec.optim in LOW_RANK_OPTIMS:
        found["optim"] = PACKAGES["galore" if spec.optim.value.startswith("galore") else "apollo"]
    return found


def needed_modules(spec: JobSpec) -> dict[str, str]:
    """python module -> pip requirement, for every package the spec's tricks need."""
    return {module: req for needs in _needed(spec).values() for module, req in needs}


def trick_combination_problems(spec: JobSpec) -> list[Problem]:
    """Combinations of the tricks with the method, trainer and batch that trl/transformers/peft reject."""
    out: list[Problem] = []
    if spec.optim in LOW_RANK_OPTIMS and spec.method is not Method.FULL:
        out.append(
            Problem(
                "optim",
                f"{spec.optim.value} projects full weight gradients to low rank; with method {spec.method.value} "
                "only the adapters train, and they are low-rank already",
                "use method: full with GaLore/APOLLO, or optim: adamw_torch / adamw_bnb_8bit with an adapter",
            )
        )
    if spec.optim in LAYERWISE_OPTIMS and spec.gradient_accumulation_steps > 1:
        # transformers: "Layerwise GaLore does not support gradient accumulation!"
        out.append(
            Problem(
                "gradient_accumulation_steps",
                f"{spec.optim.value} updates each weight during the backward pass, so gradients cannot accumulate",
                f"set gradient_accumulation_steps: 1, or use {spec.optim.value.removesuffix('_layerwise')}",
            )
        )
    if spec.activation_offloading and spec.trainer not in OFFLOADING_TRAINERS:
        out.append(
            Problem(
                "activation_offloading",
                f"the {spec.trainer.value} trainer has no activation offloading (trl: sft, dpo, kto, reward)",
                f"set activation_offloading: false for {spec.trainer.value}",
            )
        )
    if spec.loraplus_lr_ratio is not None and spec.method not in LORA_FAMILY:
        out.append(
            Problem(
                "loraplus_lr_ratio",
                f"LoRA+ sets the learning rate of LoRA's B matrices; method {spec.method.value} has none",
                "leave loraplus_lr_ratio empty, or use method: lora, dora or qlora",
            )
        )
    if spec.loraplus_lr_ratio is not None and spec.optim is Optim.ADAFACTOR:
        out.append(
            Problem(
                "loraplus_lr_ratio",
                "LoRA+ is built here on AdamW (torch or bitsandbytes 8-bit); adafactor sets its own step sizes",
                "use optim: adamw_torch or adamw_bnb_8bit with LoRA+",
            )
        )
    if spec.torch_compile and spec.method in COMPILE_BREAKING:
        out.append(
            Problem(
                "torch_compile",
                f"method {spec.method.value} breaks torch.compile's graph at every layer "
                + (
                    "(bitsandbytes' quantized matmuls are opaque to it)"
                    if spec.method is not Method.PREFIX_TUNING
                    else "(the prefix travels as a cache object)"
                )
                + ", so it would compile for nothing",
                "set torch_compile: false, or use method: lora",
            )
        )
    return out


def trick_warnings(spec: JobSpec, device: Device) -> list[str]:
    """Tricks that run, but not as the spec suggests."""
    out: list[str] = []
    if spec.cpu_return_freed_memory and device.cuda:
        out.append("cpu_return_freed_memory only changes a CPU worker's allocator; a GPU run ignores it")
    if spec.optim in LAYERWISE_OPTIMS and spec.max_grad_norm > 0:
        out.append(f"{spec.optim.value}: gradients are applied as they arrive, so max_grad_norm clips nothing")
    return out
