"""Real training on the tiny offline Llama (CPU): SFT/DPO, LoRA/full, store writes, failure, cancel.

Each training here runs a handful of steps on a 140k-parameter model, so a test takes seconds.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import greedy_answer, run_card_snippet, tiny_spec

from jobs.devices.facts import CPU
from jobs.spec.job import JobSpec
from jobs.train.artifacts import sha256_of, write_bundle
from jobs.train.callbacks import STOP_REQUESTED, StoreCallback
from storage.models import RunStatus
from storage.store import MetricPoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clear_stop_flag():
    STOP_REQUESTED.clear()
    yield
    STOP_REQUESTED.clear()


def losses(log_history: list[dict[str, Any]]) -> list[float]:
    return [e["loss"] for e in log_history if "loss" in e]


def logits_of(model: Any, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer("Tell me about volcanoes.", return_tensors="pt")
    model.eval()
    with torch.no_grad():
        return model(**ids).logits


# ---------------------------------------------------------------------- callback (fast)
class CountingStore:
    """Stands in for Store: counts write transactions, never cancels."""

    def __init__(self) -> None:
        self.metric_calls: list[list[MetricPoint]] = []
        self.progress: list[tuple[int, int | None]] = []
        self.cancel = False
        self.control_reads = 0

    def add_metrics(self, run_id: int, points: Any, progress: tuple[int, int | None] | None = None) -> int:
        self.metric_calls.append(list(points))
        if progress is not None:
            self.progress.append(progress)
        return len(self.metric_calls[-1])

    def add_memory_samples(self, samples: Any) -> int:
        return 0

    def set_progress(self, run_id: int, step: int, total: int | None = None) -> None:
        self.progress.append((step, total))

    def run_control(self, run_id: int) -> Any:
        self.control_reads += 1
        return type("R", (), {"cancel_requested": self.cancel})()


def test_callback_buffers_metrics_and_measures_throughput() -> None:
    from transformers import TrainerControl, TrainerState

    store = CountingStore()
    cb = StoreCallback(store, 1, flush_interval=3600, cancel_interval=3600, cuda=False)  # type: ignore[arg-type]
    state, control = TrainerState(max_steps=50), TrainerControl()
    cb.on_train_begin(None, state, control)  # type: ignore[arg-type]
    for step in range(1, 51):
        state.global_step = step
        cb.on_step_end(None, state, control)  # type: ignore[arg-type]
        cb.on_log(
            None,
            state,
            control,
            logs={
                "loss": 1.0 / step,
                "num_tokens": 100.0 * step,  # type: ignore[arg-type]
                "learning_rate": 1e-3,
                "flag": True,
                "note": "x",
            },
        )
    assert store.metric_calls == []  # nothing written per scalar or per step
    cb.on_log(None, state, control, logs={"loss": float("nan")})  # type: ignore[arg-type]
    cb.on_train_end(None, state, control)  # type: ignore[arg-type]
    (points,) = store.metric_calls  # one transaction for everything
    names = {p.name for p in points}
    assert {"loss", "num_tokens", "learning_rate", "step_time", "tokens_per_second"} <= names
    assert math.isnan(points[-1].value) and points[-1].name == "loss"  # kept as NaN (the store: NULL)
    assert cb.nonfinite_step == 50 and control.should_training_stop and not control.should_save
    assert "flag" not in names and "note" not in names
    assert all(p.value > 0 for p in points if p.name == "tokens_per_second")
    assert store.progress[0] == (0, 50) and store.progress[-1] == (50, 50)
    assert len(store.progress) == 2  # the last report rode in the metrics' transaction: one write, not two


def test_callback_stops_on_cancel_request_and_on_signal() -> None:
    from transformers import TrainerControl, TrainerState

    store = CountingStore()
    cb = StoreCallback(store, 1, cancel_interval=0.0, cuda=False)  # type: ignore[arg-type]
    state, control = TrainerState(max_steps=10), TrainerControl()
    cb.on_train_begin(None, state, control)  # type: ignore[arg-type]
    cb.on_step_end(None, state, control)  # type: ignore[arg-type]
    assert not control.should_training_stop
    store.cancel = True
    cb.on_step_end(None, state, control)  # type: ignore[arg-type]
    assert control.should_training_stop and cb.stop_reason == "cancel"
    assert control.should_save  # a checkpoint at the step it stops, so the run can resume

    cb2, control2 = StoreCallback(CountingStore(), 2, cancel_interval=3600, cuda=False), TrainerControl()  # type: ignore[arg-type]
    cb2.on_train_begin(None, state, control2)  # type: ignore[arg-type]
    STOP_REQUESTED.set()
    cb2.on_step_end(None, state, control2)  # type: ignore[arg-type]
    assert control2.should_training_stop and cb2.stop_reason == "signal"


class FakeClock:
    """The callback's seconds, which pass only when a test says so: durations without real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_slow_writes_stretch_the_flush_interval_within_its_bounds() -> None:
    """A flush that takes 30 ms (a slow store) would be 3% of each second: the next flushes wait
    longer (up to max_flush_interval); once writes are fast again the interval comes back down."""
    from transformers import TrainerControl, TrainerState

    clock = FakeClock()

    class SlowStore(CountingStore):
        delay = 0.03

        def add_metrics(self, run_id: int, points: Any, progress: Any = None) -> int:
            clock.advance(self.delay)  # the write takes `delay` seconds on the callback's clock
            return super().add_metrics(run_id, points, progress)

    store = SlowStore()
    cb = StoreCallback(
        store,  # type: ignore[arg-type]
        1,
        flush_interval=1.0,
        cancel_interval=None,
        cuda=False,
        write_budget=0.005,
        max_flush_interval=5.0,
        clock=clock,
    )
    state, control = TrainerState(max_steps=10), TrainerControl()
    cb.on_train_begin(None, state, control)  # type: ignore[arg-type]
    assert cb.flush_every == 1.0  # progress only: no metric write yet
    cb.on_log(None, state, control, logs={"loss": 1.0})  # type: ignore[arg-type]
    cb.flush()
    assert cb.flush_every == 5.0  # 30 ms / 0.5% = 6 s, capped at 5 s
    store.delay = 0.0
    cb.on_log(None, state, control, logs={"loss": 1.0})  # type: ignore[arg-type]
    cb.flush()
    assert cb.flush_every == pytest.approx(4.2)  # a fast write brings the estimate down gradually: 0.7 * 30 ms
    for _ in range(29):
        cb.on_log(None, state, control, logs={"loss": 1.0})  # type: ignore[arg-type]
        cb.flush()
    assert cb.flush_every == 1.0  # fast writes again: back to flush_interval


