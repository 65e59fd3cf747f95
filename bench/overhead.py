"""How much does tunedeck's instrumentation cost? The same training with and without it.

    .venv/bin/python bench/overhead.py                      # tiny-llama, 5 pairs
    .venv/bin/python bench/overhead.py --model smollm2-135m-instruct --steps 20 --pairs 3

Both sides run the same code in the same kind of process; only the instrumentation differs:
(a) bare: a child process started exactly as the worker starts its children (same interpreter,
    environment, new session, output to a file) that calls `jobs.train.train_spec(spec, out)`
    with no callbacks: no StoreCallback, no store writes, and a parent that only waits;
(b) tunedeck: `Store.create_run` -> `Worker(store).work(burst=True)` -> child `python -m
    jobs.train`: StoreCallback (metric rows, progress, heartbeats), the parent's 1 Hz memory
    sampler and heartbeats, artifacts.
Model loading, data preparation and the trl/peft configs are the same code on both sides, so a
difference is the instrumentation's. Two figures per side:
- tokens/s over the whole training: non-pad tokens trained (trl's `num_tokens`) / `train_runtime`
  (model loading and saving excluded). Everything counts, the periodic store flushes too, and so
  does anything else the machine did meanwhile.
- the median step time: the time from one optimizer step's end to the next one's, the median
  over all steps (bare: a clock callback that only records `time.perf_counter()` at each step end;
  tunedeck: StoreCallback's own `step_time` rows, logged every step, which measure the same
  interval). The steady cost of a step, callbacks included; a few steps slowed by another process,
  or by a flush, do not move it, so repeats agree more closely.
Pairs alternate the order. Prints every pair, each side's spread across repeats (max/min - 1:
below 5% means the figures are steadier than the effect being measured), and the min / median /
max of each ratio tunedeck/bare (tokens/s ratio; bare/tunedeck for step times), 1.00 meaning no
overhead. A busy machine widens the spread: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}


def bare_child(spec_path: str) -> None:
    """The bare side: tunedeck's own training function with no callbacks; prints one JSON line."""
    from jobs.spec import JobSpec
    from jobs.train import setup_logging, train_spec

    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """Only the time of each step's end: the bare side's step times."""

        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(time.perf_counter())

    setup_logging()
    spec = JobSpec.from_json(Path(spec_path).read_text())
    clock = StepClock()
    result = train_spec(spec, Path(spec_path).parent / "bare-out", [clock])
    m = result.metrics
    steps = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    print("BARE_RESULT " + json.dumps({"num_tokens": m["num_tokens"], "train_runtime": m["train_runtime"],
                                       "steps": m["global_step"], "step_time": statistics.median(steps)}),
          flush=True)


def make_spec(args: argparse.Namespace, data_file: Path) -> Any:
    """The job both sides train: LoRA SFT on the chat sample, no eval, no checkpoints."""
    from jobs.spec import JobSpec

    return JobSpec.from_dict(dict(model=args.model, dataset=str(data_file), method="lora", trainer="sft",
                                  max_steps=args.steps, per_device_train_batch_size=args.batch,
                                  max_length=args.max_length, learning_rate=1e-3, logging_steps=1,
                                  lr_scheduler_type="constant", run_name="overhead-bench"))


