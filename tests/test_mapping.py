"""Table tests of the pure spec -> trl/peft/bitsandbytes mapping (no training, no files)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from jobs.config.mapping import (
    capability_problems,
    capability_warnings,
    peft_config,
    quantization_config,
    resolve_precision,
    resolved_config,
    torch_dtype_name,
    training_config,
)
from jobs.devices.facts import CPU, Device
from jobs.spec.enums import Method, Optim, Precision, Trainer
from jobs.spec.job import JobSpec, SpecError

H100 = Device(cuda=True, bf16=True, compute_capability=(9, 0), name="NVIDIA H100")
V100 = Device(cuda=True, bf16=False, compute_capability=(7, 0), name="Tesla V100")


@pytest.mark.parametrize(
    "precision, device, expected",
    [
        (Precision.AUTO, CPU, Precision.FP32),
        (Precision.AUTO, H100, Precision.BF16),
        (Precision.AUTO, V100, Precision.FP16),
        (Precision.BF16, CPU, Precision.BF16),
        (Precision.FP32, H100, Precision.FP32),
        (Precision.FP16, H100, Precision.FP16),
    ],
)
def test_resolve_precision(precision: Precision, device: Device, expected: Precision) -> None:
    assert resolve_precision(JobSpec(precision=precision), device) is expected


@pytest.mark.parametrize(
    "precision, device, bf16, fp16, use_cpu",
    [
        (Precision.AUTO, CPU, False, False, True),
        (Precision.BF16, CPU, True, False, True),
        (Precision.AUTO, H100, True, False, False),
        (Precision.AUTO, V100, False, True, False),
        (Precision.FP32, H100, False, False, False),
    ],
)
def test_precision_flags(
    tmp_path: Any, precision: Precision, device: Device, bf16: bool, fp16: bool, use_cpu: bool
) -> None:
    kwargs = resolved_config(JobSpec(precision=precision), device, str(tmp_path))["trainer_config"]
    assert (kwargs["bf16"], kwargs["fp16"], kwargs["use_cpu"]) == (bf16, fp16, use_cpu)
    if not device.cuda:  # the config object itself must build on this CPU machine
        args = training_config(JobSpec(precision=precision), device, str(tmp_path))
        assert (args.bf16, args.fp16, args.use_cpu) == (bf16, fp16, use_cpu)


@pytest.mark.parametrize(
    "spec, device, fields",
    [
        (JobSpec(precision=Precision.FP16), CPU, ["precision"]),
        (JobSpec(precision=Precision.BF16), V100, ["precision"]),
        (JobSpec(precision=Precision.BF16), CPU, []),
        (JobSpec(precision=Precision.FP16), V100, []),
        (JobSpec(optim=Optim.PAGED_ADAMW_8BIT), CPU, []),
        (JobSpec(method=Method.QLORA), CPU, []),
    ],
)
def test_capability_problems(spec: JobSpec, device: Device, fields: list[str]) -> None:
    assert [p.field for p in capability_problems(spec, device)] == fields


def test_fp16_on_cpu_message_says_why_and_what_to_do() -> None:
    (problem,) = capability_problems(JobSpec(precision=Precision.FP16), CPU)
    assert "needs CUDA" in problem.problem and "fp32 without loss scaling" in problem.problem
    assert "auto" in problem.fix


@pytest.mark.parametrize(
    "spec, device, needle",
    [
        (JobSpec(optim=Optim.PAGED_ADAMW_8BIT), CPU, "paged optimizers need CUDA"),
        (JobSpec(optim=Optim.PAGED_ADAMW_32BIT), CPU, "paged optimizers need CUDA"),
        (JobSpec(method=Method.QLORA), CPU, "slower"),
        (JobSpec(precision=Precision.BF16), CPU, "use_cpu=True"),
    ],
)
def test_capability_warnings(spec: JobSpec, device: Device, needle: str) -> None:
    assert any(needle in w for w in capability_warnings(spec, device))


def test_no_warnings_for_paged_optimizer_on_cuda() -> None:
    assert capability_warnings(JobSpec(optim=Optim.PAGED_ADAMW_8BIT), H100) == []


@pytest.mark.parametrize(
    "method, cls, fields",
    [
        (
            Method.LORA,
            "LoraConfig",
            {
                "r": 16,
                "lora_alpha": 32,
                "lora_dropout": 0.05,
                "use_dora": False,
                "target_modules": "all-linear",
                "use_rslora": False,
            },
        ),
        (Method.DORA, "LoraConfig", {"use_dora": True, "r": 16}),
        (Method.QLORA, "LoraConfig", {"use_dora": False, "r": 16}),
        (Method.LORA_8BIT, "LoraConfig", {"use_dora": False}),
        (
            Method.IA3,
            "IA3Config",
            {"target_modules": {"k_proj", "v_proj", "down_proj"}, "feedforward_modules": {"down_proj"}},
        ),
        (Method.PROMPT_TUNING, "PromptTuningConfig", {"num_virtual_tokens": 20}),
        (Method.PREFIX_TUNING, "PrefixTuningConfig", {"num_virtual_tokens": 20}),
        (Method.P_TUNING, "PromptEncoderConfig", {"num_virtual_tokens": 20}),
    ],
)
def test_peft_config_per_method(method: Method, cls: str, fields: dict[str, Any]) -> None:
    config = peft_config(JobSpec(method=method))
    assert type(config).__name__ == cls
    assert config.task_type == "CAUSAL_LM"
    for name, value in fields.items():
        got = getattr(config, name)
        assert (set(got) if isinstance(value, set) else got) == value, name


def test_full_fine_tune_has_no_peft_or_quantization() -> None:
    spec = JobSpec(method=Method.FULL)
    assert peft_config(spec) is None and quantization_config(spec) is None


def test_lora_comma_list_and_rslora() -> None:
    config = peft_config(JobSpec(lora_target_modules="q_proj, v_proj,", use_rslora=True, lora_r=4, lora_alpha=8))
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    assert (config.r, config.lora_alpha, config.use_rslora) == (4, 8, True)


def test_ia3_uses_peft_defaults_for_a_known_model_type() -> None:
    config = peft_config(JobSpec(method=Method.IA3), model_type="gpt2")
    assert set(config.target_modules) == {"c_attn", "mlp.c_proj"}


@pytest.mark.parametrize(
    "method, precision, expected",
    [
        (
            Method.QLORA,
            Precision.BF16,
            {
                "load_in_4bit": True,
                "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": torch.bfloat16,
            },
        ),
        (Method.QLORA, Precision.FP16, {"bnb_4bit_compute_dtype": torch.float16}),
        (Method.QLORA, Precision.FP32, {"bnb_4bit_compute_dtype": torch.float32}),
        (Method.LORA_8BIT, Precision.BF16, {"load_in_8bit": True, "load_in_4bit": False}),
        (Method.LORA, Precision.BF16, None),
        (Method.IA3, Precision.FP32, None),
    ],
)
def test_quantization_config(method: Method, precision: Precision, expected: dict[str, Any] | None) -> None:
    config = quantization_config(JobSpec(method=method), precision)
    if expected is None:
        assert config is None
        return
    for name, value in expected.items():
        assert getattr(config, name) == value, name


@pytest.mark.parametrize(
    "method, precision, dtype",
    [
        (Method.FULL, Precision.BF16, "float32"),
        (Method.LORA, Precision.BF16, "bfloat16"),
        (Method.QLORA, Precision.FP16, "float16"),
        (Method.LORA, Precision.FP32, "float32"),
    ],
)
def test_load_dtype(method: Method, precision: Precision, dtype: str) -> None:
    assert torch_dtype_name(JobSpec(method=method), precision) == dtype


@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            {},
            {
                "per_device_train_batch_size": 8,
                "gradient_accumulation_steps": 1,
                "activation_checkpointing": False,
                "optim": "adamw_torch",
                "learning_rate": 2e-4,
                "lr_scheduler_type": "linear",
                "warmup_steps": 0,
                "num_train_epochs": 1.0,
                "max_steps": -1,
                "weight_decay": 0.0,
                "max_grad_norm": 1.0,
                "logging_steps": 1,
                "seed": 42,
                "max_length": 512,
                "packing": False,
                "report_to": [],
                "logging_nan_inf_filter": False,
                "disable_tqdm": True,
                "dataloader_num_workers": 0,
                "save_strategy": "no",
                "eval_strategy": "no",
                "bf16": False,
                "fp16": False,
                "use_cpu": True,
            },
        ),
        (
            {"gradient_checkpointing": True, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
            {
                "activation_checkpointing": True,
                "activation_checkpointing_kwargs": {"use_reentrant": False},
                "per_device_train_batch_size": 2,
                "gradient_accumulation_steps": 4,
            },
        ),
        ({"optim": "adamw_bnb_8bit"}, {"optim": "adamw_bnb_8bit"}),
        ({"optim": "paged_adamw_8bit"}, {"optim": "paged_adamw_8bit"}),
        (
            {"optim": "adafactor", "lr_scheduler_type": "cosine", "warmup_steps": 3},
            {"optim": "adafactor", "lr_scheduler_type": "cosine", "warmup_steps": 3},
        ),
        ({"save_steps": 10}, {"save_strategy": "steps", "save_steps": 10}),
        ({}, {"save_total_limit": 2}),
        ({"save_total_limit": None}, {"save_total_limit": None}),
        ({"eval_steps": 5}, {"eval_strategy": "steps", "eval_steps": 5}),
        ({"packing": True, "max_length": 64, "max_steps": 7}, {"packing": True, "max_length": 64, "max_steps": 7}),
        ({"trainer": "dpo", "beta": 0.3, "dataset": "sample:preference-format"}, {"beta": 0.3, "max_length": 512}),
    ],
)
def test_training_config_fields(tmp_path: Any, changes: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = JobSpec().replace(**changes)
    args = training_config(spec, CPU, str(tmp_path), has_eval=True)
    assert type(args).__name__ == ("DPOConfig" if spec.trainer is Trainer.DPO else "SFTConfig")
    for name, value in expected.items():
        got = getattr(args, name)
        got = got.value if hasattr(got, "value") else got
        assert got == value, name


def test_eval_strategy_needs_eval_data(tmp_path: Any) -> None:
    args = training_config(JobSpec(eval_steps=5), CPU, str(tmp_path), has_eval=False)
    assert args.eval_strategy.value == "no"


def test_dpo_config_has_no_packing_and_sft_has_no_beta(tmp_path: Any) -> None:
    dpo = resolved_config(JobSpec(trainer=Trainer.DPO), CPU, str(tmp_path))["trainer_config"]
    sft = resolved_config(JobSpec(), CPU, str(tmp_path))["trainer_config"]
    assert "packing" not in dpo and dpo["beta"] == 0.1
    assert "beta" not in sft and sft["packing"] is False


def test_resolved_config_is_json_and_records_every_library_config(tmp_path: Any) -> None:
    record = resolved_config(JobSpec(method=Method.QLORA, precision=Precision.BF16), H100, str(tmp_path))
    again = json.loads(json.dumps(record))
    assert again["trainer_config_class"] == "SFTConfig"
    assert again["peft_config_class"] == "LoraConfig" and again["peft_config"]["r"] == 16
    assert again["quantization_config"] == {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    }
    assert again["precision"] == "bf16" and again["torch_dtype"] == "bfloat16"
    assert again["prepare_model_for_kbit_training"] is True
    assert again["device"]["compute_capability"] == [9, 0]
    full = resolved_config(JobSpec(method=Method.FULL), CPU, str(tmp_path))
    assert full["peft_config"] is None and full["quantization_config"] is None


# ---------------------------------------------------------------------- issue 4: the menu
@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            {},
            {
                "completion_only_loss": True,
                "assistant_only_loss": False,
                "padding_free": False,
                "auto_find_batch_size": False,
                "loss_type": "nll",
            },
        ),
        (
            {"assistant_only_loss": True, "completion_only_loss": False},
            {"assistant_only_loss": True, "completion_only_loss": False},
        ),
        ({"padding_free": True, "packing": True}, {"padding_free": True, "packing": True}),
        ({"auto_find_batch_size": True}, {"auto_find_batch_size": True}),
        ({"loss_type": "dft"}, {"loss_type": "dft"}),
        ({"trainer": "dpo", "loss_type": "ipo"}, {"loss_type": "ipo"}),
        ({"trainer": "dpo"}, {"loss_type": "sigmoid", "padding_free": False}),
    ],
)
def test_new_trainer_fields_reach_the_config(tmp_path: Any, changes: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = JobSpec().replace(**changes)
    record = resolved_config(spec, CPU, str(tmp_path))["trainer_config"]
    args = training_config(spec, CPU, str(tmp_path))
    for name, value in expected.items():
        assert record[name] == value, name
        got = getattr(args, name)
        assert got == [value] if isinstance(got, list) else got == value, name
    if spec.trainer is Trainer.DPO:
        assert "assistant_only_loss" not in record and "completion_only_loss" not in record


@pytest.mark.parametrize(
    "changes, expected",
    [
        (
            {"bnb_4bit_quant_type": "fp4"},
            {"bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "float32"},
        ),
        ({"bnb_4bit_use_double_quant": False}, {"bnb_4bit_use_double_quant": False}),
        ({"bnb_4bit_compute_dtype": "bf16"}, {"bnb_4bit_compute_dtype": "bfloat16"}),
        ({"bnb_4bit_compute_dtype": "fp16", "precision": "bf16"}, {"bnb_4bit_compute_dtype": "float16"}),
        ({"precision": "bf16"}, {"bnb_4bit_compute_dtype": "bfloat16"}),  # auto follows the run's precision
    ],
)
def test_qlora_quantization_fields(tmp_path: Any, changes: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = JobSpec(method=Method.QLORA).replace(**changes)
    record = resolved_config(spec, CPU, str(tmp_path))["quantization_config"]
    config = quantization_config(spec, resolve_precision(spec, CPU))
    for name, value in expected.items():
        assert record[name] == value, name
        got = getattr(config, name)
        assert (str(got).replace("torch.", "") if name == "bnb_4bit_compute_dtype" else got) == value, name


def test_bnb_fields_on_other_methods_only_warn() -> None:
    spec = JobSpec().replace(bnb_4bit_quant_type="fp4")
    assert capability_problems(spec, CPU) == []
    assert any("only apply to method qlora" in w for w in capability_warnings(spec, CPU))


@pytest.mark.parametrize(
    "changes, field, needle",
    [
        ({"padding_free": True}, "padding_free", "needs packing"),
        ({"loss_type": "hinge"}, "loss_type", "is a DPO loss"),
        ({"trainer": "dpo", "loss_type": "nll"}, "loss_type", "is an SFT loss"),
        ({"trainer": "dpo", "assistant_only_loss": True}, "assistant_only_loss", "is an SFT option"),
    ],
)
def test_combinations_the_libraries_reject_are_refused(changes: dict[str, Any], field: str, needle: str) -> None:
    try:
        spec = JobSpec.from_dict(changes)
        problems = capability_problems(spec, CPU)
    except SpecError as exc:
        problems = exc.problems
    assert [p.field for p in problems] == [field] and needle in problems[0].problem and problems[0].fix


@pytest.mark.parametrize(
    "changes",
    [
        {"padding_free": True, "packing": True},
        {"trainer": "dpo", "padding_free": True},
        {"assistant_only_loss": True},  # the built-in default model's template has generation markers
        {"method": "prompt_tuning", "packing": True},
    ],
)
def test_valid_combinations_pass(changes: dict[str, Any]) -> None:
    spec = JobSpec().replace(**changes)
    assert spec.problems() == [] and capability_problems(spec, CPU) == []


def test_prompt_tuning_with_packing_warns() -> None:
    spec = JobSpec().replace(method="p_tuning", packing=True)
    assert any("once per packed row" in w for w in capability_warnings(spec, CPU))


def test_template_problem() -> None:
    from jobs.checks.template import template_problem
    from jobs.models.tiny import CHAT_TEMPLATE

    assert template_problem(CHAT_TEMPLATE) is None
    plain = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    problem = template_problem(plain)
    assert problem is not None and "generation" in problem.problem and "{% generation %}" in problem.fix
    assert "no chat template" in template_problem(None).problem