def test_periodic_flushes_write_in_order_off_the_training_thread(caplog: pytest.LogCaptureFixture) -> None:
    """Periodic flushes go to the writer thread in order; flush() waits for them; a failed
    periodic write is logged and training goes on."""
    from transformers import TrainerControl, TrainerState

    class ThreadStore(CountingStore):
        fail_first = True

        def add_metrics(self, run_id: int, points: Any, progress: Any = None) -> int:
            self.threads.append(threading.current_thread().name)
            if self.fail_first:
                self.fail_first = False
                raise RuntimeError("database went away")
            time.sleep(0.01)  # the writer lags behind the training thread, so train end must wait for it
            return super().add_metrics(run_id, points, progress)

    store = ThreadStore()
    store.threads = []  # type: ignore[attr-defined]
    # The fake clock stands still: every write costs 0 s, so with flush_interval 0 every log is a
    # periodic flush, however long the real writes take.
    cb = StoreCallback(store, 1, flush_interval=0.0, cancel_interval=None, cuda=False, clock=FakeClock())  # type: ignore[arg-type]
    state, control = TrainerState(max_steps=20), TrainerControl()
    cb.on_train_begin(None, state, control)  # type: ignore[arg-type]
    for step in range(1, 21):
        state.global_step = step
        cb.on_log(None, state, control, logs={"loss": float(step)})  # type: ignore[arg-type]  # the first write fails
    cb.on_train_end(None, state, control)  # type: ignore[arg-type]
    written = [p.step for call in store.metric_calls for p in call if p.name == "loss"]
    assert written == list(range(2, 21))  # in order; the failed batch (step 1) is gone, and nothing else
    assert set(store.threads) == {"tunedeck-metrics-writer"}  # type: ignore[attr-defined]
    assert store.progress[-1] == (20, 20)  # train end waited for the writer, then reported the last step
    assert "writing 1 metric rows failed; training goes on" in caplog.text and "database went away" in caplog.text


def test_a_watched_child_leaves_cancel_to_its_worker() -> None:
    """cancel_interval=None (a worker watches and relays a cancel as SIGTERM): no database reads per step."""
    from transformers import TrainerControl, TrainerState

    store = CountingStore()
    store.cancel = True
    cb = StoreCallback(store, 1, cancel_interval=None, cuda=False)  # type: ignore[arg-type]
    state, control = TrainerState(max_steps=10), TrainerControl()
    cb.on_train_begin(None, state, control)  # type: ignore[arg-type]
    for step in range(1, 4):
        state.global_step = step
        cb.on_step_end(None, state, control)  # type: ignore[arg-type]
    assert store.control_reads == 0 and not control.should_training_stop


