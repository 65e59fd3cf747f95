"""The one typed job spec that crosses every boundary: CLI, UI, database, worker.

A `JobSpec` is parsed once at the edge (YAML, JSON, form values) and then passed around
as-is. Its fields are declared, section by section, in `jobs.spec.sections`, each with its help
text, form group and bounds next to it; `jobs.spec.parse` reads raw values into them and
this module holds the class that joins them (building, serialising, replacing and validating a
spec) and the checks across fields below it: what a spec cannot ask for although each of its
values is fine on its own (bounds first, then the combinations: losses and options of another
trainer, LoRA initialisations a base cannot take, GRPO's rewards and group sizes in `jobs.spec.grpo`,
...), each naming the field and the fix. Pure: no file system, no device.

    spec = JobSpec.from_yaml(Path("examples/smollm2-tag-format.yaml").read_text())
    problems = spec.problems()      # [] when the spec is valid on its own
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import yaml

from jobs.errors import Problem, ProblemError
from jobs.spec.columns import parse_columns
from jobs.spec.doctor_codes import RULE_CHOICES, stop_codes
from jobs.spec.enums import (
    DEFAULT_MODEL,
    DEFAULT_SFT_DATASET,
    LORA_FAMILY,
    TARGETED_METHODS,
    LoraInit,
    Method,
)
from jobs.spec.evaluation import early_stopping_problems, judge_problems
from jobs.spec.field import plain
from jobs.spec.grpo import grpo_problems
from jobs.spec.mixture import LIST_FIX, DataSource, parse_sources, sources_text
from jobs.spec.parse import bounds_problems, parse_values
from jobs.spec.rewards import RewardSpec, parse_rewards
from jobs.spec.sections.evaluation import EvaluationFields
from jobs.spec.sections.memory import MemoryFields
from jobs.spec.sections.method import MethodFields, QuantFields
from jobs.spec.sections.model_data import ModelDataFields
from jobs.spec.sections.run import RunFields
from jobs.spec.sections.trainers import TrainerFields
from jobs.spec.sections.training import TrainingFields
from jobs.spec.trackers import CHOICES, trackers
from jobs.spec.trainer_records import RECORDS, record_for


class SpecError(ProblemError):
    """Raised with every problem of a spec at once."""

    subject = "in the job spec"


# A dataclass collects its bases' fields from the last base to the first, so the sections are
# listed last to first: the fields run model/data, method, trainer options, 4-bit base, memory,
# training, evaluation, run (the order of the form and of the field table in docs/spec.md).
@dataclass(frozen=True)
class JobSpec(
    RunFields, EvaluationFields, TrainingFields, MemoryFields, QuantFields, TrainerFields, MethodFields, ModelDataFields
):
    """A fine-tuning job: model, data, method, memory tricks and hyper-parameters."""

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
        listed: list[Problem] = []
        for key in ("dataset", "eval_dataset"):  # a YAML/JSON list of sources -> the stored text (jobs.spec.mixture)
            if isinstance(data.get(key), list):
                text = sources_text(data[key])
                data = {k: v for k, v in data.items() if k != key} | ({key: text} if text is not None else {})
                if text is None:
                    listed.append(Problem(key, "has a list item that is not a data set", LIST_FIX))
        values, problems = parse_values(cls, data)
        problems = listed + problems
        # `values` holds only known fields, each already of its type, so the spec builds even when
        # other keys failed (those keep their defaults): its range and combination problems are
        # reported too, except for a field already reported for its value.
        spec = cls(**values)
        reported = {p.field for p in problems}
        problems.extend(p for p in spec.problems() if p.field not in reported)
        if problems:
            raise SpecError(problems)
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
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, **changes: Any) -> JobSpec:
        return JobSpec.from_dict({**self.to_dict(), **{k: plain(v) for k, v in changes.items()}})

    # ------------------------------------------------------------------ derived
    @property
    def dataset_sources(self) -> list[DataSource]:
        """`dataset` as its sources (one for a plain reference); [] when it cannot be read (a spec problem)."""
        sources, problems = parse_sources(self.dataset)
        return [] if problems else sources

    @cached_property
    def _parsed_rewards(self) -> tuple[list[RewardSpec], list[Problem]]:
        return parse_rewards(self.rewards) if self.rewards is not None else ([], [])

    @property
    def declared_rewards(self) -> list[RewardSpec]:
        """`rewards` as typed declared rewards, parsed once per spec; [] when none or unreadable (a spec problem)."""
        return self._parsed_rewards[0]

    @property
    def reward_problems(self) -> list[Problem]:
        """What is wrong with `rewards`, each naming its place (`rewards[1].pattern`)."""
        return self._parsed_rewards[1]

    @property
    def display_name(self) -> str:
        return self.run_name or f"{self.model.rstrip('/').split('/')[-1]}-{self.method.value}-{self.trainer.value}"

    # ------------------------------------------------------------------ checks
    def problems(self) -> list[Problem]:
        """Everything wrong with this spec on its own (no file system, no device): `spec_problems`."""
        return spec_problems(self)

    def validate(self) -> JobSpec:
        problems = self.problems()
        if problems:
            raise SpecError(problems)
        return self


# ---------------------------------------------------------------------- checks across fields
def spec_problems(spec: JobSpec) -> list[Problem]:
    """Everything wrong with this spec on its own (no file system, no device)."""
    out: list[Problem] = []
    for f in fields(spec):
        out.extend(bounds_problems(f, getattr(spec, f.name)))
    out.extend(_input_problems(spec))
    out.extend(_trainer_problems(spec))
    out.extend(_lora_init_problems(spec))
    out.extend(
        p for p in grpo_problems(spec, record_for(spec.trainer).generates) if p.field not in {q.field for q in out}
    )  # a bound problem is enough
    if spec.max_steps == 0:
        out.append(
            Problem(
                "max_steps",
                "0 would train nothing",
                "use -1 to train for num_train_epochs, or a positive step count",
            )
        )
    out.extend(_eval_split_problems(spec))
    out.extend(early_stopping_problems(spec, record_for(spec.trainer)))
    out.extend(judge_problems(spec, record_for(spec.trainer)))
    if spec.dataset_columns is not None:
        out.extend(Problem("dataset_columns", problem, fix) for problem, fix in parse_columns(spec.dataset_columns)[1])
    out.extend(_name_problems(spec))
    low, high = spec.image_min_pixels, spec.image_max_pixels
    if low is not None and high is not None and low > high:
        out.append(Problem("image_min_pixels", f"{low} is above image_max_pixels ({high})", "give a min <= the max"))
    return out


def _input_problems(spec: JobSpec) -> list[Problem]:
    """The model, data, adapter targets and trackers named: empty or unreadable ones."""
    out: list[Problem] = []
    if not spec.model.strip():
        out.append(Problem("model", "is empty", f"use `{DEFAULT_MODEL}`, a hub id such as org/name, or a local folder"))
    if not spec.dataset.strip():
        out.append(
            Problem(
                "dataset", "is empty", f"use `{DEFAULT_SFT_DATASET}` or a path to a .jsonl/.json/.csv/.parquet file"
            )
        )
    else:
        out.extend(Problem("dataset", problem, fix) for problem, fix in parse_sources(spec.dataset)[1])
    if spec.eval_dataset and spec.eval_dataset.strip():
        out.extend(Problem("eval_dataset", problem, fix) for problem, fix in parse_sources(spec.eval_dataset)[1])
    if spec.lora_target_modules.strip() == "" and spec.method in TARGETED_METHODS:
        out.append(Problem("lora_target_modules", "is empty", "use `all-linear` or names such as q_proj,v_proj"))
    for word in trackers(spec.report_to)[1]:
        out.append(Problem("report_to", f"`{word}` is not a tracker tunedeck reports to", f"use any of: {CHOICES}"))
    for word in stop_codes(spec.doctor_stop_on)[1]:
        out.append(
            Problem("doctor_stop_on", f"`{word}` is not a rule of the training doctor", f"use any of: {RULE_CHOICES}")
        )
    return out


def _trainer_problems(spec: JobSpec) -> list[Problem]:
    """Options the chosen trainer or method does not take (trl's configs refuse them or train wrongly)."""
    out: list[Problem] = []
    record = record_for(spec.trainer)
    if spec.packing and "packing" not in record.kwargs:
        out.append(
            Problem("packing", "is only supported by the SFT trainer", f"set packing: false for {spec.trainer.value}")
        )
    owner = next((t.value for t, r in RECORDS.items() if spec.loss_type in r.losses), None)
    if owner is not None and spec.loss_type not in record.losses:
        out.append(
            Problem(
                "loss_type",
                f"{spec.loss_type.value} is {'an' if owner == 'sft' else 'a'} {owner.upper()} loss",
                f"for {spec.trainer.value} use " + ", ".join(["auto"] + sorted(t.value for t in record.losses)),
            )
        )
    if spec.assistant_only_loss and "assistant_only_loss" not in record.kwargs:
        out.append(
            Problem(
                "assistant_only_loss",
                f"is an SFT option ({spec.trainer.value.upper()} already scores only the answers)",
                f"set assistant_only_loss: false for {spec.trainer.value}",
            )
        )
    if spec.padding_free and "padding_free" in record.unsupported:
        # KTOConfig, RewardConfig, ORPOConfig, CPOConfig, GRPOConfig have no padding_free (TypeError: unexpected keyword).
        out.append(
            Problem(
                "padding_free",
                f"is not supported by the {spec.trainer.value.upper()} trainer",
                f"set padding_free: false for {spec.trainer.value}",
            )
        )
    if record.min_batch > 1 and spec.per_device_train_batch_size < record.min_batch:
        # trl: "Actual (not effective) batch size must be > 1. KTO will not work properly because the KL term
        # will be equivalent to the implied reward."
        out.append(
            Problem(
                "per_device_train_batch_size",
                f"must be at least {record.min_batch} for {spec.trainer.value} (its KL estimate pairs each "
                "row with another completion of the same micro-batch)",
                f"set per_device_train_batch_size: {record.min_batch} or more (lower gradient_accumulation_steps to keep memory)",
            )
        )
    if spec.method is Method.PREFIX_TUNING and spec.gradient_checkpointing:
        out.append(
            Problem(
                "gradient_checkpointing",
                "prefix tuning fails with gradient checkpointing (the cached prefix keys do not match the recomputed attention shape)",
                "set gradient_checkpointing: false, or use prompt_tuning / p_tuning",
            )
        )
    return out


def _eval_split_problems(spec: JobSpec) -> list[Problem]:
    """eval_split: a fraction or a row count, and not together with eval_dataset."""
    out: list[Problem] = []
    if spec.eval_split is not None:
        if spec.eval_split >= 1 and not float(spec.eval_split).is_integer():
            out.append(
                Problem(
                    "eval_split",
                    f"{spec.eval_split:g} is neither a fraction below 1 nor a whole row count",
                    "write a fraction such as 0.1, or a row count such as 50",
                )
            )
        if spec.eval_dataset and spec.eval_dataset.strip():
            out.append(
                Problem(
                    "eval_split",
                    "is set together with eval_dataset, so which rows to evaluate on is ambiguous",
                    "leave eval_split empty to use eval_dataset, or leave eval_dataset empty to hold out rows",
                )
            )
    return out


def _name_problems(spec: JobSpec) -> list[Problem]:
    """The run name and the host/device pins: lengths and surrounding spaces."""
    out: list[Problem] = []
    if spec.run_name is not None and len(spec.run_name) > 200:
        out.append(Problem("run_name", "is longer than 200 characters", "use a shorter name"))
    for name, limit in (("pin_host", 128), ("pin_device", 32)):
        value = getattr(spec, name)
        if value is not None and (len(value) > limit or not value.strip() or value != value.strip()):
            out.append(
                Problem(
                    name,
                    f"{value!r} is not a host/device name (at most {limit} characters, no surrounding spaces)",
                    f"give the name `hostname` or --device shows, or leave {name} empty",
                )
            )
    return out


def _lora_init_problems(spec: JobSpec) -> list[Problem]:
    """LoRA initialisations that peft offers only for some bases."""
    init, m = spec.lora_init, spec.method
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
