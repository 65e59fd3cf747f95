"""How much does tunedeck's instrumentation cost? The same training with and without it.

    .venv/bin/python bench/overhead.py                      # tiny-llama, 600 steps, 10 pairs (~5 min)
    .venv/bin/python bench/overhead.py --sides bare,bare    # the method's own bias: expect 1.00
    .venv/bin/python bench/overhead.py --model smollm2-135m-instruct --steps 20 --pairs 3
    .venv/bin/python bench/overhead.py --sides bare,bare-malloc --steps 200 --pairs 4   # the CPU allocator's cost

Both sides run the same code in the same kind of process; only the instrumentation differs:
(a) bare: a child process started as the worker starts its children (same interpreter,
    environment, new session, output to a file) that calls `jobs.train.training.train_spec(spec, out)`
    with a clock callback only: no StoreCallback, no store writes, and a parent that only waits;
(b) tunedeck: the run is queued with `Store.create_run`, then `tunedeck worker --burst` (a
    process of its own, as a user starts it) trains it in its child `python -m jobs.train.child`:
    StoreCallback (metric rows, progress), the worker's memory sampler, heartbeats and cancel
    polling, artifacts. On a CPU the worker starts its child with `CPU_ALLOCATOR_ENV`
    (`jobs/worker/processes.py`) only when the spec asks (`cpu_return_freed_memory`, off by default), so
    with the default spec both sides run glibc's own allocator;
(c) bare-malloc: the bare side with `CPU_ALLOCATOR_ENV` added to its environment, nothing else
    changed. `--sides bare,bare-malloc` is the threshold's own cost in speed, and its saving in
    peak RSS; `--sides bare-malloc,tunedeck` compares a threshold-less worker run with a threshold bare side.
Model loading, data preparation and the trl/peft configs are the same code on both sides, so a
difference is the instrumentation's. Two figures per side:
- tokens/s over the whole training: non-pad tokens trained (trl's `num_tokens`) / `train_runtime`
  (model loading and saving excluded). Everything counts: the periodic store flushes, the
  worker's wake-ups, and anything else the machine did meanwhile.
- the median step time, from one optimizer step's end to the next (bare: the clock callback;
  tunedeck: StoreCallback's own `step_time` rows, logged every step). The steady cost of a step;
  a few steps slowed by a flush or another process do not move it.
The bare sides also report their training process's peak RSS (`ru_maxrss`: the exact high-water
mark of that one process, model loading included); the tunedeck side's memory is a sampled curve
of a process tree, not the same measure, so no peak RSS is printed for it.

Two ways to pair the sides (`--mode`):
- concurrent (the default on a CPU-only machine with 2+ cores): both sides train at the same
  time, each pinned to its own half of the cores (sched_setaffinity, inherited by every process
  of the side, the tunedeck worker included) with the same thread count (OMP_NUM_THREADS = cores
  per side). The machine's speed drifts by tens of percent over minutes on a shared host; run
  side by side, both sides meet the same drift, so their ratio holds still. The halves swap
  every pair and the side started first alternates every two pairs. The tunedeck worker shares
  its side's cores with its training child, so every wake-up of the worker is paid in training time.
- sequential (a GPU, or one core): one side after the other, alternating the order, all cores.
Prints every pair, each side's spread across repeats (max/min - 1), the spread of the pair
ratios, and min / median / max of each ratio tunedeck/bare (tokens/s; bare/tunedeck for step
times), 1.00 meaning no overhead; with two bare sides also the peak RSS ratio (below 1.00: less). `--sides bare,bare` runs the method against itself: its
median shows the bias of the pairing, its spread the noise left in a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    from transformers import TrainerCallback

    from jobs.spec.job import JobSpec
    from jobs.train.child import setup_logging
    from jobs.train.training import train_spec

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
    print(
        "BARE_RESULT "
        + json.dumps(
            {
                "num_tokens": m["num_tokens"],
                "train_runtime": m["train_runtime"],
                "steps": m["global_step"],
                "step_time": statistics.median(steps),
                # KiB on Linux: the process's own high-water mark, exact where a sampler could miss it
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        ),
        flush=True,
    )


def make_spec(args: argparse.Namespace, data_file: Path) -> Any:
    """The job both sides train: LoRA SFT on the chat sample, no eval, no checkpoints, no samples."""
    from jobs.spec.job import JobSpec

    return JobSpec.from_dict(
        dict(
            model=args.model,
            dataset=str(data_file),
            method="lora",
            trainer="sft",
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            max_length=args.max_length,
            learning_rate=1e-3,
            logging_steps=1,
            lr_scheduler_type="constant",
            run_name="overhead-bench",
            sample_count=0,
        )
    )


def pinned(cores: set[int] | None) -> Any:
    """A preexec_fn that pins the new process (and so all it starts) to `cores`."""
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)


def side_env(threads: int | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a side's processes: the same for every side apart from `extra`."""
    from jobs.worker.processes import CPU_ALLOCATOR_ENV
    from storage.settings import data_dir

    env = dict(os.environ, **OFFLINE_ENV, TUNEDECK_HOME=str(data_dir()), PYTHONUNBUFFERED="1")
    for name in CPU_ALLOCATOR_ENV:  # glibc's defaults unless a side asks: a user's setting would blur bare-malloc
        env.pop(name, None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra or {})
    return env