# ---------------------------------------------------------------------- real training
@pytest.mark.integration
def test_sft_lora_learns_and_adapter_reloads_with_same_logits(tiny_model: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from jobs.train.training import train_spec

    result = train_spec(tiny_spec(tiny_model), tmp_path / "out", device=CPU)
    seen = losses(result.log_history)
    assert len(seen) == 12
    assert sum(seen[-3:]) / 3 < sum(seen[:3]) / 3 - 0.05, seen  # loss went down
    lora_b = [p for n, p in result.model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # initialised to zero; trained
    assert 0 < result.metrics["trainable_params"] < result.metrics["total_params"]
    assert "eval_loss" in result.metrics and result.metrics["tokens_per_second"] > 0

    trained = logits_of(result.model, result.tokenizer)
    with result.model.disable_adapter():
        base_logits = logits_of(result.model, result.tokenizer)
    assert not torch.allclose(trained, base_logits, atol=1e-4)  # the adapter changes the output

    bundle = write_bundle(tmp_path / "bundle", tiny_spec(tiny_model), result.model, result.tokenizer, result.metrics)
    assert (bundle / "adapter_model.safetensors").exists() and (bundle / "adapter_config.json").exists()
    assert not [p for p in bundle.iterdir() if p.suffix in {".bin", ".pt", ".pkl"}]
    assert "PeftModel.from_pretrained" in (bundle / "README.md").read_text()
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model)), str(bundle))
    assert torch.allclose(logits_of(reloaded, result.tokenizer), trained, atol=1e-5)


@pytest.mark.integration
def test_bundle_card_snippet_runs_as_written_with_plain_peft(tiny_model: Path, tmp_path: Path) -> None:
    import json

    from jobs.train.artifacts import LOAD_PROMPT
    from jobs.train.training import train_spec

    result = train_spec(tiny_spec(tiny_model, max_steps=4), tmp_path / "out", device=CPU)
    bundle = write_bundle(
        tmp_path / "bundle", tiny_spec(tiny_model, max_steps=4), result.model, result.tokenizer, result.metrics
    )
    # The adapter names a base that plain peft can load, not a tunedeck-only name.
    assert json.loads((bundle / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model)
    printed = run_card_snippet(bundle)
    result.model.eval()
    assert printed == greedy_answer(result.model, result.tokenizer, LOAD_PROMPT)


@pytest.mark.integration
def test_dpo_with_lora_trains_against_the_base_as_reference(tiny_model: Path, tmp_path: Path) -> None:
    from jobs.data.sources import SAMPLES_DIR
    from jobs.train.training import train_spec

    rows = (SAMPLES_DIR / "preference-format.train.jsonl").read_text().splitlines()[:8]
    (tmp_path / "pref.jsonl").write_text("\n".join(rows) + "\n")  # a local file: no eval split
    spec = tiny_spec(
        tiny_model,
        trainer="dpo",
        dataset=str(tmp_path / "pref.jsonl"),
        max_steps=4,
        per_device_train_batch_size=2,
        max_length=128,
    )
    result = train_spec(spec, tmp_path / "out", device=CPU)
    assert type(result.trainer).__name__ == "DPOTrainer" and result.trainer.ref_model is None
    logged = {k for e in result.log_history for k in e}
    assert {"rewards/chosen", "rewards/margins", "loss"} <= logged
    assert result.metrics["train_loss"] > 0 and result.metrics["global_step"] == 4
    assert all(p.abs().sum() > 0 for n, p in result.model.named_parameters() if "lora_B" in n)


@pytest.mark.integration
def test_full_fine_tune_run_through_the_store(tiny_model: Path, store: Any) -> None:
    from transformers import AutoModelForCausalLM

    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, method="full", learning_rate=1e-3, max_steps=8))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED, record.error_summary
    assert (record.current_step, record.total_steps) == (8, 8)
    assert record.peak_memory_bytes > 0 and record.peak_memory_source == "host"
    assert record.resolved_config["trainer_config"]["max_steps"] == 8
    assert record.resolved_config["peft_config"] is None
    for key in ("train_loss", "eval_loss", "train_runtime", "tokens_per_second", "trainable_params", "total_params"):
        assert key in record.final_metrics, key
    assert record.final_metrics["trainable_params"] == record.final_metrics["total_params"]
    names = set(store.metric_names(run_id))
    assert {"loss", "grad_norm", "learning_rate", "step_time", "tokens_per_second", "eval_loss"} <= names
    assert len(store.metrics(run_id, ["loss"])) == 8

    kinds = {a.kind: a for a in store.artifacts(run_id)}
    archive = Path(kinds["bundle"].path)
    assert archive.name.endswith("-model.zip") and kinds["bundle"].sha256 == sha256_of(archive)
    assert kinds["bundle"].size == archive.stat().st_size
    with zipfile.ZipFile(archive) as zf:
        files = set(zf.namelist())
    assert {"model.safetensors", "config.json", "spec.yaml", "metrics.json", "README.md", "tokenizer.json"} <= files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]
    bundle = Path(kinds["model"].path)
    saved = json.loads((bundle / "metrics.json").read_text())
    assert saved["train_loss"] == record.final_metrics["train_loss"]
    # The bundle carries the figures the dashboard shows (jobs.train.figures), not a second definition of them.
    from jobs.train.figures import run_figures

    shown = run_figures(store, record).metrics()
    assert {"tokens_per_second", "step_time", "loss", "peak_memory_bytes"} <= set(shown)
    for key, value in shown.items():
        assert saved[key] == pytest.approx(value) and record.final_metrics[key] == pytest.approx(value), key
    assert "tokens_per_second_mean" not in saved and "step_time_mean" not in saved
    reloaded = AutoModelForCausalLM.from_pretrained(str(bundle))
    assert sum(p.numel() for p in reloaded.parameters()) == record.final_metrics["total_params"]


