"""Every GGUF type tunedeck exports, on one model: size, tensor types, and agreement with the source model.

    .venv/bin/python bench/gguf_quants.py                          # the built-in SmolLM2, all five types
    .venv/bin/python bench/gguf_quants.py --model PATH --types q4_k_m q6_k

Each type is written as an export writes it (`jobs.export.gguf.write_file`: tunedeck's writer for f16
and q8_0, llama.cpp's quantizer over an f16 file for the K-quants) and checked as an export checks it
(`check_round_trip`): fed the source model's greedy answers to the check prompts, the share of positions
where the file picks the same next token, read through transformers' GGUF loader and through llama.cpp
itself; free-running answer agreement beside it. The K-quants need llama-cpp-python (`./dev.sh gguf`).
The figures set `K_FORCED_AGREEMENT` and `Q8_0_FORCED_AGREEMENT` in jobs/export/gguf.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from jobs.export.gguf import check_round_trip, write_file
    from jobs.export.llamacpp import EXPORT_TYPES, llama_cpp_problem
    from jobs.models.references import resolve_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a model folder or a built-in model name")
    p.add_argument("--types", nargs="+", default=list(EXPORT_TYPES), choices=EXPORT_TYPES)
    args = p.parse_args()
    source = Path(resolve_model(args.model).path)
    print(f"{'type':7} {'MB':>7} {'x f16':>6} {'hf next':>8} {'llama next':>10} {'free':>6} {'s':>5}  tensors")
    f16_size = None
    with tempfile.TemporaryDirectory() as tmp:
        for gguf_type in args.types:
            if problem := llama_cpp_problem(gguf_type):
                print(f"{gguf_type:7} skipped: {problem}")
                continue
            start = time.monotonic()
            dest = Path(tmp) / f"bench-{gguf_type}.gguf"
            write_file(source, dest, gguf_type, "bench")
            check = check_round_trip(source, dest, gguf_type)
            size = dest.stat().st_size
            f16_size = f16_size or (size if gguf_type == "f16" else None)
            ratio = f"{size / f16_size:.2f}" if f16_size else "-"
            llama = f"{check.llama_cpp['forced_agreement']:.3f}" if check.llama_cpp else "-"
            types = ", ".join(f"{n} {t}" for t, n in check.tensor_types.items())
            print(
                f"{gguf_type:7} {size / 1e6:7.1f} {ratio:>6} {check.forced_agreement:8.3f} {llama:>10} "
                f"{check.token_agreement:6.3f} {time.monotonic() - start:5.0f}  {types}",
                flush=True,
            )
            dest.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
