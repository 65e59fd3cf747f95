"""GPU types for the cluster executors (jobs.cluster.gpu_types): `--gpu-type` parsed with every problem at
once, and the type each run asks for from its predicted peak. The dispatcher's use of them is in test_slurm."""

from __future__ import annotations

import pytest

from jobs.cluster.gpu_types import MARGIN, GpuType, GpuTypeError, facts_of, parse_gpu_types, pick

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
