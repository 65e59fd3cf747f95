"""The closed sets a job spec chooses from: trainers, methods, precisions, ... and their families.

Each enum is a `(str, Enum)` whose values are the spec's YAML/JSON words. The families
(`LORA_FAMILY`, `DPO_LOSSES`, ...) and the applicability sets (`SFT_ONLY`, `GRPO_ONLY`, ...)
say which fields and losses go with which trainer or method; `jobs.spec.job.spec_problems` checks them and
the form (through `FieldInfo.when`) shows fields by them. Imports nothing of the project.
"""

from __future__ import annotations

from enum import Enum

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_SFT_DATASET = "sample:chat-format"


class Trainer(str, Enum):
    SFT = "sft"
    DPO = "dpo"
    KTO = "kto"
    REWARD = "reward"
    ORPO = "orpo"  # trl.experimental
    CPO = "cpo"  # trl.experimental
    GRPO = "grpo"


DEFAULT_TRAINER = Trainer.SFT  # a spec's trainer when it names none (and the data checks' when none parsed)
# Each trainer's facts (trl classes, row formats, losses, memory, refusals): jobs.spec.trainer_records.


class RowFormat(str, Enum):
    """The row formats trl reads (`jobs.data.row_formats` knows their columns)."""

    TEXT = "text"
    MESSAGES = "messages"
    PROMPT_COMPLETION = "prompt_completion"
    PREFERENCE = "preference"
    UNPAIRED = "unpaired"  # KTO: prompt, completion, label (true: desirable)
    PROMPT_ONLY = "prompt_only"  # GRPO: prompt only; the completions are generated


class Method(str, Enum):
    FULL = "full"
    LORA = "lora"
    DORA = "dora"
    QLORA = "qlora"
    LORA_8BIT = "lora_8bit"
    IA3 = "ia3"
    PROMPT_TUNING = "prompt_tuning"
    PREFIX_TUNING = "prefix_tuning"
    P_TUNING = "p_tuning"
    MORA = "mora"
    ADAPTION_PROMPT = "adaption_prompt"
    LOKR = "lokr"
    LOHA = "loha"
    OFT = "oft"
    VERA = "vera"
    MISS = "miss"
    HIRA = "hira"


LORA_FAMILY = {Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT}
PROMPT_FAMILY = {Method.PROMPT_TUNING, Method.PREFIX_TUNING, Method.P_TUNING}
# Methods that put an adapter on the targeted linear layers (lora_target_modules applies).
TARGETED_METHODS = LORA_FAMILY | {
    Method.MORA,
    Method.LOKR,
    Method.LOHA,
    Method.OFT,
    Method.VERA,
    Method.MISS,
    Method.HIRA,
}
# Methods whose adapter size is set by lora_r.
RANKED_METHODS = TARGETED_METHODS - {Method.OFT}

# One line per method, shown next to the method choice in the form.
METHOD_DESCRIPTIONS: dict[Method, str] = {
    Method.FULL: "every weight trains; most memory, no adapter",
    Method.LORA: "low-rank adapters A, B on the linear layers (Hu et al. 2021)",
    Method.DORA: "LoRA plus a learned magnitude per output column (Liu et al. 2024)",
    Method.QLORA: "LoRA on a 4-bit NF4 base (Dettmers et al. 2023)",
    Method.LORA_8BIT: "LoRA on an 8-bit LLM.int8 base",
    Method.IA3: "one learned scaling vector per attention/MLP layer (Liu et al. 2022)",
    Method.PROMPT_TUNING: "learned virtual tokens before the input (Lester et al. 2021)",
    Method.PREFIX_TUNING: "learned keys/values prepended in every layer (Li & Liang 2021)",
    Method.P_TUNING: "virtual tokens produced by a small MLP encoder (Liu et al. 2021)",
    Method.MORA: "one square matrix per layer: LoRA's parameters, higher-rank update (Jiang et al. 2024)",
    Method.ADAPTION_PROMPT: "LLaMA-Adapter: gated prompts in the top layers (Zhang et al. 2023; llama, mistral, gpt2)",
    Method.LOKR: "Kronecker-product update (LyCORIS LoKr)",
    Method.LOHA: "Hadamard product of two low-rank updates (LyCORIS LoHa)",
    Method.OFT: "orthogonal rotation of the weights in blocks (Qiu et al. 2023)",
    Method.VERA: "frozen shared random matrices, learned scaling vectors (Kopiczko et al. 2024)",
    Method.MISS: "shard-shared update, cheap and fast (MiSS, Kang & Yin 2024)",
    Method.HIRA: "Hadamard product of the base weight with a low-rank update (HiRA, Huang et al. 2025)",
}


class LoraInit(str, Enum):
    DEFAULT = "default"
    PISSA = "pissa"
    OLORA = "olora"
    EVA = "eva"
    LOFTQ = "loftq"


class MoeTargets(str, Enum):
    """Which parts of a mixture-of-experts model get LoRA adapters (dense models: no effect)."""

    ATTENTION = "attention"
    EXPERTS = "attention+experts"
    ROUTER = "attention+experts+router"

    @property
    def experts(self) -> bool:
        return self is not MoeTargets.ATTENTION

    @property
    def router(self) -> bool:
        return self is MoeTargets.ROUTER


