"""Trick sweeps (issue 8 item 6): probe specs per trick, queued as one sweep, trained by the real worker,
and their memory/time table relative to the baseline."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import training_helpers
import yaml

from jobs.devices.facts import CPU, DeviceFacts
from jobs.queue.sweep import plan_probes, sweep_table
from jobs.spec.job import JobSpec
from jobs.spec.stored import spec_of
from jobs.spec.tricks.registry import Trick
from storage.models import RunStatus
from storage.store import Store

H200 = DeviceFacts(
    kind="cuda", name="NVIDIA H200", total_bytes=150 * 1024**3, compute_capability="9.0", bf16=True, fp16=True
).device()


def test_probes_on_the_cpu_skip_16_bit_precision_and_keep_the_effective_batch() -> None:
    spec = JobSpec.from_dict({"method": "full", "per_device_train_batch_size": 8, "max_steps": 500, "save_steps": 50})
    probes, skipped = plan_probes(spec, list(Trick), steps=5, device=CPU)
    by_trick = {trick: probe for trick, _note, probe in probes}
    assert list(by_trick) == [
        "baseline",
        "gradient_checkpointing",
        "accumulation",
        "optim_8bit",
        "lora",
        "qlora",
        "cpu_return_freed_memory",
        "galore",
    ]
    assert all(p.max_steps == 5 and p.save_steps is None and p.on_oom.value == "fail" for p in by_trick.values())
    accumulation = by_trick["accumulation"]
    assert (accumulation.per_device_train_batch_size, accumulation.gradient_accumulation_steps) == (4, 2)
    assert by_trick["optim_8bit"].optim.value == "adamw_bnb_8bit" and by_trick["qlora"].method.value == "qlora"
    assert (
        by_trick["cpu_return_freed_memory"].cpu_return_freed_memory and by_trick["galore"].optim.value == "galore_adamw"
    )
    assert dict(skipped).keys() == {"bf16", "fp16", "activation_offloading", "use_liger_kernel", "torch_compile"}
    assert "needs a CUDA device" in dict(skipped)["fp16"] and "Triton" in dict(skipped)["use_liger_kernel"]
    assert "minutes" in dict(skipped)["torch_compile"]


def test_probes_on_a_gpu_worker_include_bf16_and_fp16() -> None:
    probes, skipped = plan_probes(JobSpec(), [Trick.BF16, Trick.FP16, Trick.LORA], steps=5, device=H200)
    assert [t for t, _n, _p in probes] == ["baseline", "bf16", "fp16"]
    assert skipped == [("lora", "the method is already lora")]


def test_probes_on_a_gpu_worker_include_its_tricks() -> None:
    chosen = [Trick.OFFLOADING, Trick.LIGER, Trick.COMPILE, Trick.CPU_ALLOCATOR, Trick.GALORE]
    probes, skipped = plan_probes(JobSpec(), chosen, steps=5, device=H200)
    names = [t for t, _n, _p in probes]
    assert names[:2] == ["baseline", "activation_offloading"] and "torch_compile" in names
    assert ("use_liger_kernel" in names) is (importlib.util.find_spec("liger_kernel") is not None)
    assert dict(skipped)["galore"].startswith("GaLore is for full fine-tuning")
    assert "CPU worker's allocator" in dict(skipped)["cpu_return_freed_memory"]


def test_run_page_button_queues_a_sweep_of_the_runs_spec(store: Store, tiny_model: Path) -> None:
    from app.ui.sweep import queue_from_run

    run_id = store.create_run(training_helpers.tiny_spec(tiny_model))
    text = queue_from_run(store, run_id, ["baseline", "gradient_checkpointing", "fp16"], 4)
    assert text.startswith("Sweep 1: queued runs") and "skipped fp16" in text
    members = store.sweep_runs(1)
    assert [m["trick"] for m in members] == ["baseline", "gradient_checkpointing"]
    assert spec_of(store.get_run(members[1]["run_id"])).gradient_checkpointing


@pytest.mark.integration
@pytest.mark.slow
def test_cli_sweep_through_the_worker_prints_the_table(
    store: Store, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from app.cli.main import main
    from app.ui.sweep import table_frame
    from jobs.worker.loop import Worker

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(training_helpers.tiny_spec(tiny_model, max_length=64).to_dict()))
    assert main(["sweep", str(spec_file), "--steps", "3", "--tricks", "gradient_checkpointing,accumulation,fp16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sweep 1: queued runs") and "skipped fp16" in out
    Worker(store, sample=False, poll_interval=0.2).work(burst=True)  # what `tunedeck worker --burst` runs
    rows = sweep_table(store, 1)
    assert [r["trick"] for r in rows] == ["baseline", "gradient_checkpointing", "accumulation"]
    assert all(r["status"] == RunStatus.SUCCEEDED.value for r in rows), rows
    assert all(r["peak_bytes"] and r["step_time"] for r in rows)
    assert rows[0]["memory_vs_baseline"] == 1.0 and rows[0]["time_vs_baseline"] == 1.0
    assert all(r["memory_vs_baseline"] > 0 and r["time_vs_baseline"] > 0 for r in rows)
    accumulation = store.get_run(rows[2]["run_id"]).resolved_config["trainer_config"]
    assert (accumulation["per_device_train_batch_size"], accumulation["gradient_accumulation_steps"]) == (2, 2)
    assert main(["sweep", "--show", "1"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["trick", "run", "status", "peak"] and len(table) == 4
    assert table[1].startswith("baseline") and "1.00x" in table[1] and "micro-batch 4 x 1 -> 2 x 2" in table[3]
    assert list(table_frame(rows)["trick"]) == ["baseline", "gradient_checkpointing", "accumulation"]
