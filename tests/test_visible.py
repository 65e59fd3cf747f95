"""CUDA_VISIBLE_DEVICES read as CUDA reads it (issue 32): empty hides every GPU, an invalid index ends the
list, UUIDs and MIG ids are looked up in NVML (here a fake lookup), unknown ones are dropped with a warning."""

from __future__ import annotations

import logging
import sys

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


class FakeNvml:
    """pynvml's calls the probe and the claim use, over two cards; card 1 has MIG slice MIG_A (20 GiB of its 80)."""

    class NVMLError(Exception):
        pass

    GIB = 1024**3

    def __init__(self) -> None:
        self.cards = [("NVIDIA RTX 4090", CARD0, 24), ("NVIDIA H100", CARD1, 80)]

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple:  # noqa: N802
        return ("card", index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple:  # noqa: N802
        if uuid == MIG_A:
            return ("mig", 1)
        return ("card", [c[1] for c in self.cards].index(uuid))

    def nvmlDeviceGetUUID(self, handle: tuple) -> bytes:  # noqa: N802
        return (MIG_A if handle[0] == "mig" else self.cards[handle[1]][1]).encode()

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple) -> int:  # noqa: N802
        if handle[1] == 0:
            raise self.NVMLError("not supported")
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: tuple, slot: int) -> tuple:  # noqa: N802
        if slot == 1:
            raise self.NVMLError("not found")  # an empty slot
        return ("mig", handle[1])

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: tuple) -> tuple:  # noqa: N802
        return ("card", handle[1])

    def nvmlDeviceGetMemoryInfo(self, handle: tuple) -> object:  # noqa: N802
        from types import SimpleNamespace

        total = 20 if handle[0] == "mig" else self.cards[handle[1]][2]
        return SimpleNamespace(total=total * self.GIB, free=(total - 5) * self.GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: tuple) -> list:  # noqa: N802
        from types import SimpleNamespace

        return [SimpleNamespace(pid=999_999_999, usedGpuMemory=5 * self.GIB)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: tuple) -> list:  # noqa: N802
        raise self.NVMLError("not supported")

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple) -> tuple[int, int]:  # noqa: N802
        return (9, 0) if handle[1] == 1 else (8, 9)

    def nvmlDeviceGetName(self, handle: tuple) -> str:  # noqa: N802
        return self.cards[handle[1]][0]

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return "570.00"


def test_the_probe_and_the_room_read_uuids_and_mig_slices_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.devices.probe import nvml_facts
    from jobs.devices.room import read_room
    from jobs.devices.visible import nvml_uuids

    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_uuids(fake)() == {CARD0: 0, CARD1: 1, MIG_A: 1}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", CARD1)
    facts = nvml_facts(0)
    assert facts is not None and facts.name == "NVIDIA H100" and facts.total_bytes == 80 * FakeNvml.GIB
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_A)
    facts = nvml_facts(0)
    assert facts is not None and facts.name == "NVIDIA H100" and facts.total_bytes == 20 * FakeNvml.GIB  # the slice's
    room = read_room(0)
    assert room is not None and room.total_bytes == 20 * FakeNvml.GIB and room.free_bytes == 15 * FakeNvml.GIB
    assert (
        room.taken_by_others() == 5 * FakeNvml.GIB and "pid 999999999 (not visible here) 5.0 GiB" in room.others_text()
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert nvml_facts(0) is None and read_room(0) is None  # no GPU: the CPU's facts take over
