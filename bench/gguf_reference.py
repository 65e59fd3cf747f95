"""tunedeck's GGUF writer vs llama.cpp's own converter, on one model folder: time, metadata and tensors compared.

    .venv/bin/python bench/gguf_reference.py                      # the built-in SmolLM2, f16 and q8_0
    .venv/bin/python bench/gguf_reference.py --model PATH --types f16

llama.cpp's converter is the one `./dev.sh gguf` keeps in the venv (share/tunedeck/llama.cpp, from the pinned
llama-cpp-python source: `jobs.export.converter`), run as an export runs it: a child process with the venv's
python and its own gguf-py. For each type both files are written and timed, then read with the `gguf` reader; the
script prints every metadata key whose value differs and counts the tensors whose name, type, shape or bytes
differ (goal: 0 tensors; name fields may differ, and the pre-tokenizer name: tunedeck writes the split rule
tokenizer.json states, llama.cpp its guess from a hash of the tokenizer's output). SmolLM2: ~1 min on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _fields(reader) -> dict:
    out = {}
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            out[key] = field.contents()
    return out


def _show(value) -> str:
    return f"list of {len(value)}" if isinstance(value, list) and len(value) > 5 else repr(value)[:80]


def compare(ref: Path, ours: Path) -> int:
    """Print the differences between two GGUF files; return how many tensors differ."""
    import numpy as np
    from gguf import GGUFReader

    a, b = GGUFReader(str(ref)), GGUFReader(str(ours))
    fa, fb = _fields(a), _fields(b)
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key, "<missing>") != fb.get(key, "<missing>"):
            print(
                f"  metadata {key}: llama.cpp {_show(fa.get(key, '<missing>'))}, tunedeck {_show(fb.get(key, '<missing>'))}"
            )
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    differing = sorted(set(ta) ^ set(tb))
    for name in sorted(set(ta) & set(tb)):
        x, y = ta[name], tb[name]
        if (
            x.tensor_type != y.tensor_type
            or list(x.shape) != list(y.shape)
            or not np.array_equal(np.asarray(x.data), np.asarray(y.data))
        ):
            differing.append(name)
    print(
        f"  tensors: {len(ta)} in llama.cpp's file, {len(tb)} in tunedeck's, {len(differing)} differ "
        f"{differing[:5] if differing else ''}"
    )
    return len(differing)


def main() -> int:
    from jobs.export.converter import convert, converter_installed
    from jobs.export.gguf_writer import folder_plan, write_gguf
    from jobs.models.references import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a model folder or a built-in model name")
    p.add_argument("--types", default="f16,q8_0")
    args = p.parse_args()
    if not converter_installed():
        print("llama.cpp's converter is not in this venv: run ./dev.sh gguf")
        return 2
    folder = Path(resolve_model(args.model).path)
    pre = folder_plan(folder).pre_tokenizer
    with tempfile.TemporaryDirectory(prefix="gguf-reference-") as tmp:
        failures = 0
        for gguf_type in args.types.split(","):
            ref, ours = Path(tmp) / f"llamacpp-{gguf_type}.gguf", Path(tmp) / f"tunedeck-{gguf_type}.gguf"
            start = time.perf_counter()
            convert(folder, ref, gguf_type, pre)
            converter_s = time.perf_counter() - start
            start = time.perf_counter()
            write_gguf(folder, ours, gguf_type, folder.name)
            writer_s = time.perf_counter() - start
            print(
                f"{gguf_type}: {folder}: llama.cpp's converter {converter_s:.1f} s, tunedeck's writer {writer_s:.1f} s"
            )
            failures += compare(ref, ours) > 0
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
