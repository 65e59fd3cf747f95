"""Predicted vs measured peak training memory over a grid of configurations.

    python bench/memory_truth.py                 # CPU: counted live tensor bytes, the full grid (~5-10 min)
    python bench/memory_truth.py --quick         # CPU: the CI-sized subset (tests/test_memory_truth.py)
    python bench/memory_truth.py --device cuda   # a CUDA host: max allocated / reserved and NVML, + 0.5B/1.5B shapes
    python bench/memory_truth.py --device cuda --only "qwen2.5-0.5b lora sft b4,qwen2.5-0.5b full"   # a subset (--list)

Every configuration is a `JobSpec` trained for two optimizer steps by tunedeck's own path
(`jobs.config.mapping` configs, `prepare_model_for_kbit_training`, `jobs.train.trainers.build_trainer`), on a
random-weight model built from a config (memory does not depend on weight values) and `text` /
preference rows longer than `max_length`, so every row trains exactly `max_length` tokens.

On the CPU the peak is counted exactly by `jobs.memory.count.LiveBytes` (every tensor storage
alive at once; the weights loaded outside it are handed over); on CUDA it is
`torch.cuda.max_memory_allocated/reserved` and NVML's `used`, each configuration in its own
process. The prediction is `jobs.memory.predict.predict` with the CUDA-only constant left out on the CPU.
The last line says "N% of M configs within 10%": the goal is >= 90% and none more than 25% under
(docs/memory.md, "How well it predicts").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from jobs.spec.job import JobSpec  # noqa: E402  (after the sys.path line, so the script runs from anywhere)

# Model shapes, built with random weights. Vocabularies larger than the 512-token tokenizer on
# purpose: the logits are sized by the model, not by the tokens used.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-h64": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
    "llama-h256": dict(
        model_type="llama",
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=4096,
        tie_word_embeddings=False,
    ),
    "llama-h128-mha": dict(
        model_type="llama",
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=8192,
        tie_word_embeddings=True,
    ),
    "qwen2-tied": dict(
        model_type="qwen2",
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
        tie_word_embeddings=True,
    ),
    "qwen2-untied": dict(
        model_type="qwen2",
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=3000,
        tie_word_embeddings=False,
    ),
    "smollm2-135m": dict(
        model_type="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151_936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151_936,
        tie_word_embeddings=True,
    ),
}


@dataclass(frozen=True)
class Case:
    """One grid point: a model shape and the spec fields that differ from the base spec."""

    shape: str
    fields: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        short = {
            "method": "",
            "trainer": "",
            "gradient_checkpointing": "ckpt",
            "per_device_train_batch_size": "b",
            "max_length": "s",
            "optim": "",
            "precision": "",
        }
        parts = []
        for k, v in self.fields:
            if k == "gradient_checkpointing":
                if v:
                    parts.append("ckpt")
                continue
            parts.append(f"{short.get(k, k)}{v}")
        return f"{self.shape} " + " ".join(parts)


def case(
    shape: str,
    method: str = "lora",
    trainer: str = "sft",
    ckpt: bool = False,
    batch: int = 4,
    length: int = 64,
    optim: str = "adamw_torch",
    precision: str = "fp32",
) -> Case:
    return Case(
        shape,
        (
            ("method", method),
            ("trainer", trainer),
            ("gradient_checkpointing", ckpt),
            ("per_device_train_batch_size", batch),
            ("max_length", length),
            ("optim", optim),
            ("precision", precision),
        ),
    )


def grid(full: bool = True) -> list[Case]:
    """A covering subset of shape x method x checkpointing x batch x length x optimizer x trainer."""
    quick = [
        case("llama-h64", "lora", batch=4, length=64),
        case("qwen2-untied", "full", batch=1, length=64, optim="adafactor"),
        case("llama-h64", "qlora", ckpt=True, batch=1, length=64, optim="adamw_bnb_8bit"),
        case("qwen2-tied", "lora", "dpo", batch=1, length=64),
        case("llama-h256", "ia3", batch=4, length=64),
        case("llama-h64", "full", "dpo", batch=1, length=64),
    ]
    if not full:
        return quick
    rest = [
        case("llama-h256", "lora", batch=4, length=256),
        case("llama-h256", "lora", ckpt=True, batch=4, length=256),
        case("llama-h256", "dora", batch=1, length=256),
        case("llama-h256", "full", batch=4, length=64, optim="adamw_bnb_8bit"),
        case("llama-h256", "full", ckpt=True, batch=1, length=256),
        case("llama-h256", "qlora", batch=4, length=256),
        case("llama-h256", "prompt_tuning", batch=4, length=256),
        case("llama-h256", "lora", "dpo", ckpt=True, batch=4, length=64),
        case("llama-h128-mha", "lora", batch=4, length=256, optim="adafactor"),
        case("llama-h128-mha", "full", "dpo", batch=4, length=64, optim="adamw_bnb_8bit"),
        case("llama-h128-mha", "dora", ckpt=True, batch=4, length=64),
        case("llama-h128-mha", "ia3", "dpo", batch=1, length=256),
        case("qwen2-tied", "full", batch=4, length=256),
        case("qwen2-tied", "qlora", "dpo", batch=4, length=64),
        case("qwen2-tied", "prompt_tuning", ckpt=True, batch=1, length=256),
        case("qwen2-untied", "lora", batch=4, length=256, optim="adamw_bnb_8bit"),
        case("qwen2-untied", "dora", "dpo", batch=1, length=64),
        case("qwen2-untied", "full", ckpt=True, batch=4, length=256),
        case("qwen2-untied", "ia3", ckpt=True, batch=4, length=64, optim="adafactor"),
        case("llama-h64", "prompt_tuning", "dpo", batch=4, length=256),
        case("llama-h64", "lora", batch=1, length=256, precision="bf16"),
        case("llama-h256", "full", batch=1, length=64, precision="bf16"),
        case("smollm2-135m", "lora", batch=1, length=64),
        case("smollm2-135m", "qlora", ckpt=True, batch=4, length=64),
    ]
    return quick + rest


# ---------------------------------------------------------------------- model and data folders
def build_model(work: Path, shape: str) -> Path:
    """A random-weight model folder of `shape` with the offline tokenizer (reused when present)."""
    dest = work / shape
    if (dest / "config.json").is_file():
        return dest
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from jobs.models.tiny import train_tokenizer

    tokenizer = train_tokenizer()
    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(
        fields.pop("model_type"),
        **fields,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    tmp = Path(tempfile.mkdtemp(dir=work))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(dest)
    return dest


def build_data(work: Path, model_dir: Path, trainer: str, length: int, rows: int = 16) -> Path:
    """Rows that each tokenize to more than `length` tokens (so every row trains exactly `length`)."""
    dest = work / f"{trainer}-{length}.jsonl"
    if dest.is_file():
        return dest
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    first = len(tokenizer.all_special_ids)

    def text(n: int) -> str:
        return tokenizer.decode([rng.randrange(first, len(tokenizer)) for _ in range(n)])

    with dest.open("w") as fh:
        for _ in range(rows):
            row = (
                {"text": text(2 * length)}
                if trainer == "sft"
                else {"prompt": text(length // 2), "chosen": text(2 * length), "rejected": text(2 * length)}
            )
            fh.write(json.dumps(row) + "\n")
    return dest


def spec_for(c: Case, model_dir: Path, data: Path, out: Path) -> JobSpec:
    return JobSpec.from_dict(
        {
            "model": str(model_dir),
            "dataset": str(data),
            "max_steps": 2,
            "logging_steps": 1,
            "learning_rate": 1e-4,
            **dict(c.fields),
        }
    )


# ---------------------------------------------------------------------- measuring
def measure_cpu(spec: JobSpec, out: Path) -> dict[str, int]:
    """Count the live tensor bytes of two real optimizer steps of `spec` on the CPU: {"peak", "weights"}."""
    import torch

    from jobs.config.mapping import QUANTIZED_METHODS, peft_config, training_config
    from jobs.data.loading import load_datasets
    from jobs.devices.facts import CPU
    from jobs.memory.count import LiveBytes
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model, moe_layout_of

    torch.manual_seed(0)
    model, tokenizer = load_model(spec, CPU)  # read from safetensors: invisible to the counter, handed over below
    train_ds, _ = load_datasets(spec)
    moe = moe_layout_of(model)
    with LiveBytes() as counter:
        counter.track_module(model)
        weights = counter.live
        args = training_config(spec, CPU, str(out))
        if spec.method in QUANTIZED_METHODS:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(
                model,
                use_gradient_checkpointing=spec.gradient_checkpointing,
                gradient_checkpointing_kwargs={"use_reentrant": False},
            )
        trainer = build_trainer(
            spec, model, tokenizer, args, train_ds, None, peft_config(spec, model.config.model_type, moe), []
        )
        if getattr(trainer, "ref_model", None) is not None:  # DPO's reference copy, loaded by trl from disk
            counter.track_module(trainer.ref_model)
        trainer.train()
        peak = counter.peak
    return {"peak": peak, "weights": weights}


def predicted(spec: JobSpec, model_dir: Path, facts: Any) -> Any:
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict

    # Allocated bytes (what LiveBytes and torch count), not a host process's resident pages.
    return predict(spec, arch_from_config(json.loads((model_dir / "config.json").read_text())), facts, resident=False)


@dataclass(frozen=True)
class Row:
    """One grid result: predicted bytes (CUDA-only constant left out) against the counted peak."""

    label: str
    predicted: int
    measured: int
    parts: dict[str, int]

    @property
    def error(self) -> float:
        """Signed relative error of the prediction: +0.05 means 5% over the measured peak."""
        return (self.predicted - self.measured) / self.measured


def run_cpu_grid(cases: list[Case], work: Path, log: Any = None) -> list[Row]:
    """Train and count each case on the CPU; one Row each."""
    from jobs.devices.probe import cpu_facts

    facts = cpu_facts()
    rows = []
    for c in cases:
        model_dir = build_model(work, c.shape)
        f = dict(c.fields)
        data = build_data(work, model_dir, f["trainer"], f["max_length"])
        spec = spec_for(c, model_dir, data, work / "out")
        p = predicted(spec, model_dir, facts)
        m = measure_cpu(spec, work / "out")
        row = Row(c.label, p.total_bytes - p.part("overhead") - p.part("runtime"), m["peak"], p.parts_dict())
        rows.append(row)
        if log is not None:
            print(format_row(row), file=log, flush=True)
    return rows


def format_row(r: Row) -> str:
    return f"{r.label:58s} {r.predicted / 2**20:10.1f} {r.measured / 2**20:10.1f} {100 * r.error:+7.1f}%"


def summary(rows: list[Row], within: float = 0.10) -> tuple[float, float, str]:
    """(share within +-10%, worst under-prediction, the summary line)."""
    good = sum(abs(r.error) <= within for r in rows)
    worst = min((r.error for r in rows), default=0.0)
    share = good / len(rows) if rows else 0.0
    return (
        share,
        worst,
        (
            f"{100 * share:.0f}% of {len(rows)} configs within {100 * within:.0f}% "
            f"(worst under-prediction {100 * min(worst, 0):.1f}%)"
        ),
    )


def quiet() -> None:
    """No progress bars or advisory warnings in the table."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ["TQDM_DISABLE"] = "1"
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


