"""Which writer makes a run's GGUF file: tunedeck's own, llama.cpp's converter, or none (refused, naming the family).

    route = gguf_route(config, tokenizer)        # Route("writer"|"converter", pre_tokenizer), or GgufUnsupported
    problems = family_problems(store, run_id)   # [] or the refusal before queueing, naming the family

tunedeck's own writer (`jobs.export.gguf_writer`) keeps the models it describes (Llama and Qwen2 with a byte-level
BPE tokenizer): measured against llama.cpp's converter on them (bench/gguf_reference.py, SmolLM2-135M: 272 of 272
tensors byte-equal; f16 38 s against 67 s, q8_0 9 s against 45 s) it writes the same tensors, faster, and its
files are also checked through transformers' GGUF loader. Every other family goes to llama.cpp's converter (`jobs.export.converter`) when the converter registers its architecture, and is refused
before queueing, naming the family, when it does not.

A converted file is checked by llama.cpp alone (`jobs.export.gguf_checks.check_with_llama_cpp`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.export.converter import CONVERTER_FIX, converter_problem
from jobs.export.gguf_writer import GgufUnsupported, _pre_tokenizer_name, gguf_plan
from jobs.export.llamacpp import LLAMA_CPP_FIX, llama_cpp_installed


@dataclass(frozen=True)
class Route:
    writer: str  # "writer" (tunedeck's) or "converter" (llama.cpp's convert_hf_to_gguf.py)
    pre_tokenizer: str | None  # llama.cpp's name of the byte-level BPE split rule, where tokenizer.json has one


def _pre_name(tokenizer: dict[str, Any] | None) -> str | None:
    if not tokenizer:
        return None
    try:
        return _pre_tokenizer_name(tokenizer)
    except GgufUnsupported:
        return None


def gguf_route(config: dict[str, Any], tokenizer: dict[str, Any] | None) -> Route:
    """tunedeck's writer where it describes the model, else llama.cpp's converter where it knows the family, else
    GgufUnsupported naming the family (message "problem; fix")."""
    try:
        return Route("writer", gguf_plan(config, tokenizer or {}).pre_tokenizer)
    except GgufUnsupported:
        pass
    if problem := converter_problem(config):
        fix = CONVERTER_FIX if "not installed" in problem else "export the merged safetensors (`--merged`) instead"
        raise GgufUnsupported(f"{problem}; {fix}")
    if not llama_cpp_installed():
        raise GgufUnsupported(
            f"a converted GGUF file is checked by llama.cpp, which is not installed here; {LLAMA_CPP_FIX}"
        )
    return Route("converter", _pre_name(tokenizer))


def run_config(store: Any, run_id: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The config.json and tokenizer.json the run's GGUF would be written from, known before merging: a full fine-tune's
    model folder, or the base's config with the run's saved tokenizer."""
    from jobs.spec.enums import Method
    from jobs.spec.stored import finished_problem, read_spec

    run = store.get_run(run_id)
    if finished_problem(run, run_id, "export") is not None:
        raise ValueError(f"run {run_id} has no finished result")
    spec = read_spec(run.spec_json)
    kinds = ("model",) if spec.method is Method.FULL else ("adapter", "model")
    folders = [Path(a.path) for a in store.artifacts(run_id) if a.kind in kinds]
    tokenizer = next(
        (json.loads((f / "tokenizer.json").read_text()) for f in folders if (f / "tokenizer.json").is_file()), None
    )
    with_config = [f for f in folders if (f / "config.json").is_file()]
    if spec.method is Method.FULL and with_config:
        return json.loads((with_config[-1] / "config.json").read_text()), tokenizer
    from transformers import AutoConfig

    from jobs.models.references import resolve_model

    base = resolve_model(spec.model, trust_remote_code=spec.trust_remote_code).path
    config = AutoConfig.from_pretrained(base, trust_remote_code=spec.trust_remote_code).to_dict()
    return config, tokenizer


def family_problems(store: Any, run_id: int) -> list[Problem]:
    """The refusal of a GGUF request before queueing: a family neither writer knows, named ([] when one does, and
    when the run is not finished or its model cannot be read here: the export task says why)."""
    try:
        config = run_config(store, run_id)
    except (OSError, ValueError):
        return []
    try:
        gguf_route(*config)
    except GgufUnsupported as exc:
        problem, _, fix = str(exc).partition("; ")
        return [Problem("gguf", problem, fix)]
    return []
