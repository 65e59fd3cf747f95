"""The spec's method sections: which trainer and which (peft) method, the adapter's knobs, and the 4-bit base.

`MethodFields` opens the Method group (trainer, method, then each adapter's own fields, shown
only for the methods they apply to); `QuantFields` closes it with qlora's bitsandbytes settings,
after the trainer options of `jobs.spec.sections.trainers`.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.enums import (
    LORA_FAMILY,
    PROMPT_FAMILY,
    QLORA_ONLY,
    RANKED_METHODS,
    TARGETED_METHODS,
    ComputeDtype,
    LoraInit,
    Method,
    MoeTargets,
    MoraType,
    QuantType,
    Trainer,
    VisionTrain,
)
from jobs.spec.field import Group, spec_field


@dataclass(frozen=True)
class MethodFields:
    """The trainer, the method and the adapter's shape: rank, alpha, dropout, layers, initialisation."""

    trainer: Trainer = spec_field(
        Trainer.SFT,
        Group.METHOD,
        "sft: supervised fine-tuning on text, chat messages or prompt/completion rows. dpo: preference tuning on prompt/chosen/rejected rows. kto: preference tuning on unpaired prompt/completion/label rows (label true = desirable). reward: a reward model (sequence-classification head scoring chosen above rejected) on prompt/chosen/rejected rows. orpo, cpo (experimental in trl, pinned): preference tuning on prompt/chosen/rejected rows without a reference model. grpo: reinforcement learning on prompt-only rows: sampled completions are scored by rewards (built-in, a reward run's model, or your function). PPO was removed from trl: for RLHF train a reward model, then GRPO.",
        label="Trainer",
    )
    method: Method = spec_field(
        Method.LORA,
        Group.METHOD,
        "full: all weights train. lora/dora: low-rank adapters. qlora: LoRA on a 4-bit NF4 base. lora_8bit: LoRA on an 8-bit base. "
        "ia3, prompt_tuning, prefix_tuning, p_tuning, adaption_prompt (LLaMA-Adapter), lokr, loha, oft, vera, miss, hira: "
        "other peft methods. mora: MoRA's square-matrix update (tunedeck's own, on peft's LoRA).",
        label="Method",
    )
    lora_r: int = spec_field(
        16,
        Group.METHOD,
        "Adapter rank: LoRA's r; MoRA's square matrix gets the same parameter count; "
        "LoKr/LoHa/VeRA/MiSS/HiRA rank. Larger learns more and costs more memory.",
        ge=1,
        le=4096,
        methods=RANKED_METHODS,
        label="LoRA rank",
    )
    lora_alpha: int = spec_field(
        32,
        Group.METHOD,
        "Scaling numerator (LoRA: scale = alpha / r, or alpha / sqrt(r) with rsLoRA; LoKr/LoHa alpha).",
        ge=1,
        methods=LORA_FAMILY | {Method.LOKR, Method.LOHA},
        label="LoRA alpha",
    )
    lora_dropout: float = spec_field(
        0.05,
        Group.METHOD,
        "Dropout on the adapter input (LoRA family, MoRA, VeRA, MiSS, HiRA).",
        ge=0.0,
        le=0.9,
        methods=LORA_FAMILY | {Method.MORA, Method.VERA, Method.MISS, Method.HIRA},
        label="LoRA dropout",
        advanced=True,
    )
    loraplus_lr_ratio: float | None = spec_field(
        None,
        Group.METHOD,
        "LoRA+: train the B matrices at this multiple of the learning rate (the paper suggests 16; empty: off). "
        "Same memory, faster convergence (published: up to 2x fewer steps). LoRA family only.",
        gt=0.0,
        le=1024.0,
        methods=LORA_FAMILY,
        label="LoRA+ ratio",
        advanced=True,
    )
    lora_target_modules: str = spec_field(
        "all-linear",
        Group.METHOD,
        "Which layers get adapters: all-linear, or comma-separated module names such as q_proj,v_proj.",
        methods=TARGETED_METHODS,
        label="Layers with adapters",
        advanced=True,
    )
    moe_targets: MoeTargets = spec_field(
        MoeTargets.EXPERTS,
        Group.METHOD,
        "Mixture-of-experts models only (Mixtral, Qwen3-MoE, gpt-oss, OLMoE, DeepSeek...): which parts get "
        "adapters. attention: the layers outside the expert blocks. attention+experts: also every expert "
        "(their fused weights, through peft's target_parameters) and any shared expert. "
        "attention+experts+router: also the router that picks the experts. Adapters on the fused experts "
        "need lora_dropout 0 (peft cannot drop out inside them): tunedeck sets it and says so, and refuses dora "
        "on them. Dense models ignore this field.",
        methods=LORA_FAMILY,
        label="MoE: layers with adapters",
    )
    vision_train: VisionTrain = spec_field(
        VisionTrain.LANGUAGE,
        Group.METHOD,
        "Vision-language models only (LLaVA, Qwen2-VL, SmolVLM, Gemma 3...): what trains. language: the "
        "language model (LoRA adapters on it, or its weights in a full fine-tune); the vision tower and the "
        "projector that maps image features into the language model stay frozen. language+projector: the "
        "projector too (with all-linear LoRA: adapters on its layers). language+projector+vision: the vision "
        "tower as well (more memory; rarely needed unless the images look unlike the tower's training data). "
        "Text-only models ignore this field.",
        methods=LORA_FAMILY | {Method.FULL},
        label="Vision models: what trains",
        advanced=True,
    )
    use_rslora: bool = spec_field(
        False,
        Group.METHOD,
        "Rank-stabilised LoRA scaling (alpha / sqrt(r)).",
        methods=LORA_FAMILY,
        label="Rank-stabilised LoRA",
        advanced=True,
    )
    lora_init: LoraInit = spec_field(
        LoraInit.DEFAULT,
        Group.METHOD,
        "How LoRA's A and B start. default: random A, zero B. pissa: the principal singular "
        "vectors of each weight (the base keeps the residual). olora: a QR decomposition of each "
        "weight. eva: SVD of the layer inputs on a pass over the training data. loftq (qlora "
        "only): A, B that cancel most of the 4-bit quantization error.",
        methods=LORA_FAMILY,
        label="LoRA initialisation",
        advanced=True,
    )
    num_virtual_tokens: int = spec_field(
        20,
        Group.METHOD,
        "Virtual tokens for prompt, prefix and P-tuning.",
        ge=1,
        le=1024,
        methods=PROMPT_FAMILY,
        label="Virtual tokens",
    )
    mora_type: MoraType = spec_field(
        MoraType.ROPE,
        Group.METHOD,
        "MoRA's compress/decompress operators. rope: chunks rotated RoPE-style (the paper's "
        "choice for small ranks). sharing: summed groups of rows/columns (for large ranks, ~256).",
        methods={Method.MORA},
        label="MoRA operators",
    )
    adapter_len: int = spec_field(
        10,
        Group.METHOD,
        "LLaMA-Adapter: learned prompt tokens per adapted layer.",
        ge=1,
        le=1024,
        methods={Method.ADAPTION_PROMPT},
        label="Adapter prompt length",
    )
    adapter_layers: int = spec_field(
        8,
        Group.METHOD,
        "LLaMA-Adapter: how many of the top layers get adaption prompts (at most the model's layer count).",
        ge=1,
        le=1024,
        methods={Method.ADAPTION_PROMPT},
        label="Adapted layers",
    )
    oft_block_size: int = spec_field(
        32,
        Group.METHOD,
        "OFT: size of the orthogonal blocks. peft moves it to the nearest divisor "
        "of each layer's input features (with a warning). Larger rotates more at once and costs more.",
        ge=1,
        le=4096,
        methods={Method.OFT},
        label="OFT block size",
    )


@dataclass(frozen=True)
class QuantFields:
    """qlora's 4-bit base: data type, double quantization, compute dtype."""

    bnb_4bit_quant_type: QuantType = spec_field(
        QuantType.NF4,
        Group.METHOD,
        "qlora only: 4-bit data type of the frozen base. nf4 (QLoRA's NormalFloat) or fp4.",
        label="4-bit data type",
        when=QLORA_ONLY,
    )
    bnb_4bit_use_double_quant: bool = spec_field(
        True,
        Group.METHOD,
        "qlora only: quantize the quantization constants too (~0.4 bit/param less).",
        label="Double quantization",
        when=QLORA_ONLY,
    )
    bnb_4bit_compute_dtype: ComputeDtype = spec_field(
        ComputeDtype.AUTO,
        Group.METHOD,
        "qlora only: dtype 4-bit layers de-quantize to for their matmuls. auto: the run's precision.",
        label="4-bit compute dtype",
        when=QLORA_ONLY,
    )
