"""The peft side of the pure spec -> library config mapping: which peft config a method gets.

Split from `jobs.config.mapping` (which re-exports both functions) so that `jobs.memory.params` can count an
adapter's parameters from the same kwargs without importing the capability checks, which in
turn read model shapes from `jobs.memory.params`.

    peft_kwargs(JobSpec(method="lora"))    # ("LoraConfig", {"r": 16, ...})
    peft_config(spec, model_type="llama")  # the peft config object, or None for full fine-tuning
"""

from __future__ import annotations

from typing import Any

from jobs.config.trainers import task_type
from jobs.spec.enums import LORA_FAMILY, Method, VisionTrain
from jobs.spec.job import JobSpec

IA3_LLAMA_TARGETS = ["k_proj", "v_proj", "down_proj"]
IA3_LLAMA_FEEDFORWARD = ["down_proj"]
# A vision-language model's image side by each family's names: the vision tower (Qwen2-VL's projector, `merger`,
# sits inside its `visual`) and the projector. What `vision_train` leaves out of training is matched by these.
TOWER_MODULES = r".*(?:^|\.)(?:vision_tower|vision_model|visual(?!\.merger))(?:\..*)?"
PROJECTOR_MODULES = r".*(?:^|\.)(?:multi_modal_projector|mm_projector|connector|visual\.merger)(?:\..*)?"
VISION_MODULES = f"(?:{TOWER_MODULES})|(?:{PROJECTOR_MODULES})"


def frozen_vision(spec: JobSpec) -> str | None:
    """The regex (full match on module and parameter names) of a vision-language model's parts that stay
    frozen under the spec's `vision_train`; None when everything trains."""
    if spec.vision_train is VisionTrain.LANGUAGE:
        return VISION_MODULES
    if spec.vision_train is VisionTrain.PROJECTOR:
        return TOWER_MODULES
    return None


def peft_kwargs(
    spec: JobSpec, model_type: str | None = None, moe: Any = None, *, vision: bool = False
) -> tuple[str, dict[str, Any]] | None:
    """(peft config class name, its keyword arguments) for the spec's method; None for full. `moe`: the model's
    `jobs.models.moe_layout.MoeLayout` (None: a dense model), where the spec's moe_targets places adapters.
    `vision`: a vision-language model, whose parts `vision_train` keeps frozen LoRA leaves out (`frozen_vision`)."""
    m = spec.method
    base: dict[str, Any] = {"task_type": task_type(spec)}
    if m is Method.FULL:
        return None
    # LoRA: the base stays frozen (no gradients, no optimizer state); only r*(in+out) adapter
    # weights per layer train, ~0.1-1% of the model, so optimizer memory all but vanishes. The
    # adapters add a little compute per layer. DoRA also learns a per-column magnitude: often
    # closer to full fine-tuning, ~10-30% slower and more activation memory.
    if m in LORA_FAMILY:
        from jobs.config.methods import lora_init_kwargs, targets

        modules, placed = targets(spec), {}
        dropout = spec.lora_dropout
        if moe is not None:
            from jobs.config.moe import moe_targets

            chosen = moe_targets(spec, moe, modules)
            modules = chosen.target_modules
            if chosen.target_parameters:  # peft's ParamWrapper: no dropout inside a fused expert matmul
                placed, dropout = {"target_parameters": chosen.target_parameters}, 0.0
        return "LoraConfig", {
            **base,
            "r": spec.lora_r,
            "lora_alpha": spec.lora_alpha,
            "lora_dropout": dropout,
            "target_modules": modules,
            **placed,
            "use_rslora": spec.use_rslora,
            "use_dora": m is Method.DORA,
            **({"exclude_modules": frozen_vision(spec)} if vision and frozen_vision(spec) else {}),
            "bias": "none",
            **lora_init_kwargs(spec),
        }
    from jobs.config.methods import method_kwargs

    found = method_kwargs(spec)
    if found is not None:
        return found
    # IA3 learns one scaling vector per targeted layer: far fewer parameters than LoRA.
    if m is Method.IA3:
        # Not named `targets`: the LoRA branch imports a function of that name into this scope.
        ia3_targets, feedforward = IA3_LLAMA_TARGETS, IA3_LLAMA_FEEDFORWARD
        if model_type is not None:
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING as FF
            from peft.utils.constants import TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING as TM

            if model_type in TM and model_type in FF:
                ia3_targets, feedforward = list(TM[model_type]), list(FF[model_type])
        return "IA3Config", {**base, "target_modules": list(ia3_targets), "feedforward_modules": list(feedforward)}
    # Prompt-learning methods train only virtual-token embeddings (prefix: per-layer keys and
    # values); each virtual token lengthens every sequence, costing a little activation memory.
    virtual = {"num_virtual_tokens": spec.num_virtual_tokens}
    if m is Method.PROMPT_TUNING:
        return "PromptTuningConfig", {**base, **virtual, "prompt_tuning_init": "RANDOM"}
    if m is Method.PREFIX_TUNING:
        return "PrefixTuningConfig", {**base, **virtual}
    if m is Method.P_TUNING:
        return "PromptEncoderConfig", {**base, **virtual, "encoder_reparameterization_type": "MLP"}
    raise ValueError(f"no peft mapping for method {m!r}")  # pragma: no cover - enum is closed


def peft_config(spec: JobSpec, model_type: str | None = None, moe: Any = None, *, vision: bool = False) -> Any | None:
    """The peft config object for the spec's method, or None for a full fine-tune."""
    found = peft_kwargs(spec, model_type, moe, vision=vision)
    if found is None:
        return None
    from jobs.config.methods import config_class

    cls_name, kwargs = found
    if "eva_config" in kwargs:
        from peft import EvaConfig

        kwargs = {**kwargs, "eva_config": EvaConfig(**kwargs["eva_config"])}
    return config_class(cls_name)(**kwargs)
