"""Importance-matrix quants: llama.cpp's `llama-imatrix` over calibration text, then `llama-quantize --imatrix`.

    problem = imatrix_problem()                          # None, or why the tools are not here
    text = calibration_text(store, run_id, tokenizer)    # Calibration: the run's own training rows as text
    text = calibration_file(Path("calib.txt"))           # ... or a file the user gave
    info = quantize_with_imatrix(f16, dest, "q4_k_m", text, tokenizer, config)   # {"calibration": ..., "chunks": ...}

A plain K-quant rounds every weight alike; with an importance matrix (the mean square of each weight column's
inputs, measured by running the f16 model over calibration text) llama.cpp's quantizer spends its error where the
activations are small. IQ types (`iq4_xs`) are always made with one.

The two programs are built by `./dev.sh gguf` (and `./dev.sh test`) from the llama.cpp source the pinned
llama-cpp-python vendors (CPU only, those two targets and llama-mtmd-cli, `jobs.export.mtmd`), into `bin/` beside the converter
(`share/tunedeck/llama.cpp/bin` in the venv, or under $TUNEDECK_LLAMA_CPP_CONVERTER), once per pinned version.
Each runs as a child process of the export task: in its process group, so cancelling the task ends it, and killed
here too when the export stops for any other reason.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.export.converter import converter_dir
from jobs.export.llamacpp import IQ_QUANTS, QUANTS

log = logging.getLogger("jobs.export.merged")

IMATRIX_TYPES = QUANTS  # tunedeck's name -> llama-quantize's: the K-quants on request, the IQ types always
ALWAYS = tuple(IQ_QUANTS)
TOOLS = ("llama-imatrix", "llama-quantize")
TOOLS_FIX = (
    "run `./dev.sh gguf` where the worker runs: it builds llama.cpp's llama-imatrix and llama-quantize (CPU only, "
    "from the pinned llama-cpp-python source) into the virtual environment"
)
MAX_CONTEXT = 512  # llama-imatrix's own default chunk length
MAX_CHUNKS = 64  # calibration beyond 64 chunks of 512 tokens adds little; it bounds the export's time
MIN_CONTEXT = 16


class ImatrixFailed(RuntimeError):
    """llama-imatrix or llama-quantize exited with an error (its last lines say why)."""


@dataclass(frozen=True)
class Calibration:
    text: str
    source: str  # where it came from, in words ("the run's 240 training rows", "file calib.txt")


def tools_dir() -> Path:
    return converter_dir() / "bin"


def imatrix_problem() -> str | None:
    """Why importance-matrix quants cannot be made here (None: they can)."""
    missing = [t for t in TOOLS if not os.access(tools_dir() / t, os.X_OK)]
    if missing:
        return (
            f"GGUF with an importance matrix is made by llama.cpp's {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not built here (looked in {tools_dir()})"
        )
    return None


def calibration_file(path: Path) -> Calibration:
    """The calibration text of a file the user named; ValueError (the problem) when it has none."""
    if not path.is_file():
        raise ValueError(f"calibration file {path} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"calibration file {path} is empty")
    return Calibration(text, f"file {path.name}")


def calibration_text(spec: Any, tokenizer: Any) -> Calibration:
    """The run's own training rows as text, each as training rendered it (chat rows through the chat template)."""
    from jobs.data.loading import load_data

    rows = load_data(spec).train.to_list()
    texts = [t for row in rows if (t := row_text(row, tokenizer))]
    if not texts:
        raise ValueError("the run's training rows hold no text to calibrate on")
    return Calibration("\n\n".join(texts), f"the run's {len(texts)} training rows")


def row_text(row: dict[str, Any], tokenizer: Any) -> str:
    """One training row as text: its conversation through the chat template, else its text columns joined."""
    messages: list[dict[str, Any]] = []
    parts: list[str] = []
    for key in ("messages", "prompt", "completion", "chosen", "text"):
        value = row.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            messages += [m for m in value if isinstance(m, dict) and isinstance(m.get("content"), str)]
    if messages and getattr(tokenizer, "chat_template", None):
        try:
            return str(tokenizer.apply_chat_template(messages, tokenize=False))
        except Exception:  # a template that refuses these turns: their contents are still text  # noqa: BLE001
            pass
    return "\n".join(parts + [str(m["content"]) for m in messages]).strip()


