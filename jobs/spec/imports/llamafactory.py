"""LLaMA-Factory training YAML (`llamafactory-cli train FILE`) as spec fields.

Where a key is absent, LLaMA-Factory's own default is carried over when it differs from tunedeck's
and changes the training (LoRA rank 8 with alpha 2 x rank and no dropout, learning rate 5e-5,
3 epochs, cutoff 2048, gradient checkpointing on, packing for pre-training), so the imported run
trains like the original. Data set names resolve through `dataset_info.json`
(`jobs.spec.imports.llamafactory_data`).
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
    TEMPLATE,
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
from jobs.spec.imports.llamafactory_data import map_datasets
from jobs.spec.imports.llamafactory_vision import map_vision

TOOL = "llamafactory"
# Keys that, on their own, say a file is LLaMA-Factory's.
MARKERS = ("stage", "finetuning_type", "cutoff_len", "lora_rank", "template", "pref_beta", "quantization_bit")

STAGES = {"pt": "sft", "sft": "sft", "rm": "reward", "dpo": "dpo", "kto": "kto", "orpo": "orpo"}
PREF_LOSSES = {"sigmoid": "sigmoid", "hinge": "hinge", "ipo": "ipo"}
DEFAULTS = {"learning_rate": 5e-5, "num_train_epochs": 3.0, "max_length": 2048}

DROPPED = {
    "deepspeed": DISTRIBUTED,
    "fsdp": DISTRIBUTED,
    "fsdp_config": DISTRIBUTED,
    "ddp_timeout": DISTRIBUTED,
    "ddp_find_unused_parameters": DISTRIBUTED,
    "ddp_backend": DISTRIBUTED,
    "use_reentrant_gc": "tunedeck sets the checkpointing options itself",
    "gradient_checkpointing_kwargs": "tunedeck sets the checkpointing options itself",
    "plot_loss": TRACKING,
    "logging_dir": TRACKING,
    "include_num_input_tokens_seen": TRACKING,
    "output_dir": OUTPUT,
    "overwrite_output_dir": OUTPUT,
    "save_only_model": OUTPUT,
    "save_strategy": "tunedeck saves every save_steps (and every save_minutes)",
    "resume_from_checkpoint": RESUME,
    "template": TEMPLATE,
    "enable_thinking": TEMPLATE,
    "default_system": "tunedeck takes the system prompt from the rows (a system turn or column)",
    "tool_format": "tool calls are rendered by the model's own chat template (its tool format)",
    "flash_attn": KERNELS,
    "enable_liger_kernel": KERNELS,
    "use_unsloth": KERNELS,
    "use_unsloth_gc": KERNELS,
    "shift_attn": KERNELS,
    "upcast_layernorm": KERNELS,
    "tf32": KERNELS,
    "rope_scaling": "tunedeck uses the model's own position settings",
    "preprocessing_num_workers": LOADING,
    "preprocessing_batch_size": LOADING,
    "dataloader_num_workers": LOADING,
    "dataloader_pin_memory": LOADING,
    "overwrite_cache": LOADING,
    "tokenized_path": LOADING,
    "streaming": LOADING,
    "buffer_size": LOADING,
    "interleave_probs": "tunedeck concatenates the data sets and shuffles them with the seed (no sampling probabilities)",
    "neat_packing": "tunedeck's packing does not keep the packed rows from attending to each other",
    "mask_history": "tunedeck trains on every assistant turn of a conversation",
    "eval_strategy": EVALUATION,
    "evaluation_strategy": EVALUATION,
    "per_device_eval_batch_size": "tunedeck has no separate evaluation batch size",
    "compute_accuracy": EVALUATION,
    "push_to_hub": HUB,
    "hub_model_id": HUB,
    "cache_dir": "tunedeck keeps models in its own cache (TUNEDECK_MODELS_DIR / the Hugging Face cache)",
    "neftune_noise_alpha": "NEFTune noise has no tunedeck equivalent",
    "loraplus_lr_ratio": "LoRA+ learning rates have no tunedeck equivalent",
    "loraplus_lr_embedding": "LoRA+ learning rates have no tunedeck equivalent",
    "additional_target": "tunedeck trains only the adapters (lora_target_modules)",
    "pissa_iter": "peft's PiSSA defaults are used",
    "pissa_convert": "tunedeck saves the PiSSA adapter as trained",
    "simpo_gamma": "SimPO has no tunedeck equivalent",
    "lr_scheduler_kwargs": "tunedeck's schedules take no extra arguments",
    "pure_bf16": "tunedeck keeps fp32 master weights (precision: bf16 is mixed precision)",
    "adapter_name_or_path": "tunedeck starts a fresh adapter: merge yours into the model first, then point model at the merged folder",
}


def import_llamafactory(
    data: Mapping[str, Any], dataset_info: Mapping[str, Any] | None = None, dataset_dir: str = "data"
) -> Imported:
    """A LLaMA-Factory training config as spec fields; raises ImportConfigError for values with no equivalent."""
    r = Reader(data, TOOL)
    r.copy("model_name_or_path", "model")
    r.copy("trust_remote_code", "trust_remote_code")
    r.copy("run_name", "run_name")
    stage = _stage(r)
    _task(r)
    _method(r)
    capped = map_datasets(r, stage, dataset_info, dataset_dir)  # several data sets: max_samples caps each
    mix = r.take("mix_strategy")
    if mix is not None and str(mix).strip().lower() != "concat":
        r.note("mix_strategy", f"`{mix}`: tunedeck concatenates the data sets and shuffles them with the seed")
    if not capped:
        r.copy("max_samples", "max_train_samples")
    _training(r, stage)
    map_vision(r)
    for key in list(r.data):
        if key.startswith("ray_"):
            r.drop(key, DISTRIBUTED)
    r.drop_all(DROPPED)
    kto_batch(r)
    return r.result()


def _stage(r: Reader) -> str:
    """The trainer (from stage and pref_loss) and its options; returns LLaMA-Factory's stage."""
    stage = str(r.take("stage") or "sft").strip().lower()
    if stage == "ppo":
        r.fail(
            "stage",
            "ppo has no tunedeck trainer (PPO was removed from trl)",
            "for RLHF train a reward model (stage: rm), then grpo",
        )
        return stage
    if stage not in STAGES:
        r.fail(
            "stage", f"`{stage}` is not a LLaMA-Factory training stage tunedeck has", "use one of: " + ", ".join(STAGES)
        )
        return stage
    trainer = STAGES[stage]
    loss = r.take("pref_loss")
    if loss is not None and stage in ("dpo", "orpo"):
        name = str(loss).strip().lower()
        if name == "orpo":
            trainer = "orpo"
        elif name == "simpo":
            r.fail("pref_loss", "simpo has no tunedeck equivalent", "use pref_loss: sigmoid (DPO), hinge, ipo or orpo")
        elif name in PREF_LOSSES and trainer == "dpo":
            r.put("loss_type", PREF_LOSSES[name], "pref_loss")
        else:
            r.fail(
                "pref_loss", f"`{loss}` has no tunedeck equivalent", "use pref_loss: sigmoid (DPO), hinge, ipo or orpo"
            )
    elif loss is not None:
        r.note("pref_loss", f"only preference stages read it; stage is {stage}")
    r.put("trainer", trainer, "stage")
    if trainer in ("dpo", "kto", "orpo"):
        r.copy("pref_beta", "beta")
    else:
        r.drop("pref_beta", f"only preference stages read it; stage is {stage}")
    if trainer == "kto":
        r.copy("kto_chosen_weight", "desirable_weight")
        r.copy("kto_rejected_weight", "undesirable_weight")
    for key, what in (("pref_ftx", "an SFT term in the preference loss"), ("dpo_label_smoothing", "label smoothing")):
        value = r.take(key)
        if value not in (None, 0, 0.0):
            r.note(key, f"{what} has no tunedeck equivalent")
    return stage


