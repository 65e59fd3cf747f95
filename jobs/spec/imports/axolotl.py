"""axolotl YAML (`axolotl train FILE`) as spec fields; its `datasets:` entries in `jobs.spec.imports.axolotl_data`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.spec.imports.axolotl_data import map_dataset_list
from jobs.spec.imports.base import (
    DISTRIBUTED,
    EVALUATION,
    HUB,
    KERNELS,
    LOADING,
    MODEL_CLASSES,
    MULTIMODAL,
    OUTPUT,
    RESUME,
    SAME_NAMED_KEYS,
    TEMPLATE,
    TRACKER_SETTINGS,
    TRACKING,
    Imported,
    Reader,
    kto_batch,
    lora_targets,
    map_optimizer,
    map_precision,
    map_report_to,
    map_scheduler,
    map_warmup,
)

TOOL = "axolotl"
MARKERS = ("base_model", "micro_batch_size", "sequence_len", "adapter", "num_epochs", "sample_packing")
RL = {"dpo": ("dpo", None), "ipo": ("dpo", "ipo"), "kto": ("kto", None), "orpo": ("orpo", None)}

DROPPED = {
    "model_type": MODEL_CLASSES,
    "tokenizer_type": MODEL_CLASSES,
    "base_model_config": MODEL_CLASSES,
    "tokenizer_config": MODEL_CLASSES,
    "tokenizer_use_fast": MODEL_CLASSES,
    "special_tokens": "tunedeck keeps the tokenizer's own special tokens (a pad token is set when it has none)",
    "tokens": "tunedeck adds no tokens to the tokenizer",
    "chat_template": TEMPLATE,
    "chat_template_jinja": TEMPLATE,
    "default_system_message": "tunedeck takes the system prompt from the rows (a system turn or column)",
    "output_dir": OUTPUT,
    "save_safetensors": OUTPUT,
    "save_only_model": OUTPUT,
    "dataset_prepared_path": LOADING,
    "dataset_processes": LOADING,
    "dataset_num_proc": LOADING,
    "dataloader_num_workers": LOADING,
    "dataloader_pin_memory": LOADING,
    "dataloader_prefetch_factor": LOADING,
    "dataset_exact_deduplication": "tunedeck trains on the rows as given (no deduplication)",
    "remove_unused_columns": LOADING,
    "pad_to_sequence_len": "tunedeck pads each micro-batch to its longest row",
    "eval_sample_packing": EVALUATION,
    "sample_packing_sequentially": "tunedeck's packing has no order options",
    "curriculum_sampling": "tunedeck shuffles the rows with the seed",
    "group_by_length": "tunedeck shuffles the rows with the seed",
    "evals_per_epoch": EVALUATION,
    "eval_strategy": EVALUATION,
    "eval_batch_size": "tunedeck has no separate evaluation batch size",
    "eval_max_new_tokens": EVALUATION,
    "eval_table_size": EVALUATION,
    "saves_per_epoch": "tunedeck saves every save_steps (and every save_minutes)",
    "save_strategy": "tunedeck saves every save_steps (and every save_minutes)",
    "save_first_step": "tunedeck saves every save_steps (and every save_minutes)",
    "resume_from_checkpoint": RESUME,
    "auto_resume_from_checkpoints": RESUME,
    "lora_model_dir": "tunedeck starts a fresh adapter: merge yours into the model first, then point model at the merged folder",
    "lora_modules_to_save": "tunedeck trains only the adapters (lora_target_modules)",
    "lora_fan_in_fan_out": "peft reads it from the model's layer types",
    "tf32": KERNELS,
    "attn_implementation": KERNELS,
    "flash_attention": KERNELS,
    "sdp_attention": KERNELS,
    "xformers_attention": KERNELS,
    "flash_attn_cross_entropy": KERNELS,
    "flash_attn_rms_norm": KERNELS,
    "flash_attn_fuse_qkv": KERNELS,
    "flash_attn_fuse_mlp": KERNELS,
    "plugins": KERNELS,
    "liger_rope": KERNELS,
    "liger_rms_norm": KERNELS,
    "liger_glu_activation": KERNELS,
    "liger_layer_norm": KERNELS,
    "liger_fused_linear_cross_entropy": KERNELS,
    "cut_cross_entropy": KERNELS,
    "unsloth_lora_mlp": KERNELS,
    "unsloth_lora_qkv": KERNELS,
    "unsloth_lora_o": KERNELS,
    "lora_mlp_kernel": KERNELS,
    "lora_qkv_kernel": KERNELS,
    "lora_o_kernel": KERNELS,
    "use_ray": DISTRIBUTED,
    "trl": "GRPO-style trainer options of axolotl's rl trainers",
    "gradient_checkpointing_kwargs": "tunedeck sets the checkpointing options itself",
    "deepspeed": DISTRIBUTED,
    "fsdp": DISTRIBUTED,
    "fsdp_config": DISTRIBUTED,
    "fsdp_version": DISTRIBUTED,
    "tensor_parallel_size": DISTRIBUTED,
    "context_parallel_size": DISTRIBUTED,
    "ddp_timeout": DISTRIBUTED,
    "local_rank": DISTRIBUTED,
    "strict": "axolotl's config validation switch; tunedeck always checks the spec",
    "loss_watchdog_threshold": "tunedeck has no loss watchdog (cancel a run from its page or `tunedeck cancel`)",
    "loss_watchdog_patience": "tunedeck has no loss watchdog (cancel a run from its page or `tunedeck cancel`)",
    "train_on_eos": "tunedeck trains on the end-of-turn tokens of the answers",
    "neftune_noise_alpha": "NEFTune noise has no tunedeck equivalent",
    "hub_model_id": HUB,
    "hub_strategy": HUB,
    "push_dataset_to_hub": HUB,
    "processor_type": MULTIMODAL,
    "image_size": MULTIMODAL,
    "image_resize_algorithm": MULTIMODAL,
    "skip_prepare_dataset": LOADING,
    "test_value": "not an axolotl training option (it marks the example for axolotl's own tests)",
}
TRACKING_PREFIXES = (
    "wandb_",
    "mlflow_",
    "comet_",
    "swanlab_",
    "use_wandb",
    "use_mlflow",
    "use_comet",
    "use_tensorboard",
    "otel_",
    "use_otel",
)


# axolotl turns a tracker on when its project (or its use_ flag) is set; the rest of its settings are the tracker's own
TRACKER_ON = {
    "use_wandb": "wandb",
    "wandb_project": "wandb",
    "use_mlflow": "mlflow",
    "mlflow_tracking_uri": "mlflow",
    "use_tensorboard": "tensorboard",
}
TRACKER_KEYS = (*TRACKER_ON, "wandb_entity", "wandb_name", "wandb_mode", "mlflow_experiment_name", "mlflow_run_name")


def _trackers_on(r: Reader) -> dict[str, str]:
    """The source keys that turn a tracker tunedeck mirrors to on (a true flag or a named project), and which."""
    on = {}
    for key, tracker in TRACKER_ON.items():
        value = r.data.get(key)
        if value is True or (isinstance(value, str) and value.strip() and value.strip().lower() != "false"):
            on[key] = tracker
    return on


def import_axolotl(data: Mapping[str, Any]) -> Imported:
    """An axolotl config as spec fields; raises ImportConfigError for values with no equivalent."""
    r = Reader(data, TOOL)
    r.copy("base_model", "model")
    r.copy("trust_remote_code", "trust_remote_code")
    trainer = _trainer(r)
    _method(r)
    map_dataset_list(r, "datasets", "dataset", trainer)
    map_dataset_list(r, "test_datasets", "eval_dataset", trainer)
    if r.has("shuffle_merged_datasets") and not r.true("shuffle_merged_datasets"):  # true: what tunedeck does
        r.note("shuffle_merged_datasets", "tunedeck always shuffles the rows of several data sets with the seed")
    _training(r, trainer)
    turned_on = _trackers_on(r)
    map_report_to(r, "report_to", turned_on)
    for key in list(r.data):
        if key in turned_on:
            r.take(key)  # carried over as report_to
        elif key in TRACKER_KEYS:
            r.drop(key, TRACKER_SETTINGS)
        elif key.startswith(TRACKING_PREFIXES):
            r.drop(key, TRACKING)
        elif key.startswith("ray_"):
            r.drop(key, DISTRIBUTED)
    r.drop_all(DROPPED)
    kto_batch(r)
    return r.result()


def _trainer(r: Reader) -> str:
    rl = r.take("rl")
    if rl is None:
        trainer = "reward" if r.true("reward_model") else "sft"
    else:
        name = str(rl).strip().lower()
        if name not in RL:
            r.fail("rl", f"`{rl}` has no tunedeck trainer", "use rl: dpo, ipo, kto or orpo (or remove rl for SFT)")
            return "sft"
        trainer, loss = RL[name]
        if loss:
            r.put("loss_type", loss, "rl")
    r.put("trainer", trainer, "rl")
    for key in ("rl_beta", "dpo_beta", "orpo_alpha"):
        if trainer in ("dpo", "kto", "orpo"):
            r.copy(key, "beta")
        else:
            r.drop(key, f"only preference trainers read it; this config trains {trainer}")
    if trainer == "kto":
        r.copy("kto_desirable_weight", "desirable_weight")
        r.copy("kto_undesirable_weight", "undesirable_weight")
    if "train_on_inputs" in r.data:
        if trainer == "sft":
            r.put("completion_only_loss", not r.true("train_on_inputs"), "train_on_inputs")
        else:
            r.drop("train_on_inputs", "preference trainers score only the answers")
    return trainer


def _method(r: Reader) -> None:
    adapter = str(r.take("adapter") or "").strip().lower()
    four, eight = r.true("load_in_4bit"), r.true("load_in_8bit")
    dora = r.true("peft_use_dora")
    if adapter not in ("", "lora", "qlora"):
        r.fail(
            "adapter",
            f"`{adapter}` is not lora or qlora",
            "use adapter: lora or qlora (or remove it to train every weight)",
        )
        return
    if four and eight:
        r.fail("load_in_8bit", "is true together with load_in_4bit", "keep one of load_in_4bit and load_in_8bit")
        return
    if not adapter:
        if four or eight:
            r.fail(
                "load_in_4bit" if four else "load_in_8bit",
                "a quantized base cannot be fully fine-tuned",
                "add adapter: lora or qlora",
            )
        r.put("method", "full", "adapter")
        for key in (
            "lora_r",
            "lora_alpha",
            "lora_dropout",
            "lora_target_linear",
            "lora_target_modules",
            "peft_use_rslora",
        ):
            r.drop(key, "no adapter: every weight trains")
        return
    method = "qlora" if adapter == "qlora" or four else "lora_8bit" if eight else "lora"
    if dora and method != "lora":
        r.fail(
            "peft_use_dora",
            "DoRA on a quantized base has no tunedeck equivalent",
            "remove load_in_4bit/8bit, or peft_use_dora",
        )
    r.put("method", "dora" if dora else method, "adapter")
    r.copy("lora_r", "lora_r")
    r.copy("lora_alpha", "lora_alpha")
    r.copy("lora_dropout", "lora_dropout")
    r.copy("peft_use_rslora", "use_rslora")
    modules = r.take("lora_target_modules")
    if r.true("lora_target_linear"):
        r.put("lora_target_modules", "all-linear", "lora_target_linear")
        if modules is not None:
            r.note("lora_target_modules", "lora_target_linear is true and wins (every linear layer)")
    elif modules is not None:
        r.put("lora_target_modules", lora_targets(modules), "lora_target_modules")


def _training(r: Reader, trainer: str) -> None:
    r.copy_same((*SAME_NAMED_KEYS, "early_stopping_patience", "metric_for_best_model"))
    for key, field_name in (
        ("sequence_len", "max_length"),
        ("micro_batch_size", "per_device_train_batch_size"),
        ("num_epochs", "num_train_epochs"),
    ):
        r.copy(key, field_name)
    val = r.take("val_set_size")
    if val not in (None, 0, 0.0):
        r.put("eval_split", val, "val_set_size")
    if r.true("sample_packing"):
        if trainer == "sft":
            r.put("packing", True, "sample_packing")
        else:
            r.note("sample_packing", f"packing is SFT-only; this config trains {trainer}")
    checkpointing = r.data.get("gradient_checkpointing")
    if isinstance(checkpointing, str) and checkpointing.strip().lower() in ("unsloth", "offload"):
        r.take("gradient_checkpointing")
        r.put("gradient_checkpointing", True, "gradient_checkpointing")
        r.note("gradient_checkpointing", f"`{checkpointing}` offloading is not offered; plain checkpointing is used")
    elif "gradient_checkpointing" in r.data:
        r.put("gradient_checkpointing", r.true("gradient_checkpointing"), "gradient_checkpointing")
    map_scheduler(r, "lr_scheduler")
    map_warmup(r)
    map_optimizer(r, "optimizer")
    map_precision(r)
