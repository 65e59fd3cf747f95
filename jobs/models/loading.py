"""Loading a resolved model: (model, tokenizer) from safetensors only, and counting its parameters.

Never turns `trust_remote_code` on by itself; the tokenizer gets a pad token (eos) when it has none.

    model, tokenizer = load_model_and_tokenizer(resolve_model(spec.model), torch_dtype=torch.bfloat16)
"""

from __future__ import annotations

from typing import Any

from jobs.models.registry import ModelError, ResolvedModel, model_error


def load_model_and_tokenizer(
    resolved: ResolvedModel,
    *,
    torch_dtype: Any = None,
    quantization_config: Any = None,
    trust_remote_code: bool = False,
    reward_head: bool = False,
) -> tuple[Any, Any]:
    """Load (model, tokenizer) from safetensors; the tokenizer gets a pad token (eos) if it has none.

    `reward_head`: the base with a new one-output sequence-classification head (a reward model) instead
    of the language-model head."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from jobs.models.vision import vision_model

    if not reward_head and vision_model(str(resolved.path)):
        return load_vision_model(resolved, torch_dtype=torch_dtype, quantization_config=quantization_config)
    kwargs: dict[str, Any] = {"use_safetensors": True, "trust_remote_code": bool(trust_remote_code)}
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=bool(trust_remote_code))
        if reward_head:
            model = AutoModelForSequenceClassification.from_pretrained(resolved.path, num_labels=1, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(resolved.path, **kwargs)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ModelError):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise model_error(
            f"{resolved.ref!r} could not be loaded: {first}",
            "check that it is a causal language model with safetensors weights and a tokenizer",
        ) from exc
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise model_error(
                f"{resolved.ref!r} has a tokenizer with neither a pad nor an eos token",
                "use a model whose tokenizer defines eos_token",
            )
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_vision_model(resolved: ResolvedModel, *, torch_dtype: Any = None, quantization_config: Any = None):
    """(model, processor) of a vision-language model: `AutoModelForImageTextToText` and `AutoProcessor` (the
    processor holds the tokenizer and the image processor, and is what trl's SFTTrainer takes for image data)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    kwargs: dict[str, Any] = {"use_safetensors": True}
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    try:
        processor = AutoProcessor.from_pretrained(resolved.path)
        model = AutoModelForImageTextToText.from_pretrained(resolved.path, **kwargs)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise model_error(
            f"{resolved.ref!r} could not be loaded as a vision-language model: {first}",
            "check that it has safetensors weights and a processor (processor_config.json or preprocessor_config.json)",
        ) from exc
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config.get_text_config(), "pad_token_id", None) is None:
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    return model, processor


def count_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters; 4-bit packed weights count as their unpacked size."""
    trainable = total = 0
    for param in model.parameters():
        n = param.numel()
        if param.__class__.__name__ == "Params4bit":
            # bitsandbytes packs two 4-bit values per byte of its storage dtype.
            storage = getattr(param, "quant_storage", None)
            n *= 2 * (storage.itemsize if storage is not None else 1)
        total += n
        if param.requires_grad:
            trainable += n
    return trainable, total
