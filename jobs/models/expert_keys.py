"""The expert keys trl reads from a mixture-of-experts config, filled from the built model where a family lacks them.

trl 1.16's fused LM head (`trl.trainer.utils.add_fused_lm_head`, used by every trainer) adds the load-balancing
loss of a MoE model from `text_config.num_experts` and `text_config.num_experts_per_tok`. Those are the keys of
some families only: GraniteMoE(-hybrid), PhiMoE, DBRX, GLM-4-MoE, DeepSeek-V3 and Llama-4 name the expert count
otherwise (`num_local_experts`, `n_routed_experts`, ...), so the first step failed with `AttributeError:
'GraniteMoeHybridConfig' object has no attribute 'num_experts'`. The count is read here from what transformers
built (`jobs.models.moe_layout`: the fused expert weights' first dimension), never from a family's own key.
Imports nothing of the project.

    fill_expert_keys(model, moe_layout(model, text_config))   # ["num_experts"] when it set it
"""

from __future__ import annotations

from typing import Any


def fill_expert_keys(model: Any, layout: Any) -> list[str]:
    """Set the expert keys trl reads on the model's text config when the family's config has none; the keys set.
    `layout`: the model's `jobs.models.moe_layout.MoeLayout`, or None for a dense model (nothing to do)."""
    if layout is None or not layout.experts:
        return []
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    wanted = {"num_experts": int(layout.experts), "num_experts_per_tok": int(layout.top_k)}
    filled = [key for key in wanted if getattr(text, key, None) is None]
    for key in filled:
        setattr(text, key, wanted[key])
    return filled
