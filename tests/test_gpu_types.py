"""GPU types for the cluster executors (jobs.cluster.gpu_types): `--gpu-type` parsed with every problem at
once, and the type each run asks for from its predicted peak. The dispatcher's use of them is in test_slurm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.checks.memory import predict_memory
from jobs.cluster.gpu_types import MARGIN, GpuType, GpuTypeError, facts_of, parse_gpu_types, pick, predicted_on
from jobs.devices.facts import DeviceFacts
from jobs.spec.job import JobSpec
from jobs.units import human_bytes

GIB = 2**30


def test_one_name_or_sized_types_smallest_first() -> None:
    assert parse_gpu_types(None) == [] and parse_gpu_types("") == []
    assert parse_gpu_types("a100") == [GpuType("a100")]
    assert parse_gpu_types("a100=80GiB, t4=16G@7.5") == [GpuType("t4", 16 * GIB, "7.5"), GpuType("a100", 80 * GIB)]


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(GpuTypeError) as caught:
        parse_gpu_types("a100=lots,h 100=80GiB,t4=16GiB@seven,v100@7.0,a100=40GiB")
    said = str(caught.value)
    assert "'lots' is not a memory size" in said and "write NAME=SIZE, e.g. a100=80GiB" in said
    assert "'h 100' is not a GPU type name" in said
    assert "'seven' is not a compute capability" in said
    assert "'v100@7.0' has a compute capability but no size" in said
    assert "a type is named twice" in said
    assert {p.field for p in caught.value.problems} == {"--gpu-type"}
    with pytest.raises(GpuTypeError, match="t4 has no memory size, so runs cannot be sent to the type that fits"):
        parse_gpu_types("t4,a100=80GiB")


def test_each_run_asks_for_the_smallest_type_that_keeps_the_margin() -> None:
    types = parse_gpu_types("t4=16GiB@7.5,l4=24GiB@8.9,a100=80GiB")
    assert pick([], 5 * GIB) is None
    assert pick(types, 5 * GIB).gpu.name == "t4"
    just = int(MARGIN * 16 * GIB)
    assert pick(types, just).gpu.name == "t4" and pick(types, just + 1).gpu.name == "l4"
    chosen = pick(types, 30 * GIB)
    assert chosen.gpu.name == "a100"
    assert chosen.why == "predicted 30.0 GiB; t4 (16.0 GiB), l4 (24.0 GiB) leave too little"
    assert pick(types, None).why == "no memory prediction was saved with the run: the largest type"
    too_big = pick(types, 200 * GIB)
    assert too_big.gpu.name == "a100" and "more than every type holds" in too_big.why
    assert pick(parse_gpu_types("a100"), 200 * GIB) == pick(parse_gpu_types("a100"), None)  # no sizes: no choice
    assert pick(parse_gpu_types("a100"), None).why is None


def test_the_published_device_is_the_largest_type() -> None:
    facts = facts_of(parse_gpu_types("t4=16GiB@7.5,a100=80GiB"), "login1")
    assert (facts.kind, facts.total_bytes, facts.bf16, facts.compute_capability) == ("cuda", 80 * GIB, True, "8.0")
    assert facts.name == "a100 (cluster GPU type)" and facts.host == "login1"
    assert facts_of(parse_gpu_types("t4=16GiB@7.5")).bf16 is False
    assert facts_of(parse_gpu_types("a100")) is None and facts_of([]) is None


def llama_3b(folder: Path) -> Path:
    """A 3B-parameter Llama's config alone: the predictor reads configs, never weights."""
    folder.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def lora_on_llama_3b(tmp_path: Path) -> JobSpec:
    """A job that needs about 16 GiB on a GPU (bf16 or fp16) and about 34 GiB on the CPU (fp32, resident)."""
    model = llama_3b(tmp_path / "m")
    return JobSpec.from_dict(
        {"model": str(model), "method": "lora", "max_length": 512, "per_device_train_batch_size": 4}
    )


def test_a_prediction_made_on_the_cpu_is_made_again_for_each_types_gpu(tmp_path: Path) -> None:
    """The dashboard's CPU predicts fp32 and resident memory: about twice what a GPU in bf16 or fp16 needs."""
    spec = lora_on_llama_3b(tmp_path)
    on_cpu = predict_memory(spec, DeviceFacts(kind="cpu", name="cpu", total_bytes=64 * GIB)).prediction.total_bytes
    types = parse_gpu_types("t4=16GiB@7.5,l4=24GiB@8.9,a100=80GiB")
    assert pick(types, on_cpu).gpu.name == "a100"  # the CPU's figure alone
    on = predicted_on(spec)
    on_l4 = on(types[1])
    assert on_l4 is not None and on_l4 < on_cpu / 1.5 and on(types[0]) > MARGIN * 16 * GIB
    chosen = pick(types, on_cpu, on)
    assert chosen.gpu.name == "l4"
    assert chosen.why == (
        f"predicted {human_bytes(on_l4)} on l4 (saved at submit: {human_bytes(on_cpu)}); t4 (16.0 GiB) leaves too little"
    )
    assert pick(types, None, on).gpu.name == "l4"  # nothing saved: predicted here all the same
    unknown = predicted_on(JobSpec(model=str(tmp_path / "no-such-model")))  # no config on this host
    assert pick(types, on_cpu, unknown) == pick(types, on_cpu)
