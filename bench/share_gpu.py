"""Several small LoRA jobs sharing one GPU against the same jobs one after another (issue 26).

    python bench/share_gpu.py                          # a CUDA host: 1, 2 and 4 shared vs sequential (~10 min on an H200)
    python bench/share_gpu.py --counts 1,2 --steps 20  # shorter
    python bench/share_gpu.py --plan                   # anywhere: the jobs' predicted peaks and how many fit (no GPU)
    python bench/share_gpu.py --json share.json --workdir /tmp/w
    python bench/share_gpu.py --tiny --allow-cpu --counts 1,2 --steps 2   # a smoke run of this script on the CPU

The jobs are LoRA on Qwen2.5-0.5B's shape (random weights: `bench/tricks_gpu.py`'s model), bf16, rows
truncated to --seq-len, micro-batch --batch, all alike. They go the product's way: a fresh data
directory per pass, a worker that publishes its device, `jobs.checks.pipeline.check` +
`jobs.queue.submit.enqueue` (the prediction is saved with each run, as at submit), then the real
worker (`Worker.work(burst=True)`), each run in its own training process. First a sequential pass
trains max(counts) jobs one after another (`tunedeck worker`); the wall time of N sequential jobs is
from the first one's start to the N-th one's end. Then, for each N, a pass trains N jobs with
`share_device: true` under `tunedeck worker --share N --share-margin MARGIN`.

Reported per N: wall time shared vs sequential (and the speed-up), the summed tokens/s of the runs
(each run's mean, from its metrics) and N jobs' tokens over the wall time, whether the runs overlapped
(their recorded spans), each run's measured peak (torch's max reserved) against its predicted peak and
the share cap it ran under. Only the GPU numbers mean anything; `--allow-cpu` exists to test the script.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
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

GIB = 2**30
H200_TOTAL = 143_771 * 2**20  # --plan without a GPU sizes for an H200 as NVML reports it


def job(model_dir: Path | str, data: Path | str, args: argparse.Namespace, index: int, share: bool) -> Any:
    """One of the alike small LoRA jobs."""
    from jobs.spec.job import JobSpec

    return JobSpec.from_dict(
        dict(
            run_name=f"share-bench-{index}",
            model=str(model_dir),
            dataset=str(data),
            method="lora",
            precision="bf16" if not args.allow_cpu else "auto",
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=1,
            max_length=args.seq_len,
            max_steps=args.steps,
            logging_steps=1,
            learning_rate=2e-4,
            lr_scheduler_type="constant",
            sample_count=0,  # no before/after generation: the comparison is the training
            save_minutes=None,
            share_device=share,
            seed=index,
        )
    )


def model_config(tiny: bool) -> dict[str, Any]:
    from tricks_gpu import QWEN2_05B, TINY

    return dict(
        model_type="qwen2", **(TINY if tiny else QWEN2_05B), tie_word_embeddings=True, max_position_embeddings=4096
    )


def plan(args: argparse.Namespace) -> str:
    """The jobs' predicted peak on this GPU (or an H200 stand-in) and how many fit with the margin."""
    from jobs.devices.facts import DeviceFacts
    from jobs.devices.probe import detect
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict
    from jobs.worker.share import SharePolicy

    here = detect()
    facts = here if here.cuda else DeviceFacts("cuda", "NVIDIA H200 (stand-in)", H200_TOTAL, "9.0", True, True)
    peak = predict(job("model", "data.jsonl", args, 0, True), arch_from_config(model_config(args.tiny)), facts)
    reserve = SharePolicy.parse(max(args.counts), args.margin).reserve(peak.total_bytes)
    return (
        f"plan: LoRA micro-batch {args.batch} x {args.seq_len} tokens, predicted {peak.total_bytes / GIB:.2f} GiB "
        f"(bound), reserving {reserve / GIB:.2f} GiB with margin {args.margin}: {facts.total_bytes // reserve} fit "
        f"on {facts.name} ({facts.total_bytes / GIB:.1f} GiB); counts {args.counts}"
    )


def one_pass(
    work: Path, name: str, model_dir: Path, data: Path, args: argparse.Namespace, count: int, share: int
) -> dict:
    """Submit `count` jobs to a fresh data directory and train them with a worker sharing up to `share` runs."""
    home = Path(tempfile.mkdtemp(prefix=f"share-{name}-", dir=work))
    os.environ["TUNEDECK_HOME"] = str(home)
    os.environ.pop("TUNEDECK_DATABASE_URL", None)
    from jobs.checks.pipeline import check
    from jobs.queue.saved_prediction import load_prediction, predicted_bytes
    from jobs.queue.submit import enqueue
    from jobs.train import figures
    from jobs.worker.loop import Worker
    from jobs.worker.share import SharePolicy, memory_fraction
    from storage.store import Store

    store = Store()
    policy = SharePolicy.parse(share, args.margin)
    worker = Worker(store, poll_interval=0.5, heartbeat_interval=1.0, grace_period=20.0, share=policy)
    worker.publish_device()  # the checks read the worker's device, as when a worker is running
    ids = [enqueue(store, check(job(model_dir, data, args, i, share > 1), store=store)) for i in range(count)]
    started = time.perf_counter()
    worker.work(burst=True)
    wall = time.perf_counter() - started
    total = worker.pool.capacity_bytes if worker.pool is not None else 0
    runs = []
    for run_id in ids:
        run = store.get_run(run_id)
        assert run is not None
        predicted = predicted_bytes(load_prediction(store, run_id))
        tps = figures.run_figures(store, run).tokens_per_second
        reserved = policy.reserve(predicted) if predicted and share > 1 else None
        runs.append(
            {
                "run_id": run_id,
                "status": run.status.value,
                "error": run.error_summary,
                "started_at": run.started_at,
                "finished_at": run.finished_at,
                "tokens_per_second": tps,
                "predicted_bytes": predicted,
                "measured_peak_bytes": run.peak_memory_bytes,
                "peak_source": run.peak_memory_source,
                "cap_fraction": memory_fraction(reserved, total) if reserved and total else None,
                "tokens": args.steps * args.batch * args.seq_len,
            }
        )
    store.dispose()
    return {"name": name, "count": count, "share": share, "wall_s": wall, "runs": runs}


