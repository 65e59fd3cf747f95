"""The prediction agrees with counted peaks of real training steps (CI-sized subset of bench/memory_truth.py).

The counter itself is checked first: it must see exactly the bytes of the tensors alive.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def test_counter_counts_live_storages_exactly() -> None:
    import torch

    from jobs.memory.count import LiveBytes

    outside = torch.zeros(250)  # created before: invisible until handed over
    with LiveBytes() as counter:
        a = torch.ones(1000)
        b = a * 2
        view = b.view(10, 100)  # a view: no new storage
        b.add_(1)  # in place: no new storage
        assert counter.live == 8000
        counter.track(outside)
        assert counter.live == 9000
        del a
        assert counter.live == 5000
        del b, view
        assert counter.live == 1000 and counter.peak == 9000


def test_counter_sees_quantization_constants() -> None:
    import torch

    from jobs.memory.count import LiveBytes

    class State:  # a stand-in for bitsandbytes' QuantState with a nested state
        absmax, code, offset = torch.zeros(16), torch.zeros(256), None
        state2 = type("S2", (), {"absmax": torch.zeros(4), "code": None, "offset": None, "state2": None})()

    layer = torch.nn.Linear(8, 8, bias=False)
    layer.weight.quant_state = State()
    with LiveBytes() as counter:
        counter.track_module(layer)
    assert counter.peak == 4 * (64 + 16 + 256 + 4)


def test_grid_covers_the_issue_axes() -> None:
    from bench.memory_truth import grid

    cases = grid(full=True)
    assert len(cases) >= 24
    fields = [dict(c.fields) for c in cases]
    assert {f["method"] for f in fields} >= {"full", "lora", "dora", "qlora", "ia3", "prompt_tuning"}
    assert {f["optim"] for f in fields} >= {"adamw_torch", "adamw_bnb_8bit", "adafactor"}
    assert {f["trainer"] for f in fields} == {"sft", "dpo"} and {f["gradient_checkpointing"] for f in fields} == {
        True,
        False,
    }
    assert {f["per_device_train_batch_size"] for f in fields} >= {1, 4} and {f["max_length"] for f in fields} >= {
        64,
        256,
    }
    assert {c.shape for c in cases} >= {"qwen2-tied", "qwen2-untied", "smollm2-135m"}


def test_cuda_table_reads_measurements_without_a_gpu() -> None:
    from bench.memory_truth import SHAPES, case, cuda_table, spec_for
    from jobs.devices.facts import DeviceFacts
    from jobs.memory.parts import arch_from_config
    from jobs.memory.predict import predict

    facts = DeviceFacts(kind="cuda", name="NVIDIA H200", total_bytes=139 * 2**30, bf16=True, fp16=True)
    c = case("qwen2.5-0.5b", "lora", batch=4, length=512, precision="bf16")
    spec = spec_for(c, Path("unused"), Path("unused.jsonl"), Path("out"))
    p = predict(spec, arch_from_config(SHAPES["qwen2.5-0.5b"]), facts)
    reserved = p.total_bytes - 600 * 2**20
    text = cuda_table(
        [
            (
                c.label,
                p,
                {
                    "weights": p.part("weights"),
                    "adapter": p.part("adapter"),
                    "optimizer": p.part("optimizer"),
                    "allocated": reserved,
                    "reserved": reserved,
                    "nvml_peak": p.total_bytes,
                },
            ),
            ("broken", p, {"failed": "CUDA out of memory", "nvml_peak": 0}),
        ]
    )
    assert "+0.0%" in text and "FAILED: CUDA out of memory" in text and "100% of 1 configs within 10%" in text


@pytest.mark.integration
def test_prediction_within_10_percent_of_counted_peaks(tmp_path: Path) -> None:
    """Two real optimizer steps per configuration, counted; the goal of docs/memory.md on the CI subset."""
    from bench.memory_truth import grid, quiet, run_cpu_grid, summary

    quiet()
    rows = run_cpu_grid(grid(full=False), tmp_path)
    share, worst, line = summary(rows)
    detail = "\n".join(f"{r.label}: predicted {r.predicted}, counted {r.measured}, {100 * r.error:+.1f}%" for r in rows)
    assert share >= 0.9 and worst >= -0.25, f"{line}\n{detail}"
