"""trl CLI configs (`trl sft --config FILE`, `trl dpo --config FILE`, `trl grpo --config FILE`) as spec fields.

A trl config does not name its trainer (the command does): a GRPO-only key (`num_generations`,
`reward_funcs`, `epsilon_high`, ...) makes it grpo, a DPO-only key (`beta`, `max_prompt_length`,
`rpo_alpha`, ...) dpo, else sft; `trainer` in --set changes it. Keys trl's TrainingArguments
share with LLaMA-Factory's map the same way; absent keys keep trl's defaults where they change the
training (learning rate 2e-5 for sft and 1e-6 for dpo, 3 epochs, 1024 tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.spec.imports.base import (
    DISTRIBUTED,
    EVALUATION,
    HF_TRAINING_KEYS,
    HUB,
    KERNELS,
    LOADING,
    OUTPUT,
    RESUME,
    TRACKING,
    Imported,
    Reader,
    lora_targets,
    map_optimizer,
    map_precision,
    map_report_to,
    map_scheduler,
    map_warmup,
)

TOOL = "trl"
MARKERS = ("model_name_or_path", "dataset_name", "use_peft")
DPO_KEYS = (
    "beta",
    "max_prompt_length",
    "rpo_alpha",
    "ref_model_init_kwargs",
    "reference_free",
    "precompute_ref_log_probs",
)
GRPO_KEYS = (
    "num_generations",
    "max_completion_length",
    "reward_funcs",
    "reward_weights",
    "epsilon_high",
    "importance_sampling_level",
    "scale_rewards",
    "mask_truncated_completions",
    "top_entropy_quantile",
    "use_vllm",
)
# GRPOConfig's defaults where ours differ (beta: trl 0.0, tunedeck 0.1; max_completion_length: 256, 64)
DEFAULTS = {
    "sft": {"learning_rate": 2e-5},
    "dpo": {"learning_rate": 1e-6},
    "grpo": {"learning_rate": 1e-6, "beta": 0.0, "max_completion_length": 256},
}
DPO_LOSSES = {"sigmoid", "hinge", "ipo"}
GRPO_LOSSES = {"grpo", "dr_grpo", "dapo", "bnpo"}
# trl's grpo script's reward names -> tunedeck's declared reward kinds
TRL_REWARDS = {
    "accuracy_reward": "accuracy",
    "reasoning_accuracy_reward": "reasoning_accuracy",
    "think_format_reward": "think_format",
    "get_soft_overlong_punishment": "overlong",
}

# trl's vLLM server mode: a server started apart, on GPUs of its own (tunedeck runs vLLM colocated: jobs.config.vllm)
VLLM_SERVER_KEYS = (
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_group_port",
)
NO_VLLM_SERVER = "tunedeck runs vLLM inside the training process (colocate): it talks to no vLLM server"

DROPPED = {
    "env": "tunedeck's worker runs with its own environment: set variables where it runs",
    "output_dir": OUTPUT,
    "overwrite_output_dir": OUTPUT,
    "save_strategy": "tunedeck saves every save_steps (and every save_minutes)",
    "save_only_model": OUTPUT,
    "logging_dir": TRACKING,
    "logging_strategy": TRACKING,
    "logging_first_step": TRACKING,
    "push_to_hub": HUB,
    "hub_model_id": HUB,
    "hub_strategy": HUB,
    "eval_strategy": EVALUATION,
    "evaluation_strategy": EVALUATION,
    "per_device_eval_batch_size": "tunedeck has no separate evaluation batch size",
    "dataset_test_split": "tunedeck holds out rows with eval_split or reads eval_dataset",
    "dataset_config": "tunedeck reads the hub data set's default configuration",
    "dataset_streaming": LOADING,
    "dataset_num_proc": LOADING,
    "dataloader_num_workers": LOADING,
    "torch_dtype": "tunedeck loads the weights in the run's precision",
    "dtype": "tunedeck loads the weights in the run's precision",
    "attn_implementation": KERNELS,
    "use_liger_kernel": KERNELS,
    "tf32": KERNELS,
    "model_revision": "tunedeck loads the model's main revision",
    "resume_from_checkpoint": RESUME,
    "deepspeed": DISTRIBUTED,
    "fsdp": DISTRIBUTED,
    "fsdp_config": DISTRIBUTED,
    "ddp_timeout": DISTRIBUTED,
    "gradient_checkpointing_kwargs": "tunedeck sets the checkpointing options itself",
    "lora_task_type": "tunedeck sets the adapter's task type by the trainer",
    "lora_modules_to_save": "tunedeck trains only the adapters (lora_target_modules)",
    "max_prompt_length": "tunedeck bounds the whole row by max_length",
    "neftune_noise_alpha": "NEFTune noise has no tunedeck equivalent",
    "bnb_4bit_quant_storage": "tunedeck stores the 4-bit weights in bitsandbytes' default type",
    **dict.fromkeys(VLLM_SERVER_KEYS, NO_VLLM_SERVER),
    "vllm_max_model_length": "tunedeck sets vLLM's context to max_length + max_completion_length",
    "vllm_enable_sleep_mode": "tunedeck keeps vLLM's share reserved for the whole run (no sleep mode)",
}


def import_trl(data: Mapping[str, Any]) -> Imported:
    """A trl CLI config as spec fields; raises ImportConfigError for values with no equivalent."""
    r = Reader(data, TOOL)
    grpo_key = next((k for k in GRPO_KEYS if r.has(k)), None)
    trainer = "grpo" if grpo_key else "dpo" if any(r.has(k) for k in DPO_KEYS) else "sft"
    r.put("trainer", trainer, grpo_key or ("beta" if trainer == "dpo" else "model_name_or_path"))
    r.copy("model_name_or_path", "model")
    r.copy("trust_remote_code", "trust_remote_code")
    r.copy("run_name", "run_name")
    _data(r)
    _method(r)
    _trainer_options(r, trainer)
    r.copy_same(HF_TRAINING_KEYS)
    length = "max_seq_length" if r.has("max_seq_length") and not r.has("max_length") else "max_length"
    r.copy(length, "max_length")
    if length == "max_length":
        r.drop("max_seq_length", "max_length is given too, and it wins")
    for field_name, value in {"num_train_epochs": 3.0, "max_length": 1024, **DEFAULTS[trainer]}.items():
        r.fields.setdefault(field_name, value)
    if "gradient_checkpointing" in r.data:
        r.put("gradient_checkpointing", r.true("gradient_checkpointing"), "gradient_checkpointing")
    map_scheduler(r, "lr_scheduler_type")
    map_warmup(r)
    map_optimizer(r, "optim")
    map_precision(r)
    map_report_to(r, "report_to")
    r.drop_all(DROPPED)
    return r.result()


def _data(r: Reader) -> None:
    r.copy("dataset_name", "dataset")
    split = r.take("dataset_train_split")
    if split is not None and str(split) != "train":
        r.note("dataset_train_split", f"tunedeck reads the train split, not `{split}`")
    field = r.take("dataset_text_field")
    if field is not None and str(field) != "text":
        r.put("dataset_columns", f"text={field}", "dataset_text_field")


def _method(r: Reader) -> None:
    peft = r.true("use_peft")
    four, eight = r.true("load_in_4bit"), r.true("load_in_8bit")
    dora = r.true("use_dora")
    keys = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_rslora")
    if not peft:
        if four or eight:
            r.fail(
                "load_in_4bit" if four else "load_in_8bit",
                "a quantized base cannot be fully fine-tuned",
                "add use_peft: true",
            )
        r.put("method", "full", "use_peft")
        for key in keys:
            r.drop(key, "use_peft is off: every weight trains")
        return
    if four and eight:
        r.fail("load_in_8bit", "is true together with load_in_4bit", "keep one of load_in_4bit and load_in_8bit")
    method = "qlora" if four else "lora_8bit" if eight else "lora"
    if dora and method != "lora":
        r.fail(
            "use_dora", "DoRA on a quantized base has no tunedeck equivalent", "remove load_in_4bit/8bit, or use_dora"
        )
    r.put("method", "dora" if dora else method, "use_peft")
    r.copy("lora_r", "lora_r")
    r.copy("lora_alpha", "lora_alpha")
    r.copy("lora_dropout", "lora_dropout")
    r.copy("use_rslora", "use_rslora")
    targets = r.take("lora_target_modules")
    if targets is not None:
        r.put("lora_target_modules", lora_targets(targets), "lora_target_modules")
    r.fields.setdefault("lora_target_modules", "all-linear")
    if method == "qlora":
        r.copy("bnb_4bit_quant_type", "bnb_4bit_quant_type")
        r.copy("use_bnb_nested_quant", "bnb_4bit_use_double_quant")


def _trainer_options(r: Reader, trainer: str) -> None:
    if trainer == "grpo":
        _grpo_options(r)
        return
    loss = r.take("loss_type")
    if trainer == "dpo":
        r.copy("beta", "beta")
        if loss is not None:
            name = str(loss).strip().lower()
            if name in DPO_LOSSES:
                r.put("loss_type", name, "loss_type")
            else:
                r.fail("loss_type", f"`{loss}` has no tunedeck equivalent", "use loss_type: sigmoid, hinge or ipo")
        for key in ("rpo_alpha", "reference_free", "precompute_ref_log_probs", "ref_model_init_kwargs"):
            r.drop(key, "DPO variants beyond the loss type have no tunedeck equivalent")
        return
    if loss is not None:
        name = str(loss).strip().lower()
        if name in ("nll", "dft"):
            r.put("loss_type", name, "loss_type")
        else:
            r.fail("loss_type", f"`{loss}` has no tunedeck equivalent", "use loss_type: nll or dft")
    r.copy("packing", "packing")
    r.copy("padding_free", "padding_free")
    r.copy("completion_only_loss", "completion_only_loss")
    r.copy("assistant_only_loss", "assistant_only_loss")


def _grpo_options(r: Reader) -> None:
    """GRPOConfig's sampling, loss knobs and the grpo script's `reward_funcs` (trl.rewards names) with weights."""
    loss = r.take("loss_type")
    if loss is not None:
        if str(loss).strip().lower() in GRPO_LOSSES:
            r.put("loss_type", str(loss).strip().lower(), "loss_type")
        else:
            r.fail(
                "loss_type", f"`{loss}` has no tunedeck equivalent", "use loss_type: " + ", ".join(sorted(GRPO_LOSSES))
            )
    for key in ("beta", "num_generations", "max_completion_length", "temperature", "importance_sampling_level"):
        r.copy(key, key)
    for key in ("epsilon_high", "mask_truncated_completions", "top_entropy_quantile"):
        r.copy(key, key)
    _vllm(r)
    scale = r.take("scale_rewards")
    if scale is not None:  # trl reads true as group and false as none
        r.put("scale_rewards", {True: "group", False: "none"}.get(scale, scale), "scale_rewards")
    names, weights = r.take("reward_funcs"), r.take("reward_weights")
    if names is None:
        if weights is not None:
            r.note("reward_weights", "no reward_funcs to weigh: declare rewards in the spec")
        return
    names = [names] if isinstance(names, str) else list(names)
    unknown = [str(n) for n in names if n not in TRL_REWARDS]
    if unknown:
        r.fail(
            "reward_funcs",
            f"{', '.join(unknown)}: code tunedeck does not import",
            "declare the rewards instead (rewards: [...], docs/methods-and-data.md), or keep " + ", ".join(TRL_REWARDS),
        )
        return
    if weights is not None and not (isinstance(weights, list) and len(weights) == len(names)):
        r.fail("reward_weights", f"`{weights}` is not one weight per reward_funcs entry", "give one number per reward")
        return
    weights = weights or [1.0] * len(names)
    r.put(
        "rewards", [{"kind": TRL_REWARDS[n], "weight": w} for n, w in zip(names, weights, strict=True)], "reward_funcs"
    )
    if "get_soft_overlong_punishment" in names:
        r.note(
            "reward_funcs",
            "overlong starts its penalty a quarter before max_completion_length (trl's script: 1280/256)",
        )


def _vllm(r: Reader) -> None:
    """use_vllm in colocate mode (trl's default) with its share of the GPU; server mode is refused."""
    mode, on = r.take("vllm_mode"), r.true("use_vllm")
    if not on:
        if mode is not None:
            r.note("vllm_mode", "use_vllm is off: trl reads no vLLM mode")
        if r.has("vllm_gpu_memory_utilization"):
            r.drop("vllm_gpu_memory_utilization", "use_vllm is off: nothing reserves a share for vLLM")
        return
    if mode is not None and str(mode).strip().lower() != "colocate":
        r.fail(
            "vllm_mode",
            f"`{mode}` has no tunedeck equivalent: server mode sends generation to a vLLM server started apart on "
            "GPUs of its own (`trl vllm-serve`), and tunedeck's workers start none; tunedeck runs vLLM inside the "
            "training process (colocate)",
            "use vllm_mode: colocate (it shares the training GPU: vllm_gpu_memory_utilization), or remove use_vllm",
        )
        return
    r.put("use_vllm", True, "use_vllm")
    r.copy("vllm_gpu_memory_utilization", "vllm_gpu_memory_utilization")
