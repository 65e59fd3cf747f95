"""The one typed job spec that crosses every boundary: CLI, UI, database, worker.

A `JobSpec` is parsed once at the edge (YAML, JSON, form values) and then passed around
as-is. Every field carries its help text, its form group and its bounds next to it, so the
form, the README table and the validation messages all come from one place.

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

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_SFT_DATASET = "sample:chat-format"
DEFAULT_DPO_DATASET = "sample:preference-format"


class Trainer(str, Enum):
    SFT = "sft"
    DPO = "dpo"


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


LORA_FAMILY = {Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT}
PROMPT_FAMILY = {Method.PROMPT_TUNING, Method.PREFIX_TUNING, Method.P_TUNING}


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


SFT_LOSSES = {LossType.NLL, LossType.DFT}
DPO_LOSSES = {LossType.SIGMOID, LossType.HINGE, LossType.IPO}


class Scheduler(str, Enum):
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    LINEAR = "linear"
    COSINE = "cosine"


class Group(str, Enum):
    RUN = "Run"
    MODEL = "Model"
    DATA = "Data"
    METHOD = "Method"
    MEMORY = "Memory tricks"
    TRAINING = "Training"


def _f(default: Any, group: Group, help: str, *, ge: float | None = None,
       gt: float | None = None, le: float | None = None) -> Any:
    """A spec field with its help text, form group and numeric bounds attached."""
    meta = {"group": group, "help": help, "ge": ge, "gt": gt, "le": le}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: which field, what is wrong, how to fix it."""

    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}. Fix: {self.fix}"