# ---------------------------------------------------------------------- CUDA: each case in its own process
CUDA_EXTRA = [
    case("qwen2.5-0.5b", "lora", batch=4, length=512, precision="bf16"),
    case("qwen2.5-0.5b", "lora", ckpt=True, batch=8, length=512, precision="bf16"),
    case("qwen2.5-0.5b", "full", batch=2, length=512, precision="bf16"),
    case("qwen2.5-0.5b", "full", ckpt=True, batch=4, length=512, precision="bf16", optim="adamw_bnb_8bit"),
    case("qwen2.5-0.5b", "qlora", batch=4, length=512, precision="bf16"),
    case("qwen2.5-0.5b", "lora", "dpo", batch=2, length=512, precision="bf16"),
    case("qwen2.5-1.5b", "lora", batch=4, length=512, precision="bf16"),
    case("qwen2.5-1.5b", "lora", ckpt=True, batch=8, length=1024, precision="bf16"),
    case("qwen2.5-1.5b", "full", ckpt=True, batch=2, length=512, precision="bf16", optim="adamw_bnb_8bit"),
    case("qwen2.5-1.5b", "qlora", ckpt=True, batch=8, length=512, precision="bf16"),
]


def cuda_child(spec_json: str, out: str, result: str) -> int:
    """Train one spec on CUDA and write the measured peaks and persistent parts as JSON."""
    import torch
    from transformers import TrainerCallback

    from jobs.config.mapping import QUANTIZED_METHODS, peft_config, training_config
    from jobs.data.loading import load_datasets
    from jobs.devices.probe import detect_device
    from jobs.train.trainers import build_trainer
    from jobs.train.training import load_model

    quiet()
    spec = JobSpec.from_json(spec_json)
    device = detect_device()
    torch.cuda.reset_peak_memory_stats()
    model, tokenizer = load_model(spec, device)
    try:
        model.to("cuda")  # the Trainer would move it later; here so the weights can be read apart
    except (ValueError, RuntimeError):  # some transformers versions refuse .to() on quantized models
        pass
    weights = torch.cuda.memory_allocated()
    train_ds, _ = load_datasets(spec)
    if spec.method in QUANTIZED_METHODS:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=spec.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    seen: dict[str, int] = {}

    class Probe(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seen["after_step"] = torch.cuda.memory_allocated()  # weights + adapter + optimizer state

    trainer = build_trainer(
        spec,
        model,
        tokenizer,
        training_config(spec, device, out),
        train_ds,
        None,
        peft_config(spec, model.config.model_type),
        [Probe()],
    )
    before = torch.cuda.memory_allocated()
    trainer.train()
    import pynvml

    pynvml.nvmlInit()
    used = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    Path(result).write_text(
        json.dumps(
            {
                "weights": weights,
                "adapter": before - weights,
                "optimizer": seen.get("after_step", before) - before,
                "allocated": torch.cuda.max_memory_allocated(),
                "reserved": torch.cuda.max_memory_reserved(),
                "nvml_used_end": used,
            }
        )
    )
    return 0


def run_cuda_grid(cases: list[Case], work: Path, timeout: float) -> list[tuple[str, Any, dict[str, Any]]]:
    """Each case in a child process (clean peaks; an OOM is one row); NVML peak polled here."""
    import subprocess
    import threading
    import time

    import pynvml

    from jobs.devices.probe import local_facts

    facts = local_facts()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    out = []
    for c in cases:
        model_dir = build_model(work, c.shape)
        f = dict(c.fields)
        spec = spec_for(c, model_dir, build_data(work, model_dir, f["trainer"], f["max_length"]), work / "out")
        result = work / "result.json"
        result.unlink(missing_ok=True)
        peak = [0]
        done = threading.Event()

        def poll(done: threading.Event = done, peak: list[int] = peak) -> None:
            while not done.is_set():
                peak[0] = max(peak[0], pynvml.nvmlDeviceGetMemoryInfo(handle).used)
                time.sleep(0.02)

        idle = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", spec.to_json(), str(work / "out"), str(result)],
                timeout=timeout,
                capture_output=True,
                text=True,
            )
            failed = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
        except subprocess.TimeoutExpired:
            failed = "timeout"
        done.set()
        thread.join()
        measured = json.loads(result.read_text()) if result.is_file() else {"failed": failed}
        measured["nvml_peak"] = peak[0] - idle
        out.append((c.label, predicted(spec, model_dir, facts), measured))
    return out