class Bare:
    """Side (a): a child started as `Worker.execute` starts one, running `train_spec` bare."""

    name = "bare"
    extra_env: dict[str, str] = {}

    def __init__(self, spec: Any, work: Path, tag: str, cores: set[int] | None, threads: int | None) -> None:
        self.folder = work / f"bare-{tag}"
        self.folder.mkdir()
        spec_path = self.folder / "spec.json"
        spec_path.write_text(spec.to_json())
        self.log_path = self.folder / "bare.log"
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "--bare-child", str(spec_path)],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=side_env(threads, self.extra_env),
                start_new_session=True,
                preexec_fn=pinned(cores),
            )

    def result(self) -> dict[str, float]:
        returncode = self.process.wait()
        text = self.log_path.read_text(errors="replace")
        line = next((ln for ln in text.splitlines() if ln.startswith("BARE_RESULT ")), None)
        if returncode != 0 or line is None:
            raise RuntimeError(f"bare run failed ({returncode}):\n{text[-3000:]}")
        r = json.loads(line.split(" ", 1)[1])
        shutil.rmtree(self.folder / "bare-out", ignore_errors=True)
        return {"tokens_per_second": r["num_tokens"] / r["train_runtime"], **r}


class BareMalloc(Bare):
    """Side (c): the bare side with the CPU worker's allocator setting in its environment."""

    name = "bare-malloc"

    def __init__(self, spec: Any, work: Path, tag: str, cores: set[int] | None, threads: int | None) -> None:
        from jobs.worker.processes import CPU_ALLOCATOR_ENV

        self.extra_env = dict(CPU_ALLOCATOR_ENV)
        super().__init__(spec, work, f"malloc-{tag}", cores, threads)


