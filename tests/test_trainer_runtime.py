"""What a trainer's own trl classes add to the CPU runtime baseline (issues 45 and 49).

The baseline (`jobs.train.baseline`) holds the trl trainers most runs use; GRPO's training child also imports
`trl.GRPOTrainer`, measured here at 53.9 MiB more, so every GRPO run on the CPU was predicted that much low from
its load on. The baseline now measures each trainer's own increment (`trainer_bytes`), the worker caches and
publishes it with the runtime (`DeviceFacts.trainer_bytes`), and the prediction's runtime part adds the run's own,
at submit (`jobs.memory.breakdown.runtime_part`) and at the claim (`Prediction.with_runtime`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_devices import fake_baseline, own_cache, published_facts, spawns, start  # noqa: F401 - own_cache: autouse

from jobs.devices import probe
from jobs.devices.facts import DeviceFacts, RuntimeBaseline
from jobs.devices.probe import detect
from jobs.devices.target import target
from jobs.memory.breakdown import Prediction
from jobs.memory.model_config import arch_for
from jobs.memory.predict import predict
from jobs.queue.saved_prediction import load_prediction, save_prediction, with_runtime
from jobs.spec.job import JobSpec
from storage.store import Store

MIB = 1024**2
GRPO_BYTES = 56_508_416  # what `python -m jobs.train.baseline` measured for grpo on the development machine
CPU = DeviceFacts(
    kind="cpu",
    name="cpu",
    total_bytes=64 * 2**30,
    host="box",
    runtime_bytes=400 * MIB,
    trainer_bytes={"grpo": GRPO_BYTES},
)
COMMON = ("sft", "dpo", "kto", "reward")  # the trainers whose trl classes the common figure holds


@pytest.fixture(scope="module")
def baseline_output(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`python -m jobs.train.baseline` run once for this module (seconds: it imports what the training child does)."""
    home = tmp_path_factory.mktemp("baseline-home")
    done = subprocess.run(
        [sys.executable, "-m", "jobs.train.baseline"],
        env={**os.environ, "TUNEDECK_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    printed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return printed


@pytest.mark.slow
def test_the_baseline_module_imports_what_the_child_does_and_reports_its_rss(baseline_output: dict[str, Any]) -> None:
    import psutil

    assert {"torch", "transformers", "peft", "trl", "datasets"} <= set(baseline_output["libraries"])
    # torch alone is over 100 MiB resident; the whole runtime is well under this machine's memory.
    assert 100 * 1024**2 < baseline_output["runtime_bytes"] < psutil.virtual_memory().total / 2


def test_the_baseline_measures_what_grpos_own_trl_classes_add_and_nothing_for_the_common_trainers(
    baseline_output: dict[str, Any],
) -> None:
    added = baseline_output["trainer_bytes"]
    # measured 53.9 MiB (trl.GRPOTrainer and what it imports); any real import of it is well over 1 MiB
    assert added["grpo"] > MIB
    assert not set(COMMON) & set(added)  # imported with the common figure: nothing more, not listed
    assert all(isinstance(n, int) and n > 0 for n in added.values())
    assert RuntimeBaseline.from_dict(baseline_output) == RuntimeBaseline(baseline_output["runtime_bytes"], added)


@pytest.fixture(scope="module")
def arch():
    return arch_for("smollm2-135m-instruct")


def grpo() -> JobSpec:
    return JobSpec.from_dict(
        dict(model="smollm2-135m-instruct", trainer="grpo", dataset="sample:prompt-format", rewards="repetition")
        | dict(max_length=64, num_generations=4, per_device_train_batch_size=4, max_completion_length=32, beta=0.0)
    )


def test_a_grpo_prediction_adds_its_trainers_increment_and_the_common_trainers_predictions_are_unchanged(
    arch,
) -> None:
    p, unknown = predict(grpo(), arch, CPU), predict(grpo(), arch, replace(CPU, trainer_bytes={}))
    assert p.part("runtime") == 400 * MIB + GRPO_BYTES
    assert "+ trl's GRPOTrainer 53.9 MiB" in p.to_dict()["formulas"]["runtime"]
    assert p.total_bytes == unknown.total_bytes + GRPO_BYTES
    assert p.phases == {name: value + GRPO_BYTES for name, value in unknown.phases.items()}
    for trainer in COMMON:  # as before the baseline measured trainers: the same parts, formulas and phases
        spec = JobSpec.from_dict(dict(model="smollm2-135m-instruct", trainer=trainer, max_length=64))
        now, before = predict(spec, arch, CPU), predict(spec, arch, replace(CPU, trainer_bytes={}))
        assert now.parts == before.parts and now.phases == before.phases, trainer
        assert now.part("runtime") == 400 * MIB, trainer


def test_at_the_claim_a_grpo_prediction_takes_its_trainers_increment_and_an_sft_one_the_runtime_alone(arch) -> None:
    measured = RuntimeBaseline(300 * MIB, {"grpo": GRPO_BYTES})
    sft = JobSpec(model="smollm2-135m-instruct")
    for spec, runtime, own in ((grpo(), 300 * MIB + GRPO_BYTES, True), (sft, 300 * MIB, False)):
        before = predict(spec, arch, replace(CPU, runtime_bytes=0, trainer_bytes={}))
        after = with_runtime(before.to_dict(), measured, spec.trainer, "w1")
        assert after["parts"]["runtime"] == runtime and after["total_bytes"] == before.total_bytes + runtime
        assert after["phases"] == {name: value + runtime for name, value in before.phases.items()}
        assert after["device"]["trainer_bytes"] == {"grpo": GRPO_BYTES}
        assert ("+ trl's GRPOTrainer 53.9 MiB" in after["formulas"]["runtime"]) is own


def test_facts_and_predictions_saved_before_the_trainer_increments_still_read(store: Store, arch) -> None:
    assert DeviceFacts.from_json(CPU.to_json()) == CPU
    older = {k: v for k, v in CPU.to_dict().items() if k != "trainer_bytes"}  # published by an older worker
    assert DeviceFacts.from_dict(older) == replace(CPU, trainer_bytes={})
    assert DeviceFacts.from_dict({**older, "trainer_bytes": "edited"}).trainer_bytes == {}
    assert hash(CPU) == hash(replace(CPU, trainer_bytes={}))  # still hashable: the map is left out of it
    store.publish_device("old:1", "box", older)
    assert target(store).facts == replace(CPU, trainer_bytes={})
    store.publish_device("new:2", "box", CPU.to_dict())
    assert DeviceFacts.from_dict(store.published_devices()[0]["facts"]) == CPU
    saved = predict(grpo(), arch, replace(CPU, trainer_bytes={})).to_dict()
    del saved["device"]["trainer_bytes"]  # a prediction.json written before
    assert Prediction.from_dict(saved).device == replace(CPU, trainer_bytes={})


def test_the_worker_publishes_the_increments_and_measures_again_over_an_older_cache_entry(
    store: Store, tmp_path: Path
) -> None:
    from jobs.worker.loop import Worker

    runs, grpo_bytes = tmp_path / "runs.jsonl", {"grpo": GRPO_BYTES}
    path = probe.runtime_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    older = {"key": probe.runtime_key(), "runtime_bytes": 300 * MIB}  # cached before trainers were measured
    path.write_text(json.dumps({"entries": [older]}))
    assert probe.cached_baseline() is None
    start(Worker(store, worker_id="first:1", sample=False, baseline_argv=fake_baseline(runs, trainer_bytes=grpo_bytes)))
    assert len(spawns(runs)) == 1  # measured again: the older entry could not say what grpo adds
    assert published_facts(store, "first:1") == replace(detect(), runtime_bytes=512 * MIB, trainer_bytes=grpo_bytes)
    (entry,) = json.loads(path.read_text())["entries"]
    assert entry["runtime_bytes"] == 512 * MIB and entry["trainer_bytes"] == grpo_bytes
    start(Worker(store, worker_id="again:2", sample=False, baseline_argv=fake_baseline(runs, 1, {})))
    assert len(spawns(runs)) == 1  # from the cache, increments included
    assert published_facts(store, "again:2").trainer_bytes == grpo_bytes
    probe.local_facts.cache_clear()
    assert probe.local_facts().trainer_bytes == grpo_bytes  # what the checks read without a worker


def test_a_worker_claiming_a_grpo_run_adds_the_runtime_and_grpos_increment(store: Store, tmp_path: Path, arch) -> None:
    from jobs.worker.loop import Worker

    spec = grpo()
    run_id = store.create_run(spec)
    unknown = replace(detect(), runtime_bytes=0)
    save_prediction(store, run_id, predict(spec, arch, unknown))  # submitted before any worker measured
    before = load_prediction(store, run_id)
    assert before is not None and before["parts"]["runtime"] == 0
    Worker(
        store,
        worker_id="w-grpo",
        sample=False,
        child_argv=lambda rid: [sys.executable, "-c", "import sys; sys.exit(0)"],
        baseline_argv=fake_baseline(tmp_path / "runs.jsonl", trainer_bytes={"grpo": GRPO_BYTES, "orpo": 1}),
        poll_interval=0.1,
    ).work(burst=True)
    after = load_prediction(store, run_id)
    assert after is not None and after["parts"]["runtime"] == 512 * MIB + GRPO_BYTES
    assert after["total_bytes"] == before["total_bytes"] + 512 * MIB + GRPO_BYTES
    assert "worker w-grpo" in after["formulas"]["runtime"] and "GRPOTrainer" in after["formulas"]["runtime"]
