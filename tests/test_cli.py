"""The `tunedeck` CLI: bad input exits 2 with one line per problem; runs/show/cancel; `run` end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.main import main
from app.cli.usage import load_spec
from app.server import exposure_warning, is_loopback
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.stored import spec_of
from storage.models import RunStatus
from storage.store import MetricPoint, Store

GOOD = "model: tiny-llama\ndataset: sample:chat-format\nmax_steps: 3\nmax_length: 64\n"


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_submit_bad_spec_exits_2_with_every_problem(data_home: Path, tmp_path: Path, capsys) -> None:
    spec = write(tmp_path, "learning_rat: 1e-4\nlora_r: 0\nmethod: magic\n")
    assert main(["submit", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s)" in err
    assert "learning_rat: unknown field. Fix: did you mean `learning_rate`?" in err
    assert "lora_r: 0 is out of range. Fix: use a value >= 1 and <= 4096" in err
    assert "method: `magic` is not one of the choices" in err
    assert "Traceback" not in err
    assert Store().list_runs() == []


def test_submit_missing_file_and_bad_set(data_home: Path, tmp_path: Path, capsys) -> None:
    assert main(["submit", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    spec = write(tmp_path, GOOD)
    assert main(["submit", str(spec), "--set", "novalue"]) == 2
    assert "--set: `novalue` is not key=value" in capsys.readouterr().err
    assert main(["submit", str(spec), "--set", "lora_r=abc"]) == 2
    assert "lora_r: expected a whole number" in capsys.readouterr().err


def test_submit_bad_yaml(data_home: Path, tmp_path: Path, capsys) -> None:
    assert main(["submit", str(write(tmp_path, "model: [oops"))]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_submit_missing_data_file_is_reported_before_queueing(data_home: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("jobs.data.sources")
    spec = write(tmp_path, GOOD + f"eval_dataset: {tmp_path / 'missing.jsonl'}\n")
    assert main(["submit", str(spec)]) == 2
    assert "eval_dataset" in capsys.readouterr().err
    assert Store().list_runs() == []


def test_cli_process_exit_code_without_traceback(data_home: Path, tmp_path: Path) -> None:
    spec = write(tmp_path, "lora_r: -3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "submit", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "lora_r: -3 is out of range" in proc.stderr and "Traceback" not in proc.stderr


def test_store_free_commands_leave_no_database(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`--help`, `hash-password` and `plan` in a fresh TUNEDECK_HOME create no database; `runs` does."""
    import io

    def databases() -> list[str]:
        return sorted(p.name for p in data_home.rglob("*.db*"))

    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0 and "hash-password" in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO("pw-carol-333\n"))
    assert main(["hash-password", "--user", "carol"]) == 0
    assert capsys.readouterr().out.startswith("carol:")
    spec = write(tmp_path, "model: smollm2-135m-instruct\n")
    assert main(["plan", str(spec), "--memory", "24GiB"]) == 0
    assert "Fits" in capsys.readouterr().out
    assert databases() == []
    assert main(["runs"]) == 0  # a command that reads runs opens (and creates) the database
    assert "tunedeck.db" in databases()


def test_files_named_in_a_spec_are_found_beside_it_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "qs.jsonl").write_text('{"question": "2+2?", "answer": "4"}\n')
    (tmp_path / "specs" / "rows.jsonl").write_text("")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "rows.jsonl").write_text("")  # found from the current folder: kept as written
    text = "model: tiny-llama\ndataset: [rows.jsonl, sample:chat-format]\neval_tasks: qs.jsonl, hellaswag\n"
    (tmp_path / "specs" / "job.yaml").write_text(text)
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = load_spec(str(tmp_path / "specs" / "job.yaml"))
    assert spec.eval_tasks == f"{tmp_path / 'specs' / 'qs.jsonl'}, hellaswag"
    assert "rows.jsonl" in str(spec.dataset) and str(tmp_path / "specs") not in str(spec.dataset)
    monkeypatch.chdir(tmp_path)
    assert load_spec("specs/job.yaml").eval_tasks == f"{tmp_path / 'specs' / 'qs.jsonl'}, hellaswag"


def test_load_spec_overrides(tmp_path: Path) -> None:
    spec = load_spec(str(write(tmp_path, GOOD)), ["lora_r=4", "packing=true", "eval_dataset="])
    assert (spec.lora_r, spec.packing, spec.eval_dataset) == (4, True, None)
    with pytest.raises(SpecError):
        load_spec(str(write(tmp_path, GOOD)), ["nosuch=1"])