class Tunedeck:
    """Side (b): queue the spec; `tunedeck worker --burst`, a process of its own, trains it."""

    name = "tunedeck"

    def __init__(self, spec: Any, work: Path, tag: str, cores: set[int] | None, threads: int | None) -> None:
        from storage.store import Store

        store = Store()
        self.run_id = store.create_run(spec)
        store.dispose()
        self.log_path = work / f"worker-{tag}.log"
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.cli.main", "worker", "--burst"],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=side_env(threads),
                start_new_session=True,
                preexec_fn=pinned(cores),
            )

    def result(self) -> dict[str, float]:
        from storage.models import RunStatus
        from storage.store import Store

        returncode = self.process.wait()
        store = Store()
        try:
            record = store.get_run(self.run_id)
            if returncode != 0 or record is None or record.status is not RunStatus.SUCCEEDED:
                raise RuntimeError(
                    f"tunedeck run {self.run_id} ended "
                    f"{record.status if record else 'missing'} (worker exit {returncode}): "
                    f"{record.error_summary if record else ''}\n"
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            m = record.final_metrics
            steps = [p.value for p in store.metrics(self.run_id, ["step_time"])]
        finally:
            store.dispose()
        return {
            "tokens_per_second": m["num_tokens"] / m["train_runtime"],
            "num_tokens": m["num_tokens"],
            "train_runtime": m["train_runtime"],
            "steps": m["global_step"],
            "step_time": statistics.median(steps),
        }


SIDES = {"bare": Bare, "bare-malloc": BareMalloc, "tunedeck": Tunedeck}


def callback_cost(spec: Any, work: Path) -> dict[str, float]:
    """In-process: seconds spent inside StoreCallback's handlers, as a share of train_runtime."""
    from jobs.train.callbacks import StoreCallback
    from jobs.train.training import train_spec
    from storage.store import Store

    spent = {"s": 0.0, "calls": 0}

    class TimedCallback(StoreCallback):
        """StoreCallback whose every handler is timed."""

    for name in ("on_train_begin", "on_step_end", "on_log", "on_train_end"):
        # the default binds this loop turn's handler (B008 is what we want here)
        def timed(self: Any, *a: Any, _orig: Any = getattr(StoreCallback, name), **k: Any) -> Any:  # noqa: B008
            t0 = time.perf_counter()
            try:
                return _orig(self, *a, **k)
            finally:
                spent["s"] += time.perf_counter() - t0
                spent["calls"] += 1

        setattr(TimedCallback, name, timed)

    store = Store()
    run_id = store.create_run(spec)
    result = train_spec(spec, work / "timed-out", [TimedCallback(store, run_id, cancel_interval=None)])
    runtime = result.metrics["train_runtime"]
    return {
        "callback_s": spent["s"],
        "handler_calls": spent["calls"],
        "train_runtime": runtime,
        "share": spent["s"] / runtime,
    }


def spread(values: list[float]) -> float:
    """max/min - 1: how far apart repeats of the same side landed."""
    return max(values) / min(values) - 1.0


def default_mode() -> str:
    """Concurrent on a CPU-only machine with two cores or more; sequential otherwise."""
    import torch

    if torch.cuda.is_available() or len(os.sched_getaffinity(0)) < 2:
        return "sequential"
    return "concurrent"


def run_pair(i: int, sides: list[str], spec: Any, work: Path, mode: str) -> list[dict[str, float]]:
    """One pair: both sides at once on their own core halves (concurrent), or one after the other."""
    results: list[dict[str, float]] = [{}, {}]
    if mode == "concurrent":
        cores = sorted(os.sched_getaffinity(0))
        halves = [set(cores[: len(cores) // 2]), set(cores[len(cores) // 2 :])]
        if i % 2:
            halves.reverse()
        order = [0, 1] if (i // 2) % 2 == 0 else [1, 0]
        threads = len(halves[0])
        started: dict[int, Any] = {}
        for k in order:
            started[k] = SIDES[sides[k]](spec, work, f"{i}-{k}", halves[k], threads)
        for k in order:
            t0 = time.perf_counter()
            results[k] = started[k].result()
            results[k]["cores"] = ",".join(map(str, sorted(halves[k])))  # type: ignore[assignment]
            results[k]["wall_s"] = time.perf_counter() - t0
        return results
    order = [0, 1] if i % 2 == 0 else [1, 0]
    for k in order:
        t0 = time.perf_counter()
        results[k] = SIDES[sides[k]](spec, work, f"{i}-{k}", None, None).result()
        results[k]["wall_s"] = time.perf_counter() - t0
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; a wrong --sides is an argparse error naming the choices."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--mode", choices=["concurrent", "sequential"], help="default: concurrent on CPU")
    parser.add_argument(
        "--sides",
        default="bare,tunedeck",
        help="the two sides of each pair: bare,tunedeck (default); bare,bare checks the method; "
        "bare,bare-malloc measures the CPU allocator setting",
    )
    parser.add_argument("--no-callback-cost", action="store_true", help="skip the in-process callback timing")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--bare-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sides = args.sides.split(",")
    if not args.bare_child and (len(sides) != 2 or any(s not in SIDES for s in sides)):
        parser.error(f"--sides: two of {', '.join(SIDES)}, comma-separated (got {args.sides!r})")
    return args


def prepare(args: argparse.Namespace) -> tuple[Path, Any, str]:
    """A throw-away database and runs folder sharing the real model cache; the spec; the model's path."""
    from storage.settings import models_dir

    work = Path(tempfile.mkdtemp(prefix="tunedeck-overhead-"))
    shared_models = models_dir()  # SmolLM2 converts once, outside the timed pairs
    (work / "home").mkdir()
    (work / "home" / "models").symlink_to(shared_models, target_is_directory=True)
    os.environ.update(OFFLINE_ENV, TUNEDECK_HOME=str(work / "home"))
    os.environ.pop("TUNEDECK_DATABASE_URL", None)
    from jobs.data.sources import SAMPLES_DIR
    from jobs.models.references import resolve_model

    data_file = work / "train.jsonl"  # a local file: no default eval split, so no eval on either side
    shutil.copy(SAMPLES_DIR / "chat-format.train.jsonl", data_file)
    model_path = resolve_model(args.model).path
    return work, make_spec(args, data_file), str(model_path)


def pair_row(i: int, labels: list[str], a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    """One pair's figures under each side's label, and its ratios."""
    rss_ratio = b["peak_rss"] / a["peak_rss"] if "peak_rss" in a and "peak_rss" in b else None
    return {
        "pair": i + 1,
        **{f"{k}_{lab}": v for lab, r in zip(labels, (a, b)) for k, v in r.items()},
        "ratio": b["tokens_per_second"] / a["tokens_per_second"],
        "step_ratio": a["step_time"] / b["step_time"],
        **({"rss_ratio": rss_ratio} if rss_ratio is not None else {}),
    }


def describe_pair(row: dict[str, Any], labels: list[str], sides: tuple[dict[str, float], ...]) -> str:
    """The line printed after each pair."""
    where = [f" (cores {r['cores']})" if "cores" in r else "" for r in sides]
    rss_ratio = row.get("rss_ratio")
    return (
        f"pair {row['pair']}: "
        + ", ".join(
            f"{lab}{w} {r['tokens_per_second']:.1f} tok/s ({r['train_runtime']:.1f} s, median step "
            f"{r['step_time'] * 1000:.1f} ms"
            + (f", peak RSS {r['peak_rss'] / 2**20:.0f} MiB" if "peak_rss" in r else "")
            + ")"
            for lab, w, r in zip(labels, where, sides)
        )
        + f"; ratio {row['ratio']:.3f}, step ratio {row['step_ratio']:.3f}"
        + (f", peak RSS ratio {rss_ratio:.3f}" if rss_ratio is not None else "")
    )


def print_sides(rows: list[dict[str, Any]], labels: list[str]) -> float:
    """Each side's min / median / max over the pairs; returns the largest spread."""
    spreads = []
    for lab in labels:
        tps = [r[f"tokens_per_second_{lab}"] for r in rows]
        steps = [r[f"step_time_{lab}"] * 1000 for r in rows]
        spreads += [spread(tps), spread(steps)]
        rss = [r[f"peak_rss_{lab}"] / 2**20 for r in rows if f"peak_rss_{lab}" in r]
        print(
            f"{lab}: tokens/s min {min(tps):.1f} / median {statistics.median(tps):.1f} / max {max(tps):.1f}, "
            f"spread {spread(tps) * 100:.1f}%; median step ms min {min(steps):.2f} / median "
            f"{statistics.median(steps):.2f} / max {max(steps):.2f}, spread {spread(steps) * 100:.1f}%"
            + (
                f"; peak RSS MiB min {min(rss):.0f} / median {statistics.median(rss):.0f} / max {max(rss):.0f}"
                if rss
                else ""
            ),
            flush=True,
        )
    return max(spreads)


def print_ratios(rows: list[dict[str, Any]], labels: list[str]) -> dict[str, float]:
    """The ratios' min / median / max over the pairs; returns their summary figures."""
    ratios = [r["ratio"] for r in rows]
    step_ratios = [r["step_ratio"] for r in rows]
    rss_ratios = [r["rss_ratio"] for r in rows if "rss_ratio" in r]
    median = statistics.median(ratios)
    what = f"{labels[1]}/{labels[0]}"
    print(
        f"ratio {what}, tokens/s over the whole training: min {min(ratios):.3f} / median {median:.3f} / "
        f"max {max(ratios):.3f}, spread {spread(ratios) * 100:.1f}% ({(1 - median) * 100:+.1f}% overhead at the median)"
    )
    print(
        f"ratio {what}, median step time: min {min(step_ratios):.3f} / median "
        f"{statistics.median(step_ratios):.3f} / max {max(step_ratios):.3f}, spread {spread(step_ratios) * 100:.1f}%"
    )
    if rss_ratios:
        print(
            f"ratio {what}, peak RSS: min {min(rss_ratios):.3f} / median {statistics.median(rss_ratios):.3f} / "
            f"max {max(rss_ratios):.3f}, spread {spread(rss_ratios) * 100:.1f}%"
        )
    return {
        "ratio_min": min(ratios),
        "median_ratio": median,
        "ratio_max": max(ratios),
        "median_step_ratio": statistics.median(step_ratios),
        **({"median_rss_ratio": statistics.median(rss_ratios)} if rss_ratios else {}),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the pairs and print each side's figures and the ratios' min / median / max."""
    args = parse_args(argv)
    if args.bare_child:
        bare_child(args.bare_child)
        return 0
    sides = args.sides.split(",")
    mode = args.mode or default_mode()
    work, spec, model_path = prepare(args)
    labels = [f"{s}#{k + 1}" if sides[0] == sides[1] else s for k, s in enumerate(sides)]
    print(
        f"model {args.model} ({model_path}), {args.steps} steps, batch {args.batch}, max_length "
        f"{args.max_length}, {args.pairs} pairs, mode {mode}, sides {' vs '.join(labels)}, work dir {work}",
        flush=True,
    )
    rows = []
    for i in range(args.pairs):
        a, b = run_pair(i, sides, spec, work, mode)
        rows.append(pair_row(i, labels, a, b))
        print(describe_pair(rows[-1], labels, (a, b)), flush=True)
    widest = print_sides(rows, labels)
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "mode": mode, "pairs": rows}
    summary |= print_ratios(rows, labels)
    if widest > 0.05:
        print(
            "note: a side's spread is above 5%: the machine's speed changed between repeats"
            + (
                " (each pair's sides met the same speed: see the ratios' spread)"
                if mode == "concurrent"
                else "; the ratio is less certain than its digits"
            ),
            flush=True,
        )
    if not args.no_callback_cost:
        cost = callback_cost(spec, work)  # robust to a noisy machine: time inside the callback itself
        print(
            f"StoreCallback: {cost['callback_s']:.3f} s in {cost['handler_calls']} handler calls over a "
            f"{cost['train_runtime']:.1f} s training = {cost['share'] * 100:.2f}% of training time",
            flush=True,
        )
        summary["callback_cost"] = cost
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
