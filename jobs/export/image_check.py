"""The merged export's check image and its prompt, shared by every check that shows a vision model a picture.

    image = check_image()                          # a drawn, fixed 64x64 picture
    inputs = image_inputs(processor, image)        # the model inputs of the picture and IMAGE_QUESTION

Used by the merged model's image check (`jobs.export.vision`) and llama.cpp's read-back of a GGUF pair
(`jobs.export.mtmd`); it imports nothing of tunedeck's, so both can.
"""

from __future__ import annotations

from typing import Any

IMAGE_QUESTION = "Describe the image."
CHECK_IMAGE_SIZE = 64


def check_image() -> Any:
    """The image of the merged export's check: a drawn, fixed picture (colour blocks), the same every time."""
    from PIL import Image, ImageDraw

    size = CHECK_IMAGE_SIZE
    image = Image.new("RGB", (size, size), (200, 40, 40))
    draw = ImageDraw.Draw(image)
    draw.rectangle((size // 2, 0, size - 1, size // 2), fill=(40, 40, 200))
    draw.ellipse((size // 8, size // 2, size // 2, size - size // 8), fill=(240, 240, 240))
    return image


def image_inputs(processor: Any, image: Any, question: str = IMAGE_QUESTION) -> dict[str, Any]:
    """The model inputs of one image and a question, through the processor's chat template."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return dict(processor(images=[image], text=text, return_tensors="pt"))
