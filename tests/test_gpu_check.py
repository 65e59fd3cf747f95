"""The prepared GPU check (bench/gpu_check.sh) where no GPU is: its dry run, the wheel selection, the
constants' summary and the OOM job's sizing. The GPU itself is exercised only on the GPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cuda_constants  # noqa: E402
import gpu_env  # noqa: E402

SECTIONS = ("install", "facts", "constants", "oom", "pytest", "memtruth", "memruns", "tricks", "vllm")


def fake_wheels(folder: Path, missing: str | None = None) -> Path:
    folder.mkdir()
    rows = [
        ("trl-1.16.0-py3-none-any.whl", "trl", "1.16.0", "always"),
        ("peft-0.21.2-py3-none-any.whl", "peft", "0.21.2", ">=0.21.2,<0.22"),
    ]
    for file, *_ in rows:
        if file != missing:
            (folder / file).write_bytes(b"x" * 1024)
    (folder / "manifest.tsv").write_text("".join("\t".join(r) + "\n" for r in rows))
    return folder


def dry_run(wheels: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_WHEELS": str(wheels), "PYTHON": sys.executable, "OUT": str(wheels.parent / "out")}
    return subprocess.run(
        ["bash", str(ROOT / "bench/gpu_check.sh"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_prints_every_section_and_finds_every_file(tmp_path: Path) -> None:
    done = dry_run(fake_wheels(tmp_path / "wheels"))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for name in SECTIONS:
        assert f"[{name}]" in out
    scripts = ("cuda_constants.py", "oom_gpu.py", "memory_truth.py --device cuda", "tricks_gpu.py", "-m gpu")
    for script in (*scripts, "vllm_gpu.py --steps 2"):
        assert script in out
    assert "MISSING" not in out and "test_training.py" in out
    assert not (tmp_path / "out").exists()  # a dry run writes no report


def test_dry_run_fails_naming_a_missing_wheel(tmp_path: Path) -> None:
    done = dry_run(fake_wheels(tmp_path / "wheels", missing="trl-1.16.0-py3-none-any.whl"))
    assert done.returncode == 1
    assert "MISSING" in done.stdout and "trl-1.16.0-py3-none-any.whl" in done.stdout


def test_select_installs_what_is_missing_or_outside_its_range_and_keeps_the_rest(tmp_path: Path) -> None:
    wheels = gpu_env.read_manifest(fake_wheels(tmp_path / "wheels") / "manifest.tsv")
    have = {"trl": "1.16.0", "peft": "0.21.2"}
    chosen, _ = gpu_env.select(wheels, have.get)
    assert [w.name for w in chosen] == ["trl"]  # always; the machine's peft is within range
    chosen, reasons = gpu_env.select(wheels, {"peft": "0.18.0"}.get)
    assert [w.name for w in chosen] == ["trl", "peft"] and "the machine has 0.18.0" in reasons[1]
    chosen, _ = gpu_env.select(wheels, {}.get)
    assert [w.file.name for w in chosen] == ["trl-1.16.0-py3-none-any.whl", "peft-0.21.2-py3-none-any.whl"]


def reading(used: int, reserved: int, process: int | None = None) -> dict:
    return {"used": used, "reserved": reserved, "allocated": 0, "process": process}


def test_constants_summary_suggests_the_largest_context_and_slack() -> None:
    mib = 2**20
    lora = {
        "config": "lora",
        "base_used": 500 * mib,
        "idle": reading(1000 * mib, 2 * mib, 480 * mib),
        "cublas": reading(1100 * mib, 34 * mib, 600 * mib),
        "steps": [reading(5000 * mib, 4000 * mib), reading(5300 * mib, 4100 * mib)],
        "max_reserved": 4200 * mib,
        "max_allocated": 4000 * mib,
        "nvml_peak": 5350 * mib,
    }
    failed = {"config": "full", "error": "exit code 1"}
    s = cuda_constants.summarize([lora, failed], "NVIDIA H200")
    row = s["rows"][0]
    assert row["context_idle"] == 998 * mib and row["process_context_idle"] == 478 * mib
    assert row["context_train_max"] == 1200 * mib and row["context_at_peak"] == 1150 * mib
    assert abs(row["slack"] - 0.05) < 1e-9
    assert s["suggested"] == {
        "device": "NVIDIA H200",
        "key": "H200",
        "cuda_context_bytes": 1200 * mib,
        "allocator_slack": 0.05,
    }
    text = cuda_constants.table(s)
    assert "CUDA_CONTEXT_BYTES['H200'] = 1200 * 1024**2" in text and "ALLOCATOR_SLACK = 0.05" in text
    assert "| full | FAILED: exit code 1 |" in text


def test_oom_job_is_predicted_over_the_device_and_its_halved_batch_under() -> None:
    import oom_gpu

    from jobs.devices.facts import DeviceFacts
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict

    h200 = DeviceFacts("cuda", "NVIDIA H200", oom_gpu.H200_TOTAL, "9.0", True, True)
    arch = arch_from_config(oom_gpu.model_config())
    batch, at_b, at_half = oom_gpu.choose_batch(arch, h200)
    assert batch % 2 == 0
    assert at_b >= oom_gpu.FACTOR * h200.total_bytes > h200.total_bytes > at_half  # B cannot fit; B/2 can
    smaller = predict(oom_gpu.job("m", "d.jsonl", batch - 2), arch, h200).total_bytes
    assert smaller < oom_gpu.FACTOR * h200.total_bytes  # the smallest such batch
    assert oom_gpu.job("m", "d.jsonl", batch).ignore_memory_prediction  # submit would refuse it otherwise