def cuda_table(rows: list[tuple[str, Any, dict[str, Any]]]) -> str:
    """Per-component and total errors; the goal is +-10% of max reserved (+ context) on >= 90%."""
    from jobs.memory.breakdown import context_bytes

    gib = 2**30
    lines = [
        f"{'config':58s} {'pred':>7s} {'reserved':>8s} {'alloc':>7s} {'nvml':>7s} {'err(res)':>8s}  "
        "weights / adapter+optimizer errors"
    ]
    errors = []
    for label, p, m in rows:
        if "failed" in m:
            lines.append(f"{label:58s} FAILED: {m['failed']}")
            continue
        ctx = context_bytes(p.device)
        pred_res = p.total_bytes - ctx  # reserved excludes the CUDA context
        err = (pred_res - m["reserved"]) / m["reserved"]
        errors.append(err)
        w_err = (p.part("weights") - m["weights"]) / max(m["weights"], 1)
        ao_pred = p.part("adapter") + p.part("optimizer")
        ao_err = (ao_pred - (m["adapter"] + m["optimizer"])) / max(m["adapter"] + m["optimizer"], 1)
        lines.append(
            f"{label:58s} {p.total_bytes / gib:7.2f} {m['reserved'] / gib:8.2f} {m['allocated'] / gib:7.2f} "
            f"{m['nvml_peak'] / gib:7.2f} {100 * err:+7.1f}%  {100 * w_err:+.1f}% / {100 * ao_err:+.1f}%"
        )
    good = sum(abs(e) <= 0.10 for e in errors)
    lines.append(
        f"{100 * good / max(len(errors), 1):.0f}% of {len(errors)} configs within 10% of max reserved "
        f"(worst under-prediction {100 * min(errors + [0.0]):.1f}%)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="the CI-sized subset only")
    parser.add_argument("--workdir", default=None, help="keep models and data here (reused by a second run)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per CUDA configuration")
    parser.add_argument(
        "--only",
        help="comma-separated parts of configuration labels (see --list): only the configurations whose label "
        "contains one of them, from the whole grid and (with --device cuda) the CUDA shapes",
    )
    parser.add_argument("--list", action="store_true", help="print the configuration labels and exit")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        return cuda_child(*ns.child)
    cases = grid(full=not ns.quick) + (CUDA_EXTRA if ns.device == "cuda" and not ns.quick else [])
    if ns.only:
        wanted = [w.strip() for w in ns.only.split(",") if w.strip()]
        unmatched = [w for w in wanted if not any(w in c.label for c in cases)]
        if unmatched:
            parser.error(f"--only: no configuration label contains {unmatched} (see --list)")
        cases = [c for c in cases if any(w in c.label for w in wanted)]
    if ns.list:
        print("\n".join(c.label for c in cases))
        return 0
    quiet()
    work = Path(ns.workdir or tempfile.mkdtemp(prefix="tunedeck-memtruth-"))
    work.mkdir(parents=True, exist_ok=True)
    if ns.device == "cuda":
        print(cuda_table(run_cuda_grid(cases, work, ns.timeout)))
        return 0
    print(f"{'config':58s} {'predicted':>10s} {'measured':>10s} {'error':>8s}   (MiB; CPU: counted live tensor bytes)")
    rows = run_cpu_grid(cases, work, log=sys.stdout)
    print(summary(rows)[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