def _task(r: Reader) -> None:
    """do_train must be on: evaluation and prediction configs have no tunedeck equivalent."""
    if "do_train" in r.data and not r.true("do_train"):
        r.fail("do_train", "is false: this config does not train", "import a training config (do_train: true)")
    if r.true("do_predict"):
        r.fail(
            "do_predict",
            "prediction runs have no tunedeck equivalent",
            "remove do_predict, or chat with a finished run: `tunedeck generate RUN_ID`",
        )
    r.drop("do_eval", EVALUATION)


def _method(r: Reader) -> None:
    """finetuning_type + quantization + LoRA options as method and its fields."""
    kind = str(r.take("finetuning_type") or "lora").strip().lower()
    bits = r.take("quantization_bit")
    qmethod = str(r.data.get("quantization_method") or "bnb").strip().lower()
    dora = r.true("use_dora")
    if kind == "freeze":
        r.fail(
            "finetuning_type",
            "freeze (train only some layers of the full model) has no tunedeck equivalent",
            "use finetuning_type: lora or full",
        )
        return
    if kind not in ("lora", "full"):
        r.fail("finetuning_type", f"`{kind}` is not lora, full or freeze", "use finetuning_type: lora or full")
        return
    if bits is not None:
        r.take("quantization_method")
    if bits is not None and qmethod not in ("bnb", "bitsandbytes"):
        r.fail(
            "quantization_method",
            f"`{qmethod}` is not offered (tunedeck quantizes with bitsandbytes)",
            "use quantization_method: bnb",
        )
    if kind == "full":
        for key in ("freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"):
            r.drop(key, "finetuning_type is full")
        if bits is not None:
            r.fail(
                "quantization_bit",
                "a quantized base cannot be fully fine-tuned",
                "remove quantization_bit, or use finetuning_type: lora",
            )
        else:
            r.drop("quantization_method", "no quantization_bit is given, so nothing is quantized")
        r.put("method", "full", "finetuning_type")
        _lora_keys(r, used=False)
        return
    if bits is None:
        method = "lora"
        if "quantization_method" in r.data:
            r.drop("quantization_method", "no quantization_bit is given, so nothing is quantized")
    elif bits in (4, 8) and not isinstance(bits, bool):
        method = "qlora" if bits == 4 else "lora_8bit"
    else:
        r.fail("quantization_bit", f"`{bits}` is not 4 or 8", "use quantization_bit: 4 (qlora) or 8, or remove it")
        return
    if dora and method != "lora":
        r.fail(
            "use_dora", "DoRA on a quantized base has no tunedeck equivalent", "remove quantization_bit, or use_dora"
        )
    r.put(
        "method", "dora" if dora else method, "use_dora" if dora else "quantization_bit" if bits else "finetuning_type"
    )
    qtype = r.take("quantization_type")
    if qtype is not None and method == "qlora":
        r.put("bnb_4bit_quant_type", qtype, "quantization_type")
    if "double_quantization" in r.data and method == "qlora":
        r.put("bnb_4bit_use_double_quant", r.true("double_quantization"), "double_quantization")
    for key in ("freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules"):
        r.drop(key, f"finetuning_type is {kind}")
    _lora_keys(r, used=True)


