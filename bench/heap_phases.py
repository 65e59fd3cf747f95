"""glibc's heap through real LoRA steps on the CPU: what `jobs.memory.trick_effects.GLIBC_HOLES` is read from.

    python bench/heap_phases.py                                  # bench/memory_runs.py's small model, 8 x 500
    python bench/heap_phases.py --model smollm2-135m-instruct --length 54 --batch 8
    python bench/heap_phases.py --checkpointing                  # the recomputed block beside the head
    python bench/heap_phases.py --grpo --all                     # bench/grpo_memory.py's GRPO case, MID_SHAPE

Run it with glibc's default allocator (no MALLOC_MMAP_THRESHOLD_ in the environment: what a run gets without
`cpu_return_freed_memory`). Each step is marked at each decoder block's forward and backward, the final norm's,
and the optimizer step, with glibc's own counters (mallinfo2): `heap` its size (arena), `in use` its allocated
bytes (uordblks), `mmap` the blocks mapped on their own (hblkhd), and the process's RSS. The last lines: the
holes ratio of each step after the first, (the heap's largest size - its bytes in use at the forward's end) /
(the bytes in use the forward added: the saved activations), and the process's peak RSS (VmHWM). With `--grpo`
the rollout (generation, rewards, the reference pass; `--beta 0`: none) is marked too.

Read with `--grpo` on 2026-12-05 (MID_SHAPE, 4 completions of 32 tokens on prompts up to 38): the RSS grows
~135 MiB during the first rollout outside glibc's heap (no module is imported then: the weights' file-backed
pages, first touched by generation; the prediction's weights part), and the heap's peak over its bytes in use
at the step's start varied from +176 MiB to +376 MiB between two runs of the same spec (completions of other
lengths each step: the freed blocks of one step's shapes do not fit the next's).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
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
FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]


def status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


class Marks:
    """(label, heap size, heap in use, mmapped, RSS) at each marked point."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.mallinfo2.restype = MallInfo2
        self.rows: list[tuple[str, int, int, int, int]] = []

    def __call__(self, label: str) -> None:
        m = self.libc.mallinfo2()
        self.rows.append((label, m.arena, m.uordblks, m.hblkhd, status("VmRSS")))

    def holes(self) -> list[float]:
        """Per step after the first: (largest heap - in use at the forward's end) / the forward's added bytes."""
        out, begin, end, top = [], None, None, 0
        for label, arena, used, _, _ in self.rows + [("step_begin", 0, 0, 0, 0)]:
            if label == "step_begin":
                if begin is not None and end is not None and end > begin:
                    out.append((top - end) / (end - begin))
                begin, end, top = used, None, arena
            top = max(top, arena)
            if label == "norm_forward":
                end = used
        return out[1:]


def write_rows(tokenizer: Any, dest: Path, rows: int, length: int) -> None:
    rng = random.Random(0)
    words = "the of and to in is was it for on with as they be at one have this from".split()
    with dest.open("w") as fh:
        for _ in range(rows):
            ids = tokenizer(" ".join(rng.choice(words) for _ in range(2 * length)), add_special_tokens=False)
            fh.write(json.dumps({"text": tokenizer.decode(ids["input_ids"][: length - 4])}) + "\n")


def train(ns: argparse.Namespace, marks: Marks) -> None:
    from transformers import AutoTokenizer, TrainerCallback

    from bench.memory_runs import SMALL_SHAPE, random_llama
    from jobs.config.mapping import peft_config, training_config
    from jobs.data.loading import load_datasets
    from jobs.devices.facts import CPU
    from jobs.models.references import resolve_model
    from jobs.spec.job import JobSpec
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model, moe_layout_of

    work = Path(tempfile.mkdtemp(prefix="heap-phases-"))
    if ns.grpo:
        from bench.grpo_memory import GRPO, MID_SHAPE

        model = str(random_llama(work / "mid", MID_SHAPE))
        fields = {**GRPO, "model": model, "max_steps": ns.steps, "sample_count": 0, "beta": ns.beta}
        spec = JobSpec.from_dict({**fields, **dict(json.loads(v) for v in ns.set)})
    else:
        model = str(random_llama(work / "small", SMALL_SHAPE)) if ns.model == "small" else ns.model
        data = work / "rows.jsonl"
        write_rows(AutoTokenizer.from_pretrained(resolve_model(model).path), data, ns.batch * ns.steps, ns.length)
        spec = JobSpec.from_dict(
            {"model": model, "dataset": str(data), "max_steps": ns.steps, "max_train_samples": ns.batch * ns.steps,
             "method": "lora", "lora_r": 16, "lora_alpha": 32, "lora_target_modules": "all-linear",
             "sample_count": 0, "max_length": ns.length, "per_device_train_batch_size": ns.batch,
             "gradient_checkpointing": ns.checkpointing}
        )  # fmt: skip
    loaded, tokenizer = load_model(spec, CPU)
    train_ds, _ = load_datasets(spec)

    class Steps(TrainerCallback):
        def on_step_begin(self, *_: object, **__: object) -> None:
            marks("step_begin")

        def on_optimizer_step(self, *_: object, **__: object) -> None:
            marks("optimizer")

    peft = peft_config(spec, loaded.config.model_type, moe_layout_of(loaded))
    args = training_config(spec, CPU, str(work / "out"))
    trainer = build_trainer(spec, loaded, tokenizer, args, train_ds, None, peft, [Steps()])
    inner = trainer.model.get_base_model().model
    for i, block in enumerate(inner.layers):
        block.register_forward_hook(lambda *_, i=i: marks(f"forward {i}"))
        block.register_full_backward_hook(lambda *_, i=i: marks(f"backward {i}"))
    inner.norm.register_forward_hook(lambda *_: marks("norm_forward"))
    inner.norm.register_full_backward_hook(lambda *_: marks("norm_backward"))
    if ns.grpo:  # the rollout (generation, rewards, the reference pass) before each step's forward
        rollout = trainer._generate_and_score_completions

        def marked(*args: object, **kwargs: object) -> object:
            marks("rollout_begin")
            out = rollout(*args, **kwargs)
            marks("rollout_end")
            return out

        trainer._generate_and_score_completions = marked
    trainer.train()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="'small' (memory_runs' 4-layer Llama) or a model reference")
    parser.add_argument("--length", type=int, default=500)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--all", action="store_true", help="every mark, not only the step's phases")
    parser.add_argument("--grpo", action="store_true", help="bench/grpo_memory.py's GRPO example on its MID_SHAPE")
    parser.add_argument("--beta", type=float, default=0.04, help="with --grpo: the KL weight (0: no reference pass)")
    parser.add_argument(
        "--set", action="append", default=[], help="with --grpo: a spec field, e.g. --set '[\"num_generations\", 8]'"
    )
    ns = parser.parse_args()
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        parser.error("MALLOC_MMAP_THRESHOLD_ is set: this measures glibc's default (dynamic) threshold")
    marks = Marks()
    train(ns, marks)
    print(f"{'mark':16s} {'heap':>8s} {'in use':>8s} {'mmap':>8s} {'rss':>8s}  (MiB)")
    for label, arena, used, mapped, rss in marks.rows:
        if ns.all or not label.startswith(("forward ", "backward ")):
            print(f"{label:16s} {arena / MIB:8.1f} {used / MIB:8.1f} {mapped / MIB:8.1f} {rss / MIB:8.1f}")
    print("holes / saved activations, steps after the first:", ", ".join(f"{h:.2f}" for h in marks.holes()))
    print(f"peak RSS (VmHWM) {status('VmHWM') / MIB:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
