"""Which tensors a method trains and keeps, read from the spec and the model's shapes: the inputs of the
prediction's parts (`jobs.memory.predict`) that depend on where the adapters go.

    trainable_shapes(spec, arch)     # shapes the optimizer updates (per-tensor optimizer rules)
    activation_plan(spec, arch)      # what each block keeps for the backward under this method
    adapted_experts(spec, arch)      # LoRA on a MoE model's fused experts (peft's ParamWrapper)
    optimizer_bytes(optim, p, shapes, cuda, elem)   # (state, step temporaries, formula)
"""

from __future__ import annotations

import math

from jobs.memory.parts import ActivationPlan, Arch, adafactor_state_bytes, adam8bit_state_bytes
from jobs.memory.shape import targeted_linears
from jobs.spec.enums import LORA_FAMILY, LOW_RANK_OPTIMS, Method, Optim
from jobs.spec.job import JobSpec


def trainable_shapes(spec: JobSpec, arch: Arch, trainable: int) -> list[tuple[int, ...]]:
    """Shapes of the tensors the optimizer updates (for per-tensor optimizer rules); `trainable`: their count."""
    from jobs.config.peft import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return list(arch.param_shapes)
    if m in LORA_FAMILY:
        kwargs = peft_kwargs(spec, arch.model_type, arch.shape.moe)[1]  # type: ignore[index]
        out: list[tuple[int, ...]] = []
        for lin in targeted_linears(spec, arch.shape, kwargs["target_modules"]):
            out += [(spec.lora_r, lin.in_features), (lin.out_features, spec.lora_r)]
            if m is Method.DORA:
                out.append((lin.out_features,))
        return out
    count = trainable
    if m is Method.PROMPT_TUNING:
        return [(spec.num_virtual_tokens, arch.hidden)]
    return [(count,)]


def activation_plan(spec: JobSpec, arch: Arch) -> ActivationPlan:
    from jobs.config.peft import peft_kwargs

    m = spec.method
    if m is Method.FULL:
        return ActivationPlan(weights_train=True)
    if m in LORA_FAMILY:
        kwargs = peft_kwargs(spec, arch.model_type, arch.shape.moe)[1]  # type: ignore[index]
        targets = {lin.name.split(".")[-1] for lin in targeted_linears(spec, arch.shape, kwargs["target_modules"])}
        return ActivationPlan(
            weights_train=False,
            adapters=tuple(x for x in arch.block_linears if x.name in targets),
            lora_r=spec.lora_r,
            dropout=kwargs["lora_dropout"] > 0,  # as peft gets it: 0 when the adapters reach fused experts
            dora=m is Method.DORA,
            adapter_elem=2 if m in (Method.QLORA, Method.LORA_8BIT) else None,
        )
    if m is Method.IA3:
        kwargs = peft_kwargs(spec, arch.model_type, arch.shape.moe)[1]  # type: ignore[index]
        targets = set(kwargs["target_modules"])
        return ActivationPlan(
            weights_train=False,
            ia3=tuple(x for x in arch.block_linears if x.name in targets),
            ia3_feedforward=frozenset(kwargs["feedforward_modules"]),
        )
    return ActivationPlan(weights_train=False)


def adapted_experts(spec: JobSpec, arch: Arch) -> bool:
    """Whether LoRA adapts the fused expert weights (peft's ParamWrapper) under the spec's moe_targets."""
    from jobs.config.peft import peft_kwargs

    if spec.method not in LORA_FAMILY or arch.shape.moe is None:
        return False
    found = peft_kwargs(spec, arch.model_type, arch.shape.moe)
    return found is not None and any(".experts." in t for t in found[1].get("target_parameters", ()))


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def optimizer_bytes(
    optim: Optim, p: int, shapes: list[tuple[int, ...]], cuda: bool, elem: int = 4
) -> tuple[float, float, str]:
    """(state bytes kept between steps, extra bytes during the step, formula); `elem`: the trained weights' bytes."""

    def largest() -> int:  # the biggest tensor: not needed by CUDA's AdamW (the form's planner asks ~200 times)
        return max((_numel(s) for s in shapes), default=0)

    if optim in (Optim.ADAMW, Optim.PAGED_ADAMW_32BIT) or optim in LOW_RANK_OPTIMS:  # low rank: trick_effects
        # torch AdamW keeps two moments in the parameters' dtype. On CUDA it updates all tensors at
        # once (foreach): one temporary per parameter; on the CPU it loops tensor by tensor: two
        # temporaries of the largest tensor.
        temp = elem * p if cuda and optim is Optim.ADAMW else 2.0 * elem * largest()
        kind = "fp32" if elem == 4 else "bf16"
        return 2.0 * elem * p, temp, f"{p:,} x {2 * elem} B (two {kind} moments)"
    if optim in (Optim.ADAMW_8BIT, Optim.PAGED_ADAMW_8BIT):
        state = adam8bit_state_bytes([_numel(s) for s in shapes])
        return (
            state,
            4.0 * largest(),
            f"{p:,} x ~2 B (two 8-bit moments + block scales; tensors < 4096 values keep fp32)",
        )
    if optim is Optim.ADAFACTOR:
        state = adafactor_state_bytes(shapes)
        return state, 12.0 * largest(), "fp32 row + column second moments per matrix, full per vector (factored)"
    raise ValueError(f"no memory rule for optimizer {optim}")  # pragma: no cover - the enum is closed
