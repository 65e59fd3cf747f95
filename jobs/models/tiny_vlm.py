"""A tiny offline LLaVA vision-language model for tests and demos: random weights, built from configs.

`build_tiny_vlm(dest)` writes a normal Hugging Face model folder in a few seconds, with no network: a
CLIP vision tower (32x32 pixels in 8x8 patches: 16 image tokens per image), LLaVA's projector and a tiny
Llama language model, the byte-level tokenizer of `jobs.models.tiny` with an `<image>` token, a CLIP
image processor (every image resized and cropped to 32x32) and a chat template that reads content parts
and marks the assistant's tokens (`{% generation %}`) for trl's assistant-only loss. It loads with
transformers' `AutoProcessor` and `AutoModelForImageTextToText`.

LLaVA is the family whose processor builds offline without torchvision (Qwen2-VL's and SmolVLM's
processors need a video processor, which does).

    python -c "from pathlib import Path; from jobs.models.tiny_vlm import build_tiny_vlm; \
print(build_tiny_vlm(Path('data/models/tiny-llava')))"
"""

from __future__ import annotations

from pathlib import Path

from jobs.models.tiny import build_folder_atomically, tiny_llama_config, train_tokenizer, write_seeded_model

BUILDER_VERSION = "tiny-llava-1"
IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 32
PATCH_SIZE = 8

# ChatML-like, over content parts: an image part becomes the processor's `<image>` token (which the
# processor expands to one token per image feature), text parts their text.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{%- set parts = [{'type': 'text', 'text': message['content']}] %}"
    "{%- else %}{%- set parts = message['content'] %}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{% generation %}"
    "{%- for part in parts %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}"
    "{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}"
    "{%- for part in parts %}"
    "{%- if part['type'] == 'image' %}{{- '<image>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _write_tiny_vlm(out: Path) -> None:
    """Write the tiny LLaVA model and its processor into `out`."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = train_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",  # drops CLIP's class token: (32/8)^2 = 16 tokens an image
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
    )
    text = tiny_llama_config(tokenizer)
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    write_seeded_model(out, LlavaForConditionalGeneration, config, tokenizer, "jobs.models.tiny_vlm", processor)


def build_tiny_vlm(dest: Path) -> Path:
    """Build the tiny LLaVA model folder at `dest` (returns at once if it is already there)."""
    return build_folder_atomically(Path(dest), _write_tiny_vlm, version=BUILDER_VERSION)
