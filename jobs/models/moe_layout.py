"""Where a mixture-of-experts model keeps its experts and router, read from the built model of any family.

transformers 5 stores a MoE block's experts as fused 3-D parameters (experts x out x in) in a module named
`experts`; the router is a custom module (a plain weight) or a linear named `gate` or `router` beside it.
`moe_layout` finds them on a model built on the meta device (`jobs.memory.shape`) or loaded for training
(`jobs.train.training`), so no family is hard-coded. Imports nothing of the project.

    layout = moe_layout(model, model.config.get_text_config())   # None for a dense model
    layout.expert_params      # ("mlp.experts.down_proj", "mlp.experts.gate_up_proj")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MoeLayout:
    """Where a mixture-of-experts model keeps its experts and router, found on the built model (any family).

    Names are relative to a decoder layer (`mlp.experts.gate_up_proj`), as peft's `target_parameters` match
    them; linear names are leaf names, as `target_modules` lists them."""

    expert_params: tuple[str, ...]  # the fused 3-D expert weights (experts x out x in)
    router_params: tuple[str, ...]  # router weights that are plain parameters (not nn.Linear)
    router_linears: tuple[str, ...]  # router layers that are plain nn.Linear
    custom_routers: tuple[str, ...]  # routers that subclass nn.Linear with their own output (llama4): peft cannot wrap
    moe_linears: tuple[str, ...]  # other linears inside the expert blocks (shared experts, their gates)
    outside_linears: tuple[str, ...]  # linears outside every expert block (attention, mixers), less the head
    experts: int  # experts per MoE layer
    top_k: int  # experts each token is routed to
    moe_layers: int  # decoder layers with an expert block
    expert_param_count: int  # elements of every fused expert weight of the model
    router_param_count: int  # elements of every router

    @property
    def active_param_share(self) -> float:
        """The share of the expert weights one token passes through."""
        return min(1.0, self.top_k / self.experts) if self.experts else 1.0


# Config keys that hold how many experts a token is routed to, by family.
TOP_K_KEYS = ("num_experts_per_tok", "moe_k", "top_k", "moe_topk", "num_activated_experts", "experts_per_token")


def moe_layout(model: Any, text_config: Any) -> MoeLayout | None:
    """The MoE layout of a built model (meta device or real), or None for a dense model."""
    import torch

    modules = dict(model.named_modules())
    blocks = [name.rpartition(".")[0] for name, m in modules.items() if _is_experts(name, m)]
    if not blocks:
        return None
    head = model.get_output_embeddings()
    experts_p: set[str] = set()
    router_p: set[str] = set()
    router_l: set[str] = set()
    custom: set[str] = set()
    moe_l: set[str] = set()
    outside: set[str] = set()
    n_experts = expert_count = router_count = 0
    for name, m in modules.items():
        block = next((b for b in blocks if name.startswith(b + ".")), None)
        if block is not None and _is_experts(name, m):
            for pname, p in m.named_parameters(recurse=False):
                if p.dim() == 3:
                    experts_p.add(_relative(f"{name}.{pname}"))
                    n_experts = int(p.shape[0])
                    expert_count += p.numel()
        elif block is not None and _is_router(name, m, block):
            router_count += sum(p.numel() for p in m.parameters())
            if isinstance(m, torch.nn.Linear):
                (router_l if type(m) is torch.nn.Linear else custom).add(name.rsplit(".", 1)[-1])
            else:
                router_p.update(_relative(f"{name}.{pn}") for pn, p in m.named_parameters() if p.dim() == 2)
                router_l.update(n.rsplit(".", 1)[-1] for n, c in m.named_modules() if isinstance(c, torch.nn.Linear))
        elif isinstance(m, torch.nn.Linear) and m is not head:
            (moe_l if block is not None else outside).add(name.rsplit(".", 1)[-1])
    moe_l -= router_l | custom
    top_k = next((int(v) for k in TOP_K_KEYS if isinstance(v := getattr(text_config, k, None), int)), 1)
    return MoeLayout(
        expert_params=tuple(sorted(experts_p)),
        router_params=tuple(sorted(router_p)),
        router_linears=tuple(sorted(router_l)),
        custom_routers=tuple(sorted(custom)),
        moe_linears=tuple(sorted(moe_l)),
        outside_linears=tuple(sorted(outside - moe_l - router_l - custom)),
        experts=n_experts,
        top_k=top_k,
        moe_layers=len(blocks),
        expert_param_count=expert_count,
        router_param_count=router_count,
    )


def _is_experts(name: str, module: Any) -> bool:
    fused = any(p.dim() == 3 for p in module.parameters(recurse=False))
    return fused and (name.endswith(".experts") or type(module).__name__.endswith("Experts"))


def _is_router(name: str, module: Any, block: str) -> bool:
    if name.count(".") != block.count(".") + 1:  # a direct child of the expert block
        return False
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("gate", "router") or "router" in type(module).__name__.lower()


def _relative(name: str) -> str:
    """`model.layers.3.mlp.experts.down_proj` -> `mlp.experts.down_proj` (the part after the layer index)."""
    parts = name.split(".")
    index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    return ".".join(parts[index + 1 :]) if index is not None else name