class VisionTrain(str, Enum):
    """What trains in a vision-language model (text-only models: no effect)."""

    LANGUAGE = "language"
    PROJECTOR = "language+projector"
    ALL = "language+projector+vision"


class Thinking(str, Enum):
    """What is trained of the rows' reasoning (`<think>` blocks, reasoning fields): `jobs.data.thinking`."""

    TRAIN = "train"
    ANSWER_ONLY = "answer_only"
    STRIP = "strip"


class MoraType(str, Enum):
    ROPE = "rope"
    SHARING = "sharing"


class Precision(str, Enum):
    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Optim(str, Enum):
    ADAMW = "adamw_torch"
    ADAMW_8BIT = "adamw_bnb_8bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADAMW_32BIT = "paged_adamw_32bit"
    ADAFACTOR = "adafactor"
    # Low-rank optimizer state for full fine-tuning (galore-torch, apollo-torch; transformers' names).
    GALORE_ADAMW = "galore_adamw"
    GALORE_ADAMW_8BIT = "galore_adamw_8bit"
    GALORE_ADAMW_LAYERWISE = "galore_adamw_layerwise"
    GALORE_ADAMW_8BIT_LAYERWISE = "galore_adamw_8bit_layerwise"
    APOLLO_ADAMW = "apollo_adamw"
    APOLLO_ADAMW_LAYERWISE = "apollo_adamw_layerwise"


GALORE_OPTIMS = {
    Optim.GALORE_ADAMW,
    Optim.GALORE_ADAMW_8BIT,
    Optim.GALORE_ADAMW_LAYERWISE,
    Optim.GALORE_ADAMW_8BIT_LAYERWISE,
}
APOLLO_OPTIMS = {Optim.APOLLO_ADAMW, Optim.APOLLO_ADAMW_LAYERWISE}
# Optimizers that keep their state at low rank for the linears in optim_target_modules (full fine-tuning only).
LOW_RANK_OPTIMS = GALORE_OPTIMS | APOLLO_OPTIMS
# Layer-wise variants step each weight inside the backward pass, as soon as its gradient is ready.
LAYERWISE_OPTIMS = {o for o in LOW_RANK_OPTIMS if o.value.endswith("_layerwise")}


class QuantType(str, Enum):
    NF4 = "nf4"
    FP4 = "fp4"


class ComputeDtype(str, Enum):
    AUTO = "auto"
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class LossType(str, Enum):
    AUTO = "auto"
    NLL = "nll"
    DFT = "dft"
    SIGMOID = "sigmoid"
    HINGE = "hinge"
    IPO = "ipo"
    KTO = "kto"
    REWARD = "reward"
    ORPO = "orpo"  # trl.experimental
    CPO = "cpo"  # trl.experimental
    APO_ZERO_UNPAIRED = "apo_zero_unpaired"
    # GRPO's (trl GRPOConfig.loss_type): how the token losses of a group are summed
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    DAPO = "dapo"
    BNPO = "bnpo"


SFT_LOSSES = {LossType.NLL, LossType.DFT}
DPO_LOSSES = {LossType.SIGMOID, LossType.HINGE, LossType.IPO}
KTO_LOSSES = {LossType.KTO, LossType.APO_ZERO_UNPAIRED}
GRPO_LOSSES = {LossType.GRPO, LossType.DR_GRPO, LossType.DAPO, LossType.BNPO}


class ImportanceSamplingLevel(str, Enum):
    """GRPO's importance ratio: one per token, or one per completion (GSPO)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


class ScaleRewards(str, Enum):
    """How GRPO divides the advantages: by the group's reward spread, the batch's, or not at all (Dr. GRPO)."""

    GROUP = "group"
    BATCH = "batch"
    NONE = "none"


class Scheduler(str, Enum):
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    LINEAR = "linear"
    COSINE = "cosine"


class OnOom(str, Enum):
    RECOVER = "recover"
    FAIL = "fail"


# Who a field applies to, by the value of a deciding field: the form shows a field only when every
# deciding field holds one of the listed values. New trainers and methods join these sets (or a
# field declares its own `when`), and the form follows without further code.
SFT_ONLY = {"trainer": {Trainer.SFT}}
PREFERENCE_ONLY = {"trainer": {Trainer.DPO, Trainer.KTO, Trainer.ORPO, Trainer.CPO}}
KTO_ONLY = {"trainer": {Trainer.KTO}}
GRPO_ONLY = {"trainer": {Trainer.GRPO}}
LOW_RANK_ONLY = {"optim": set(LOW_RANK_OPTIMS)}
# The trl configs that have activation_offloading (trl 1.16).
OFFLOADING_ONLY = {"trainer": {Trainer.SFT, Trainer.DPO, Trainer.KTO, Trainer.REWARD}}
LORA_ONLY = {"method": LORA_FAMILY}
QLORA_ONLY = {"method": {Method.QLORA}}
PROMPT_ONLY = {"method": PROMPT_FAMILY}
