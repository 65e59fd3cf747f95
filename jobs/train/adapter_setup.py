"""The steps some adapters need between building the trainer and its first step, and at save time.

These touch the model and the data (so they are not in the pure `jobs.config.methods` mapping):

- EVA: one pass over training batches to set LoRA's A from the layer inputs' singular vectors.
- LoftQ (qlora): re-initialise A and B from the 16-bit weights so that W_4bit + B A ~ W.
- PiSSA / OLoRA: keep the adapter as initialised, so the final one can be converted to an adapter
  for the *original* base (peft's `path_initial_model_for_weight_conversion`).
- LLaMA-Adapter: point peft's wrapper at trl's fused-LM-head forward.

    prepare_adapter(spec, trainer, output_dir)             # after build_trainer, before train()
    save_adapter(spec, model, bundle, output_dir)           # instead of model.save_pretrained
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from jobs.spec.enums import LoraInit, Method
from jobs.spec.job import JobSpec

log = logging.getLogger("jobs.train.adapter_setup")
INITIAL_ADAPTER = "initial-adapter"
CONVERTED_INITS = {LoraInit.PISSA, LoraInit.OLORA}


def initial_adapter_dir(output_dir: Path | str) -> Path:
    """Where the PiSSA/OLoRA adapter is kept as initialised (needed to convert the final one)."""
    return Path(output_dir) / INITIAL_ADAPTER


def prepare_adapter(spec: JobSpec, trainer: Any, output_dir: Path | str) -> None:
    """Run the spec's method-specific set-up on the trainer's (peft) model."""
    model = trainer.model
    if spec.method is Method.ADAPTION_PROMPT:
        # peft's AdaptionPromptModel copies `model.forward` when it is built; trl then patches the
        # inner model's forward with its fused LM head (log-probs without full logits). Re-point
        # the copy, or trl's loss finds no `log_probs` in the outputs.
        model.base_model.forward = model.base_model.model.forward
    if spec.method not in {Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT}:
        return
    if spec.lora_init is LoraInit.EVA:
        from peft import initialize_lora_eva_weights

        # A handful of forward passes without gradients; the batches are the trainer's own.
        initialize_lora_eva_weights(model, trainer.get_train_dataloader(), show_progress_bar=False)
        log.info("EVA: LoRA A initialised from the training inputs' singular vectors")
    elif spec.lora_init is LoraInit.LOFTQ:
        from peft import replace_lora_weights_loftq

        replace_lora_weights_loftq(model, model_path=_safetensors_file(model))
        log.info("LoftQ: LoRA A, B re-initialised against the 4-bit quantization error")
    elif spec.lora_init in CONVERTED_INITS:
        config = model.peft_config["default"]
        init, config.init_lora_weights = config.init_lora_weights, True
        try:  # saved with init_lora_weights=True, as peft's conversion expects
            model.save_pretrained(str(initial_adapter_dir(output_dir)), safe_serialization=True)
        finally:
            config.init_lora_weights = init


def save_adapter(spec: JobSpec, model: Any, bundle: Path, output_dir: Path | str | None) -> None:
    """model.save_pretrained, converting PiSSA/OLoRA adapters to ones that load on the original base."""
    initial = initial_adapter_dir(output_dir) if output_dir is not None else None
    if spec.lora_init in CONVERTED_INITS and spec.method in {Method.LORA, Method.DORA}:
        if initial is None or not initial.is_dir():
            raise RuntimeError(
                f"{spec.lora_init.value}: the initial adapter is missing, so the trained one cannot be "
                "converted for the original base"
            )
        # peft: the saved adapter has rank 2r and applies to the unmodified base weights.
        model.save_pretrained(
            str(bundle), safe_serialization=True, path_initial_model_for_weight_conversion=str(initial)
        )
        return
    model.save_pretrained(str(bundle), safe_serialization=True)


def _safetensors_file(model: Any) -> str | None:
    """The base model's local .safetensors file for LoftQ (None: let peft find it from the hub cache)."""
    name = getattr(model.get_base_model().config, "_name_or_path", "")
    folder = Path(name) if name else None
    if folder is not None and folder.is_dir():
        files = sorted(folder.glob("*.safetensors"))
        if len(files) == 1:
            return str(files[0])
    return None