def overlapped(runs: list[dict]) -> bool:
    """Whether every run's span overlapped every other's (all were on the device at one moment)."""
    spans = [(r["started_at"], r["finished_at"]) for r in runs if None not in (r["started_at"], r["finished_at"])]
    return len(spans) == len(runs) and max(s for s, _ in spans) < min(e for _, e in spans)


def summarize(sequential: dict, shared: list[dict]) -> list[dict]:
    """Per N: shared against the first N sequential runs."""
    seq = sorted(sequential["runs"], key=lambda r: r["started_at"] or 0)
    out = []
    for p in shared:
        n = p["count"]
        seq_wall = (seq[n - 1]["finished_at"] or 0) - (seq[0]["started_at"] or 0)
        tps = [r["tokens_per_second"] for r in p["runs"] if r["tokens_per_second"]]
        out.append(
            {
                "count": n,
                "shared_wall_s": round(p["wall_s"], 1),
                "sequential_wall_s": round(seq_wall, 1),
                "speedup": round(seq_wall / p["wall_s"], 2) if p["wall_s"] else None,
                "summed_tokens_per_second": round(sum(tps), 1) if tps else None,
                "tokens_per_wall_second": round(sum(r["tokens"] for r in p["runs"]) / p["wall_s"], 1),
                "sequential_tokens_per_wall_second": round(sum(r["tokens"] for r in seq[:n]) / seq_wall, 1)
                if seq_wall > 0
                else None,
                "overlapped": overlapped(p["runs"]),
                "all_succeeded": all(r["status"] == "succeeded" for r in p["runs"]),
                "peaks": [
                    {
                        k: r[k]
                        for k in ("run_id", "predicted_bytes", "measured_peak_bytes", "peak_source", "cap_fraction")
                    }
                    for r in p["runs"]
                ],
            }
        )
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "N  shared s  sequential s  speed-up  sum tok/s  tok/wall-s (seq)   overlap  ok   peaks measured/predicted GiB"
    ]
    for r in rows:
        peaks = " ".join(
            f"{(p['measured_peak_bytes'] or 0) / GIB:.2f}/{(p['predicted_bytes'] or 0) / GIB:.2f}" for p in r["peaks"]
        )
        lines.append(
            f"{r['count']:<2} {r['shared_wall_s']:>8.1f}  {r['sequential_wall_s']:>12.1f}  {r['speedup'] or 0:>8.2f}  "
            f"{r['summed_tokens_per_second'] or 0:>9.0f}  {r['tokens_per_wall_second']:>7.0f} "
            f"({r['sequential_tokens_per_wall_second'] or 0:>7.0f})  {str(r['overlapped']):<7}  "
            f"{'yes' if r['all_succeeded'] else 'NO':<3}  {peaks}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,4", help="how many jobs share the GPU in each pass (default 1,2,4)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per job")
    parser.add_argument("--batch", type=int, default=4, help="micro-batch per job")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per row (rows are truncated to it)")
    parser.add_argument("--margin", default="10%", help="--share-margin of the sharing worker")
    parser.add_argument("--plan", action="store_true", help="print the predicted peak and how many fit (no GPU needed)")
    parser.add_argument("--tiny", action="store_true", help="the tiny model instead of Qwen2.5-0.5B's shape")
    parser.add_argument(
        "--allow-cpu", action="store_true", help="run without CUDA (tests the script, measures nothing)"
    )
    parser.add_argument("--workdir", type=Path, help="model, data, data directories (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    ns = parser.parse_args(argv)
    ns.counts = sorted({int(x) for x in ns.counts.split(",") if x.strip()})
    if not ns.counts or ns.counts[0] < 1:
        parser.error("--counts: give positive numbers, e.g. 1,2,4")
    if ns.plan:
        print(plan(ns))
        return 0
    from jobs.devices.probe import detect

    if not detect().cuda and not ns.allow_cpu:
        raise SystemExit("no CUDA device here: `--plan` shows the sizing without one (`--allow-cpu` tests the script)")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stdout
    )
    from tricks_gpu import build_data, build_model

    work = ns.workdir or Path(tempfile.mkdtemp(prefix="tunedeck-share-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    model_dir = build_model(work / ("model-tiny" if ns.tiny else "model-qwen2-0.5b"), tiny=ns.tiny)
    data = build_data(work / "share-data.jsonl", model_dir, rows=ns.batch * ns.steps + 8, seq_len=ns.seq_len)
    print(plan(ns), flush=True)
    top = max(ns.counts)
    sequential = one_pass(work, "sequential", model_dir, data, ns, top, share=1)
    print(f"sequential: {top} jobs in {sequential['wall_s']:.0f} s", flush=True)
    shared = []
    for n in ns.counts:
        shared.append(one_pass(work, f"shared-{n}", model_dir, data, ns, n, share=n))
        print(f"shared: {n} jobs in {shared[-1]['wall_s']:.0f} s", flush=True)
    rows = summarize(sequential, shared)
    print(table(rows))
    if ns.json:
        ns.json.write_text(json.dumps({"summary": rows, "sequential": sequential, "shared": shared}, indent=1))
    ok = all(r["all_succeeded"] for r in rows) and all(r["overlapped"] for r in rows if r["count"] > 1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
