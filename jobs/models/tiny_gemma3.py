"""A tiny offline Gemma 3 vision-language model for tests and demos: random weights, built from configs.

`build_tiny_gemma3(dest)` writes a normal Hugging Face model folder in a few seconds, with no network and
no torchvision: a SigLIP vision tower (32x32 pixels in 8x8 patches), Gemma 3's projector (the 4x4 patches
average-pooled to 2x2: 4 tokens an image), a tiny Gemma 3 language model, the byte-level tokenizer of
`jobs.models.tiny` with Gemma's image tokens, Gemma 3's image processor (PIL backend: every image
resized to 32x32) and the chat template of `jobs.models.tiny_vlm` with `<start_of_image>` for each
image (which the processor expands to a blank line, the begin-of-image token, the image tokens, the
end-of-image token and a blank line). It loads with `AutoProcessor` and `AutoModelForImageTextToText`.
Its image projection is random (transformers starts it at zeros: every image would look alike). Its
attention scale is the head width (`query_pre_attn_scalar` 16), as in the released Gemma 3 models and as
llama.cpp reads them (its GGUF export agrees with it only so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.models.tiny import build_folder_atomically, train_tokenizer, write_seeded_model
from jobs.models.tiny_vlm import CHAT_TEMPLATE as LLAVA_TEMPLATE

BUILDER_VERSION = "tiny-gemma3-4"
BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
IMAGE_SIZE = 32
PATCH_SIZE = 8
TOKENS_PER_IMAGE = 4
CHAT_TEMPLATE = LLAVA_TEMPLATE.replace("'<image>'", f"'{BOI}'")


def _id(tokenizer: Any, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int)
    return found


def _write_tiny_gemma3(out: Path) -> None:
    """Write the tiny Gemma 3 model and its processor into `out`."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3Processor,
    )
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [BOI, EOI, IMAGE]})
    tokenizer.add_tokens(["\n\n"])  # a blank line is one token, as in Gemma's tokenizer (the image's wrapping)
    tokenizer.save_pretrained(out)  # reloaded with Gemma's named image tokens (tokenizer.boi_token_id...)
    named = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE}
    tokenizer = AutoTokenizer.from_pretrained(out, extra_special_tokens=named)
    image_processor = Gemma3ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    processor = Gemma3Processor(image_processor, tokenizer, CHAT_TEMPLATE, image_seq_length=TOKENS_PER_IMAGE)
    text = {
        "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 1024,
        "sliding_window": 64, "query_pre_attn_scalar": 16, "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
    }  # fmt: skip
    vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}  # fmt: skip
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=_id(tokenizer, BOI),
        eoi_token_index=_id(tokenizer, EOI),
        image_token_index=_id(tokenizer, IMAGE),
    )
    write_seeded_model(out, _with_projection, config, tokenizer, "jobs.models.tiny_gemma3", processor)


def _with_projection(config: Any) -> Any:
    """Gemma 3 with a random image projection: transformers starts `mm_input_projection_weight` at zeros, which
    would make every image the same to the language model (and a projector's check blind)."""
    import torch
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.05)
    return model


def build_tiny_gemma3(dest: Path) -> Path:
    """Build the tiny Gemma 3 model folder at `dest` (returns at once if it is already there)."""
    return build_folder_atomically(Path(dest), _write_tiny_gemma3, version=BUILDER_VERSION)