def test_submit_runs_show_cancel(data_home: Path, tmp_path: Path, capsys) -> None:
    spec = write(tmp_path, GOOD + "run_name: cli-test\n")
    assert main(["submit", str(spec), "--set", "lora_r=4"]) == 0
    run_id = int(capsys.readouterr().out.strip())
    store = Store()
    run = store.get_run(run_id)
    assert run.status is RunStatus.QUEUED and spec_of(run).lora_r == 4

    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert "ID" in out.splitlines()[0] and "cli-test" in out and "queued" in out
    assert main(["runs", "--status", "running"]) == 0
    assert capsys.readouterr().out.strip() == "no runs"
    assert main(["runs", "--status", "bogus"]) == 2
    assert "--status: `bogus` is not a run status" in capsys.readouterr().err

    store.claim_next_on_device("w", "0")
    store.set_progress(run_id, 2, 3)
    store.add_metrics(run_id, [MetricPoint(2, "loss", 1.25, 1.0)])
    store.set_peak_memory(run_id, 3 * 2**20, "host")
    store.add_artifact(run_id, "adapter", "/data/runs/1/adapter", 2048, "0" * 64)
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert "2/3" in out and "1.2500" in out

    assert main(["cancel", str(run_id)]) == 0
    assert "cancel requested" in capsys.readouterr().out
    store.mark_failed(run_id, "training process exited with code 3", "line1\nline2", exit_code=3)
    assert main(["show", str(run_id)]) == 0
    out = capsys.readouterr().out
    for text in (
        "status:   failed",
        "exit code: 3",
        "peak memory: 3.0 MiB (host)",
        "lora_r: 4",
        "adapter: /data/runs/1/adapter (2.0 KiB)",
        "error:    training process exited with code 3",
        "  line2",
    ):
        assert text in out
    assert main(["show", "999"]) == 2
    assert "run 999 does not exist" in capsys.readouterr().err
    assert main(["cancel", str(run_id)]) == 0
    assert "already failed" in capsys.readouterr().out


def test_cancel_queued(data_home: Path, tmp_path: Path, capsys) -> None:
    run_id = Store().create_run(JobSpec(model="tiny-llama"))
    assert main(["cancel", str(run_id)]) == 0
    assert f"run {run_id}: cancelled" in capsys.readouterr().out


def test_loopback_warning() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert exposure_warning("127.0.0.1", 7860) is None
    warning = exposure_warning("0.0.0.0", 7860)
    assert warning and "no login" in warning


def test_worker_burst_on_empty_queue(data_home: Path, capsys) -> None:
    assert main(["worker", "--burst"]) == 0
    assert "0 run(s) done" in capsys.readouterr().err


@pytest.mark.integration
def test_run_tiny_model_end_to_end(data_home: Path, tmp_path: Path, tiny_model: Path) -> None:
    pytest.importorskip("jobs.train.child")
    spec = write(
        tmp_path,
        f"model: {tiny_model}\ndataset: sample:chat-format\nmax_steps: 4\nmax_length: 64\n"
        "per_device_train_batch_size: 2\nlogging_steps: 1\n",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "run", str(spec)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "no worker is running" in proc.stderr
    assert "succeeded" in proc.stderr
    store = Store()
    [run] = store.list_runs()
    assert run.status is RunStatus.SUCCEEDED and run.current_step == 4
    assert store.metrics(run.id, ["loss"])
    assert run.peak_memory_bytes and run.peak_memory_bytes > 0


@pytest.mark.integration
def test_run_failing_spec_exits_1(data_home: Path, tmp_path: Path, tiny_model: Path) -> None:
    pytest.importorskip("jobs.train.child")
    # Valid at submit (config, tokenizer, adapters and one meta-device step all pass), but its weights file is
    # cut short: the child cannot load it, the run fails and `run` says why.
    import shutil

    broken = tmp_path / "broken-weights"
    shutil.copytree(tiny_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    spec = write(tmp_path, f"model: {broken}\nmax_steps: 2\nmax_length: 64\n")
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "run", str(spec)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "failed" in proc.stderr and "error:" in proc.stderr


def test_submit_reports_model_data_and_device_problems_together(data_home: Path, tmp_path: Path, capsys) -> None:
    from jobs.devices.probe import detect_device

    fp16_problem = not detect_device().cuda
    spec = write(tmp_path, f"model: ./no-such-model\ndataset: {tmp_path / 'missing.jsonl'}\nprecision: fp16\n")
    assert main(["submit", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "\n  model: " in err and "\n  dataset: " in err
    if fp16_problem:
        assert "\n  precision: fp16 needs CUDA" in err
    assert Store().list_runs() == []


def test_setup_builds_a_builtin_model(data_home: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(data_home / "models"))
    assert main(["setup", "--model", "tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert "model tiny-llama ready at" in out and (data_home / "models" / "tiny-llama" / "config.json").is_file()
    assert main(["setup", "--model", "no-such-model"]) == 2
    assert "model:" in capsys.readouterr().err


def test_serve_starts_worker_and_stops_it(data_home: Path) -> None:
    import signal
    import socket
    import time
    import urllib.request

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"server did not come up:\n{proc.stdout.read() if proc.poll() is not None else ''}"
                    ) from None
                time.sleep(0.5)
        workers = [c for c in psutil.Process(proc.pid).children() if "worker" in c.cmdline()]
        assert len(workers) == 1
        assert Store().live_workers(30) or time.sleep(3) or Store().live_workers(30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert not workers[0].is_running() or workers[0].status() == psutil.STATUS_ZOMBIE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
