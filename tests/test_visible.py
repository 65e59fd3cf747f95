"""CUDA_VISIBLE_DEVICES read as CUDA reads it (issue 32): empty hides every GPU, an invalid index ends the
list, UUIDs and MIG ids are looked up in NVML (here a fake lookup), unknown ones are dropped with a warning."""

from __future__ import annotations

import logging

import pytest

from jobs.devices.visible import visible_devices, visible_indices

CARD0, CARD1 = "GPU-8a3f1c22-0000-1111-2222-333344445555", "GPU-8b77aa10-6666-7777-8888-999900001111"
MIG_A, MIG_B = "MIG-1d2e3f40-aaaa-bbbb-cccc-ddddeeeeffff", "MIG-5a6b7c80-aaaa-bbbb-cccc-ddddeeeeffff"
NVML = {CARD0: 0, CARD1: 1, MIG_A: 1, MIG_B: 1}  # two cards; card 1 split into two MIG slices


def lookup() -> dict[str, int]:
    return dict(NVML)


def never() -> dict[str, int]:
    raise AssertionError("NVML was asked for UUIDs although none was named")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, [0, 1, 2, 3]),  # unset: every device
        ("", []),  # set but empty: none (was: every GPU)
        ("  ", []),
        ("2", [2]),
        ("2,0", [2, 0]),  # CUDA's order
        (" 1 , 3 ", [1, 3]),
        ("0,7,1", [0]),  # an index past the last device ends the list
        ("1,-1,2", [1]),
        ("1,1,2", [1]),  # a repeated index too
        ("0,x,1", [0]),  # and anything that is no index
        ("0,,1", [0]),
        ("9", []),
    ],
)
def test_indices_as_cuda_reads_them(raw: str | None, expected: list[int]) -> None:
    assert visible_devices(4, raw, never) == expected
    assert visible_indices(4, raw, never) == expected


def test_the_environment_is_read_when_no_device_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_indices(2) == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_indices(2) == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert visible_indices(2) == [1] and visible_indices(2, visible="0") == [0]  # a worker's own device first


def test_gpu_uuids_map_through_nvml_whole_or_by_unique_prefix() -> None:
    assert visible_devices(2, CARD1, lookup) == [1]
    assert visible_devices(2, f"{CARD1},{CARD0}", lookup) == [1, 0]
    assert visible_devices(2, "GPU-8a3f", lookup) == [0]  # a unique prefix, as CUDA accepts
    assert visible_devices(2, CARD0.upper().replace("GPU-", "gpu-"), lookup) == [0]


def test_mig_ids_keep_their_slice_and_map_to_their_card() -> None:
    assert visible_devices(2, MIG_A, lookup) == [MIG_A]  # the probe reads the slice's own memory
    assert visible_indices(2, MIG_A, lookup) == [1]  # not index 0's whole card (the old fallback)
    assert visible_indices(2, f"{MIG_A},{MIG_B}", lookup) == [1]


def test_unknown_or_ambiguous_uuids_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jobs.devices.visible"):
        assert visible_devices(2, f"GPU-deadbeef,{CARD1}", lookup) == [1]
        assert visible_devices(2, "GPU-8", lookup) == []  # a prefix of both cards
        assert visible_devices(2, MIG_A, None) == []  # no NVML to ask
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and "GPU-deadbeef" in warned[0] and "left out" in warned[0]
