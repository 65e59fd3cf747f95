"""Which layers of a mixture-of-experts model get LoRA adapters: the spec's `moe_targets`, as peft arguments.

transformers 5 keeps a MoE block's experts as fused 3-D parameters (experts x out x in), not as linears, so
peft adapts them through `target_parameters` (its `ParamWrapper`), which cannot apply dropout inside the
fused matmul: `lora_dropout` must be 0 there. The layer names come from the model itself
(`jobs.memory.shape.moe_layout`, read on the meta device), never from a per-family table.

    moe_targets(spec, layout)   # MoeTargeting(target_modules=[...], target_parameters=[...])
    moe_problems(spec, layout)  # [] or the combinations peft cannot train, each with its fix
    moe_notes(spec, layout)     # what tunedeck chose for the user (lora_dropout 0)
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.errors import Problem
from jobs.models.moe_layout import MoeLayout
from jobs.spec.enums import LORA_FAMILY, Method
from jobs.spec.job import JobSpec


@dataclass(frozen=True)
class MoeTargeting:
    """peft's `target_modules` (linear leaf names, or the user's own) and `target_parameters`."""

    target_modules: str | list[str]
    target_parameters: list[str]


def moe_targets(spec: JobSpec, layout: MoeLayout, user_modules: str | list[str]) -> MoeTargeting:
    """The adapters' places for `spec.moe_targets` on this MoE model. `user_modules`: the spec's
    lora_target_modules as peft takes them; a list of names is kept as the user wrote it, all-linear becomes
    the linears the choice names (an explicit list: peft's own all-linear would add the experts and router
    of some families by itself)."""
    choice = spec.moe_targets
    params: list[str] = []
    if choice.experts:
        params += layout.expert_params
    if choice.router:
        params += layout.router_params
    if user_modules != "all-linear":
        return MoeTargeting(user_modules, params)
    names = list(layout.outside_linears)
    if choice.experts:
        names += layout.moe_linears
    if choice.router:
        names += layout.router_linears
    return MoeTargeting(sorted(set(names)), params)


def forced_dropout(spec: JobSpec, layout: MoeLayout | None) -> bool:
    """True when the spec's lora_dropout has to become 0: adapters on fused expert or router parameters."""
    if layout is None or spec.method not in LORA_FAMILY or spec.lora_dropout == 0:
        return False
    return bool(moe_targets(spec, layout, "all-linear").target_parameters)


def moe_problems(spec: JobSpec, layout: MoeLayout | None) -> list[Problem]:
    """What peft cannot train on this MoE model with this spec, each naming the field and the fix."""
    if layout is None or spec.method not in LORA_FAMILY:
        return []
    out: list[Problem] = []
    fused = moe_targets(spec, layout, "all-linear").target_parameters
    if spec.method is Method.DORA and fused:
        # peft 0.21: "lora.ParamWrapper does not work with use_dora=True."
        out.append(
            Problem(
                "moe_targets",
                f"dora cannot adapt this mixture-of-experts model's fused {_what(spec)} "
                "(peft's ParamWrapper has no DoRA)",
                "set moe_targets: attention (DoRA on the layers outside the experts), or method: lora",
            )
        )
    if spec.moe_targets.router and layout.custom_routers:
        # peft 0.21 wraps llama4's router (an nn.Linear returning a tuple): "'tuple' object has no attribute 'dtype'".
        out.append(
            Problem(
                "moe_targets",
                f"this model's router ({', '.join(layout.custom_routers)}) is a linear layer with its own output "
                "that peft's LoRA cannot wrap ('tuple' object has no attribute 'dtype')",
                "set moe_targets: attention+experts (the router then stays frozen)",
            )
        )
    return out


def moe_notes(spec: JobSpec, layout: MoeLayout | None) -> list[str]:
    """What tunedeck changes for the user on a MoE model, said at submit."""
    if not forced_dropout(spec, layout):
        return []
    return [
        f"lora_dropout {spec.lora_dropout:g} -> 0: adapters on the fused {_what(spec)} of this mixture-of-experts "
        "model cannot apply dropout (peft's ParamWrapper); set moe_targets: attention to keep the dropout"
    ]


def _what(spec: JobSpec) -> str:
    return "expert and router weights" if spec.moe_targets.router else "expert weights"
