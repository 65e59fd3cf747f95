"""The files beside a run's GGUF files: each one's Ollama Modelfile and the folder's README.md.

    write_modelfile(source, folder / "x-f16.Modelfile", "x-f16.gguf", projector="x-mmproj-f16.gguf")
    (folder / "README.md").write_text(gguf_card(spec, run_id, folder))

A vision-language run's language model file goes with its projector (`jobs.export.projector`): its Modelfile
names both (two FROM lines: Ollama takes the second, a `clip` file, as the model's projector) and the card gives
the llama.cpp command line that loads the pair.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from jobs.export.projector import pair_command
from jobs.spec.job import JobSpec

log = logging.getLogger("jobs.export.merged")


def write_modelfile(source: Path, path: Path, gguf_name: str, projector: str | None = None) -> None:
    """The Ollama Modelfile beside the GGUF (`jobs.export.modelfile`): the run's template, stops, sampling defaults
    (the model's generation_config.json when it samples, else greedy like tunedeck's Chat); with `projector`, the
    vision projector's file as a second FROM."""
    from transformers import AutoTokenizer, GenerationConfig

    from jobs.export.modelfile import modelfile

    generation: dict[str, float] = {}
    if (source / "generation_config.json").is_file():
        config = GenerationConfig.from_pretrained(str(source))
        if config.do_sample:
            names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
            names["repetition_penalty"] = "repeat_penalty"
            generation = {o: float(v) for n, o in names.items() if (v := getattr(config, n, None)) is not None}
    text, templated = modelfile(AutoTokenizer.from_pretrained(str(source)), gguf_name, generation, projector)
    path.write_text(text)
    log.info("wrote %s (%s)", path, "with the chat template" if templated else "without a TEMPLATE")


def gguf_card(spec: JobSpec, run_id: int, folder: Path) -> str:
    """README.md of the run's GGUF folder: each file, its round-trip check, how to use it."""
    from jobs.train.artifacts import provenance_note

    parts = [
        f"# {spec.display_name} (GGUF)\n\nRun {run_id} of tunedeck ({spec.method.value} on `{spec.model}`) "
        "as GGUF files for llama.cpp, Ollama and other GGUF readers.\n"
    ]
    for check_file in sorted(folder.glob("*.check.json")):
        check = json.loads(check_file.read_text())
        gguf_file = check_file.name.replace(".check.json", ".gguf")
        if not (folder / gguf_file).is_file():
            continue
        rows = "\n".join(
            f"| {p} | {a!r} | {'same' if a == b else repr(b)} |"
            for p, a, b in zip(check["prompts"], check["source_answers"], check["gguf_answers"])
        )
        parts.append(
            f"## {gguf_file}\n{_checked_by(check)}: {check['rule']}: "
            f"passed. Answer token agreement {check['token_agreement']:.1%}; next-token agreement on the "
            f"source's answers {check['forced_agreement']:.1%}; largest logit difference "
            f"{check['max_logit_diff']:.3g}; tokenizer ids equal on {len(check['tokenizer_texts'])} texts "
            f"and the chat prompts.{_llama_line(check)}{_projector_line(gguf_file, check)}\n\n"
            f"| prompt | source model | GGUF |\n|---|---|---|\n{rows}\n"
        )
    parts.append(
        "## How to use\n```bash\nllama-cli -m FILE.gguf -cnv            # llama.cpp, chat with the file's template\n"
        "ollama create my-model -f FILE.Modelfile && ollama run my-model   # Ollama: template, stops, sampling\n```\n"
        "Each `FILE.Modelfile` carries the run's chat template as Ollama's TEMPLATE (checked against the "
        "template's own rendering of a conversation), its stop tokens and greedy sampling like tunedeck's Chat; "
        "a vision-language model's names its projector file in a second FROM.\n"
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        'model = AutoModelForCausalLM.from_pretrained(".", gguf_file="FILE.gguf")\n'
        'tokenizer = AutoTokenizer.from_pretrained(".", gguf_file="FILE.gguf")\n```\n'
        "The checks above are what tunedeck ran; Ollama itself was not run on these files.\n"
    )
    return "\n".join(parts) + provenance_note(spec)


def _checked_by(check: dict[str, Any]) -> str:
    if check["rule"].startswith("read by llama.cpp"):
        return "Written by llama.cpp's convert_hf_to_gguf.py and checked by loading it back with llama.cpp"
    return "Checked by loading it back with transformers' GGUF loader"


def _llama_line(check: dict[str, Any]) -> str:
    """The card's words on the file's tensor types and on llama.cpp's own reading of it."""
    types = ", ".join(f"{n} {t}" for t, n in check.get("tensor_types", {}).items())
    line = f" Tensors: {types}." if types else ""
    if weights := check.get("imatrix"):
        line += (
            f" Quantized with an importance matrix of {weights['calibration']} ({weights['chunks']} chunks of "
            f"{weights['context']} tokens, llama.cpp's llama-imatrix)."
        )
    llama = check.get("llama_cpp")
    if llama is None:
        return line + " llama.cpp itself was not run on it (llama-cpp-python is not installed where it was made)."
    return line + (
        f" Read back by llama.cpp {llama['version']}: next-token agreement on the source's answers "
        f"{llama['forced_agreement']:.1%}, its tokenizer's ids equal on the same texts."
    )


def _projector_line(gguf_file: str, check: dict[str, Any]) -> str:
    """The card's words on a vision-language model's projector file and the command that loads the pair."""
    projector = check.get("mmproj")
    if not projector:
        return ""
    vision = ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in projector["vision"].items())
    return (
        f"\n\nIts vision tower and projector: `{projector['file']}` ({projector['projector_type']} projector; "
        f"{vision}), read back by {projector['read_by']}: {projector['tensors_equal']} of {projector['tensors']} "
        f"tensors hold the model's own vision weights (not compared, changed by the converter on purpose: "
        f"{', '.join(projector['corrected']) or 'none'}).{_pair_words(projector)} The pair, in llama.cpp:\n"
        f"```bash\n{pair_command(gguf_file, projector['file'])}\n```"
    )


def _pair_words(projector: dict[str, Any]) -> str:
    """What llama.cpp answered from the pair (llama-mtmd-cli on the check image), or why it was not asked."""
    if pair := projector.get("llama_cpp"):
        return (
            f" From this language model file, llama.cpp's {pair['tool']} answered the export's check image with the "
            f"first token {pair['llama_cpp']!r} (the merged model in transformers: {pair['transformers']!r})."
        )
    return "".join(f" {note}." for note in projector.get("notes") or [])