def run_bare(spec: Any, work: Path) -> dict[str, float]:
    """Side (a): a child started as `Worker.execute` starts one, running `train_spec` bare."""
    from storage.settings import data_dir

    spec_path = work / "bare-spec.json"
    spec_path.write_text(spec.to_json())
    log_path = work / "bare.log"
    env = dict(os.environ, **OFFLINE_ENV, TUNEDECK_HOME=str(data_dir()), PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as out:
        child = subprocess.Popen([sys.executable, __file__, "--bare-child", str(spec_path)], cwd=ROOT,
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        returncode = child.wait()
    text = log_path.read_text(errors="replace")
    line = next((l for l in text.splitlines() if l.startswith("BARE_RESULT ")), None)
    if returncode != 0 or line is None:
        raise RuntimeError(f"bare run failed ({returncode}):\n{text[-3000:]}")
    result = json.loads(line.split(" ", 1)[1])
    return {"tokens_per_second": result["num_tokens"] / result["train_runtime"], **result}


def run_tunedeck(spec: Any, work: Path, index: int) -> dict[str, float]:
    """Side (b): queue the spec and drain the queue with the real worker."""
    from jobs.worker import Worker
    from storage.models import RunStatus
    from storage.store import Store

    store = Store()
    run_id = store.create_run(spec)
    Worker(store).work(burst=True)
    record = store.get_run(run_id)
    store.dispose()
    if record is None or record.status is not RunStatus.SUCCEEDED:
        raise RuntimeError(f"tunedeck run {run_id} ended {record.status if record else 'missing'}: "
                           f"{record.error_summary if record else ''}\n{record.error_detail if record else ''}")
    m = record.final_metrics
    store = Store()
    steps = [p.value for p in store.metrics(run_id, ["step_time"])]
    store.dispose()
    return {"tokens_per_second": m["num_tokens"] / m["train_runtime"], "num_tokens": m["num_tokens"],
            "train_runtime": m["train_runtime"], "steps": m["global_step"], "step_time": statistics.median(steps)}


def callback_cost(spec: Any, work: Path) -> dict[str, float]:
    """In-process: seconds spent inside StoreCallback's handlers, as a share of train_runtime."""
    from jobs.callbacks import StoreCallback
    from jobs.train import train_spec
    from storage.store import Store

    spent = {"s": 0.0, "calls": 0}

    class TimedCallback(StoreCallback):
        """StoreCallback whose every handler is timed."""

    for name in ("on_train_begin", "on_step_end", "on_log", "on_train_end"):
        def timed(self: Any, *a: Any, _orig: Any = getattr(StoreCallback, name), **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _orig(self, *a, **k)
            finally:
                spent["s"] += time.perf_counter() - t0
                spent["calls"] += 1
        setattr(TimedCallback, name, timed)

    store = Store()
    run_id = store.create_run(spec)
    result = train_spec(spec, work / "timed-out", [TimedCallback(store, run_id)])
    runtime = result.metrics["train_runtime"]
    return {"callback_s": spent["s"], "handler_calls": spent["calls"], "train_runtime": runtime,
            "share": spent["s"] / runtime}


def spread(values: list[float]) -> float:
    """max/min - 1: how far apart repeats of the same side landed."""
    return max(values) / min(values) - 1.0


def main(argv: list[str] | None = None) -> int:
    """Run the pairs and print tokens/s of each side and the median ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--bare-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_child:
        bare_child(args.bare_child)
        return 0

    from storage.settings import models_dir

    work = Path(tempfile.mkdtemp(prefix="tunedeck-overhead-"))
    # A throw-away database and runs folder, sharing the real model cache (SmolLM2 converts once).
    shared_models = models_dir()
    (work / "home").mkdir()
    (work / "home" / "models").symlink_to(shared_models, target_is_directory=True)
    os.environ.update(OFFLINE_ENV, TUNEDECK_HOME=str(work / "home"))
    os.environ.pop("TUNEDECK_DATABASE_URL", None)
    from jobs.data import SAMPLES_DIR
    from jobs.models import resolve_model

    data_file = work / "train.jsonl"  # a local file: no default eval split, so no eval on either side
    shutil.copy(SAMPLES_DIR / "chat-format.train.jsonl", data_file)
    model_path = resolve_model(args.model).path  # converts a built-in once, outside the timed pairs
    spec = make_spec(args, data_file)
    print(f"model {args.model} ({model_path}), {args.steps} steps, batch {args.batch}, max_length "
          f"{args.max_length}, {args.pairs} pairs, work dir {work}", flush=True)
    rows = []
    for i in range(args.pairs):
        order = ["bare", "tunedeck"] if i % 2 == 0 else ["tunedeck", "bare"]
        pair: dict[str, dict[str, float]] = {}
        for side in order:
            t0 = time.perf_counter()
            pair[side] = run_bare(spec, work) if side == "bare" else run_tunedeck(spec, work, i)
            pair[side]["wall_s"] = time.perf_counter() - t0
        ratio = pair["tunedeck"]["tokens_per_second"] / pair["bare"]["tokens_per_second"]
        step_ratio = pair["bare"]["step_time"] / pair["tunedeck"]["step_time"]
        rows.append({"pair": i + 1, "order": order, **{f"{k}_{s}": v for s in pair for k, v in pair[s].items()},
                     "ratio": ratio, "step_ratio": step_ratio})
        print(f"pair {i + 1} ({' then '.join(order)}): bare {pair['bare']['tokens_per_second']:.1f} tok/s "
              f"({pair['bare']['train_runtime']:.1f} s, median step {pair['bare']['step_time'] * 1000:.1f} ms), "
              f"tunedeck {pair['tunedeck']['tokens_per_second']:.1f} tok/s ({pair['tunedeck']['train_runtime']:.1f} s, "
              f"median step {pair['tunedeck']['step_time'] * 1000:.1f} ms), ratio {ratio:.3f}, "
              f"step ratio {step_ratio:.3f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    step_ratios = [r["step_ratio"] for r in rows]
    median = statistics.median(ratios)
    spreads = []
    for side in ("bare", "tunedeck"):
        tps = [r[f"tokens_per_second_{side}"] for r in rows]
        steps = [r[f"step_time_{side}"] * 1000 for r in rows]
        spreads += [spread(tps), spread(steps)]
        print(f"{side}: tokens/s min {min(tps):.1f} / median {statistics.median(tps):.1f} / max {max(tps):.1f}, "
              f"spread {spread(tps) * 100:.1f}%; median step ms min {min(steps):.2f} / median "
              f"{statistics.median(steps):.2f} / max {max(steps):.2f}, spread {spread(steps) * 100:.1f}%", flush=True)
    print(f"ratio tunedeck/bare, tokens/s over the whole training: min {min(ratios):.3f} / median {median:.3f} / "
          f"max {max(ratios):.3f} ({(1 - median) * 100:+.1f}% overhead at the median)")
    print(f"ratio bare/tunedeck, median step time: min {min(step_ratios):.3f} / median "
          f"{statistics.median(step_ratios):.3f} / max {max(step_ratios):.3f}")
    if max(spreads) > 0.05:
        print("note: a side's spread is above 5%: the machine was busy or the runs too short (--steps); "
              "the ratio is less certain than its digits", flush=True)
    cost = callback_cost(spec, work)  # robust to a noisy machine: time inside the callback itself
    print(f"StoreCallback: {cost['callback_s']:.3f} s in {cost['handler_calls']} handler calls over a "
          f"{cost['train_runtime']:.1f} s training = {cost['share'] * 100:.2f}% of training time", flush=True)
    rows.append({"callback_cost": cost})
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "pairs": rows,
                                         "ratio_min": min(ratios), "median_ratio": median,
                                         "ratio_max": max(ratios), "median_step_ratio": statistics.median(step_ratios)},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