def _lora_keys(r: Reader, used: bool) -> None:
    keys = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_rslora", "pissa_init")
    if not used:
        for key in keys:
            r.drop(key, "finetuning_type is full: there is no adapter")
        return
    rank = r.take("lora_rank")
    rank = 8 if rank is None else rank  # LLaMA-Factory's default
    r.put("lora_r", rank, "lora_rank")
    alpha = r.take("lora_alpha")
    if alpha is None and isinstance(rank, int):
        alpha = rank * 2  # LLaMA-Factory's default: twice the rank
    r.put("lora_alpha", alpha, "lora_alpha")
    dropout = r.take("lora_dropout")
    r.put("lora_dropout", 0.0 if dropout is None else dropout, "lora_dropout")
    targets = r.take("lora_target")
    r.put("lora_target_modules", lora_targets(targets) if targets is not None else "all-linear", "lora_target")
    r.copy("use_rslora", "use_rslora")
    if r.true("pissa_init"):
        r.put("lora_init", "pissa", "pissa_init")


def _training(r: Reader, stage: str) -> None:
    r.copy_same(HF_TRAINING_KEYS)
    for key, field_name in (("cutoff_len", "max_length"),):
        r.copy(key, field_name)
    for field_name, value in DEFAULTS.items():
        r.fields.setdefault(field_name, value)
    val_size = r.take("val_size")
    if val_size not in (None, 0, 0.0):
        r.put("eval_split", val_size, "val_size")
    packing = r.take("packing")
    r.put("packing", stage == "pt" if packing is None else packing, "packing")
    if r.true("disable_gradient_checkpointing"):
        r.put("gradient_checkpointing", False, "disable_gradient_checkpointing")
    elif "gradient_checkpointing" in r.data:
        r.put("gradient_checkpointing", r.true("gradient_checkpointing"), "gradient_checkpointing")
    else:
        r.put("gradient_checkpointing", True, "disable_gradient_checkpointing")  # LLaMA-Factory's default
    if "train_on_prompt" in r.data and STAGES.get(stage) == "sft":
        r.put("completion_only_loss", not r.true("train_on_prompt"), "train_on_prompt")
    else:
        r.drop("train_on_prompt", "preference trainers score only the answers")
    map_scheduler(r, "lr_scheduler_type")
    map_warmup(r)
    map_optimizer(r, "optim")
    map_precision(r)
    map_report_to(r, "report_to")
