"""Every validation message of the job spec (parse, rules): unknown keys, types, bounds, enums, combinations."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.errors import Problem
from jobs.spec.enums import DEFAULT_MODEL, Method, Optim, Precision, Scheduler, Trainer
from jobs.spec.field_info import field_infos
from jobs.spec.job import JobSpec, SpecError


def problems_of(data) -> list[Problem]:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data)
    return info.value.problems


def one(data) -> Problem:
    problems = problems_of(data)
    assert len(problems) == 1, problems
    return problems[0]


def test_defaults_are_valid() -> None:
    spec = JobSpec()
    assert spec.problems() == []
    assert spec.model == DEFAULT_MODEL
    assert spec.trainer is Trainer.SFT and spec.method is Method.LORA
    assert JobSpec.from_dict({}) == spec
    assert JobSpec.from_yaml("") == spec


def test_unknown_key_suggests_the_closest_field() -> None:
    p = one({"learning_rat": 1e-4})
    assert (p.field, p.problem, p.fix) == ("learning_rat", "unknown field", "did you mean `learning_rate`?")


def test_unknown_key_without_close_match() -> None:
    p = one({"zzzzzz": 1})
    assert p.problem == "unknown field"
    assert p.fix == "remove it; see the field table in docs/spec.md"


def test_not_a_mapping() -> None:
    p = one([1, 2])
    assert p.field == "spec" and "expected a mapping" in p.problem and "list" in p.problem


@pytest.mark.parametrize("field,value", [("lora_r", "eight"), ("lora_r", 2.5), ("lora_r", True), ("lora_r", [1])])
def test_int_field_rejects_non_integers(field: str, value) -> None:
    p = one({field: value})
    assert p.field == field and p.problem.startswith("expected a whole number")
    assert p.fix == "write a whole number such as 8"


@pytest.mark.parametrize("raw,expected", [("16", 16), (16.0, 16), ("1e1", 10), (" 4 ", 4)])
def test_int_field_accepts_integral_forms(raw, expected: int) -> None:
    assert JobSpec.from_dict({"lora_r": raw}).lora_r == expected


@pytest.mark.parametrize("value", ["fast", True, [1]])
def test_float_field_rejects_non_numbers(value) -> None:
    p = one({"learning_rate": value})
    assert p.problem.startswith("expected a number")
    assert p.fix == "write a number such as 0.0002 or 2e-4"


@pytest.mark.parametrize("value", ["nan", "inf", float("inf")])
def test_float_field_rejects_non_finite(value) -> None:
    p = one({"learning_rate": value})
    assert p.problem.startswith("must be a finite number")


def test_float_field_accepts_strings() -> None:
    assert JobSpec.from_dict({"learning_rate": "2e-4"}).learning_rate == 2e-4


@pytest.mark.parametrize("raw,expected", [(True, True), ("yes", True), ("off", False), ("0", False), ("TRUE", True)])
def test_bool_forms(raw, expected: bool) -> None:
    assert JobSpec.from_dict({"packing": raw}).packing is expected


@pytest.mark.parametrize("value", ["maybe", 1, 2.0])
def test_bool_rejects_other_values(value) -> None:
    p = one({"packing": value})
    assert p.problem.startswith("expected true or false") and p.fix == "write true or false"


def test_str_field_rejects_structures() -> None:
    p = one({"model": {"a": 1}})
    assert p.problem == "expected text, got dict" and p.fix == "write a single text value"


def test_str_field_accepts_numbers_as_text() -> None:
    assert JobSpec.from_dict({"run_name": 123}).run_name == "123"


def test_missing_value_of_required_field() -> None:
    p = one({"lora_r": None})
    assert p.problem == "is missing a value"
    assert "remove the line" in p.fix


def test_empty_optional_is_none() -> None:
    spec = JobSpec.from_dict({"eval_dataset": None, "max_train_samples": "", "eval_steps": None})
    assert spec.eval_dataset is None and spec.max_train_samples is None and spec.eval_steps is None


@pytest.mark.parametrize(
    "field,enum",
    [
        ("trainer", Trainer),
        ("method", Method),
        ("precision", Precision),
        ("optim", Optim),
        ("lr_scheduler_type", Scheduler),
    ],
)
def test_enum_fields_list_their_choices(field: str, enum) -> None:
    p = one({field: "nonsense"})
    assert p.problem == "`nonsense` is not one of the choices"
    assert p.fix == "use one of: " + ", ".join(m.value for m in enum)
    first = next(iter(enum))
    assert getattr(JobSpec.from_dict({field: first.value.upper()}), field) is first


BOUNDS = [
    ("max_train_samples", 0, "use a value >= 1"),
    ("lora_r", 0, "use a value >= 1 and <= 4096"),
    ("lora_r", 4097, "use a value >= 1 and <= 4096"),
    ("lora_alpha", 0, "use a value >= 1"),
    ("lora_dropout", -0.1, "use a value >= 0 and <= 0.9"),
    ("lora_dropout", 0.95, "use a value >= 0 and <= 0.9"),
    ("num_virtual_tokens", 0, "use a value >= 1 and <= 1024"),
    ("num_virtual_tokens", 1025, "use a value >= 1 and <= 1024"),
    ("adapter_len", 0, "use a value >= 1 and <= 1024"),
    ("adapter_layers", 1025, "use a value >= 1 and <= 1024"),
    ("oft_block_size", 0, "use a value >= 1 and <= 4096"),
    ("beta", -0.1, "use a value >= 0 and <= 10"),
    ("beta", 11.0, "use a value >= 0 and <= 10"),
    ("per_device_train_batch_size", 0, "use a value >= 1 and <= 4096"),
    ("gradient_accumulation_steps", 5000, "use a value >= 1 and <= 4096"),
    ("max_length", 7, "use a value >= 8 and <= 131072"),
    ("max_length", 131073, "use a value >= 8 and <= 131072"),
    ("learning_rate", 0.0, "use a value > 0 and <= 1"),
    ("learning_rate", 1.5, "use a value > 0 and <= 1"),
    ("warmup_steps", -1, "use a value >= 0 and <= 1000000000"),
    ("num_train_epochs", 0.0, "use a value > 0 and <= 1000"),
    ("num_train_epochs", 1001.0, "use a value > 0 and <= 1000"),
    ("max_steps", -2, "use a value >= -1 and <= 1000000000"),
    ("max_steps", 10**18, "use a value >= -1 and <= 1000000000"),
    ("weight_decay", 1.5, "use a value >= 0 and <= 1"),
    ("max_grad_norm", -1.0, "use a value >= 0 and <= 1e+06"),
    ("logging_steps", 0, "use a value >= 1 and <= 1000000000"),
    ("eval_steps", 0, "use a value >= 1 and <= 1000000000"),
    ("image_max_pixels", 100, "use a value >= 784 and <= 100000000"),
    ("image_min_pixels", 100_000_001, "use a value >= 784 and <= 100000000"),
    ("early_stopping_patience", 0, "use a value >= 1"),
    ("early_stopping_threshold", -0.1, "use a value >= 0 and <= 1e+06"),
    ("save_steps", 0, "use a value >= 1 and <= 1000000000"),
    ("save_minutes", 0.0, "use a value > 0 and <= 1e+06"),
    ("save_total_limit", 0, "use a value >= 1"),
    ("seed", -1, "use a value >= 0 and <= 4294967295"),
    ("seed", 2**32, "use a value >= 0 and <= 4294967295"),
    ("eval_split", 0.0, "use a value > 0 and <= 1e+09"),
    ("desirable_weight", 0.0, "use a value > 0 and <= 100"),
    ("undesirable_weight", 101.0, "use a value > 0 and <= 100"),
    ("sample_count", 21, "use a value >= 0 and <= 20"),
    ("sample_new_tokens", 0, "use a value >= 1 and <= 1024"),
    ("reward_model_run", 0, "use a value >= 1"),
    ("reward_model_weight", 101.0, "use a value >= -100 and <= 100"),
    ("reward_function_weight", -101.0, "use a value >= -100 and <= 100"),
    ("num_generations", 1, "use a value >= 2 and <= 64"),
    ("max_completion_length", 0, "use a value >= 1 and <= 8192"),
    ("temperature", 0.0, "use a value > 0 and <= 2"),
    ("epsilon_high", 0.1, "use a value >= 0.2 and <= 1"),
    ("top_entropy_quantile", 1.5, "use a value >= 0 and <= 1"),
    ("vllm_gpu_memory_utilization", 0.96, "use a value > 0 and <= 0.95"),
    ("completions_every", 0, "use a value >= 1 and <= 100000"),
    ("loraplus_lr_ratio", 0.0, "use a value > 0 and <= 1024"),
    ("neftune_noise_alpha", 101.0, "use a value > 0 and <= 100"),
    ("optim_rank", 0, "use a value >= 1 and <= 65536"),
    ("optim_update_proj_gap", 0, "use a value >= 1 and <= 1000000"),
]


@pytest.mark.parametrize("field,value,fix", BOUNDS)
def test_each_bound(field: str, value, fix: str) -> None:
    p = one({field: value})
    assert p.field == field
    assert p.problem.endswith("is out of range")
    assert p.fix == fix


@pytest.mark.parametrize("extra", [{}, {"learning_rat": 1e-4}])
def test_no_generations_is_a_bound_problem_under_grpo(extra: dict) -> None:
    """num_generations: 0 is reported, not a ZeroDivisionError (also when another key failed to parse)."""
    problems = problems_of({"trainer": "grpo", "rewards": "repetition", "num_generations": 0, **extra})
    assert [(p.field, p.fix) for p in problems] == [(k, "did you mean `learning_rate`?") for k in extra] + [
        ("num_generations", "use a value >= 2 and <= 64")
    ]


def test_a_partly_wrong_spec_still_reports_its_combinations() -> None:
    """Fields that parsed make a spec of their own: its combination problems join the parse problems."""
    problems = problems_of({"lora_r": "eight", "trainer": "dpo", "packing": True})
    assert [p.field for p in problems] == ["lora_r", "packing"]


def test_every_bounded_field_is_covered() -> None:
    bounded = {f.name for f in field_infos() if f.ge is not None or f.gt is not None or f.le is not None}
    assert bounded == {b[0] for b in BOUNDS}


def test_bounds_edges_are_inclusive_where_declared() -> None:
    spec = JobSpec.from_dict(
        {"lora_r": 1, "lora_dropout": 0.9, "max_length": 8, "max_steps": -1, "learning_rate": 1.0, "warmup_steps": 0}
    )
    assert spec.problems() == []


@pytest.mark.parametrize(
    "data,field,text",
    [
        ({"model": "  "}, "model", "is empty"),
        ({"dataset": ""}, "dataset", "is empty"),
        ({"lora_target_modules": " "}, "lora_target_modules", "is empty"),
        ({"packing": True, "trainer": "dpo"}, "packing", "is only supported by the SFT trainer"),
        ({"method": "prefix_tuning", "gradient_checkpointing": True}, "gradient_checkpointing", "prefix tuning fails"),
        ({"max_steps": 0}, "max_steps", "0 would train nothing"),
        ({"run_name": "x" * 201}, "run_name", "is longer than 200 characters"),
    ],
)
def test_combinations(data: dict, field: str, text: str) -> None:
    p = one(data)
    assert p.field == field and p.problem.startswith(text)
    assert p.fix


def test_empty_target_modules_is_fine_outside_lora() -> None:
    assert JobSpec.from_dict({"lora_target_modules": "", "method": "ia3"}).method is Method.IA3


def test_all_problems_are_reported_at_once() -> None:
    problems = problems_of(
        {
            "learning_rat": 1,
            "lora_r": "x",
            "method": "magic",
            "seed": -5,
            "max_steps": 0,
            "packing": True,
            "trainer": "dpo",
        }
    )
    fields = [p.field for p in problems]
    assert set(fields) == {"learning_rat", "lora_r", "method", "seed", "max_steps", "packing"}
    message = str(SpecError(problems))
    assert message.startswith(f"{len(problems)} problem(s) in the job spec:")
    assert "learning_rat: unknown field. Fix: did you mean `learning_rate`?" in message


def test_yaml_round_trip_keeps_every_field() -> None:
    spec = JobSpec(
        run_name="r",
        model="org/m",
        dataset="d.jsonl",
        eval_dataset="e.jsonl",
        trainer=Trainer.DPO,
        method=Method.QLORA,
        lora_r=4,
        precision=Precision.BF16,
        optim=Optim.ADAMW_8BIT,
        lr_scheduler_type=Scheduler.COSINE,
        learning_rate=1e-5,
        eval_steps=3,
        max_train_samples=10,
    )
    text = spec.to_yaml()
    assert "trainer: dpo" in text and "method: qlora" in text
    assert JobSpec.from_yaml(text) == spec
    assert JobSpec.from_json(spec.to_json()) == spec
    assert JobSpec.from_dict(spec.to_dict()) == spec


def test_invalid_yaml_and_json() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_yaml("model: [unclosed")
    assert info.value.problems[0].field == "spec" and "not valid YAML" in info.value.problems[0].problem
    with pytest.raises(SpecError) as info:
        JobSpec.from_json("{nope")
    assert "not valid JSON" in info.value.problems[0].problem


def test_replace_validates() -> None:
    assert JobSpec().replace(lora_r=4).lora_r == 4
    with pytest.raises(SpecError):
        JobSpec().replace(lora_r=0)
    with pytest.raises(SpecError):
        JobSpec(lora_r=0).validate()


def test_derived_values() -> None:
    spec = JobSpec(per_device_train_batch_size=4, gradient_accumulation_steps=3, model="org/Some-Model/")
    assert spec.effective_batch_size == 12
    assert spec.display_name == "Some-Model-lora-sft"
    assert JobSpec(run_name="mine").display_name == "mine"


def test_problem_str() -> None:
    assert (
        str(Problem("lora_r", "0 is out of range", "use a value >= 1"))
        == "lora_r: 0 is out of range. Fix: use a value >= 1"
    )


def test_field_infos_describe_every_field() -> None:
    infos = {f.name: f for f in field_infos()}
    assert set(infos) == set(JobSpec().to_dict())
    assert infos["method"].kind == "enum" and "qlora" in infos["method"].choices
    assert infos["eval_dataset"].optional and infos["lora_r"].kind == "int" and infos["lora_r"].le == 4096
    assert all(f.help for f in infos.values())


def test_method_specific_fields_name_their_methods() -> None:
    """The form hides knobs by this metadata: each method-specific field lists exactly its methods."""
    from jobs.spec.enums import METHOD_DESCRIPTIONS, Method
    from jobs.spec.field_info import applies_to, field_infos

    infos = {f.name: f for f in field_infos()}
    assert infos["mora_type"].methods == ("mora",) and infos["oft_block_size"].methods == ("oft",)
    assert set(infos["adapter_len"].methods) == {"adaption_prompt"}
    assert "oft" not in infos["lora_r"].methods and "mora" in infos["lora_r"].methods
    assert infos["learning_rate"].methods == ()  # applies to every method
    assert applies_to("lora_alpha", "lokr") and not applies_to("lora_alpha", Method.MORA)
    assert not applies_to("num_virtual_tokens", "lora") and applies_to("seed", "adaption_prompt")
    assert set(METHOD_DESCRIPTIONS) == set(Method) and all(0 < len(d) <= 100 for d in METHOD_DESCRIPTIONS.values())


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"method": "qlora", "lora_init": "pissa"}, "lora_init: pissa rewrites the base weights"),
        ({"method": "lora", "lora_init": "loftq"}, "lora_init: loftq offsets the 4-bit quantization error"),
        ({"method": "mora", "lora_init": "eva"}, "lora_init: eva initialises LoRA adapters; method mora has none"),
        ({"method": "oft", "lora_target_modules": " "}, "lora_target_modules: is empty"),
    ],
)
def test_lora_init_and_target_problems(changes: dict, message: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict(changes)
    assert any(message in str(p) for p in err.value.problems), err.value.problems


# The field names in their order: the YAML's, the form's and the README table's (the contract).
SPEC_FIELDS = [
    "run_name",
    "model",
    "trust_remote_code",
    "dataset",
    "eval_dataset",
    "max_train_samples",
    "dataset_columns",
    "eval_split",
    "dedupe",
    "thinking",
    "trainer",
    "method",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "loraplus_lr_ratio",
    "lora_target_modules",
    "moe_targets",
    "vision_train",
    "use_rslora",
    "lora_init",
    "num_virtual_tokens",
    "mora_type",
    "adapter_len",
    "adapter_layers",
    "oft_block_size",
    "beta",
    "desirable_weight",
    "undesirable_weight",
    "rewards",
    "reward_model_run",
    "reward_model_weight",
    "reward_function",
    "reward_function_weight",
    "num_generations",
    "max_completion_length",
    "temperature",
    "loss_type",
    "importance_sampling_level",
    "scale_rewards",
    "epsilon_high",
    "mask_truncated_completions",
    "top_entropy_quantile",
    "completions_every",
    "use_vllm",
    "vllm_gpu_memory_utilization",
    "completion_only_loss",
    "assistant_only_loss",
    "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant",
    "bnb_4bit_compute_dtype",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "precision",
    "optim",
    "optim_target_modules",
    "optim_rank",
    "optim_update_proj_gap",
    "use_liger_kernel",
    "activation_offloading",
    "torch_compile",
    "cpu_return_freed_memory",
    "max_length",
    "image_max_pixels",
    "image_min_pixels",
    "packing",
    "padding_free",
    "auto_find_batch_size",
    "on_oom",
    "ignore_memory_prediction",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "num_train_epochs",
    "max_steps",
    "weight_decay",
    "max_grad_norm",
    "neftune_noise_alpha",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_minutes",
    "save_total_limit",
    "seed",
    "early_stopping_patience",
    "early_stopping_threshold",
    "metric_for_best_model",
    "doctor_stop_on",
    "eval_tasks",
    "judge",
    "pin_host",
    "pin_device",
    "share_device",
    "sample_prompts",
    "sample_count",
    "sample_new_tokens",
    "report_to",
]


def test_spec_fields_keep_their_names_and_order() -> None:
    """The sections add up to exactly these fields, in this order (form, README and stored specs follow it)."""
    assert [f.name for f in dataclasses.fields(JobSpec)] == SPEC_FIELDS
    assert [f.name for f in field_infos()] == SPEC_FIELDS
