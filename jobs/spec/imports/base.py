"""What every importer shares: the result type, a reader that accounts for every key, and the common value maps.

A `Reader` walks one mapping of another tool's config. Each key ends in exactly one of three places:
mapped onto a spec field (`put`, `copy`), listed as not carried over with the reason (`drop`), or
reported as a problem (`fail`). `result` lists whatever no handler looked at as an unknown key (and
the keys left empty, in one line), so nothing in the file is silently lost; it raises
`ImportConfigError` with every problem at once. Pure: no file system.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.errors import Problem, ProblemError
from jobs.spec.enums import Optim, Precision, Scheduler
from jobs.spec.trackers import Tracker


class ImportConfigError(ProblemError):
    """Raised with every problem of another tool's config at once (fields named as in that file)."""

    subject = "in the imported config"


@dataclass(frozen=True)
class NotCarried:
    """One key of the source config that the spec does not hold, and why."""

    key: str
    why: str

    def __str__(self) -> str:
        return f"not carried over: {self.key}: {self.why}"


@dataclass(frozen=True)
class Imported:
    """Another tool's config as spec field values, where each came from, and what was left behind."""

    tool: str  # "llamafactory" | "axolotl" | "trl"
    fields: dict[str, Any]  # spec field -> value (still to be parsed by JobSpec.from_dict)
    origins: dict[str, str]  # spec field -> the source key it came from
    not_carried: list[NotCarried] = field(default_factory=list)
    carried: tuple[str, ...] = ()  # the source keys read into the spec (or, like do_train: true, nothing to carry)


# ---------------------------------------------------------------------- reasons shared by the tools
DISTRIBUTED = "tunedeck trains each run on one GPU (no DeepSpeed, FSDP or multi-node settings)"
TRACKING = "tunedeck records the metrics itself (the run page, `tunedeck show`)"
TRACKER_SETTINGS = (
    "a tracker's project, entity and address come from the worker's environment (WANDB_PROJECT, "
    "WANDB_ENTITY, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, ...), never from the spec"
)
OUTPUT = "tunedeck keeps each run's checkpoints and adapter in the run's own folder"
TEMPLATE = "tunedeck renders chat rows with the model's own chat template (from its tokenizer)"
KERNELS = "tunedeck picks the attention implementation, kernels and matmul precision itself"
LOADING = "tunedeck loads and tokenizes the data itself"
MULTIMODAL = "a multimodal option with no tunedeck equivalent (the model's own processor reads the images)"
RESUME = "resume an interrupted run with `tunedeck resume RUN_ID`"
EVALUATION = "tunedeck evaluates at the end of the run, or every eval_steps"
HUB = "push a finished run with `tunedeck push RUN_ID`"
MODEL_CLASSES = "tunedeck loads the model and tokenizer with their own (auto) classes"

OPTIMIZERS = {
    "adamw_torch": Optim.ADAMW,
    "adamw_torch_fused": Optim.ADAMW,
    "adamw_hf": Optim.ADAMW,
    "adamw": Optim.ADAMW,
    "adamw_bnb_8bit": Optim.ADAMW_8BIT,
    "adamw_8bit": Optim.ADAMW_8BIT,
    "paged_adamw_8bit": Optim.PAGED_ADAMW_8BIT,
    "paged_adamw_32bit": Optim.PAGED_ADAMW_32BIT,
    "adafactor": Optim.ADAFACTOR,
}
SCHEDULERS = {s.value: s for s in Scheduler}


def map_report_to(r: Reader, key: str, also: Mapping[str, str] | None = None) -> None:
    """The file's `report_to` (a word, a comma list or a list) onto the spec's, plus the trackers other keys turned
    on (`also`: source key -> tracker, axolotl's use_wandb); trackers tunedeck does not mirror to are listed as not
    carried over."""
    raw = r.take(key)
    words = [str(w).strip().lower() for w in (raw if isinstance(raw, (list, tuple)) else [raw]) if w is not None]
    words = [w.strip() for word in words for w in word.split(",") if w.strip()]
    known = [t.value for t in Tracker]
    kept = [w for w in [*words, *(also or {}).values()] if w in known]
    other = [w for w in words if w not in known and w not in ("none", "no")]
    if other:
        r.note(key, f"{', '.join(other)}: tunedeck mirrors metrics to {', '.join(known)} only")
    if kept:
        origin = key if raw is not None else ", ".join(also or {})
        r.put("report_to", ",".join(dict.fromkeys(kept)), origin)


