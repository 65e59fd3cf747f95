"""Plain Q4_K_M against Q4_K_M with an importance matrix: each one's agreement with the f16 file, side by side.

    .venv/bin/python bench/imatrix_gguf.py                        # SmolLM2-135M-Instruct, the example's rows
    .venv/bin/python bench/imatrix_gguf.py --model PATH --types q4_k_m iq4_xs --new-tokens 48 --chunks 8

The SmolLM2 example (examples/smollm2-tag-format.yaml): its model (or --model, e.g. a run's merged folder), and
its training rows as the importance matrix's calibration text, rendered as an export renders them
(`jobs.export.imatrix.calibration_text`). Every file is written as an export writes it (`jobs.export.gguf.write_file`)
(the quants from one f16 file, as an export quantizes it) and read by llama.cpp (`jobs.export.llamacpp.llama_read_back`) on held-out prompts: the example's unseen
questions (examples/tag-format-questions.jsonl) and the export check's prompts. The f16 file answers each greedily;
each quant is fed those answers, and "next" is the share of positions where it picks the f16's next token;
"free" is the share of answer positions its own greedy answer holds the same token. Needs `./dev.sh gguf` (the
binding, llama-imatrix and llama-quantize).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "smollm2-tag-format.yaml"
QUESTIONS = ROOT / "examples" / "tag-format-questions.jsonl"


def main() -> int:
    from app.cli.usage import load_spec
    from jobs.export.gguf import write_file
    from jobs.export.imatrix import ImatrixPlan, calibration_text, imatrix_problem
    from jobs.export.llamacpp import llama_read_back, quantize, tensor_types
    from jobs.export.merged import CHECK_PROMPTS, token_agreement
    from jobs.models.references import resolve_model
    from jobs.train.before_after import encode

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a model folder (default: the example's model)")
    p.add_argument("--types", nargs="+", default=["q4_k_m"], help="quantized types, each made plain and weighted")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens of each f16 answer")
    p.add_argument("--chunks", type=int, default=None, help="calibration chunks at most (default: an export's 64)")
    args = p.parse_args()
    if args.chunks:
        import jobs.export.imatrix

        jobs.export.imatrix.MAX_CHUNKS = args.chunks
    if problem := imatrix_problem():
        print(f"skipped: {problem} (./dev.sh gguf)")
        return 1
    spec = load_spec(str(EXAMPLE))
    source = Path(args.model or resolve_model(spec.model).path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    calibration = calibration_text(spec, tokenizer)
    plan = ImatrixPlan(calibration, tokenizer, json.loads((source / "config.json").read_text()))
    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    prompts = [encode(tokenizer, q)["input_ids"][0].tolist() for q in [*questions, *CHECK_PROMPTS]]
    print(f"model {source.name}; calibration: {calibration.source}; {len(prompts)} held-out prompts")
    with tempfile.TemporaryDirectory() as tmp:
        f16 = Path(tmp, "bench-f16.gguf")
        write_file(source, f16, "f16", "bench")
        reference = llama_read_back(f16, tokenizer, [], prompts, [[] for _ in prompts], args.new_tokens).answers or []
        print(f"f16: {f16.stat().st_size / 1e6:.1f} MB, {sum(map(len, reference))} answer tokens")
        print(f"{'type':8} {'imatrix':8} {'MB':>6} {'next':>6} {'free':>6} {'s':>5}  tensors")
        for gguf_type in args.types:
            for weighted in (False, True):
                start = time.monotonic()
                dest = Path(tmp, f"bench-{gguf_type}-{weighted}.gguf")
                made = plan.write_with(f16, dest, gguf_type) if weighted else None
                if not weighted:
                    quantize(f16, dest, gguf_type)
                read = llama_read_back(dest, tokenizer, [], prompts, reference, args.new_tokens)
                types = ", ".join(f"{n} {t}" for t, n in tensor_types(dest).items())
                what = f"{made['chunks']}x{made['context']}" if made else "-"
                print(
                    f"{gguf_type:8} {what:8} {dest.stat().st_size / 1e6:6.1f} {read.forced_agreement:6.3f} "
                    f"{token_agreement(reference, read.answers or []):6.3f} {time.monotonic() - start:5.0f}  {types}",
                    flush=True,
                )
                dest.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
