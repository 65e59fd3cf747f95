"""GaLore / APOLLO: the optimizer state of the targeted linears kept at low rank (full fine-tuning only).

GaLore projects each targeted weight's gradient onto `optim_rank` directions (an SVD every
optim_update_proj_gap steps) and keeps AdamW's moments there; APOLLO uses a random projection and only
scales the full gradient by the projected moments' ratio. The other weights keep full AdamW. The *_layerwise
variants step each weight in the backward pass (no gradient accumulation). Its memory part is
`jobs.memory.trick_effects` (the optimizer state from the projection's shapes).
"""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import LAYERWISE_OPTIMS, LOW_RANK_OPTIMS, Method, Optim
from jobs.spec.job import JobSpec
from jobs.spec.tricks.record import Applied, DocsRow, HasCuda, NotApplicable, Packages, TrickRecord

FIELDS = ("optim", "optim_target_modules", "optim_rank", "optim_update_proj_gap")
SUMMARY = "GaLore: low-rank optimizer state (full fine-tuning)"
PACKAGES: dict[str, Packages] = {
    "galore": (("galore_torch", "galore-torch"),),
    "apollo": (("apollo_torch", "apollo-torch"),),
}


def optim_target_modules(spec: JobSpec) -> str | list[str]:
    """`all-linear`, a regex (kept as one string) or a comma-separated list of module names."""
    text = spec.optim_target_modules.strip()
    if text.replace("_", "-") == "all-linear" or "," not in text:
        return text
    return [name.strip() for name in text.split(",") if name.strip()]


def kwargs(spec: JobSpec) -> dict[str, Any]:
    if spec.optim not in LOW_RANK_OPTIMS:
        return {}
    # GaLore projects each targeted weight's gradient onto `rank` directions (an SVD every
    # update_proj_gap steps) and keeps AdamW's moments there; APOLLO uses a random projection and
    # only scales the full gradient by the projected moments' ratio. The other weights keep full AdamW.
    return {
        "optim_target_modules": optim_target_modules(spec),
        "optim_args": f"rank={spec.optim_rank},update_proj_gap={spec.optim_update_proj_gap}",
    }


def device_problems(spec: JobSpec, device: HasCuda) -> list[Problem]:
    if spec.optim in (Optim.GALORE_ADAMW_8BIT, Optim.GALORE_ADAMW_8BIT_LAYERWISE) and not device.cuda:
        # galore_torch's GaLoreAdamW8bit.step calls torch.cuda.synchronize(): "Torch not compiled with CUDA enabled".
        return [
            Problem(
                "optim",
                f"{spec.optim.value} needs CUDA (galore-torch's 8-bit step synchronises the GPU)",
                "use optim: galore_adamw (or apollo_adamw) on the CPU, or run on a GPU worker",
            )
        ]
    return []


def combination_problems(spec: JobSpec) -> list[Problem]:
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
    return out


def warnings(spec: JobSpec, device: HasCuda) -> list[str]:
    if spec.optim in LAYERWISE_OPTIMS and spec.max_grad_norm > 0:
        return [f"{spec.optim.value}: gradients are applied as they arrive, so max_grad_norm clips nothing"]
    return []


def packages(spec: JobSpec) -> dict[str, Packages]:
    if spec.optim in LOW_RANK_OPTIMS:
        return {"optim": PACKAGES["galore" if spec.optim.value.startswith("galore") else "apollo"]}
    return {}


def step(spec: JobSpec) -> Applied[JobSpec] | NotApplicable:
    """The sweep's step: GaLore's optimizer for a full fine-tune."""
    if spec.method is not Method.FULL:
        return NotApplicable(f"GaLore is for full fine-tuning; method {spec.method.value} trains adapters")
    if spec.optim is Optim.GALORE_ADAMW:
        return NotApplicable("the optimizer is already galore_adamw")
    return Applied(spec.replace(optim=Optim.GALORE_ADAMW), f"optimizer {spec.optim.value} -> galore_adamw")


DOCS = (
    DocsRow(
        "GaLore",
        "`optim: galore_adamw*`",
        "a 7B full fine-tune on one 24 GB GPU",
        "an SVD every `optim_update_proj_gap` steps",
        "published (GaLore paper)",
    ),
    DocsRow(
        "APOLLO",
        "`optim: apollo_adamw*`",
        "SGD-like state at AdamW quality",
        "~AdamW",
        "published (APOLLO paper)",
    ),
)  # docs/memory.md's table of tricks (tests/test_trick_homes.py keeps them equal)

TRICK = TrickRecord(
    "galore",
    FIELDS,
    SUMMARY,
    kwargs=kwargs,
    device_problems=device_problems,
    combination_problems=combination_problems,
    warnings=warnings,
    packages=packages,
    installs=PACKAGES["galore"] + PACKAGES["apollo"],
    speed_field=False,  # optim is a speed field already (jobs.memory.planner)
    docs=DOCS,
)