def empty(value: Any) -> bool:
    """A key written without a value (`wandb_project:`), which means the tool's default."""
    return value is None or (isinstance(value, str) and not value.strip())


# Hugging Face TrainingArguments keys that the spec reads under the same name, in every importer
# (axolotl names epochs and the micro-batch its own way: HF_TRAINING_KEYS adds them for the others).
SAME_NAMED_KEYS = (
    "learning_rate",
    "max_steps",
    "gradient_accumulation_steps",
    "weight_decay",
    "max_grad_norm",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "seed",
    "auto_find_batch_size",
)
HF_TRAINING_KEYS = (*SAME_NAMED_KEYS, "num_train_epochs", "per_device_train_batch_size")


class Reader:
    """Accounts for every key of one source mapping; `prefix` names keys of a nested one (`datasets[0].`)."""

    def __init__(self, data: Mapping[Any, Any], tool: str, prefix: str = "") -> None:
        self.data = dict(data)
        self.tool = tool
        self.prefix = prefix
        self.fields: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        self.not_carried: list[NotCarried] = []
        self.problems: list[Problem] = []
        self._handled: set[str] = set()
        self._dropped: set[str] = set()
        self.carried: list[str] = []

    def name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        return not empty(self.data.get(key))

    def take(self, key: str) -> Any:
        """The key's value (None when absent or empty); the key counts as handled."""
        self._handled.add(key)
        value = self.data.get(key)
        return None if empty(value) else value

    def put(self, spec_field: str, value: Any, key: str) -> None:
        self.fields[spec_field] = value
        self.origins[spec_field] = self.name(key)

    def copy(self, key: str, spec_field: str) -> None:
        value = self.take(key)
        if value is not None:
            self.put(spec_field, value, key)

    def copy_same(self, keys: tuple[str, ...]) -> None:
        """`copy` each key to the spec field of the same name."""
        for key in keys:
            self.copy(key, key)

    def drop(self, key: str, why: str) -> None:
        """List the key as not carried over (when the file gives it a value)."""
        value = self.take(key)
        if value is not None:
            self._dropped.add(key)
            self.not_carried.append(NotCarried(self.name(key), why))

    def drop_all(self, reasons: Mapping[str, str]) -> None:
        for key, why in reasons.items():
            self.drop(key, why)

    def note(self, key: str, why: str) -> None:
        """A not-carried-over entry about a key's value, or part of it (one data set of several, a column)."""
        if key in self.data:
            self._dropped.add(key)
        self.not_carried.append(NotCarried(self.name(key), why))

    def fail(self, key: str, problem: str, fix: str) -> None:
        self._handled.add(key)
        self.problems.append(Problem(self.name(key), problem, fix))

    def true(self, key: str) -> bool:
        """A boolean key's value; a value that is not true/false is a problem naming the key."""
        value = self.take(key)
        if value is None or isinstance(value, bool):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        self.fail(key, f"expected true or false, got `{value}`", f"write {self.name(key)}: true or false")
        return False

    def merge(self, other: Reader) -> None:
        """Take over a nested reader's results (call after `other.finish_keys()`)."""
        self.fields.update(other.fields)
        self.origins.update(other.origins)
        self.not_carried.extend(other.not_carried)
        self.problems.extend(other.problems)
        self.carried.extend(other.carried)

    def finish_keys(self) -> None:
        """List the keys no handler looked at as unknown, and the empty ones in one line."""
        blank = []
        for key, value in self.data.items():
            if empty(value):
                blank.append(self.name(str(key)))
            elif str(key) in self._handled:
                if str(key) not in self._dropped:
                    self.carried.append(self.name(str(key)))
            else:
                self.not_carried.append(
                    NotCarried(self.name(str(key)), f"unknown to the {self.tool} importer; nothing maps it")
                )
        if blank:
            self.not_carried.append(NotCarried(", ".join(blank), "empty in the file (the tool's default)"))

    def result(self) -> Imported:
        self.finish_keys()
        if self.problems:
            raise ImportConfigError(self.problems)
        return Imported(self.tool, self.fields, self.origins, self.not_carried, tuple(self.carried))


