"""GRPO's steps/s through tunedeck's worker path against bare trl GRPOTrainer, side by side (issue 45: >= 0.97x).

    .venv/bin/python bench/grpo_speed.py                          # the tiny Llama, 20 steps each side
    .venv/bin/python bench/grpo_speed.py --model smollm2-135m-instruct --steps 30

Both sides train the same spec (LoRA, `sample:prompt-format`, one declared regex reward, num_generations 4,
max_completion_length 32) on this machine's CPU (or its GPU), in a temporary data folder (removed afterwards).
(a) tunedeck: the spec queued in a store and trained by a burst worker (`jobs.worker.loop.Worker`: its child
process, the store callback, the doctor, the completions keeper); steps/s = global_step / train_runtime as the
run recorded it (the trainer's own clock: model loading and process start-up are outside it on both sides).
(b) bare trl: `GRPOTrainer` built here from the same GRPOConfig keyword arguments (`jobs.config.mapping`), model,
LoRA config, data and reward callable, no callbacks; steps/s from its own train_runtime. Prints both and the
ratio a/b. The machine's load is printed too: the figure is only as good as the idle cores it had.
"""

from __future__ import annotations

import argparse
import os
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a model (default: the tiny Llama, built offline)")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="grpo-speed-") as tmp:
        os.environ["TUNEDECK_HOME"] = str(Path(tmp) / "home")
        model = args.model
        if model is None:
            from jobs.models.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny-llama"))
        spec = make_spec(model, args.steps)
        bare = bare_side(spec, Path(tmp) / "bare")
        ours = worker_side(spec)
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.steps} steps, model {model}")
        print(f"{'side':<26}{'steps/s':>10}")
        print(f"{'bare trl GRPOTrainer':<26}{bare:>10.4f}")
        print(f"{'tunedeck worker':<26}{ours:>10.4f}")
        print(f"ratio (tunedeck / bare): {ours / bare:.3f}  (target >= 0.97)")


if __name__ == "__main__":
    main()