class SpecError(ValueError):
    """Raised with every problem of a spec at once."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the job spec:\n{lines}")


@dataclass(frozen=True)
class JobSpec:
    """A fine-tuning job: model, data, method, memory tricks and hyper-parameters."""

    run_name: str | None = _f(None, Group.RUN, "A name to find the run by; defaults to model + method.")
    # --- Model
    model: str = _f(DEFAULT_MODEL, Group.MODEL,
                    "Built-in model name (smollm2-135m-instruct), a Hugging Face hub id, or a local model folder.")
    trust_remote_code: bool = _f(False, Group.MODEL,
                                 "Run Python code shipped with the model. Only for models you trust; never turned on implicitly.")
    # --- Data
    dataset: str = _f(DEFAULT_SFT_DATASET, Group.DATA,
                      "A bundled sample (sample:chat-format, sample:preference-format), a local .jsonl/.json/.csv/.parquet file, or a hub dataset name.")
    eval_dataset: str | None = _f(None, Group.DATA,
                                  "Held-out data, same forms as dataset. Empty: the sample's own eval split, or none for user data.")
    max_train_samples: int | None = _f(None, Group.DATA, "Use only the first N training rows (empty: all).", ge=1)
    # --- Method
    trainer: Trainer = _f(Trainer.SFT, Group.METHOD,
                          "sft: supervised fine-tuning on text, chat messages or prompt/completion rows. dpo: preference tuning on prompt/chosen/rejected rows.")
    method: Method = _f(Method.LORA, Group.METHOD,
                        "full: all weights train. lora/dora: low-rank adapters. qlora: LoRA on a 4-bit NF4 base. lora_8bit: LoRA on an 8-bit base. ia3, prompt_tuning, prefix_tuning, p_tuning: other peft methods.")
    lora_r: int = _f(16, Group.METHOD, "LoRA rank: adapter size; larger learns more and costs more memory.", ge=1, le=4096)
    lora_alpha: int = _f(32, Group.METHOD, "LoRA scaling numerator (scale = alpha / r, or alpha / sqrt(r) with rsLoRA).", ge=1)
    lora_dropout: float = _f(0.05, Group.METHOD, "Dropout on the LoRA input.", ge=0.0, le=0.9)
    lora_target_modules: str = _f("all-linear", Group.METHOD,
                                  "Which layers get adapters: all-linear, or comma-separated module names such as q_proj,v_proj.")
    use_rslora: bool = _f(False, Group.METHOD, "Rank-stabilised LoRA scaling (alpha / sqrt(r)).")
    num_virtual_tokens: int = _f(20, Group.METHOD, "Virtual tokens for prompt, prefix and P-tuning.", ge=1, le=1024)
    beta: float = _f(0.1, Group.METHOD, "DPO temperature: how far the policy may move from the reference.", gt=0.0, le=10.0)
    loss_type: LossType = _f(LossType.AUTO, Group.METHOD,
                             "auto: trl's default (nll for sft, sigmoid for dpo). sft: nll or dft. dpo: sigmoid (DPO), hinge (SLiC) or ipo.")
    completion_only_loss: bool = _f(True, Group.METHOD,
                                    "SFT on prompt/completion rows: loss on the completion only. No effect on text or messages rows.")
    assistant_only_loss: bool = _f(False, Group.METHOD,
                                   "SFT on chat messages rows: loss on the assistant turns only. Needs `{% generation %}` markers in the chat template (the built-in models have them).")
    bnb_4bit_quant_type: QuantType = _f(QuantType.NF4, Group.METHOD,
                                        "qlora only: 4-bit data type of the frozen base. nf4 (QLoRA's NormalFloat) or fp4.")
    bnb_4bit_use_double_quant: bool = _f(True, Group.METHOD,
                                         "qlora only: quantize the quantization constants too (~0.4 bit/param less).")
    bnb_4bit_compute_dtype: ComputeDtype = _f(ComputeDtype.AUTO, Group.METHOD,
                                              "qlora only: dtype 4-bit layers de-quantize to for their matmuls. auto: the run's precision.")
    # --- Memory tricks
    per_device_train_batch_size: int = _f(8, Group.MEMORY,
                                          "Micro-batch size: examples per forward pass. Activation memory grows with it.", ge=1, le=4096)
    gradient_accumulation_steps: int = _f(1, Group.MEMORY,
                                          "Micro-batches per optimizer step. Same effective batch with less memory; costs time.", ge=1, le=4096)
    gradient_checkpointing: bool = _f(False, Group.MEMORY,
                                      "Recompute activations in the backward pass: much less activation memory, ~20-30% slower.")
    precision: Precision = _f(Precision.AUTO, Group.MEMORY,
                              "auto: the best the device supports (bf16 on recent GPUs, fp32 on CPU). fp16 uses loss scaling and needs CUDA.")
    optim: Optim = _f(Optim.ADAMW, Group.MEMORY,
                      "Optimizer. AdamW keeps ~8 B/param of state; 8-bit AdamW ~2 B; paged variants spill to CPU under pressure (CUDA only).")
    max_length: int = _f(512, Group.MEMORY, "Maximum tokens per example; longer rows are truncated. Activations grow with it.", ge=8, le=131072)
    packing: bool = _f(False, Group.MEMORY, "Pack several short examples into one sequence (SFT only): fewer pad tokens, faster.")
    padding_free: bool = _f(False, Group.MEMORY,
                            "Flatten each batch into one sequence without padding (SFT: needs packing, which turns it on anyway).")
    auto_find_batch_size: bool = _f(False, Group.MEMORY,
                                    "On a CUDA out-of-memory error, halve the micro-batch and retry instead of failing.")
    # --- Training
    learning_rate: float = _f(2e-4, Group.TRAINING, "Peak learning rate. LoRA likes 1e-4..1e-3; full fine-tuning 1e-5..5e-5.", gt=0.0, le=1.0)
    lr_scheduler_type: Scheduler = _f(Scheduler.LINEAR, Group.TRAINING, "How the learning rate changes over training.")
    warmup_steps: int = _f(0, Group.TRAINING, "Optimizer steps of linear warm-up.", ge=0)
    num_train_epochs: float = _f(1.0, Group.TRAINING, "Passes over the training data (ignored when max_steps is set).", gt=0.0, le=1000.0)
    max_steps: int = _f(-1, Group.TRAINING, "Stop after this many optimizer steps; -1 trains for num_train_epochs.", ge=-1)
    weight_decay: float = _f(0.0, Group.TRAINING, "AdamW weight decay.", ge=0.0, le=1.0)
    max_grad_norm: float = _f(1.0, Group.TRAINING, "Gradient clipping norm; 0 turns clipping off.", ge=0.0)
    logging_steps: int = _f(1, Group.TRAINING, "Log metrics every N optimizer steps.", ge=1)
    eval_steps: int | None = _f(None, Group.TRAINING, "Evaluate every N steps (empty: only at the end, when there is eval data).", ge=1)
    save_steps: int | None = _f(None, Group.TRAINING, "Save a resumable checkpoint every N steps (empty: none).", ge=1)
    save_minutes: float | None = _f(10.0, Group.TRAINING,
                                    "Also save a resumable checkpoint every N minutes of training, so a crash loses at most that (empty: off).",
                                    gt=0.0)
    save_total_limit: int | None = _f(2, Group.TRAINING,
                                      "Keep at most N checkpoints on disk, the newest (empty: keep all).", ge=1)
    seed: int = _f(42, Group.TRAINING, "Random seed for data order and initialisation.", ge=0)
    # --- Placement (which worker may take the run)
    pin_host: str | None = _f(None, Group.RUN, "Only a worker on this host (its hostname) takes the run; empty: any host.")
    pin_device: str | None = _f(None, Group.RUN,
                                "Only the worker of this device (`tunedeck worker --device N`) takes the run; empty: any free worker.")

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, data: Any) -> "JobSpec":
        """Build a spec from plain data; raises SpecError listing every problem."""
        if not isinstance(data, dict):
            raise SpecError([Problem("spec", f"expected a mapping of field names to values, got {type(data).__name__}",
                                     "write the spec as `field: value` lines (see examples/)")])
        problems: list[Problem] = []
        known = {f.name: f for f in fields(cls)}
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if key not in known:
                close = _closest(str(key), known)
                fix = f"did you mean `{close}`?" if close else "remove it; see the README's field table"
                name = str(key).strip() or "spec"
                problems.append(Problem(name, "has a field with an empty name" if name == "spec" else "unknown field", fix))
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
    def from_yaml(cls, text: str) -> "JobSpec":
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError([Problem("spec", f"not valid YAML ({exc})", "fix the YAML syntax at the line shown")]) from exc
        return cls.from_dict(data if data is not None else {})

    @classmethod
    def from_json(cls, text: str) -> "JobSpec":
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

    def replace(self, **changes: Any) -> "JobSpec":
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
            out.append(Problem("model", "is empty", f"use `{DEFAULT_MODEL}`, a hub id such as org/name, or a local folder"))
        if not self.dataset.strip():
            out.append(Problem("dataset", "is empty", f"use `{DEFAULT_SFT_DATASET}` or a path to a .jsonl/.json/.csv/.parquet file"))
        if self.lora_target_modules.strip() == "" and self.method in LORA_FAMILY:
            out.append(Problem("lora_target_modules", "is empty", "use `all-linear` or names such as q_proj,v_proj"))
        if self.packing and self.trainer is Trainer.DPO:
            out.append(Problem("packing", "is only supported by the SFT trainer", "set packing: false for dpo"))
        if self.loss_type in SFT_LOSSES and self.trainer is not Trainer.SFT:
            out.append(Problem("loss_type", f"{self.loss_type.value} is an SFT loss",
                               "for dpo use auto, " + ", ".join(sorted(t.value for t in DPO_LOSSES))))
        if self.loss_type in DPO_LOSSES and self.trainer is not Trainer.DPO:
            out.append(Problem("loss_type", f"{self.loss_type.value} is a DPO loss",
                               "for sft use auto, " + ", ".join(sorted(t.value for t in SFT_LOSSES))))
        if self.assistant_only_loss and self.trainer is Trainer.DPO:
            out.append(Problem("assistant_only_loss", "is an SFT option (DPO already scores only the chosen/rejected answers)",
                               "set assistant_only_loss: false for dpo"))
        if self.method is Method.PREFIX_TUNING and self.gradient_checkpointing:
            out.append(Problem("gradient_checkpointing",
                               "prefix tuning fails with gradient checkpointing (the cached prefix keys do not match the recomputed attention shape)",
                               "set gradient_checkpointing: false, or use prompt_tuning / p_tuning"))
        if self.max_steps == 0:
            out.append(Problem("max_steps", "0 would train nothing", "use -1 to train for num_train_epochs, or a positive step count"))
        if self.run_name is not None and len(self.run_name) > 200:
            out.append(Problem("run_name", "is longer than 200 characters", "use a shorter name"))
        for name, limit in (("pin_host", 128), ("pin_device", 32)):
            value = getattr(self, name)
            if value is not None and (len(value) > limit or not value.strip() or value != value.strip()):
                out.append(Problem(name, f"{value!r} is not a host/device name (at most {limit} characters, no "
                                         "surrounding spaces)", f"give the name `hostname` or --device shows, or leave {name} empty"))
        return out

    def validate(self) -> "JobSpec":
        problems = self.problems()
        if problems:
            raise SpecError(problems)
        return self


# ---------------------------------------------------------------------- field metadata
@dataclass(frozen=True)
class FieldInfo:
    """What the form and the README need to know about one spec field."""

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


def field_infos() -> list[FieldInfo]:
    """Every JobSpec field with its group, help, type and bounds, in declaration order."""
    hints = get_type_hints(JobSpec)
    out = []
    for f in fields(JobSpec):
        base, optional = _unwrap_optional(hints[f.name])
        if isinstance(base, type) and issubclass(base, Enum):
            kind, choices = "enum", tuple(m.value for m in base)
        else:
            kind, choices = base.__name__, ()
        m = f.metadata
        out.append(FieldInfo(f.name, m["group"], m["help"], kind, optional, _plain(f.default), choices,
                             m.get("ge"), m.get("gt"), m.get("le")))
    return out


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
        return None, Problem(name, "is missing a value", f"give a value or remove the line to use the default")
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
