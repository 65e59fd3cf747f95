"""The forgetting meter's memory on the CPU: its peak RSS rise, the old full-logits way beside the product's (#49).

    python bench/forgetting_memory.py                     # bench/memory_runs.py's small model (8,192 tokens)
    python bench/forgetting_memory.py --model smollm2     # SmolLM2-135M-Instruct from the tests' cache (49,152)

Each measure runs in a fresh process (a heap that grew once keeps its pages: two measures in one process would
hide the second's rise): the model is loaded (float32, as the CPU trains it), one small forward warms the
runtime, the process's peak RSS is reset (/proc/self/clear_refs 5), then `mean_loss` reads the meter's texts:
the general text (GENERAL_SAMPLE sentences and the prompts) and MAX_TASK_ROWS eval rows of MAX_TOKENS tokens, as
`jobs.train.forgetting.record` does before training. Printed: the rise of the peak (VmHWM) over the RSS before,
both figures (the same up to float rounding), and old / new, each rise the median of --repeat processes (the
RSS of one varies by tens of MiB); `body` is the floor: the same batches through the
decoder alone (`get_decoder()`, no KV cache, as the product runs it), no head and no loss. The old way keeps the
KV cache the model builds by default, as the meter did before #49.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
MIB = 2**20
SMOLLM2 = Path.home() / ".cache" / "tunedeck" / "test-models" / "smollm2-135m-instruct"


def status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def full_logits_loss(model: Any, tokenizer: Any, texts: list[str]) -> float:
    """The meter's computation before #49: a 32-row batch's full [batch, seq, vocab] logits at once."""
    import torch

    from jobs.train.forgetting import MAX_TOKENS

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = sorted(
        (x for x in (tokenizer(t, add_special_tokens=False)["input_ids"][:MAX_TOKENS] for t in texts) if len(x) >= 2),
        key=len,
    )
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(encoded), 32):
            ids = encoded[start : start + 32]
            width = max(map(len, ids))
            input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
            logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
            total += float(nll[mask[:, 1:].bool()].sum())
            count += int(mask[:, 1:].sum())
    return total / count


def body_only(model: Any, tokenizer: Any, texts: list[str]) -> float:
    """The floor: the same batches through the decoder alone (no LM head, no loss); returns nan."""
    import torch

    from jobs.train.forgetting import BATCH, MAX_TOKENS

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = sorted((tokenizer(t, add_special_tokens=False)["input_ids"][:MAX_TOKENS] for t in texts), key=len)
    with torch.no_grad():
        for start in range(0, len(encoded), BATCH):
            ids = encoded[start : start + BATCH]
            width = max(map(len, ids))
            input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
            model.get_decoder()(input_ids=input_ids, attention_mask=mask, use_cache=False)
    return float("nan")


def model_path(name: str) -> Path:
    if name == "smollm2":
        if not (SMOLLM2 / "config.json").is_file():
            raise SystemExit(f"SmolLM2 is not in the tests' cache ({SMOLLM2}): run tests/test_smollm2.py once")
        return SMOLLM2
    from memory_runs import SMALL_SHAPE, random_llama  # type: ignore[import-not-found]

    return Path(random_llama(Path(tempfile.gettempdir()) / "tunedeck-forgetting-bench" / "small", SMALL_SHAPE))


def measure(name: str, way: str, budget: int | None) -> dict[str, float]:
    """One measure in this process: the peak RSS rise of the meter's two reads, and their figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.train import forgetting

    torch.set_num_threads(1)
    if budget:
        forgetting.LOGIT_BUDGET = budget
    path = model_path(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    rng = random.Random(0)
    words = "the of and to in is was it for on with as they be at one have this from".split()
    rows = [
        " ".join(rng.choice(words) for _ in range(2 * forgetting.MAX_TOKENS)) for _ in range(forgetting.MAX_TASK_ROWS)
    ]
    texts = [forgetting.general_texts(tokenizer), rows]
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3, 4]]))  # the runtime's first-call allocations, outside the rise
    loss = {"old": full_logits_loss, "new": forgetting.mean_loss, "body": body_only}[way]
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    figures = [loss(model, tokenizer, t) for t in texts]
    return {"rise_mib": (status("VmHWM") - before) / MIB, "general": figures[0], "task": figures[1],
            "vocab": model.config.vocab_size}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", choices=("small", "smollm2"))
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per way (the RSS varies: the median)")
    parser.add_argument("--budget", type=int, help="the product's LOGIT_BUDGET for the new way (default: its own)")
    parser.add_argument("--one", choices=("old", "new", "body"), help=argparse.SUPPRESS)  # a child's single measure
    ns = parser.parse_args()
    if ns.one:
        print(json.dumps(measure(ns.model, ns.one, ns.budget)))
        return 0
    model_path(ns.model)  # built once, before the children race for it
    out, rises = {}, {}
    budget = ["--budget", str(ns.budget)] if ns.budget else []
    for way in ("old", "new", "body"):
        rows = []
        for _ in range(ns.repeat):
            run = subprocess.run([sys.executable, __file__, "--model", ns.model, "--one", way, *budget],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
        rises[way] = sorted(r["rise_mib"] for r in rows)
        out[way] = {**rows[0], "rise_mib": statistics.median(rises[way])}
    old, new = out["old"], out["new"]
    print(f"model {ns.model} (vocab {old['vocab']:,}): the meter's peak RSS rise over the RSS before it, median of")
    print(f"{ns.repeat} fresh processes (range)")
    for way, row in out.items():
        spread = f"({rises[way][0]:.0f}-{rises[way][-1]:.0f})"
        print(f"  {way}: {row['rise_mib']:7.1f} MiB {spread:>11s}   general_loss {row['general']:.6f}   "
              f"task_loss {row['task']:.6f}")  # fmt: skip
    print(f"  old / new: {old['rise_mib'] / max(new['rise_mib'], 0.1):.1f}x (body: the decoder alone, the floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
