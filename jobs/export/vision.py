"""Exports of a vision-language run: the merged model's image check, and which GGUF requests are refused.

    vision_run(store, run_id)                    # True when the run's model takes images
    gguf_problems(store, run_id, ["f16"])        # [Problem("gguf", ...)] when no projector can be written, else []
    ids, logits = image_greedy(model, processor, CHECK_NEW_TOKENS)   # the answer to the check image

(The check image and its prompt are `jobs.export.image_check`'s, shared with llama.cpp's read-back of the GGUF pair.)

The merged export of a vision-language run is checked like a text one (the built-in prompts) and
also on one image prompt: a drawn picture (`check_image`) and `IMAGE_QUESTION`, answered greedily by
the adapter and by the merged model. The merged folder keeps the run's processor, so it reloads with
`AutoProcessor` and `AutoModelForImageTextToText`.

llama.cpp reads a vision-language model as two files, the language model and the vision tower with
its projector as an `mmproj` file, both written by its own converter (`jobs.export.projector`). A GGUF
request for a run whose family the converter writes no projector for is refused before anything is
queued, naming the family, with the merged export as the way out (`GGUF_WAY_OUT`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.export.image_check import check_image, image_inputs
from storage.roles import ArtifactReader

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
GGUF_WAY_OUT = (
    "export the merged model (safetensors, `--merged`) instead: it loads with transformers' "
    "AutoModelForImageTextToText and AutoProcessor"
)


def vision_run(store: ArtifactReader, run_id: int) -> bool:
    """Whether run `run_id` trained a vision-language model: its base's config says so, or its saved result
    holds a processor (the base's files need not be on this machine)."""
    from jobs.models.vision import vision_model
    from jobs.spec.job import JobSpec, SpecError

    run = store.get_run(run_id)
    if run is None:
        return False
    try:
        spec = JobSpec.from_json(run.spec_json)
    except SpecError:
        return False
    if vision_model(spec.model):
        return True
    results = (Path(a.path) for a in store.artifacts(run_id) if a.kind in ("adapter", "model"))
    return any((folder / name).is_file() for folder in results for name in PROCESSOR_FILES)


def gguf_problems(store: ArtifactReader, run_id: int, gguf: Sequence[str]) -> list[Problem]:
    """The refusal of GGUF types asked for a vision-language run whose projector llama.cpp's converter cannot
    write (none asked, a text run, or a family it writes: no problem; a run whose model cannot be read here: the
    export task says why)."""
    from jobs.export.converter import CONVERTER_FIX
    from jobs.export.gguf_route import run_config
    from jobs.export.projector import projector_problem

    if not gguf or not vision_run(store, run_id):
        return []
    try:
        config, _ = run_config(store, run_id)
    except (OSError, ValueError):
        return []
    if (problem := projector_problem(config)) is None:
        return []
    fix = CONVERTER_FIX if "not installed" in problem else GGUF_WAY_OUT
    return [Problem("gguf", f"run {run_id} is a vision-language model, and {problem}", fix)]


def image_greedy(model: Any, processor: Any, max_new_tokens: int) -> tuple[list[int], Any]:
    """The greedy answer ids to the check image and question, and the logits of the prompt's positions."""
    import torch

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    inputs = image_inputs(processor, check_image())
    inputs = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
    tokenizer = processor.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        logits = model(**inputs).logits.float().cpu()
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    return out[0, inputs["input_ids"].shape[1] :].tolist(), logits
