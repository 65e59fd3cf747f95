"""GRPO's steps/s through tunedeck's worker path against bare trl GRPOTrainer, side by side (issue 45: >= 0.97x).

    .venv/bin/python bench/grpo_speed.py                          # the tiny Llama, 20 steps each side
    .venv/bin/python bench/grpo_speed.py --model smollm2-135m-instruct --steps 30

Both sides train the same spec (LoRA, `sample:prompt-format`, one declared regex reward, num_generations 4,
max_completion_length 32) on this machine's CPU (or its GPU), in a temporary data folder (removed afterwards).
(a) tunedeck: the spec queued in a store and trained by a burst worker (`jobs.worker.loop.Worker`: its child
process, the store callback, the doctor, the completions keeper); steps/s = global_step / train_runtime as the
run recorded it (the trainer's own clock: model loading and process start-up are outside it on both sides).
(b) bare trl: `GRPOTrainer` built in a fresh Python process (as the worker's child is: neither side inherits a warm
process) from the same GRPOConfig keyword arguments (`jobs.config.mapping`), model, LoRA config, data and reward
callable, no callbacks; steps/s from its own train_runtime. Prints both and the ratio a/b, for each of `--rounds`
pairs run in alternating order, and the median ratio. The machine's load is printed too: the figure is only as
good as the idle cores it had. `--threads N` sets OMP_NUM_THREADS for both sides' processes (on a machine whose
cores other jobs share, one thread a side keeps OpenMP's spinning barriers out of the comparison). Last, the
worker child's path runs once more in this process under cProfile: the seconds its callbacks take, a share of the
trainer's own time that load does not skew.

Measured 2026-12-05 on the busy 2-core CPU (load 3.3-3.6), the tiny Llama, `--rounds 5 --threads 1 --steps 40`:
ratios 1.047, 0.993, 0.951, 0.989, 1.040, **median 0.993**; the callbacks took 0.035 s of the trainer's 5.78 s
(0.60%), a bound of 0.994. SmolLM2-135M (`--steps 10 --rounds 2`, load 3-6.6): 1.218 and 0.862, the load's noise.
Without `--threads 1` and with the bare side in this (warm) process, load 5-6 gave 0.34-0.69: both are why
those two settings exist.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REWARD = '[{kind: regex, pattern: "^.{0,40}$", mode: match, name: short}]'


def make_spec(model: str, steps: int):  # -> JobSpec
    from jobs.spec.job import JobSpec

    return JobSpec.from_dict(
        {
            "model": model,
            "trainer": "grpo",
            "dataset": "sample:prompt-format",
            "method": "lora",
            "rewards": REWARD,
            "num_generations": 4,
            "max_completion_length": 32,
            "per_device_train_batch_size": 4,
            "max_steps": steps,
            "logging_steps": 1,
            "learning_rate": 1e-4,
            "eval_split": None,
            "beta": 0.0,
        }
    )


def worker_side(spec) -> float:
    from jobs.worker.loop import Worker
    from storage.store import Store

    store = Store()
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.2, sample=False).work(burst=True)
    run = store.get_run(run_id)
    assert run is not None and run.status.value == "succeeded", run and run.error_summary
    return float(run.final_metrics["global_step"]) / float(run.final_metrics["train_runtime"])


def bare_side(spec, out: Path) -> float:
    from trl import GRPOConfig, GRPOTrainer

    from jobs.config.mapping import peft_config, training_kwargs
    from jobs.config.trainers import drop_unsupported, trainer_kwargs
    from jobs.data.loading import load_datasets
    from jobs.devices.facts import CPU
    from jobs.train.trainers import reward_sources
    from jobs.train.training import load_model

    model, tokenizer = load_model(spec, CPU)
    train, _ = load_datasets(spec)
    kw = drop_unsupported(spec, {**training_kwargs(spec, CPU, str(out)), **trainer_kwargs(spec)})
    kw["report_to"] = []
    funcs, classes = reward_sources(spec)
    trainer = GRPOTrainer(
        model=model,
        args=GRPOConfig(**kw),
        train_dataset=train,
        processing_class=tokenizer,
        reward_funcs=funcs,
        reward_processing_classes=classes,
        peft_config=peft_config(spec),
    )
    result = trainer.train()
    return result.global_step / result.metrics["train_runtime"]


def callback_seconds(spec) -> tuple[float, float]:
    """(seconds in the callbacks the worker's child adds, seconds in `trainer.train()`): the child's path run in this
    process under cProfile (`jobs.train.child.run`). Every callback's event is called by transformers'
    `CallbackHandler.call_event`; the time of those calls into tunedeck's modules is what the worker adds to the
    trainer's loop (the reward callable is the same on both sides). A share of the same run's own time, so load
    slows both parts alike."""
    import cProfile
    import pstats

    import transformers

    from jobs.train import child
    from storage.store import Store

    store = Store()
    run_id = store.create_run(spec)
    store.claim_next_on_device("bench", "0")
    profile, train = cProfile.Profile(), transformers.Trainer.train

    def profiled(self, *args, **kwargs):
        profile.enable()
        try:
            return train(self, *args, **kwargs)
        finally:
            profile.disable()

    transformers.Trainer.train = profiled  # type: ignore[method-assign]
    try:
        child.run(run_id, store)
    finally:
        transformers.Trainer.train = train  # type: ignore[method-assign]
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    ours = 0.0
    for (path, _, _), (_, _, _, cumulative, callers) in stats.items():
        from_handler = any(c[0].endswith("trainer_callback.py") and c[2] == "call_event" for c in callers)
        if from_handler and path.startswith(str(ROOT / "jobs")):
            ours += cumulative
    total = max(v[3] for (path, _, name), v in stats.items() if name == "train" and path.endswith("trainer.py"))
    return ours, total


def bare_in_fresh_process(spec, out: Path) -> float:
    """`bare_side` in a fresh interpreter (this script with --bare-only): its steps/s."""
    cmd = [sys.executable, __file__, "--bare-only", spec.model, "--steps", str(spec.max_steps), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("steps/s ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the bare side failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return float(lines[-1].split()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model (default: the tiny Llama, built offline)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="pairs of runs, in alternating order (the median counts)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for both sides (default: unset)")
    p.add_argument("--bare-only", default=None, metavar="MODEL", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_only:  # the bare side's own process
        print(f"steps/s {bare_side(make_spec(args.bare_only, args.steps), Path(args.out)):.6f}")
        return
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory(prefix="grpo-speed-") as tmp:
        os.environ["TUNEDECK_HOME"] = str(Path(tmp) / "home")
        model = args.model
        if model is None:
            from jobs.models.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny-llama"))
        spec = make_spec(model, args.steps)
        threads = os.environ.get("OMP_NUM_THREADS", "unset")
        print(f"{args.steps} steps a run, model {model}, {os.cpu_count()} cores, OMP_NUM_THREADS {threads}")
        print(f"{'round':<7}{'bare steps/s':>14}{'tunedeck steps/s':>18}{'ratio':>8}{'load':>7}")
        ratios = []
        for i in range(args.rounds):
            # alternating which side goes first: a machine whose load drifts favours neither side
            if i % 2 == 0:
                bare, ours = bare_in_fresh_process(spec, Path(tmp) / f"bare-{i}"), worker_side(spec)
            else:
                ours, bare = worker_side(spec), bare_in_fresh_process(spec, Path(tmp) / f"bare-{i}")
            ratios.append(ours / bare)
            print(f"{i + 1:<7}{bare:>14.4f}{ours:>18.4f}{ours / bare:>8.3f}{os.getloadavg()[0]:>7.2f}")
        print(
            f"median ratio (tunedeck / bare) of {args.rounds} rounds: {statistics.median(ratios):.3f}  (target >= 0.97)"
        )
        ours, total = callback_seconds(spec)
        print(
            f"tunedeck's callbacks: {ours:.3f} s of the trainer's {total:.2f} s ({100 * ours / total:.2f}%), "
            f"profiled in this process: they allow a ratio of {1 - ours / total:.3f}"
        )


if __name__ == "__main__":
    main()
