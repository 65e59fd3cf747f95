"""What each memory trick costs and saves, measured: peak memory, step time and tokens/s per configuration.

    python bench/tricks_gpu.py                        # CUDA host: ~0.5B Qwen2-like model, 20 steps, seq 512
    python bench/tricks_gpu.py --device cpu --tiny    # anywhere: tiny model, 4 steps, seq 64 (smoke test)
    python bench/tricks_gpu.py --only baseline,lora   # a subset

The model is built from a config with random weights (memory and speed do not depend on the
weight values; no hub needed): Qwen2.5-0.5B's shape (hidden 896, intermediate 4864, 24 layers,
14/2 heads, vocab 151,936, tied embeddings), saved with an offline byte-level BPE tokenizer
(jobs.models.tiny.train_tokenizer) to a temporary folder. The data is a .jsonl of `text` rows that each
tokenize to more than --seq-len tokens, so every row is truncated to exactly --seq-len tokens.

Each configuration is a `JobSpec` trained by tunedeck's own `jobs.train.training.train_spec` (so the
mapping to SFTConfig / LoraConfig / BitsAndBytesConfig is the one tunedeck runs) in its OWN
subprocess: the memory peak starts clean and an OOM in one configuration does not stop the table.
While a child runs, this process polls NVML (device 0, every 20 ms) for the "used" peak, which
includes the CUDA context that torch's allocator counters do not see. Step time is the mean
interval between optimizer-step ends after the first --warmup steps; tokens/s is trl's
`num_tokens` over the same interval. Configurations the device cannot honestly run (fp16 and
paged optimizers on a CPU) are skipped with the reason, found by tunedeck's capability checks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from jobs.spec.job import JobSpec  # noqa: E402  (after the sys.path line, so the script runs from anywhere)

QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151_936,
)
# Vocabulary larger than the tokenizer's 512 on purpose, as in the big model (logits sized by the model).
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=2048,
)
_GIB = 1024**3


@dataclass(frozen=True)
class Trick:
    """One benchmarked configuration: spec fields changed from the baseline."""

    name: str
    what: str
    changes: dict[str, Any] = field(default_factory=dict)


# The baseline is a full fine-tune in bf16 mixed precision, micro-batch 8, AdamW: each trick alone
# changes it in one place, then the usual combinations. bf16 itself is the baseline's precision;
# `fp32` measures what mixed precision saves.
LORA = {"method": "lora", "learning_rate": 2e-4}
TRICKS = [
    Trick("baseline", "full fine-tune, bf16, batch 8, AdamW"),
    Trick("accum", "batch 2 x accumulation 4", {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}),
    Trick("checkpointing", "+ gradient checkpointing", {"gradient_checkpointing": True}),
    Trick("fp16", "fp16 mixed precision (loss scaling)", {"precision": "fp16"}),
    Trick("fp32", "fp32, no mixed precision", {"precision": "fp32"}),
    Trick("lora", "LoRA r16 all-linear", LORA),
    Trick("qlora", "QLoRA: LoRA on a 4-bit NF4 base", {**LORA, "method": "qlora"}),
    Trick("adamw-8bit", "8-bit AdamW", {"optim": "adamw_bnb_8bit"}),
    Trick("paged-adamw-8bit", "paged 8-bit AdamW", {"optim": "paged_adamw_8bit"}),
    Trick("lora+ckpt+bf16", "LoRA + checkpointing + bf16", {**LORA, "gradient_checkpointing": True}),
    Trick("qlora+ckpt", "QLoRA + checkpointing", {**LORA, "method": "qlora", "gradient_checkpointing": True}),
    # The newer tricks (jobs/spec/tricks/), each alone on the baseline, and the presets' combinations.
    Trick("liger", "Liger kernels (Triton)", {"use_liger_kernel": True}),
    Trick("offload", "activation offloading to host RAM", {"activation_offloading": True}),
    Trick("offload+ckpt", "offloaded checkpointing", {"activation_offloading": True, "gradient_checkpointing": True}),
    Trick("galore", "GaLore AdamW, rank 128", {"optim": "galore_adamw", "optim_rank": 128}),
    Trick("galore-layerwise", "GaLore AdamW layer-wise", {"optim": "galore_adamw_layerwise", "optim_rank": 128}),
    Trick("galore-8bit", "GaLore 8-bit AdamW", {"optim": "galore_adamw_8bit", "optim_rank": 128}),
    Trick("apollo", "APOLLO AdamW, rank 128", {"optim": "apollo_adamw", "optim_rank": 128}),
    Trick("loraplus", "LoRA+ (B at 16x the learning rate)", {**LORA, "loraplus_lr_ratio": 16.0}),
    Trick("neftune", "NEFTune noise 5 (LoRA)", {**LORA, "neftune_noise_alpha": 5.0}),
    Trick("compile", "torch.compile (LoRA)", {**LORA, "torch_compile": True}),
    Trick(
        "accum+ckpt+8bit",
        "batch 2 x acc 4 + checkpointing + 8-bit AdamW",
        {
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 4,
            "gradient_checkpointing": True,
            "optim": "adamw_bnb_8bit",
        },
    ),
]


# The presets' values on a CUDA worker with every trick package (jobs/spec/presets.py), without the fields that
# decide the run's length and data (the bench sets those).
_RUN_FIELDS = {"max_train_samples", "max_steps", "num_train_epochs", "max_length"}


def preset_rows() -> list[Trick]:
    from jobs.spec.presets import preset

    out = []
    for name in ("Low memory", "Fast"):
        values = preset(name).values_for(True, frozenset({"liger_kernel"}))
        changes = {k: getattr(v, "value", v) for k, v in values.items() if k not in _RUN_FIELDS}
        on = [k for k in ("activation_offloading", "use_liger_kernel") if values.get(k)]
        out.append(
            Trick(f"preset-{name.lower().replace(' ', '-')}", f"preset {name} on CUDA (+{', '.join(on)})", changes)
        )
    return out


TRICKS += preset_rows()


def predicted_bytes(spec: JobSpec, model_dir: Path, cuda: bool) -> tuple[int, int]:
    """(tunedeck's predicted peak, the part torch's reserved figure does not see: the CUDA context)."""
    from jobs.devices.probe import cpu_facts, detect
    from jobs.memory.breakdown import context_bytes
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict

    facts = detect(0) if cuda else cpu_facts()
    p = predict(spec, arch_from_config(json.loads((model_dir / "config.json").read_text())), facts)
    return p.total_bytes, context_bytes(facts)


def base_spec(model_dir: Path, data_file: Path, steps: int, seq_len: int) -> JobSpec:
    """The baseline JobSpec: full bf16 fine-tune, batch 8, fixed sequence length, no eval."""
    return JobSpec.from_dict(
        dict(
            run_name="bench",
            model=str(model_dir),
            dataset=str(data_file),
            method="full",
            precision="bf16",
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            gradient_checkpointing=False,
            optim="adamw_torch",
            learning_rate=1e-5,
            lr_scheduler_type="constant",
            max_steps=steps,
            logging_steps=1,
            max_length=seq_len,
            packing=False,
            seed=0,
        )
    )


def skip_reason(spec: JobSpec, cuda: bool) -> str | None:
    """Why this device cannot honestly run `spec` (tunedeck's own capability checks), or None."""
    from jobs.checks.trick_packages import missing_package_problems
    from jobs.config.mapping import PAGED_OPTIMS, capability_problems
    from jobs.devices.facts import CPU, Device

    if cuda:
        found = missing_package_problems(spec, Device(cuda=True, bf16=True))
        return "; ".join(f"{p.field}: {p.problem}" for p in found) or None
    if spec.torch_compile:
        return "torch.compile: the CPU's inductor compiles for many minutes (tried: over 10 min for a tiny model)"
    problems = capability_problems(spec, CPU) + missing_package_problems(spec, CPU)
    if problems:
        return "; ".join(f"{p.field}: {p.problem}" for p in problems)
    if spec.optim in PAGED_OPTIMS:
        return f"optim {spec.optim.value}: paged optimizers page only on CUDA (the CPU runs the non-paged one)"
    return None


# ---------------------------------------------------------------------- model and data
def build_model(dest: Path, tiny: bool) -> Path:
    """A Qwen2-like model with random weights and an offline tokenizer, saved as a normal folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jobs.models.tiny import train_tokenizer

    if (dest / "config.json").is_file():
        return dest
    tokenizer = train_tokenizer()
    config = Qwen2Config(
        **(TINY if tiny else QWEN2_05B),
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)  # bf16 on disk: half the write; loads as asked
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return dest


def build_data(dest: Path, model_dir: Path, rows: int, seq_len: int) -> Path:
    """`rows` text rows that each tokenize to more than `seq_len` tokens (so all truncate to seq_len)."""
    import random

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    first_id = len(tokenizer.all_special_ids)
    with dest.open("w") as fh:
        for _ in range(rows):
            ids = [rng.randrange(first_id, len(tokenizer)) for _ in range(2 * seq_len)]
            text = tokenizer.decode(ids)
            n = len(tokenizer(text)["input_ids"])
            if n <= seq_len:
                raise RuntimeError(f"a bench row tokenized to {n} tokens, wanted > {seq_len}")
            fh.write(json.dumps({"text": text}) + "\n")
    return dest


# ---------------------------------------------------------------------- child: one configuration
def child(spec_json: str, out_dir: str, result_path: str, cuda: bool, warmup: int) -> int:
    """Train one spec with tunedeck's train_spec; write the measurements as JSON."""
    import torch
    from transformers import TrainerCallback

    from jobs.devices.facts import CPU
    from jobs.devices.probe import detect_device
    from jobs.train.training import train_spec

    class Timer(TrainerCallback):
        """perf_counter at each optimizer-step end, and trl's running num_tokens at each log."""

        def __init__(self) -> None:
            self.ends: list[float] = []
            self.tokens: dict[int, float] = {}

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.ends.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "num_tokens" in logs:
                self.tokens[state.global_step] = float(logs["num_tokens"])

    spec = JobSpec.from_json(spec_json)
    timer = Timer()
    result: dict[str, Any] = {}
    try:
        metrics = train_spec(spec, out_dir, [timer], device=detect_device() if cuda else CPU).metrics
        steps = len(timer.ends)
        first = min(warmup, steps - 2)  # keep at least one interval on very short runs
        if steps >= 2 and first >= 0:
            span = timer.ends[-1] - timer.ends[first]
            result["step_time"] = span / (steps - 1 - first)
            t0, t1 = timer.tokens.get(first + 1), timer.tokens.get(steps)
            if t0 is not None and t1 is not None and span > 0:
                result["tokens_per_second"] = (t1 - t0) / span
        result.update(
            peak_reserved=metrics.get("peak_memory_bytes") if cuda else None,
            peak_allocated=metrics.get("peak_torch_allocated_bytes"),
            peak_rss=None if cuda else metrics.get("peak_memory_bytes"),
            trainable_params=metrics.get("trainable_params"),
            total_params=metrics.get("total_params"),
            steps=steps,
            loss=metrics.get("train_loss"),
        )
        code = 0
    except torch.OutOfMemoryError as exc:
        result = {"error": "OOM: " + str(exc).splitlines()[0][:120]}
        code = 3
    except Exception as exc:  # noqa: BLE001 - one configuration's failure is one row of the table
        lines = str(exc).strip().splitlines()
        result = {"error": f"{type(exc).__name__}: {lines[0][:160] if lines else ''}"}
        code = 2
    Path(result_path).write_text(json.dumps(result))
    return code


# ---------------------------------------------------------------------- parent
class NvmlPeak:
    """Polls NVML `used` of device 0 in a thread while a child runs (~12 us per call)."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak, self._stop = interval, None, threading.Event()
        self._nvml = self._handle = None  # no NVML (CPU host): the column stays empty
        try:
            import pynvml
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError:
            self._nvml = self._handle = None

    def __enter__(self) -> NvmlPeak:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            self.peak = used if self.peak is None else max(self.peak, used)
            time.sleep(self.interval)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._handle is not None:
            self._thread.join()


def run_one(trick: Trick, spec: JobSpec, work: Path, cuda: bool, warmup: int, timeout: float) -> dict[str, Any]:
    """Run one configuration in its own Python process; its measurements, or its error."""
    result_path = work / f"{trick.name}.json"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_DATASETS_CACHE": str(work / "datasets-cache"),
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    }
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        spec.to_json(),
        str(work / trick.name),
        str(result_path),
        "1" if cuda else "0",
        str(warmup),
    ]
    start = time.perf_counter()
    with NvmlPeak() as nvml, (work / f"{trick.name}.log").open("w") as log:
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if code is None:
        result.setdefault("error", f"timed out after {timeout:.0f} s")
    elif code != 0 and "error" not in result:
        result["error"] = f"child exited with code {code} (see {work / (trick.name + '.log')})"
    result["nvml_peak"] = nvml.peak
    result["wall"] = time.perf_counter() - start
    return result


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / _GIB:.2f} GiB"


def _error(predicted: int | None, context: int, measured: int | None, cuda: bool) -> str:
    """(prediction - measured) / measured: on CUDA against max reserved, with the CUDA context left out."""
    if not predicted or not measured:
        return "-"
    return f"{100 * (predicted - (context if cuda else 0) - measured) / measured:+.0f}%"


def table(rows: list[tuple[Trick, dict[str, Any]]], cuda: bool) -> str:
    """The results as a Markdown table; ratios against the baseline row (memory x, tokens/s x)."""
    mem_key = "peak_reserved" if cuda else "peak_rss"
    base = next((r for t, r in rows if t.name == "baseline" and "error" not in r and "skipped" not in r), {})
    head = [
        "config",
        "what",
        "peak max reserved",
        "peak max allocated",
        "NVML used peak",
        "peak RSS",
        "step time",
        "tokens/s",
        "trainable",
        "memory vs base",
        "tokens/s vs base",
        "predicted",
        "predicted vs measured",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for trick, r in rows:
        if "skipped" in r or "error" in r:
            note = f"skipped: {r['skipped']}" if "skipped" in r else f"FAILED: {r['error']}"
            lines.append(f"| {trick.name} | {trick.what} | {note} |" + " |" * (len(head) - 3))
            continue
        mem, base_mem = r.get(mem_key), base.get(mem_key)
        tps, base_tps = r.get("tokens_per_second"), base.get("tokens_per_second")
        trainable = r.get("trainable_params")
        cells = [
            trick.name,
            trick.what,
            _gib(r.get("peak_reserved")),
            _gib(r.get("peak_allocated")),
            _gib(r.get("nvml_peak")),
            _gib(r.get("peak_rss")),
            f"{r['step_time'] * 1000:.0f} ms" if r.get("step_time") else "-",
            f"{tps:,.0f}" if tps else "-",
            (f"{trainable / 1e6:.1f}M" if trainable >= 1e5 else f"{trainable:,.0f}") if trainable else "-",
            f"{mem / base_mem:.2f}x" if mem and base_mem else "-",
            f"{tps / base_tps:.2f}x" if tps and base_tps else "-",
            _gib(r.get("predicted")),
            _error(r.get("predicted"), r.get("context", 0), mem, cuda),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cuda_present() -> bool:
    """A CUDA device is visible (NVML first, so this process never creates a CUDA context)."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            return pynvml.nvmlDeviceGetCount() > 0
        except pynvml.NVMLError:  # no driver or library: ask torch instead
            pass
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        spec_json, out_dir, result_path, cuda, warmup = argv[1:6]
        return child(spec_json, out_dir, result_path, cuda == "1", int(warmup))
    p = argparse.ArgumentParser(description="Memory and speed of each training trick, one subprocess each.")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny model (hidden 64, 2 layers): a smoke test")
    p.add_argument("--steps", type=int, help="optimizer steps per configuration (default 20; 4 with --tiny)")
    p.add_argument("--seq-len", type=int, help="tokens per row (default 512; 64 with --tiny)")
    p.add_argument("--warmup", type=int, help="steps left out of the timing (default 3; 1 with --tiny)")
    p.add_argument("--only", help="comma-separated configuration names: " + ",".join(t.name for t in TRICKS))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    p.add_argument("--workdir", type=Path, help="keep the model, data, logs here (default: a temp folder)")
    ns = p.parse_args(argv)
    steps = ns.steps or (4 if ns.tiny else 20)
    seq_len = ns.seq_len or (64 if ns.tiny else 512)
    warmup = ns.warmup if ns.warmup is not None else (1 if ns.tiny else 3)
    cuda = ns.device == "cuda"
    if cuda and not cuda_present():
        print("no CUDA device here: run `python bench/tricks_gpu.py --device cpu --tiny` instead", file=sys.stderr)
        return 2
    tricks = TRICKS
    if ns.only:
        names = {n.strip() for n in ns.only.split(",") if n.strip()}
        unknown = names - {t.name for t in TRICKS}
        if unknown:
            p.error(f"unknown configuration(s) {sorted(unknown)}; choose from {[t.name for t in TRICKS]}")
        tricks = [t for t in TRICKS if t.name in names]

    work = ns.workdir or Path(tempfile.mkdtemp(prefix="tunedeck-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = build_model(work / ("model-tiny" if ns.tiny else "model-qwen2-0.5b"), ns.tiny)
    data = build_data(work / "data.jsonl", model_dir, rows=8 * steps + 8, seq_len=seq_len)
    print(
        f"model {model_dir.name} and {8 * steps + 8} rows of {seq_len} tokens ready in "
        f"{time.perf_counter() - t0:.0f} s (in {work})",
        flush=True,
    )
    base = base_spec(model_dir, data, steps, seq_len)

    rows: list[tuple[Trick, dict[str, Any]]] = []
    for trick in tricks:
        spec = base.replace(**trick.changes)
        reason = skip_reason(spec, cuda)
        if reason:
            rows.append((trick, {"skipped": reason}))
            print(f"{trick.name}: skipped ({reason})", flush=True)
            continue
        result = run_one(trick, spec, work, cuda, warmup, ns.timeout)
        try:
            result["predicted"], result["context"] = predicted_bytes(spec, model_dir, cuda)
        except Exception as exc:  # noqa: BLE001 - the measurement stays; the prediction cell says why not
            print(f"{trick.name}: no prediction ({type(exc).__name__}: {exc})", flush=True)
        rows.append((trick, result))
        status = result.get("error") or (
            f"{result.get('step_time', 0) * 1000:.0f} ms/step, {result.get('tokens_per_second') or 0:,.0f} tokens/s"
        )
        print(f"{trick.name}: {status} ({result['wall']:.0f} s)", flush=True)

    device = "CPU" if not cuda else _gpu_name()
    print(
        f"\n{device} · {'tiny' if ns.tiny else 'Qwen2-0.5B-shaped'} model, random weights · seq {seq_len} · "
        f"{steps} steps (timing skips the first {warmup}) · total {time.perf_counter() - t0:.0f} s\n"
    )
    print(table(rows, cuda))
    if not cuda:
        print(
            "\nOn the CPU the torch allocator columns do not apply; peak RSS includes the Python process "
            "(imports, tokenizer, data), so memory ratios understate the tricks' effect; the predicted column has no "
            "runtime baseline here (the worker measures it), so it reads far under the RSS: compare it on a GPU."
        )
    return 0


def _gpu_name() -> str:
    try:
        import pynvml
    except ImportError:
        return "CUDA"
    try:
        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    except pynvml.NVMLError:  # a name only for the report's heading
        return "CUDA"
    return name.decode() if isinstance(name, bytes) else str(name)


if __name__ == "__main__":
    sys.exit(main())