@pytest.mark.integration
def test_missing_data_marks_the_run_failed_with_the_field(tiny_model: Path, store: Any, tmp_path: Path) -> None:
    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, dataset=str(tmp_path / "nope.jsonl")))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 1
    record = store.get_run(run_id)
    assert record.status is RunStatus.FAILED and record.error_summary.startswith("dataset:")
    assert "Traceback" in record.error_detail


@pytest.mark.integration
def test_crash_during_training_is_marked_failed_after_metrics(
    tiny_model: Path, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trl import SFTTrainer

    from jobs.train.child import run

    real_step = SFTTrainer.training_step
    calls = {"n": 0}

    def breaking_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("row 5 broke the collator\nsecond line")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "training_step", breaking_step)
    run_id = store.create_run(tiny_spec(tiny_model))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 1
    record = store.get_run(run_id)
    assert record.status is RunStatus.FAILED
    assert record.error_summary == "RuntimeError: row 5 broke the collator"
    assert record.exit_code == 1
    assert len(store.metrics(run_id, ["loss"])) == 3  # what was logged before the crash is kept


@pytest.mark.integration
def test_stop_flag_cancels_at_the_next_step(tiny_model: Path, store: Any) -> None:
    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, max_steps=50))
    store.claim_next_on_device("test", "0")
    STOP_REQUESTED.set()  # what the SIGTERM handler does
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.CANCELLED and record.current_step == 1
    assert not store.artifacts(run_id)


@pytest.mark.integration
@pytest.mark.slow
def test_child_entry_point_stops_warm_on_sigterm(tiny_model: Path, store: Any, data_home: Path) -> None:
    run_id = store.create_run(tiny_spec(tiny_model, max_steps=100000, max_train_samples=None))
    store.claim_next_on_device("test", "0")
    env = dict(os.environ, TUNEDECK_HOME=str(data_home), TUNEDECK_DATABASE_URL=store.url)
    log = data_home / "child.log"
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "jobs.train.child", "--run-id", str(run_id)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while store.get_run(run_id).current_step < 2 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
        assert child.poll() is None, log.read_text()[-3000:]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
    record = store.get_run(run_id)
    assert record.status is RunStatus.CANCELLED and record.exit_code == 0
    assert "stopping at the next step" in log.read_text()


def test_oom_summary_names_the_tricks_still_off() -> None:
    from jobs.train.failure import summarize

    spec = JobSpec.from_dict({"method": "full", "per_device_train_batch_size": 8, "max_length": 2048})
    summary = summarize(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), spec)
    assert summary.startswith("CUDA out of memory")
    for trick in (
        "per_device_train_batch_size 8 -> 4",
        "gradient_checkpointing: true",
        "max_length (now 2048)",
        "method: lora",
        "optim: adamw_bnb_8bit",
    ):
        assert trick in summary, trick
    done = JobSpec.from_dict({"method": "qlora", "per_device_train_batch_size": 1, "gradient_checkpointing": True})
    assert "gradient_checkpointing" not in summarize(torch.OutOfMemoryError("oom"), done)


def test_problem_errors_summarize_as_their_problems() -> None:
    from jobs.errors import Problem
    from jobs.spec.job import SpecError
    from jobs.train.failure import summarize

    exc = SpecError([Problem("precision", "fp16 needs CUDA", "use auto")])
    assert summarize(exc, None) == "precision: fp16 needs CUDA. Fix: use auto"


@pytest.mark.gpu
@pytest.mark.integration
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_cuda_run_records_torch_memory(tiny_model: Path, store: Any, method: str) -> None:
    from jobs.train.child import run

    run_id = store.create_run(tiny_spec(tiny_model, method=method, max_steps=6))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED, record.error_summary
    assert record.peak_memory_source == "torch" and record.peak_memory_bytes > 0
    assert record.resolved_config["precision"] in {"bf16", "fp16"}
    samples = store.memory_samples(run_id, source="torch")
    assert len(samples) == 6 and all(s.torch_allocated and s.torch_max_allocated for s in samples)
