"""The CUDA constants of the memory predictor, measured: the CUDA context and the allocator slack.

    python bench/cuda_constants.py                          # a CUDA host: 3 short runs, ~1 min on an H200
    python bench/cuda_constants.py --only lora --steps 6 --json constants.json
    python bench/cuda_constants.py --workdir /tmp/w         # keep (and reuse) the model folder

`jobs/memory/breakdown.py` adds `CUDA_CONTEXT_BYTES[device] + ALLOCATOR_SLACK x tensor bytes` to
every CUDA prediction; both were guesses. This script measures them on the GPU it runs on, each
configuration in its own process (a fresh CUDA context, as the worker gives every run):

- context: the device memory in use beyond torch's caching allocator, i.e. NVML's `used` minus
  `torch.cuda.memory_reserved()`. Read (a) at idle after CUDA init, (b) after the first cuBLAS
  matmul (its handle and workspace), (c) at every optimizer-step end of a short training run (the
  context grows as kernels load lazily), and (d) at the run's peak (NVML used polled every 20 ms
  by this process, which never touches CUDA, minus max reserved: what docs/memory.md "Overhead"
  names). Each is given two ways: the device's `used` (what tunedeck's sampler records, and what
  the verdict must leave room for: it includes the `used` of an idle GPU before the process,
  the driver's own) and this process's own bytes from NVML's process list, when the driver gives it.
- allocator slack: `max_memory_reserved / max_memory_allocated - 1` over the run, what the caching
  allocator holds above the live tensors at the peak.

The runs train Qwen2.5-0.5B's shape with random weights (`bench/tricks_gpu.py`'s model and data)
through tunedeck's own `jobs.train.training.train_spec`: LoRA (batch 8), a full fine-tune (batch 4)
and QLoRA with gradient checkpointing (batch 8), seq 512, `--steps` steps each. The last lines
suggest the figures for `jobs/memory/breakdown.py`: the largest context seen (device `used`), rounded
up to a MiB, and the largest slack, rounded up to a percent.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

MIB = 2**20
SEQ_LEN = 512
# name: spec fields over bench/tricks_gpu.py's baseline (full fine-tune, bf16, batch 8, AdamW)
CONFIGS: dict[str, dict[str, Any]] = {
    "lora": {"method": "lora", "learning_rate": 2e-4},
    "full": {"per_device_train_batch_size": 4},
    "qlora+ckpt": {"method": "qlora", "learning_rate": 2e-4, "gradient_checkpointing": True},
}


# ---------------------------------------------------------------------- NVML (parent and child)
class Nvml:
    """Device 0's used bytes, and one process's own bytes when the driver lists them."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nv, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)

    def used(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.handle).used)

    def total(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.handle).total)

    def name(self) -> str:
        name = self.nv.nvmlDeviceGetName(self.handle)
        return name.decode() if isinstance(name, bytes) else str(name)

    def process_used(self, pid: int) -> int | None:
        """`pid`'s bytes on the device (None: not listed, or the driver does not say)."""
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except self.nv.NVMLError:  # not supported in this VM / driver: the device figure stands alone
            return None
        for p in procs:
            if p.pid == pid and isinstance(p.usedGpuMemory, int) and p.usedGpuMemory < 2**62:
                return int(p.usedGpuMemory)  # NVML_VALUE_NOT_AVAILABLE is 2**64 - 1
        return None


class Poll:
    """The peak of NVML `used` while a child runs (this process never creates a CUDA context)."""

    def __init__(self, nvml: Nvml, interval: float = 0.02) -> None:
        self.nvml, self.interval, self.peak = nvml, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.nvml.used())
            time.sleep(self.interval)

    def __enter__(self) -> Poll:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


# ---------------------------------------------------------------------- child: one configuration
def reading(nvml: Nvml) -> dict[str, Any]:
    import torch

    return {
        "used": nvml.used(),
        "process": nvml.process_used(os.getpid()),
        "reserved": int(torch.cuda.memory_reserved()),
        "allocated": int(torch.cuda.memory_allocated()),
    }


