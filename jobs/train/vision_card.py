"""The model card's "How to load" for a vision-language run: `AutoProcessor` and the image-text model class.

The bundle of a vision-language run holds the processor (tokenizer, image processor, chat template); the
snippet loads it with transformers' `AutoProcessor` and `AutoModelForImageTextToText` (+ peft for an
adapter) and answers one question about an image. Tests run it as written.
"""

from __future__ import annotations

from jobs.spec.enums import Method
from jobs.spec.job import JobSpec

QUESTION = "Describe the image."

_ASK = (
    'image = Image.new("RGB", (64, 64), "red")  # your picture: Image.open("photo.png")\n'
    f'messages = [{{"role": "user", "content": [{{"type": "image"}}, {{"type": "text", "text": "{QUESTION}"}}]}}]\n'
    "text = processor.apply_chat_template(messages, add_generation_prompt=True)\n"
    'inputs = processor(images=[image], text=text, return_tensors="pt")\n'
    "output = model.generate(**inputs, max_new_tokens=40, do_sample=False)\n"
    'print(processor.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n'
)


def vision_load_snippet(spec: JobSpec, whole: bool = False) -> str:
    """A Python snippet, run from the unzipped bundle folder, that loads the result and answers about an image
    (`whole`: the folder holds a whole model whatever the method, e.g. a merged export)."""
    from jobs.models.registry import base_reference

    imports = "from PIL import Image\nfrom transformers import AutoModelForImageTextToText, AutoProcessor\n"
    if whole or spec.method is Method.FULL:
        load = 'model = AutoModelForImageTextToText.from_pretrained(".")\n'
        where = "from the folder this file is in"
    else:
        imports = "from peft import PeftModel\n" + imports
        load = (
            f'base = AutoModelForImageTextToText.from_pretrained("{base_reference(spec.model)}")\n'
            'model = PeftModel.from_pretrained(base, ".")\n'
        )
        where = "from the folder this file is in (`adapter_config.json` names the same base model)"
    return (
        f"Run this {where}:\n\n```python\n{imports}\n{load}"
        'processor = AutoProcessor.from_pretrained(".")  # tokenizer, image processor and chat template\n'
        f"{_ASK}```\n"
    )