# ---------------------------------------------------------------------- values every tool has
def map_optimizer(r: Reader, key: str) -> None:
    value = r.take(key)
    if value is None:
        return
    optim = OPTIMIZERS.get(str(value).strip().lower())
    if optim is None:
        offered = ", ".join(o.value for o in Optim)
        r.note(key, f"`{value}` is not offered (tunedeck offers {offered}); the run uses {Optim.ADAMW.value}")
    else:
        r.put("optim", optim.value, key)


def map_scheduler(r: Reader, key: str) -> None:
    value = r.take(key)
    if value is None:
        return
    scheduler = SCHEDULERS.get(str(value).strip().lower())
    if scheduler is None:
        offered = ", ".join(SCHEDULERS)
        r.note(key, f"`{value}` is not offered (tunedeck offers {offered}); the run uses {Scheduler.LINEAR.value}")
    else:
        r.put("lr_scheduler_type", scheduler.value, key)


def map_precision(r: Reader, bf16_key: str = "bf16", fp16_key: str = "fp16") -> None:
    """bf16 / fp16 flags as the spec's precision (axolotl's `bf16: auto` is auto)."""
    bf16 = r.data.get(bf16_key)
    if isinstance(bf16, str) and bf16.strip().lower() == "auto":
        r.take(bf16_key)
        r.put("precision", Precision.AUTO.value, bf16_key)
        bf16_on = False
    else:
        bf16_on = r.true(bf16_key)
    fp16_on = r.true(fp16_key)
    if bf16_on and fp16_on:
        r.fail(fp16_key, f"is true together with {bf16_key}", f"keep one of {bf16_key} and {fp16_key}")
    elif bf16_on:
        r.put("precision", Precision.BF16.value, bf16_key)
    elif fp16_on:
        r.put("precision", Precision.FP16.value, fp16_key)


def map_warmup(r: Reader, steps_key: str = "warmup_steps", ratio_key: str = "warmup_ratio") -> None:
    """warmup_steps as is; a warm-up ratio only when the run's step count is fixed (max_steps)."""
    r.copy(steps_key, "warmup_steps")
    ratio = r.take(ratio_key)
    if ratio is None:
        return
    if "warmup_steps" in r.fields:
        r.note(ratio_key, f"{steps_key} is given too, and it wins")
        return
    max_steps = r.fields.get("max_steps")
    if isinstance(ratio, (int, float)) and isinstance(max_steps, int) and max_steps > 0:
        r.put("warmup_steps", round(ratio * max_steps), ratio_key)
        return
    r.note(
        ratio_key,
        f"tunedeck counts warm-up in steps and this run's step count depends on the data; "
        f"set warmup_steps to about {ratio} x the run's optimizer steps (`tunedeck plan` shows them)",
    )


def kto_batch(r: Reader) -> None:
    """trl's KTO needs 2+ rows per micro-batch: a micro-batch of 1 becomes 2 with half the accumulation."""
    if r.fields.get("trainer") != "kto" or r.fields.get("per_device_train_batch_size") != 1:
        return
    steps = r.fields.get("gradient_accumulation_steps", 1)
    if not isinstance(steps, int) or steps < 2 or steps % 2:
        return  # the spec check reports the micro-batch, naming the fix
    r.fields["per_device_train_batch_size"] = 2
    r.fields["gradient_accumulation_steps"] = steps // 2
    r.note(
        "per_device_train_batch_size",
        f"1 became 2, and gradient_accumulation_steps {steps} became {steps // 2} (the same effective batch): "
        "trl's KTO needs at least 2 rows per micro-batch",
    )


def lora_targets(value: Any) -> str | None:
    """A list or comma text of module names (or `all` / `all-linear`) as lora_target_modules."""
    if isinstance(value, (list, tuple)):
        names = [str(v).strip() for v in value if str(v).strip()]
    else:
        names = [n.strip() for n in str(value).split(",") if n.strip()]
    if not names:
        return None
    if names in (["all"], ["all-linear"], ["all_linear"]):
        return "all-linear"
    return ",".join(names)