def child(name: str, model_dir: str, data: str, out_dir: str, steps: int, result_path: str) -> int:
    """Idle and cuBLAS readings, then `steps` optimizer steps of configuration `name`; JSON to result_path."""
    import torch
    from transformers import TrainerCallback
    from tricks_gpu import base_spec

    from jobs.devices.probe import detect_device
    from jobs.train.training import train_spec

    nvml = Nvml()
    result: dict[str, Any] = {"config": name}
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    result["idle"] = reading(nvml)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()  # creates the cuBLAS handle and its workspace
    del a
    result["cublas"] = reading(nvml)

    steps_seen: list[dict[str, Any]] = []

    class Probe(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps_seen.append({"step": state.global_step, **reading(nvml)})

    spec = base_spec(Path(model_dir), Path(data), steps, SEQ_LEN).replace(
        run_name=f"constants-{name}", sample_count=0, **CONFIGS[name]
    )
    try:
        train_spec(spec, out_dir, [Probe()], device=detect_device())
    except torch.OutOfMemoryError as exc:  # one configuration's failure is one row
        result["error"] = "OOM: " + str(exc).splitlines()[0][:160]
    result["steps"] = steps_seen
    result["max_reserved"] = int(torch.cuda.max_memory_reserved())
    result["max_allocated"] = int(torch.cuda.max_memory_allocated())
    Path(result_path).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------- parent
def context_of(r: dict[str, Any]) -> tuple[int, int | None]:
    """(device used - reserved, this process's bytes - reserved) of one reading."""
    proc = r.get("process")
    return r["used"] - r["reserved"], (proc - r["reserved"]) if proc is not None else None


def summarize(results: list[dict[str, Any]], device_name: str) -> dict[str, Any]:
    """Per-configuration figures and the suggested constants, from the children's results (pure)."""
    rows = []
    for r in results:
        if "idle" not in r:
            rows.append({"config": r["config"], "error": r.get("error", "no result")})
            continue
        row: dict[str, Any] = {"config": r["config"], "base_used": r["base_used"], "error": r.get("error")}
        for phase in ("idle", "cublas"):
            row[f"context_{phase}"], row[f"process_context_{phase}"] = context_of(r[phase])
        train = [context_of(s) for s in r["steps"]]
        if train:
            row["context_train_max"] = max(c for c, _ in train)
            row["context_train_median"] = int(statistics.median(c for c, _ in train))
            procs = [p for _, p in train if p is not None]
            row["process_context_train_max"] = max(procs) if procs else None
        if r.get("nvml_peak"):
            row["context_at_peak"] = r["nvml_peak"] - r["max_reserved"]
        if r.get("max_allocated"):
            row["max_reserved"], row["max_allocated"] = r["max_reserved"], r["max_allocated"]
            row["slack"] = r["max_reserved"] / r["max_allocated"] - 1
        rows.append(row)
    good = [row for row in rows if "slack" in row]
    contexts = [
        row[k] for row in good for k in ("context_cublas", "context_train_max", "context_at_peak") if row.get(k)
    ]
    key = next((k for k in ("H200", "H100", "A100", "L40S", "A10G", "L4", "V100") if k in device_name), device_name)
    suggested: dict[str, Any] = {"device": device_name, "key": key}
    if contexts:
        suggested["cuda_context_bytes"] = math.ceil(max(contexts) / MIB) * MIB
    if good:
        suggested["allocator_slack"] = math.ceil(round(100 * max(row["slack"] for row in good), 6)) / 100
    return {"rows": rows, "suggested": suggested}


def _mib(x: int | None) -> str:
    return "-" if x is None else f"{x / MIB:,.0f}"


def table(summary: dict[str, Any]) -> str:
    """The figures as Markdown, then the suggested constants."""
    head = (
        "| config | idle GPU used (before) | context at idle | after cuBLAS | in training (max / median) "
        "| at the NVML peak | own process (idle / training) | max reserved | max allocated | slack |"
    )
    lines = ["MiB; context = NVML used - torch reserved", "", head, "|" + "---|" * 10]
    for r in summary["rows"]:
        if "slack" not in r:
            lines.append(f"| {r['config']} | FAILED: {r.get('error')} |" + " |" * 8)
            continue
        lines.append(
            f"| {r['config']}{' (' + r['error'] + ')' if r.get('error') else ''} | {_mib(r['base_used'])} "
            f"| {_mib(r['context_idle'])} | {_mib(r['context_cublas'])} "
            f"| {_mib(r.get('context_train_max'))} / {_mib(r.get('context_train_median'))} "
            f"| {_mib(r.get('context_at_peak'))} "
            f"| {_mib(r['process_context_idle'])} / {_mib(r.get('process_context_train_max'))} "
            f"| {_mib(r['max_reserved'])} | {_mib(r['max_allocated'])} | {100 * r['slack']:.1f}% |"
        )
    s = summary["suggested"]
    lines.append("")
    if "cuda_context_bytes" in s:
        lines.append(
            f"suggested: CUDA_CONTEXT_BYTES[{s['key']!r}] = {s['cuda_context_bytes'] // MIB} * 1024**2  "
            f"# measured on {s['device']}: the largest NVML used - torch reserved"
        )
    if "allocator_slack" in s:
        lines.append(
            f"suggested: ALLOCATOR_SLACK = {s['allocator_slack']:.2f}  # the largest max reserved / max allocated - 1"
        )
    if "cuda_context_bytes" not in s and "allocator_slack" not in s:
        lines.append("suggested: nothing (no configuration finished)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        name, model_dir, data, out_dir, steps, result = argv[1:7]
        return child(name, model_dir, data, out_dir, int(steps), result)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated configurations: " + ",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per configuration (default 4)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per configuration")
    parser.add_argument("--workdir", type=Path, help="the model, data and logs (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the readings and the summary here")
    ns = parser.parse_args(argv)
    names = [n.strip() for n in (ns.only or ",".join(CONFIGS)).split(",") if n.strip()]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configuration(s) {sorted(unknown)}; choose from {list(CONFIGS)}")
    try:
        nvml = Nvml()
    except Exception as exc:  # noqa: BLE001 - no NVML means no GPU to measure: say so and stop
        print(f"no NVIDIA GPU here (NVML: {type(exc).__name__}: {exc}); run this on a CUDA host", file=sys.stderr)
        return 2
    from tricks_gpu import build_data, build_model

    work = ns.workdir or Path(tempfile.mkdtemp(prefix="tunedeck-constants-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = build_model(work / "model-qwen2-0.5b", tiny=False)
    data = build_data(work / "constants-data.jsonl", model_dir, rows=8 * ns.steps + 8, seq_len=SEQ_LEN)
    print(f"model and data ready in {time.perf_counter() - t0:.0f} s ({work})", flush=True)
    results = []
    for name in names:
        result_path = work / f"constants-{name}.json"
        result_path.unlink(missing_ok=True)
        base_used = nvml.used()  # nothing of ours on the GPU between children
        cmd = [sys.executable, __file__, "--child", name, str(model_dir), str(data), str(work / f"constants-{name}")]
        start = time.perf_counter()
        with Poll(nvml) as poll, (work / f"constants-{name}.log").open("w") as log:
            try:
                code = subprocess.run(
                    [*cmd, str(ns.steps), str(result_path)], stdout=log, stderr=subprocess.STDOUT, timeout=ns.timeout
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
        result = json.loads(result_path.read_text()) if result_path.is_file() else {"config": name}
        if code != 0:
            result.setdefault("error", f"timed out after {ns.timeout:.0f} s" if code is None else f"exit code {code}")
        result.update(base_used=base_used, nvml_peak=poll.peak)
        results.append(result)
        print(f"{name}: {result.get('error') or 'ok'} ({time.perf_counter() - start:.0f} s)", flush=True)
    summary = summarize(results, nvml.name())
    summary["device_total"] = nvml.total()
    print()
    print(table(summary))
    if ns.json:
        ns.json.write_text(json.dumps({"results": results, **summary}, indent=1))
    return 0 if all(not r.get("error") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