def context_for(tokens: int, config: dict[str, Any]) -> int:
    """The chunk length llama-imatrix is given: it needs two chunks of text at least (ImatrixFailed: too short)."""
    trained = int(config.get("max_position_embeddings") or MAX_CONTEXT)
    context = min(MAX_CONTEXT, trained, tokens // 2 - 1)
    if context < MIN_CONTEXT:
        raise ImatrixFailed(
            f"the calibration text is {tokens} tokens; llama-imatrix needs at least {2 * (MIN_CONTEXT + 1)}"
        )
    return context


def quantize_with_imatrix(
    f16: Path, dest: Path, gguf_type: str, calibration: Calibration, tokenizer: Any, config: dict[str, Any]
) -> dict[str, Any]:
    """Write `dest` as the `gguf_type` quantization of the f16 GGUF `f16`, weighted by an importance matrix of
    `calibration`; returns what is recorded with the file."""
    tokens = len(tokenizer(calibration.text, add_special_tokens=False)["input_ids"])
    context = context_for(tokens, config)
    chunks = min(MAX_CHUNKS, tokens // context)
    with tempfile.TemporaryDirectory(prefix="imatrix-", dir=dest.parent) as tmp:
        text, matrix = Path(tmp, "calibration.txt"), Path(tmp, "imatrix.gguf")
        text.write_text(calibration.text, encoding="utf-8")
        log.info("importance matrix: %d chunks of %d tokens of %s (llama-imatrix)", chunks, context, calibration.source)
        size = ["-c", str(context), "-b", str(context), "-ub", str(context)]
        _run(
            ["llama-imatrix", "-m", str(f16), "-f", str(text), "-o", str(matrix), *size, "--chunks", str(chunks)]
            + ["--no-ppl", "--parse-special", "-lv", "0"]
        )
        log.info("quantizing to %s with the importance matrix (llama-quantize)", gguf_type)
        _run(["llama-quantize", "--imatrix", str(matrix), str(f16), str(dest), IMATRIX_TYPES[gguf_type]])
    if not dest.is_file():
        raise ImatrixFailed(f"llama-quantize wrote no {dest.name}")
    return {"calibration": calibration.source, "tokens": tokens, "context": context, "chunks": chunks}


def _run(argv: list[str]) -> None:
    """One of the tools, to its end; killed if this process stops first (an exception, Ctrl-C)."""
    argv = [str(tools_dir() / argv[0]), *argv[1:]]
    with tempfile.TemporaryFile() as output:
        child = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT)
        try:
            code = child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        if code != 0:
            output.seek(0)
            lines = output.read().decode(errors="replace").strip().splitlines()[-3:]
            tail = " / ".join(line.strip() for line in lines)
            raise ImatrixFailed(f"{Path(argv[0]).name} exited with {code}: {tail}")


@dataclass(frozen=True)
class ImatrixPlan:
    """What an importance-matrix quant of one export is made with (`write_with`: the quantizer's step)."""

    calibration: Calibration
    tokenizer: Any
    config: dict[str, Any]

    def write_with(self, f16: Path, dest: Path, gguf_type: str) -> dict[str, Any]:
        return quantize_with_imatrix(f16, dest, gguf_type, self.calibration, self.tokenizer, self.config)


def uses_imatrix(gguf_type: str, imatrix: bool) -> bool:
    """Whether `gguf_type` is made with an importance matrix: asked (`imatrix`) for a quantized type, or an IQ type."""
    return gguf_type in ALWAYS or (imatrix and gguf_type in IMATRIX_TYPES)


def request_problems(gguf: list[str], imatrix: bool, calibration: str | None) -> list[tuple[str, str, str]]:
    """(field, problem, fix) of an importance-matrix request, known before anything is queued."""
    out = []
    if imatrix and not any(t in IMATRIX_TYPES for t in gguf):
        quantized = ", ".join(IMATRIX_TYPES)
        out.append(
            (
                "imatrix",
                f"an importance matrix weights the quantized types ({quantized}), none of which is asked",
                f"add one of {quantized} to the GGUF types, or drop imatrix",
            )
        )
    if not any(uses_imatrix(t, imatrix) for t in gguf):
        if calibration:
            out.append(
                (
                    "calibration",
                    "a calibration file is used only with an importance matrix",
                    "add imatrix (`--imatrix`), or drop the calibration file",
                )
            )
        return out
    if problem := imatrix_problem():
        out.append(("imatrix", problem, TOOLS_FIX))
    if calibration:
        try:
            calibration_file(Path(calibration))
        except ValueError as exc:
            out.append(
                (
                    "calibration",
                    str(exc),
                    "give a UTF-8 text file of the kind of text the model will see, "
                    "or leave it out to calibrate on the run's own training rows",
                )
            )
    return out


def imatrix_plan(spec: Any, source: Path, calibration: str | None) -> ImatrixPlan:
    """The calibration text (a file on request, else the run's training rows), the source's tokenizer and config."""
    import json

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    text = calibration_file(Path(calibration)) if calibration else calibration_text(spec, tokenizer)
    return ImatrixPlan(text, tokenizer, json.loads((source / "config.json").read_text()))
