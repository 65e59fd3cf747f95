"""The FLOPs model, the GPU peak table, and live TFLOP/s / MFU recorded by a real run (issue 8 item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
import training_helpers

from jobs.memory.flops import FlopsRate, peak_tflops, train_flops_per_token
from storage.models import RunStatus
from storage.store import Store

N = 1_000_000


def test_full_fine_tuning_is_six_n_and_recompute_adds_a_third() -> None:
    assert train_flops_per_token(N, N) == 6 * N
    assert train_flops_per_token(N, N, recompute=True) == pytest.approx(6 * N * 4 / 3)


def test_peft_pays_the_backward_through_frozen_layers_but_weight_gradients_only_for_the_adapter() -> None:
    lora = 10_000
    assert train_flops_per_token(N, lora) == 4 * N + 2 * lora
    assert train_flops_per_token(N, lora, recompute=True) == 6 * N + 2 * lora


@pytest.mark.parametrize(
    "name, precision, expected",
    [
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "fp16", 756.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),  # not the A10's row
        ("NVIDIA A10G", "fp32", 31.2),
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
        ("NVIDIA GeForce RTX 3090", "fp16", 71.0),
        ("Tesla T4", "fp16", 65.0),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla T4", "bf16", None),  # no bf16 on Turing
        ("Some Future GPU", "bf16", None),
    ],
)
def test_peak_table(name: str, precision: str, expected: float | None) -> None:
    found = peak_tflops(name, precision)
    assert (found[0] if found else None) == expected


def test_rate_for_a_run_on_a_known_gpu_gives_mfu() -> None:
    resolved = {
        "total_params": N,
        "trainable_params": N,
        "precision": "bf16",
        "device": {"cuda": True, "name": "NVIDIA H200"},
        "trainer_config": {"gradient_checkpointing": True},
    }
    rate = FlopsRate.for_run(resolved)
    tokens_per_second = 1e8
    assert rate.tflops(tokens_per_second) == pytest.approx(1e8 * 8 * N / 1e12)
    assert rate.mfu(tokens_per_second) == pytest.approx(1e8 * 6 * N / 989e12)  # recompute is not useful work
    assert rate.peak_label == "H200 bf16 989 TFLOP/s"
    cpu = FlopsRate.for_run({**resolved, "device": {"cuda": False, "name": "cpu"}})
    assert cpu.mfu(tokens_per_second) is None


@pytest.mark.integration
def test_a_run_records_tflops_from_its_tokens_per_second(store: Store, tiny_model: Path) -> None:
    from app.ui.run import RunPageData
    from jobs.train.child import run

    run_id = store.create_run(training_helpers.tiny_spec(tiny_model, max_steps=4, max_length=64))
    store.claim_next_on_device("test", "0")
    assert run(run_id, store) == 0
    record = store.get_run(run_id)
    assert record.status is RunStatus.SUCCEEDED
    rate = FlopsRate.for_run(record.resolved_config)
    trainable, total = record.resolved_config["trainable_params"], record.resolved_config["total_params"]
    assert rate.hardware_per_token == 4 * total + 2 * trainable  # LoRA, no checkpointing
    tps = {p.step: p.value for p in store.metrics(run_id, ["tokens_per_second"])}
    tflops = {p.step: p.value for p in store.metrics(run_id, ["tflops"])}
    assert tps and tflops.keys() == tps.keys()
    for step, value in tflops.items():
        assert value == pytest.approx(tps[step] * rate.hardware_per_token / 1e12)
    assert store.metrics(run_id, ["mfu"]) == []  # the CPU has no peak in the table
    assert record.final_metrics["tflops_mean"] > 0
    header = RunPageData(store).refresh(run_id, None)[0]
    assert "TFLOP/s achieved" in header and "no peak figure known for cpu" in header
