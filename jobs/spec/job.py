"""The one typed job spec that crosses every boundary: CLI, UI, database, worker.

A `JobSpec` is parsed once at the edge (YAML, JSON, form values) and then passed around
as-is. Every field carries its help text, its form group and its bounds next to it, so the
form, the field table in docs/spec.md and the validation messages all come from one place.

    spec = JobSpec.from_yaml(Path("examples/smollm2-tag-format.yaml").read_text())
    problems = spec.problems()      # [] when the spec is valid on its own
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from jobs.errors import Problem, ProblemError  # noqa: F401 - Problem is re-exported until every caller imports jobs.errors
from jobs.spec.columns import columns_text, parse_columns

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_SFT_DATASET = "sample:chat-format"
DEFAULT_DPO_DATASET = "sample:preference-format"


class Trainer(str, Enum):
    SFT = "sft"
    DPO = "dpo"
    KTO = "kto"
    REWARD = "reward"
    ORPO = "orpo"  # trl.experimental
    CPO = "cpo"  # trl.experimental
    GRPO = "grpo"


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


SFT_LOSSES = {LossType.NLL, LossType.DFT}
DPO_LOSSES = {LossType.SIGMOID, LossType.HINGE, LossType.IPO}
KTO_LOSSES = {LossType.KTO, LossType.APO_ZERO_UNPAIRED}
TRAINER_LOSSES = {
    "sft": SFT_LOSSES,
    "dpo": DPO_LOSSES,
    "kto": KTO_LOSSES,
    "reward": set(),
    "orpo": set(),
    "cpo": DPO_LOSSES,
    "grpo": set(),
}
EXPERIMENTAL_TRAINERS = {Trainer.ORPO, Trainer.CPO}  # in trl.experimental: may change in any trl release


class Scheduler(str, Enum):
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    LINEAR = "linear"
    COSINE = "cosine"


class OnOom(str, Enum):
    RECOVER = "recover"
    FAIL = "fail"


class Group(str, Enum):
    RUN = "Run"
    MODEL = "Model"
    DATA = "Data"
    METHOD = "Method"
    MEMORY = "Memory tricks"
    TRAINING = "Training"


# Who a field applies to, by the value of a deciding field: the form shows a field only when every
# deciding field holds one of the listed values. New trainers and methods join these sets (or a
# field declares its own `when`), and the form follows without further code.
SFT_ONLY = {"trainer": {Trainer.SFT}}
PREFERENCE_ONLY = {"trainer": {Trainer.DPO, Trainer.KTO, Trainer.ORPO, Trainer.CPO}}
KTO_ONLY = {"trainer": {Trainer.KTO}}
GRPO_ONLY = {"trainer": {Trainer.GRPO}}
LORA_ONLY = {"method": LORA_FAMILY}
QLORA_ONLY = {"method": {Method.QLORA}}
PROMPT_ONLY = {"method": PROMPT_FAMILY}


def _f(
    default: Any,
    group: Group,
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    methods: Any = None,
    label: str | None = None,
    when: dict[str, set[Enum]] | None = None,
    advanced: bool = False,
) -> Any:
    """A spec field with its help text, form group, numeric bounds, label and applicability attached.

    methods: the methods a method-specific field applies to (None: every method); it joins `when`.
    label: the words people use ("LoRA rank"); the form shows it with the field's name beside it.
    when: deciding field -> the values under which this field applies (None: always).
    advanced: the form keeps it in the group's closed "More" section.
    """
    when = dict(when or {})
    if methods is not None:
        when["method"] = set(methods)
    meta = {
        "group": group,
        "help": help,
        "ge": ge,
        "gt": gt,
        "le": le,
        "label": label,
        "when": when,
        "advanced": advanced,
        "methods": frozenset(methods) if methods is not None else None,
    }
    return field(default=default, metadata=meta)


class SpecError(ProblemError):
    """Raised with every problem of a spec at once."""

    subject = "in the job spec"


@dataclass(frozen=True)
class JobSpec:
    """A fine-tuning job: model, data, method, memory tricks and hyper-parameters."""

    run_name: str | None = _f(
        None, Group.RUN, "A name to find the run by; defaults to model + method.", label="Run name"
    )
    # --- Model
    model: str = _f(
        DEFAULT_MODEL,
        Group.MODEL,
        "Built-in model name (smollm2-135m-instruct), a Hugging Face hub id, or a local model folder.",
        label="Model",
    )
    trust_remote_code: bool = _f(
        False,
        Group.MODEL,
        "Run Python code shipped with the model. Only for models you trust; never turned on implicitly.",
        label="Trust the model's code",
        advanced=True,
    )
    # --- Data
    dataset: str = _f(
        DEFAULT_SFT_DATASET,
        Group.DATA,
        "A bundled sample (sample:chat-format, sample:preference-format, sample:kto-format, sample:prompt-format), a local .jsonl/.json/.csv/.parquet file (.jsonl.gz too; Alpaca and ShareGPT rows are converted), or a hub dataset name.",
        label="Training data",
    )
    eval_dataset: str | None = _f(
        None,
        Group.DATA,
        "Held-out data, same forms as dataset. Empty: the sample's own eval split, or none for user data.",
        label="Evaluation data",
    )
    max_train_samples: int | None = _f(
        None, Group.DATA, "Use only the first N training rows (empty: all).", ge=1, label="Row limit", advanced=True
    )
    dataset_columns: str | None = _f(
        None,
        Group.DATA,
        "Map your column names to the ones trl reads, as target=yours pairs: prompt=question, completion=answer (in YAML also a mapping). Alpaca and ShareGPT files need no mapping: they are detected and converted.",
        label="Column mapping",
        advanced=True,
    )
    eval_split: float | None = _f(
        None,
        Group.DATA,
        "Hold out rows of the training file for evaluation when there is no eval_dataset: a fraction (0.1 = 10%) or a row count (50). Eval loss (and perplexity for sft) is graphed.",
        gt=0.0,
        label="Held-out share",
        advanced=True,
    )
    # --- Method
    trainer: Trainer = _f(
        Trainer.SFT,
        Group.METHOD,
        "sft: supervised fine-tuning on text, chat messages or prompt/completion rows. dpo: preference tuning on prompt/chosen/rejected rows. kto: preference tuning on unpaired prompt/completion/label rows (label true = desirable). reward: a reward model (sequence-classification head scoring chosen above rejected) on prompt/chosen/rejected rows. orpo, cpo (experimental in trl, pinned): preference tuning on prompt/chosen/rejected rows without a reference model. grpo: reinforcement learning on prompt-only rows: sampled completions are scored by rewards (built-in, a reward run's model, or your function). PPO was removed from trl: for RLHF train a reward model, then GRPO.",
        label="Trainer",
    )
    method: Method = _f(
        Method.LORA,
        Group.METHOD,
        "full: all weights train. lora/dora: low-rank adapters. qlora: LoRA on a 4-bit NF4 base. lora_8bit: LoRA on an 8-bit base. "
        "ia3, prompt_tuning, prefix_tuning, p_tuning, adaption_prompt (LLaMA-Adapter), lokr, loha, oft, vera, miss, hira: "
        "other peft methods. mora: MoRA's square-matrix update (tunedeck's own, on peft's LoRA).",
        label="Method",
    )
    lora_r: int = _f(
        16,
        Group.METHOD,
        "Adapter rank: LoRA's r; MoRA's square matrix gets the same parameter count; "
        "LoKr/LoHa/VeRA/MiSS/HiRA rank. Larger learns more and costs more memory.",
        ge=1,
        le=4096,
        methods=RANKED_METHODS,
        label="LoRA rank",
    )
    lora_alpha: int = _f(
        32,
        Group.METHOD,
        "Scaling numerator (LoRA: scale = alpha / r, or alpha / sqrt(r) with rsLoRA; LoKr/LoHa alpha).",
        ge=1,
        methods=LORA_FAMILY | {Method.LOKR, Method.LOHA},
        label="LoRA alpha",
    )
    lora_dropout: float = _f(
        0.05,
        Group.METHOD,
        "Dropout on the adapter input (LoRA family, MoRA, VeRA, MiSS, HiRA).",
        ge=0.0,
        le=0.9,
        methods=LORA_FAMILY | {Method.MORA, Method.VERA, Method.MISS, Method.HIRA},
        label="LoRA dropout",
        advanced=True,
    )
    lora_target_modules: str = _f(
        "all-linear",
        Group.METHOD,
        "Which layers get adapters: all-linear, or comma-separated module names such as q_proj,v_proj.",
        methods=TARGETED_METHODS,
        label="Layers with adapters",
        advanced=True,
    )
    use_rslora: bool = _f(
        False,
        Group.METHOD,
        "Rank-stabilised LoRA scaling (alpha / sqrt(r)).",
        methods=LORA_FAMILY,
        label="Rank-stabilised LoRA",
        advanced=True,
    )
    lora_init: LoraInit = _f(
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
    num_virtual_tokens: int = _f(
        20,
        Group.METHOD,
        "Virtual tokens for prompt, prefix and P-tuning.",
        ge=1,
        le=1024,
        methods=PROMPT_FAMILY,
        label="Virtual tokens",
    )
    mora_type: MoraType = _f(
        MoraType.ROPE,
        Group.METHOD,
        "MoRA's compress/decompress operators. rope: chunks rotated RoPE-style (the paper's "
        "choice for small ranks). sharing: summed groups of rows/columns (for large ranks, ~256).",
        methods={Method.MORA},
        label="MoRA operators",
    )
    adapter_len: int = _f(
        10,
        Group.METHOD,
        "LLaMA-Adapter: learned prompt tokens per adapted layer.",
        ge=1,
        le=1024,
        methods={Method.ADAPTION_PROMPT},
        label="Adapter prompt length",
    )
    adapter_layers: int = _f(
        8,
        Group.METHOD,
        "LLaMA-Adapter: how many of the top layers get adaption prompts (at most the model's layer count).",
        ge=1,
        le=1024,
        methods={Method.ADAPTION_PROMPT},
        label="Adapted layers",
    )
    oft_block_size: int = _f(
        32,
        Group.METHOD,
        "OFT: size of the orthogonal blocks. peft moves it to the nearest divisor "
        "of each layer's input features (with a warning). Larger rotates more at once and costs more.",
        ge=1,
        le=4096,
        methods={Method.OFT},
        label="OFT block size",
    )
    beta: float = _f(
        0.1,
        Group.METHOD,
        "DPO/KTO/CPO temperature: how far the policy may move from the reference; ORPO: weight of the odds-ratio term; GRPO: weight of the KL penalty towards the base model (0: none, and no reference pass).",
        ge=0.0,
        le=10.0,
        label="Preference beta",
        when={"trainer": PREFERENCE_ONLY["trainer"] | {Trainer.GRPO}},
    )
    desirable_weight: float = _f(
        1.0,
        Group.METHOD,
        "kto only: weight of the desirable (label true) rows' loss; raise it when they are the minority.",
        gt=0.0,
        le=100.0,
        label="Desirable weight",
        when=KTO_ONLY,
        advanced=True,
    )
    undesirable_weight: float = _f(
        1.0,
        Group.METHOD,
        "kto only: weight of the undesirable (label false) rows' loss.",
        gt=0.0,
        le=100.0,
        label="Undesirable weight",
        when=KTO_ONLY,
        advanced=True,
    )
    rewards: str | None = _f(
        None,
        Group.METHOD,
        "grpo: built-in rewards from trl.rewards, comma-separated, each with an optional weight (name=weight): "
        "think_format (1 when the answer opens with <think>...</think>), repetition (penalty up to -1 for "
        "repeated 3-grams), overlong (penalty as completions near max_completion_length).",
        label="Built-in rewards",
        when=GRPO_ONLY,
    )
    reward_model_run: int | None = _f(
        None,
        Group.METHOD,
        "grpo: the id of a finished run with trainer: reward; its reward model scores every completion.",
        ge=1,
        label="Reward model (reward run id)",
        when=GRPO_ONLY,
    )
    reward_model_weight: float = _f(
        1.0,
        Group.METHOD,
        "grpo: weight of the reward model's score in the total reward.",
        ge=-100.0,
        le=100.0,
        label="Reward model weight",
        when=GRPO_ONLY,
        advanced=True,
    )
    reward_function: str | None = _f(
        None,
        Group.METHOD,
        "grpo: your own reward, module:function or path/to/file.py:function, called as trl calls "
        "reward functions (prompts, completions, completion_ids, your data's other columns; one float per completion). Runs Python: accepted "
        "only from a spec file on the command line, never from the dashboard or its API.",
        label="Custom reward function",
        when=GRPO_ONLY,
        advanced=True,
    )
    reward_function_weight: float = _f(
        1.0,
        Group.METHOD,
        "grpo: weight of the custom reward function in the total reward.",
        ge=-100.0,
        le=100.0,
        label="Custom reward weight",
        when=GRPO_ONLY,
        advanced=True,
    )
    num_generations: int = _f(
        4,
        Group.METHOD,
        "grpo: completions sampled per prompt; their rewards are compared within the group. The "
        "effective batch (micro-batch x accumulation) must be a multiple of it.",
        ge=2,
        le=64,
        label="Completions per prompt",
        when=GRPO_ONLY,
    )
    max_completion_length: int = _f(
        64,
        Group.METHOD,
        "grpo: most tokens generated per completion.",
        ge=1,
        le=8192,
        label="Max completion tokens",
        when=GRPO_ONLY,
    )
    temperature: float = _f(
        1.0,
        Group.METHOD,
        "grpo: sampling temperature of the completions; lower is less varied, "
        "and too little variety leaves nothing to compare.",
        gt=0.0,
        le=2.0,
        label="Sampling temperature",
        when=GRPO_ONLY,
        advanced=True,
    )
    loss_type: LossType = _f(
        LossType.AUTO,
        Group.METHOD,
        "auto: trl's default (nll for sft, sigmoid for dpo and cpo, kto for kto). sft: nll or dft. dpo, cpo: sigmoid (DPO), hinge (SLiC) or ipo. kto: kto or apo_zero_unpaired.",
        label="Loss",
        advanced=True,
    )
    completion_only_loss: bool = _f(
        True,
        Group.METHOD,
        "SFT on prompt/completion rows: loss on the completion only. No effect on text or messages rows.",
        label="Loss on completions only",
        when=SFT_ONLY,
        advanced=True,
    )
    assistant_only_loss: bool = _f(
        False,
        Group.METHOD,
        "SFT on chat messages rows: loss on the assistant turns only. Needs `{% generation %}` markers in the chat template (the built-in models have them).",
        label="Loss on assistant turns only",
        when=SFT_ONLY,
        advanced=True,
    )
    bnb_4bit_quant_type: QuantType = _f(
        QuantType.NF4,
        Group.METHOD,
        "qlora only: 4-bit data type of the frozen base. nf4 (QLoRA's NormalFloat) or fp4.",
        label="4-bit data type",
        when=QLORA_ONLY,
    )
    bnb_4bit_use_double_quant: bool = _f(
        True,
        Group.METHOD,
        "qlora only: quantize the quantization constants too (~0.4 bit/param less).",
        label="Double quantization",
        when=QLORA_ONLY,
    )
    bnb_4bit_compute_dtype: ComputeDtype = _f(
        ComputeDtype.AUTO,
        Group.METHOD,
        "qlora only: dtype 4-bit layers de-quantize to for their matmuls. auto: the run's precision.",
        label="4-bit compute dtype",
        when=QLORA_ONLY,
    )
    # --- Memory tricks
    per_device_train_batch_size: int = _f(
        8,
        Group.MEMORY,
        "Micro-batch size: examples per forward pass. Activation memory grows with it.",
        ge=1,
        le=4096,
        label="Micro-batch size",
    )
    gradient_accumulation_steps: int = _f(
        1,
        Group.MEMORY,
        "Micro-batches per optimizer step. Same effective batch with less memory; costs time.",
        ge=1,
        le=4096,
        label="Gradient accumulation",
    )
    gradient_checkpointing: bool = _f(
        False,
        Group.MEMORY,
        "Recompute activations in the backward pass: much less activation memory, ~20-30% slower.",
        label="Gradient checkpointing",
    )
    precision: Precision = _f(
        Precision.AUTO,
        Group.MEMORY,
        "auto: the best the device supports (bf16 on recent GPUs, fp32 on CPU). fp16 uses loss scaling and needs CUDA.",
        label="Precision",
        advanced=True,
    )
    optim: Optim = _f(
        Optim.ADAMW,
        Group.MEMORY,
        "Optimizer. AdamW keeps ~8 B/param of state; 8-bit AdamW ~2 B; paged variants spill to CPU under pressure (CUDA only).",
        label="Optimizer",
    )
    max_length: int = _f(
        512,
        Group.MEMORY,
        "Maximum tokens per example; longer rows are truncated. Activations grow with it.",
        ge=8,
        le=131072,
        label="Max tokens per example",
    )
    packing: bool = _f(
        False,
        Group.MEMORY,
        "Pack several short examples into one sequence (SFT only): fewer pad tokens, faster.",
        label="Packing",
        when=SFT_ONLY,
        advanced=True,
    )
    padding_free: bool = _f(
        False,
        Group.MEMORY,
        "Flatten each batch into one sequence without padding (SFT: needs packing, which turns it on anyway).",
        label="Padding-free batches",
        advanced=True,
    )
    auto_find_batch_size: bool = _f(
        False,
        Group.MEMORY,
        "On a CUDA out-of-memory error, halve the micro-batch and retry instead of failing.",
        label="Shrink the batch on out-of-memory",
        advanced=True,
    )
    on_oom: OnOom = _f(
        OnOom.RECOVER,
        Group.MEMORY,
        "recover: on a CUDA out-of-memory error, continue from the last checkpoint with a smaller micro-batch (same effective batch), then gradient checkpointing, then 8-bit AdamW; at most 3 times, each change recorded on the run. fail: stop with advice.",
        label="On out-of-memory",
        advanced=True,
    )
    ignore_memory_prediction: bool = _f(
        False,
        Group.MEMORY,
        "Queue the run even when the predicted peak memory exceeds the device's memory (the prediction can be wrong for unusual models).",
        label="Queue even if predicted not to fit",
        advanced=True,
    )
    # --- Training
    learning_rate: float = _f(
        2e-4,
        Group.TRAINING,
        "Peak learning rate. LoRA likes 1e-4..1e-3; full fine-tuning 1e-5..5e-5.",
        gt=0.0,
        le=1.0,
        label="Learning rate",
    )
    lr_scheduler_type: Scheduler = _f(
        Scheduler.LINEAR,
        Group.TRAINING,
        "How the learning rate changes over training.",
        label="Learning-rate schedule",
        advanced=True,
    )
    warmup_steps: int = _f(
        0, Group.TRAINING, "Optimizer steps of linear warm-up.", ge=0, label="Warm-up steps", advanced=True
    )
    num_train_epochs: float = _f(
        1.0,
        Group.TRAINING,
        "Passes over the training data (ignored when max_steps is set).",
        gt=0.0,
        le=1000.0,
        label="Epochs",
    )
    max_steps: int = _f(
        -1,
        Group.TRAINING,
        "Stop after this many optimizer steps; -1 trains for num_train_epochs.",
        ge=-1,
        label="Max steps",
    )
    weight_decay: float = _f(
        0.0, Group.TRAINING, "AdamW weight decay.", ge=0.0, le=1.0, label="Weight decay", advanced=True
    )
    max_grad_norm: float = _f(
        1.0,
        Group.TRAINING,
        "Gradient clipping norm; 0 turns clipping off.",
        ge=0.0,
        label="Gradient clipping",
        advanced=True,
    )
    logging_steps: int = _f(
        1, Group.TRAINING, "Log metrics every N optimizer steps.", ge=1, label="Log every N steps", advanced=True
    )
    eval_steps: int | None = _f(
        None,
        Group.TRAINING,
        "Evaluate every N steps (empty: only at the end, when there is eval data).",
        ge=1,
        label="Evaluate every N steps",
        advanced=True,
    )
    save_steps: int | None = _f(
        None,
        Group.TRAINING,
        "Save a resumable checkpoint every N steps (empty: none).",
        ge=1,
        label="Checkpoint every N steps",
        advanced=True,
    )
    save_minutes: float | None = _f(
        10.0,
        Group.TRAINING,
        "Also save a resumable checkpoint every N minutes of training, so a crash loses at most that (empty: off).",
        gt=0.0,
        label="Checkpoint every N minutes",
        advanced=True,
    )
    save_total_limit: int | None = _f(
        2,
        Group.TRAINING,
        "Keep at most N checkpoints on disk, the newest (empty: keep all).",
        ge=1,
        label="Checkpoints kept",
        advanced=True,
    )
    seed: int = _f(
        42, Group.TRAINING, "Random seed for data order and initialisation.", ge=0, label="Seed", advanced=True
    )
    pin_host: str | None = _f(
        None,
        Group.RUN,
        "Only a worker on this host (its hostname) takes the run; empty: any host.",
        label="Host",
        advanced=True,
    )
    pin_device: str | None = _f(
        None,
        Group.RUN,
        "Only the worker of this device (`tunedeck worker --device N`) takes the run; empty: any free worker.",
        label="Device",
        advanced=True,
    )
    sample_prompts: str | None = _f(
        None,
        Group.RUN,
        "Prompts the base model and the result answer greedily at the end of the run (the run page's before/after table), one per line (in YAML also a list). Empty: the first prompts of the held-out eval rows, else a built-in set.",
        label="Before/after prompts",
        advanced=True,
    )
    sample_count: int = _f(
        3,
        Group.RUN,
        "How many prompts the before/after samples answer (0: take none).",
        ge=0,
        le=20,
        label="Before/after samples",
        advanced=True,
    )
    sample_new_tokens: int = _f(
        48,
        Group.RUN,
        "Most tokens each before/after answer may have.",
        ge=1,
        le=1024,
        label="Before/after answer length",
        advanced=True,
    )

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """Build a spec from plain data; raises SpecError listing every problem."""
        if not isinstance(data, dict):
            raise SpecError(
                [
                    Problem(
                        "spec",
                        f"expected a mapping of field names to values, got {type(data).__name__}",
                        "write the spec as `field: value` lines (see examples/)",
                    )
                ]
            )
        problems: list[Problem] = []
        known = {f.name: f for f in fields(cls)}
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if key == "dataset_columns" and isinstance(raw, dict):
                raw = columns_text(raw)  # YAML/JSON mapping -> the one stored form, target=source pairs
            if key == "sample_prompts" and isinstance(raw, list):
                raw = "\n".join(str(p).strip() for p in raw)  # a YAML/JSON list -> the stored form, one per line
            if key not in known:
                close = _closest(str(key), known)
                fix = f"did you mean `{close}`?" if close else "remove it; see the field table in docs/spec.md"
                name = str(key).strip() or "spec"
                problems.append(
                    Problem(name, "has a field with an empty name" if name == "spec" else "unknown field", fix)
                )
                continue
            value, problem = _coerce(key, raw, hints[key])
            if problem:
                problems.append(problem)
            else:
                values[key] = value
        spec = None
        if not problems:
            spec = cls(**values)
            problems.extend(spec.problems())
        else:
            # Still report range/combination problems of the fields that did parse.
            try:
                problems.extend(p for p in cls(**values).problems() if p.field not in {q.field for q in problems})
            except Exception:  # pragma: no cover - defensive: partial specs may not build
                pass
        if problems:
            raise SpecError(problems)
        assert spec is not None
        return spec

    @classmethod
    def from_yaml(cls, text: str) -> JobSpec:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(
                [Problem("spec", f"not valid YAML ({exc})", "fix the YAML syntax at the line shown")]
            ) from exc
        return cls.from_dict(data if data is not None else {})

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError([Problem("spec", f"not valid JSON ({exc})", "fix the JSON syntax")]) from exc
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, **changes: Any) -> JobSpec:
        return JobSpec.from_dict({**self.to_dict(), **{k: _plain(v) for k, v in changes.items()}})

    # ------------------------------------------------------------------ derived
    @property
    def effective_batch_size(self) -> int:
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def display_name(self) -> str:
        return self.run_name or f"{self.model.rstrip('/').split('/')[-1]}-{self.method.value}-{self.trainer.value}"

    # ------------------------------------------------------------------ checks
    def problems(self) -> list[Problem]:
        """Everything wrong with this spec on its own (no file system, no device)."""
        out: list[Problem] = []
        for f in fields(self):
            out.extend(_bounds_problems(f, getattr(self, f.name)))
        if not self.model.strip():
            out.append(
                Problem("model", "is empty", f"use `{DEFAULT_MODEL}`, a hub id such as org/name, or a local folder")
            )
        if not self.dataset.strip():
            out.append(
                Problem(
                    "dataset", "is empty", f"use `{DEFAULT_SFT_DATASET}` or a path to a .jsonl/.json/.csv/.parquet file"
                )
            )
        if self.lora_target_modules.strip() == "" and self.method in TARGETED_METHODS:
            out.append(Problem("lora_target_modules", "is empty", "use `all-linear` or names such as q_proj,v_proj"))
        if self.packing and self.trainer is not Trainer.SFT:
            out.append(
                Problem(
                    "packing", "is only supported by the SFT trainer", f"set packing: false for {self.trainer.value}"
                )
            )
        owner = next((t for t, losses in TRAINER_LOSSES.items() if self.loss_type in losses), None)
        if owner is not None and self.loss_type not in TRAINER_LOSSES[self.trainer.value]:
            out.append(
                Problem(
                    "loss_type",
                    f"{self.loss_type.value} is {'an' if owner == 'sft' else 'a'} {owner.upper()} loss",
                    f"for {self.trainer.value} use "
                    + ", ".join(["auto"] + sorted(t.value for t in TRAINER_LOSSES[self.trainer.value])),
                )
            )
        if self.assistant_only_loss and self.trainer is not Trainer.SFT:
            out.append(
                Problem(
                    "assistant_only_loss",
                    f"is an SFT option ({self.trainer.value.upper()} already scores only the answers)",
                    f"set assistant_only_loss: false for {self.trainer.value}",
                )
            )
        if self.padding_free and self.trainer in (Trainer.KTO, Trainer.REWARD, Trainer.ORPO, Trainer.CPO, Trainer.GRPO):
            # KTOConfig, RewardConfig, ORPOConfig, CPOConfig, GRPOConfig have no padding_free (TypeError: unexpected keyword).
            out.append(
                Problem(
                    "padding_free",
                    f"is not supported by the {self.trainer.value.upper()} trainer",
                    f"set padding_free: false for {self.trainer.value}",
                )
            )
        if self.trainer is Trainer.KTO and self.per_device_train_batch_size < 2:
            # trl: "Actual (not effective) batch size must be > 1. KTO will not work properly because the KL term
            # will be equivalent to the implied reward."
            out.append(
                Problem(
                    "per_device_train_batch_size",
                    "must be at least 2 for kto (its KL estimate pairs each "
                    "row with another completion of the same micro-batch)",
                    "set per_device_train_batch_size: 2 or more (lower gradient_accumulation_steps to keep memory)",
                )
            )
        if self.method is Method.PREFIX_TUNING and self.gradient_checkpointing:
            out.append(
                Problem(
                    "gradient_checkpointing",
                    "prefix tuning fails with gradient checkpointing (the cached prefix keys do not match the recomputed attention shape)",
                    "set gradient_checkpointing: false, or use prompt_tuning / p_tuning",
                )
            )
        out.extend(self._lora_init_problems())
        out.extend(
            p for p in self._grpo_problems() if p.field not in {q.field for q in out}
        )  # a bound problem is enough
        if self.max_steps == 0:
            out.append(
                Problem(
                    "max_steps",
                    "0 would train nothing",
                    "use -1 to train for num_train_epochs, or a positive step count",
                )
            )
        if self.eval_split is not None:
            if self.eval_split >= 1 and not float(self.eval_split).is_integer():
                out.append(
                    Problem(
                        "eval_split",
                        f"{self.eval_split:g} is neither a fraction below 1 nor a whole row count",
                        "write a fraction such as 0.1, or a row count such as 50",
                    )
                )
            if self.eval_dataset and self.eval_dataset.strip():
                out.append(
                    Problem(
                        "eval_split",
                        "is set together with eval_dataset, so which rows to evaluate on is ambiguous",
                        "leave eval_split empty to use eval_dataset, or leave eval_dataset empty to hold out rows",
                    )
                )
        if self.dataset_columns is not None:
            out.extend(
                Problem("dataset_columns", problem, fix) for problem, fix in parse_columns(self.dataset_columns)[1]
            )
        if self.run_name is not None and len(self.run_name) > 200:
            out.append(Problem("run_name", "is longer than 200 characters", "use a shorter name"))
        for name, limit in (("pin_host", 128), ("pin_device", 32)):
            value = getattr(self, name)
            if value is not None and (len(value) > limit or not value.strip() or value != value.strip()):
                out.append(
                    Problem(
                        name,
                        f"{value!r} is not a host/device name (at most {limit} characters, no surrounding spaces)",
                        f"give the name `hostname` or --device shows, or leave {name} empty",
                    )
                )
        return out

    @property
    def sample_prompt_list(self) -> list[str]:
        """sample_prompts as a list: one prompt per non-empty line."""
        return [line.strip() for line in (self.sample_prompts or "").splitlines() if line.strip()]

    @property
    def column_map(self) -> dict[str, str]:
        """dataset_columns as {trl column: the data's column}; {} when unset or invalid."""
        return parse_columns(self.dataset_columns)[0] if self.dataset_columns else {}

    def _lora_init_problems(self) -> list[Problem]:
        """LoRA initialisations that peft offers only for some bases."""
        init, m = self.lora_init, self.method
        if init is LoraInit.DEFAULT:
            return []
        if m not in LORA_FAMILY:
            return [
                Problem(
                    "lora_init",
                    f"{init.value} initialises LoRA adapters; method {m.value} has none",
                    "set lora_init: default, or method: lora",
                )
            ]
        if init is LoraInit.LOFTQ and m is not Method.QLORA:
            return [
                Problem(
                    "lora_init",
                    "loftq offsets the 4-bit quantization error, so it needs a 4-bit base",
                    "use method: qlora with loftq, or pissa/olora/eva with lora",
                )
            ]
        if init in {LoraInit.PISSA, LoraInit.OLORA} and m in {Method.QLORA, Method.LORA_8BIT}:
            return [
                Problem(
                    "lora_init",
                    f"{init.value} rewrites the base weights, which a quantized base cannot hold "
                    "(peft: quantize the residual yourself afterwards)",
                    f"use method: lora or dora with {init.value}, or lora_init: loftq with qlora",
                )
            ]
        return []

    def _grpo_problems(self) -> list[Problem]:
        """GRPO's rewards and group sizes; reward fields under another trainer (see jobs.spec.rewards)."""
        from jobs.spec.rewards import function_ref_problem, parse_rewards

        grpo = self.trainer is Trainer.GRPO
        out: list[Problem] = []
        if self.beta == 0 and self.trainer in PREFERENCE_ONLY["trainer"]:
            out.append(
                Problem(
                    "beta",
                    f"0 leaves {self.trainer.value} without its preference term",
                    "use a value > 0 (0 is only for grpo: no KL penalty)",
                )
            )
        given = [n for n in ("rewards", "reward_model_run", "reward_function") if getattr(self, n) is not None]
        if not grpo:
            return out + [
                Problem(
                    n,
                    f"is a grpo option; the {self.trainer.value} trainer has no rewards",
                    f"remove {n}, or set trainer: grpo",
                )
                for n in given
            ]
        if self.rewards is not None:
            out.extend(Problem("rewards", problem, fix) for problem, fix in parse_rewards(self.rewards)[1])
        if self.reward_function is not None:
            found = function_ref_problem(self.reward_function)
            if found:
                out.append(Problem("reward_function", *found))
        if not given:
            out.append(
                Problem(
                    "rewards",
                    "grpo needs at least one reward to score the completions",
                    "name built-in rewards (e.g. rewards: repetition, overlong), a finished reward run "
                    "(reward_model_run: ID), or a reward_function in a spec file",
                )
            )
        if self.effective_batch_size % self.num_generations:
            # trl: "generation_batch_size (6) must be divisible by num_generations (4)."
            out.append(
                Problem(
                    "num_generations",
                    f"{self.num_generations} does not divide the effective batch "
                    f"({self.per_device_train_batch_size} x {self.gradient_accumulation_steps} = "
                    f"{self.effective_batch_size}); trl generates whole groups of completions per prompt",
                    "make per_device_train_batch_size x gradient_accumulation_steps a multiple of num_generations",
                )
            )
        if self.auto_find_batch_size:
            # trl: "auto_find_batch_size is not supported by GRPO, because the generation batch must contain full
            # prompt groups of num_generations completions"
            out.append(
                Problem(
                    "auto_find_batch_size",
                    "is not supported by grpo (a halved batch would split the groups of completions per prompt)",
                    "set auto_find_batch_size: false and lower "
                    "per_device_train_batch_size instead (keep it a multiple of num_generations)",
                )
            )
        return out

    def validate(self) -> JobSpec:
        problems = self.problems()
        if problems:
            raise SpecError(problems)
        return self


# ---------------------------------------------------------------------- field metadata
@dataclass(frozen=True)
class FieldInfo:
    """What the form and the field table of docs/spec.md need to know about one spec field."""

    name: str
    group: Group
    help: str
    kind: str  # "str" | "int" | "float" | "bool" | "enum"
    optional: bool
    default: Any
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    methods: tuple[str, ...] = ()  # the methods this field applies to; empty: every method
    label: str = ""
    when: tuple[tuple[str, frozenset[str]], ...] = ()  # (deciding field, values it applies under)
    advanced: bool = False

    @property
    def title(self) -> str:
        """The form's label: the words people use, with the spec name beside them."""
        return f"{self.label} ({self.name})"

    def applies(self, values: dict[str, Any]) -> bool:
        """Whether this field applies under these values of its deciding fields (plain or enum).

        A deciding value that is missing or not one of its choices counts as applying: the field
        stays in view while the spec reports that value's own problem."""
        for name, allowed in self.when:
            value = _plain(values.get(name))
            if value in _CHOICES.get(name, ()) and value not in allowed:
                return False
        return True


def field_infos() -> list[FieldInfo]:
    """Every JobSpec field with its group, help, type, bounds, label and applicability, in declaration order."""
    hints = get_type_hints(JobSpec)
    out = []
    for f in fields(JobSpec):
        base, optional = _unwrap_optional(hints[f.name])
        if isinstance(base, type) and issubclass(base, Enum):
            kind, choices = "enum", tuple(m.value for m in base)
        else:
            kind, choices = base.__name__, ()
        m = f.metadata
        methods = tuple(x.value for x in Method if x in m["methods"]) if m.get("methods") else ()
        when = tuple((name, frozenset(_plain(v) for v in allowed)) for name, allowed in m.get("when", {}).items())
        label = m.get("label") or f.name.replace("_", " ").capitalize()
        out.append(
            FieldInfo(
                f.name,
                m["group"],
                m["help"],
                kind,
                optional,
                _plain(f.default),
                choices,
                m.get("ge"),
                m.get("gt"),
                m.get("le"),
                methods,
                label,
                when,
                bool(m.get("advanced")),
            )
        )
    return out


def deciding_fields() -> list[str]:
    """The fields whose value decides whether others apply (today: trainer and method)."""
    return sorted({name for info in field_infos() for name, _ in info.when})


def _enum_choices() -> dict[str, tuple[str, ...]]:
    hints = get_type_hints(JobSpec)
    out = {}
    for f in fields(JobSpec):
        base, _ = _unwrap_optional(hints[f.name])
        if isinstance(base, type) and issubclass(base, Enum):
            out[f.name] = tuple(m.value for m in base)
    return out


def applies_to(field_name: str, method: Method | str) -> bool:
    """Whether a spec field matters for a method (the form hides the ones that do not)."""
    methods = next(f.metadata.get("methods") for f in fields(JobSpec) if f.name == field_name)
    return methods is None or Method(method) in methods


# ---------------------------------------------------------------------- helpers
def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = get_args(tp)
    if get_origin(tp) is not None and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _coerce(name: str, raw: Any, tp: Any) -> tuple[Any, Problem | None]:
    base, optional = _unwrap_optional(tp)
    blank = isinstance(raw, str) and raw.strip() == ""
    if raw is None or (blank and (base is not str or optional)):
        if optional:
            return None, None
        return None, Problem(name, "is missing a value", "give a value or remove the line to use the default")
    if isinstance(base, type) and issubclass(base, Enum):
        try:
            return base(str(raw).strip().lower()), None
        except ValueError:
            choices = ", ".join(m.value for m in base)
            return None, Problem(name, f"`{raw}` is not one of the choices", f"use one of: {choices}")
    if base is bool:
        if isinstance(raw, bool):
            return raw, None
        if isinstance(raw, str) and raw.strip().lower() in {"true", "yes", "on", "1", "false", "no", "off", "0"}:
            return raw.strip().lower() in {"true", "yes", "on", "1"}, None
        return None, Problem(name, f"expected true or false, got `{raw}`", "write true or false")
    if base is int:
        if isinstance(raw, bool):
            return None, Problem(name, f"expected a whole number, got `{raw}`", "write a whole number such as 8")
        if isinstance(raw, int):
            return raw, None
        if isinstance(raw, float) and raw.is_integer():
            return int(raw), None
        if isinstance(raw, str):
            try:
                return int(raw.strip()), None
            except ValueError:
                try:
                    as_float = float(raw.strip())
                    if as_float.is_integer():
                        return int(as_float), None
                except ValueError:
                    pass
        return None, Problem(name, f"expected a whole number, got `{raw}`", "write a whole number such as 8")
    if base is float:
        if isinstance(raw, bool):
            return None, Problem(name, f"expected a number, got `{raw}`", "write a number such as 0.0002 or 2e-4")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return None, Problem(name, f"expected a number, got `{raw}`", "write a number such as 0.0002 or 2e-4")
        if not math.isfinite(value):
            return None, Problem(name, f"must be a finite number, got `{raw}`", "write a finite number")
        return value, None
    if base is str:
        if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
            return str(raw).strip(), None
        return None, Problem(name, f"expected text, got {type(raw).__name__}", "write a single text value")
    raise TypeError(f"unsupported spec field type {tp!r}")  # pragma: no cover - programming error


def _bounds_problems(f: dataclasses.Field, value: Any) -> list[Problem]:
    if value is None or isinstance(value, (bool, str, Enum)):
        return []
    m = f.metadata
    ge, gt, le = m.get("ge"), m.get("gt"), m.get("le")
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(f.name, f"must be a finite number, got {value}", "write a finite number")]
    lo = f">= {_num(ge)}" if ge is not None else f"> {_num(gt)}" if gt is not None else None
    if (ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le):
        rng = " and ".join(x for x in (lo, f"<= {_num(le)}" if le is not None else None) if x)
        return [Problem(f.name, f"{_num(value)} is out of range", f"use a value {rng}")]
    return []


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _closest(key: str, known: dict[str, Any]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return match[0] if match else None


_CHOICES: dict[str, tuple[str, ...]] = _enum_choices()  # enum field -> its values, for FieldInfo.applies
