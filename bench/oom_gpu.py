"""A real CUDA out-of-memory error, recovered by the worker: jobs/train/oom.py checked on a GPU.

    python bench/oom_gpu.py                        # a CUDA host: submit, train through the worker, report (~1 min)
    python bench/oom_gpu.py --plan                 # anywhere: the micro-batch it would choose, and why (no GPU)
    python bench/oom_gpu.py --json oom.json --timeout 150 --workdir /tmp/w

tests/test_oom.py raises a stand-in `torch.cuda.OutOfMemoryError` from a hook on the CPU; here the
GPU really runs out. The job is LoRA on Qwen2.5-0.5B's shape (random weights: `bench/tricks_gpu.py`'s
model), bf16, rows longer than max_length 1024, with a micro-batch B chosen by tunedeck's own
predictor (`jobs.memory.predict`): the smallest even B whose predicted peak is 1.8x the device's
memory, so B cannot fit (unless the predictor is 1.8x too high) and B/2 (~0.9x) can, or, if the
predictor is low, runs out too and the next rung (gradient checkpointing) fits. It goes the product's way: a fresh data directory,
a worker that publishes its device, `jobs.checks.pipeline.check` + `jobs.queue.submit.enqueue`
(with `ignore_memory_prediction: true`, as the refusal's own fix says), then the real worker
(`Worker.work(burst=True)`), each attempt in its own training process.

Expected (the ladder of jobs/train/oom.py): the first child runs out of memory in step 1, records an
`oom_recovery` event "micro-batch B x 1 -> B/2 x 2" and exits 75; the worker starts a fresh child
that trains the run to its end (or runs out again and gets checkpointing). The last line says
RECOVERED (succeeded after at least one recovery), NO OOM (the predictor over-estimated by more than
1.8x: the run just trained) or NOT RECOVERED (with the run's error). Exit code 0 only for RECOVERED.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from jobs.spec.job import JobSpec  # noqa: E402  (after the sys.path lines, so the script runs from anywhere)

LENGTH = 1024
STEPS = 2
FACTOR = 1.8  # predicted peak at B over the device's memory: B/2 is predicted at FACTOR / 2
GIB = 2**30
# The GPU --plan sizes for when none is here: an H200 as NVML reports it (143,771 MiB).
H200_TOTAL = 143_771 * 2**20


def job(model_dir: Path | str, data: Path | str, batch: int) -> JobSpec:
    """The out-of-memory job at micro-batch `batch`."""
    return JobSpec.from_dict(
        dict(
            run_name=f"oom-check-b{batch}",
            model=str(model_dir),
            dataset=str(data),
            method="lora",
            precision="bf16",
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=1,
            max_length=LENGTH,
            max_steps=STEPS,
            logging_steps=1,
            learning_rate=2e-4,
            lr_scheduler_type="constant",
            on_oom="recover",
            ignore_memory_prediction=True,
            sample_count=0,  # no before/after generation: seconds saved, the check unchanged
            seed=0,
        )
    )


def model_config() -> dict[str, Any]:
    """The model's config as bench/tricks_gpu.py builds it (Qwen2.5-0.5B's shape)."""
    from tricks_gpu import QWEN2_05B

    return dict(model_type="qwen2", **QWEN2_05B, tie_word_embeddings=True, max_position_embeddings=4096)


def choose_batch(arch: Any, facts: Any, factor: float = FACTOR) -> tuple[int, int, int]:
    """The smallest even micro-batch predicted at >= factor x the device's memory: (B, predicted at B, at B/2)."""
    from jobs.memory.predict import predict

    def peak(batch: int) -> int:
        return predict(job("model", "data.jsonl", batch), arch, facts).total_bytes

    goal = factor * facts.total_bytes
    lo, hi = 2, 4  # peak(lo) < goal <= peak(hi) once the doubling stops; even numbers only
    while peak(hi) < goal:
        lo, hi = hi, 2 * hi
        if hi > 4096:
            raise RuntimeError(f"no micro-batch up to 4096 is predicted above {goal / GIB:.0f} GiB")
    while hi - lo > 2:
        mid = (lo + hi) // 4 * 2
        lo, hi = (mid, hi) if peak(mid) < goal else (lo, mid)
    return hi, peak(hi), peak(hi // 2)


def plan(facts: Any) -> dict[str, Any]:
    """What the check would submit on `facts`' device, from the model's config alone."""
    from jobs.memory.parts import arch_from_config

    batch, at_b, at_half = choose_batch(arch_from_config(model_config()), facts)
    return {
        "device": facts.name,
        "device_total": facts.total_bytes,
        "batch": batch,
        "max_length": LENGTH,
        "predicted_at_batch": at_b,
        "predicted_at_half": at_half,
    }


def describe_plan(p: dict[str, Any]) -> str:
    total = p["device_total"]
    return (
        f"plan: micro-batch {p['batch']} x {p['max_length']} tokens, predicted {p['predicted_at_batch'] / GIB:.1f} GiB "
        f"({p['predicted_at_batch'] / total:.2f}x of {total / GIB:.1f} GiB on {p['device']}); after one halving "
        f"{p['batch'] // 2} x 2: {p['predicted_at_half'] / GIB:.1f} GiB ({p['predicted_at_half'] / total:.2f}x)"
    )


def run_check(work: Path, timeout: float) -> dict[str, Any]:
    """Build, submit, train through the worker; what happened."""
    from tricks_gpu import build_data, build_model

    from jobs.devices.probe import detect

    facts = detect()
    if not facts.cuda:
        raise SystemExit("no CUDA device here: `--plan` shows the sizing without one")
    t0 = time.perf_counter()
    model_dir = build_model(work / "model-qwen2-0.5b", tiny=False)
    home = Path(tempfile.mkdtemp(prefix="oom-home-", dir=work))
    os.environ["TUNEDECK_HOME"] = str(home)
    os.environ.pop("TUNEDECK_DATABASE_URL", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)

    from jobs.checks.pipeline import check
    from jobs.memory.parts import arch_from_config
    from jobs.queue.submit import enqueue
    from jobs.worker.loop import Worker
    from storage.store import Store

    arch = arch_from_config(json.loads((model_dir / "config.json").read_text()))
    batch, at_b, at_half = choose_batch(arch, facts)
    sizing = {
        "device": facts.name,
        "device_total": facts.total_bytes,
        "batch": batch,
        "max_length": LENGTH,
        "predicted_at_batch": at_b,
        "predicted_at_half": at_half,
    }
    print(describe_plan(sizing), flush=True)
    data = build_data(work / f"oom-data-{batch}.jsonl", model_dir, rows=batch * STEPS + 8, seq_len=LENGTH)
    spec = job(model_dir, data, batch)
    store = Store()
    worker = Worker(store, poll_interval=0.5, heartbeat_interval=1.0, grace_period=20.0)
    worker.publish_device()  # the check reads the worker's device, as when a worker is running
    run_id = enqueue(store, check(spec, store=store))  # SpecError here names every problem
    print(f"run {run_id} queued ({time.perf_counter() - t0:.0f} s so far); the worker starts", flush=True)
    wall = work_until_done(store, worker, run_id, timeout)
    result = {**sizing, **outcome(store, run_id, spec), "worker_wall_s": round(wall, 1)}
    result["total_wall_s"] = round(time.perf_counter() - t0, 1)
    store.dispose()
    return result


def work_until_done(store: Any, worker: Any, run_id: int, timeout: float) -> float:
    """The worker takes the run; past the timeout the run is cancelled, then the worker stopped. Seconds taken."""
    timers = [
        threading.Timer(timeout, lambda: store.request_cancel(run_id)),
        threading.Timer(timeout + 30, lambda: worker.stop("the check timed out")),
    ]
    for t in timers:
        t.daemon = True
        t.start()
    started = time.perf_counter()
    worker.work(burst=True)
    for t in timers:
        t.cancel()
    return time.perf_counter() - started


def outcome(store: Any, run_id: int, spec: Any) -> dict[str, Any]:
    """What the run did: its status, each recovery, the spec it ended with, its peak, the log's tail, a verdict."""
    from jobs.train import oom
    from storage.models import RunStatus

    run = store.get_run(run_id)
    events = oom.recoveries(store, run_id)
    final = oom.effective_spec(store, run_id, spec)
    log_path = Path(run.log_path) if run.log_path else None
    tail = log_path.read_text(errors="replace").splitlines()[-40:] if log_path and log_path.is_file() else []
    if run.status is RunStatus.SUCCEEDED:
        verdict = "RECOVERED" if events else "NO OOM"
    else:
        verdict = "NOT RECOVERED"
    return {
        "run_id": run_id,
        "status": run.status.value,
        "error_summary": run.error_summary,
        "recoveries": [
            {"message": e["message"], "step": e.get("step"), "change": e["data"].get("change")} for e in events
        ],
        "final_micro_batch": final.per_device_train_batch_size,
        "final_accumulation": final.gradient_accumulation_steps,
        "final_gradient_checkpointing": final.gradient_checkpointing,
        "final_optim": final.optim.value,
        "peak_memory_bytes": run.peak_memory_bytes,
        "peak_memory_source": run.peak_memory_source,
        "current_step": run.current_step,
        "log_tail": tail,
        "verdict": verdict,
    }


def describe(r: dict[str, Any]) -> str:
    """The closing lines: each recovery, then the verdict."""
    lines = [f"recovery: {e['message']}" for e in r["recoveries"]]
    peak = f"{r['peak_memory_bytes'] / GIB:.1f} GiB ({r['peak_memory_source']})" if r.get("peak_memory_bytes") else "-"
    ended = (
        f"micro-batch {r['batch']} -> {r['final_micro_batch']} x {r['final_accumulation']}"
        f"{', checkpointing' if r['final_gradient_checkpointing'] else ''}, optim {r['final_optim']}"
    )
    lines.append(
        f"result: {r['verdict']}: run {r['status']} at step {r['current_step']} after {len(r['recoveries'])} "
        f"recover{'y' if len(r['recoveries']) == 1 else 'ies'}; {ended}; measured peak {peak}; worker "
        f"{r['worker_wall_s']:.0f} s" + (f"; error: {r['error_summary']}" if r.get("error_summary") else "")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", action="store_true", help="print the sizing only (no GPU needed)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for the worker before cancelling")
    parser.add_argument("--workdir", type=Path, help="model, data, data directory (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    ns = parser.parse_args(argv)
    if ns.plan:
        from jobs.devices.facts import DeviceFacts
        from jobs.devices.probe import detect

        here = detect()
        facts = here if here.cuda else DeviceFacts("cuda", "NVIDIA H200 (stand-in)", H200_TOTAL, "9.0", True, True)
        print(describe_plan(plan(facts)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stdout)
    work = ns.workdir or Path(tempfile.mkdtemp(prefix="tunedeck-oom-"))
    work.mkdir(parents=True, exist_ok=True)
    result = run_check(work, ns.timeout)
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=1))
    if result["verdict"] != "RECOVERED":
        print("\n".join(["the training log's end:", *result["log_tail"]]))
    print(describe(result))
    return 0 if result["verdict"] == "RECOVERED" else 1


if __name__ == "__main__":
    sys.exit(main())
