"""The memory already taken on a GPU, and by whom: read from NVML when a run is claimed (never in the
training loop), so a run is not started on a card another tenant has filled.

    room = read_room(0)                      # DeviceRoom(total, free, holders) or None without NVML
    room.available(ours={1234})              # total minus what processes other than ours hold
    room.others_text(ours={1234})            # "pid 4242 (python3) 20.0 GiB"

`ours`: the process ids of tunedeck's own runs on the device (their memory is theirs to share, see
`jobs.worker.share`). Without a process list (some containers, MIG), the memory NVML counts as used
is taken to be the others', less what our processes are known to hold.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from jobs.units import human_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """A process NVML lists on the device; `bytes` None when NVML cannot tell (no permission, MIG)."""

    pid: int
    name: str
    bytes: int | None


@dataclass(frozen=True)
class DeviceRoom:
    total_bytes: int
    free_bytes: int
    holders: tuple[Holder, ...] = ()

    def taken_by_others(self, ours: Collection[int] = ()) -> int:
        """Bytes held by processes that are not ours: their own figures when NVML gives every one, else
        NVML's used memory less what ours hold."""
        others = [h for h in self.holders if h.pid not in ours]
        if self.holders and all(h.bytes is not None for h in self.holders):
            return sum(h.bytes or 0 for h in others)
        mine = sum(h.bytes or 0 for h in self.holders if h.pid in ours)
        return max(0, self.total_bytes - self.free_bytes - mine)

    def available(self, ours: Collection[int] = ()) -> int:
        """What tunedeck's runs may use: the device's memory less what the others hold."""
        return max(0, self.total_bytes - self.taken_by_others(ours))

    def others_text(self, ours: Collection[int] = ()) -> str:
        """The other processes in words, largest first ("" when NVML names none)."""
        others = sorted((h for h in self.holders if h.pid not in ours), key=lambda h: -(h.bytes or 0))
        return ", ".join(
            f"pid {h.pid} ({h.name}){' ' + human_bytes(h.bytes) if h.bytes is not None else ''}" for h in others
        )


def own_pids(children: Iterable[int]) -> set[int]:
    """The training children and everything under them (tunedeck's own runs on the device)."""
    import psutil

    out: set[int] = set()
    for pid in children:
        out.add(pid)
        try:
            out.update(p.pid for p in psutil.Process(pid).children(recursive=True))
        except psutil.Error:  # ended meanwhile
            continue
    return out


def _name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:  # gone, or in another container's process namespace
        return "not visible here"


def _holders(pynvml: Any, handle: Any) -> tuple[Holder, ...]:
    found: dict[int, Holder] = {}
    for reader in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            listed = getattr(pynvml, reader)(handle)
        except pynvml.NVMLError:  # not supported here (MIG, an old driver): no names
            continue
        for proc in listed:
            used = getattr(proc, "usedGpuMemory", None)
            found[int(proc.pid)] = Holder(int(proc.pid), _name(int(proc.pid)), int(used) if used is not None else None)
    return tuple(found.values())


def read_room(index: int) -> DeviceRoom | None:
    """The room on visible CUDA device `index` (as `jobs.devices.probe.nvml_facts` names it); None without NVML."""
    from jobs.devices.visible import visible_entry

    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        entry = visible_entry(pynvml, index)
        if entry is None:
            return None
        handle = (
            pynvml.nvmlDeviceGetHandleByUUID(entry)
            if isinstance(entry, str)
            else pynvml.nvmlDeviceGetHandleByIndex(entry)
        )
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return DeviceRoom(int(info.total), int(info.free), _holders(pynvml, handle))
    except pynvml.NVMLError as exc:
        log.info("no NVML memory figures for device %s: %s", index, exc)
        return None
