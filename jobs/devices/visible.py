"""Which NVIDIA devices a process may use: CUDA_VISIBLE_DEVICES (or a worker's own device) read as
CUDA reads it, as NVML indices.

Shared by the probe (`jobs.devices.probe`) and the sampler (`jobs.devices.sampler`); imports nothing
heavy, so probing the device needs neither the sampler's store nor torch.

    visible_indices(4)              # [0, 1, 2, 3]; with CUDA_VISIBLE_DEVICES=2: [2]

The forms, as CUDA reads them:
- unset: every device; set but empty (`CUDA_VISIBLE_DEVICES=""`): none;
- indices `2,0`: those, in that order; an invalid one (out of range, negative, repeated, not a
  number) ends the list there, as CUDA does (`0,7,1` on a 4-GPU host is `[0]`);
- UUIDs `GPU-8a3f...` (a unique prefix is enough) and MIG ids `MIG-...` are looked up among NVML's
  devices (`uuids`: UUID -> NVML index; a MIG slice maps to its card); an unknown or ambiguous one is
  dropped with a warning. `visible_devices` keeps a MIG id as its UUID so the probe can read the
  slice's own memory rather than the whole card's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

UuidLookup = Callable[[], Mapping[str, int]]


def _uuid_match(token: str, uuids: Mapping[str, int]) -> str | None:
    """The one NVML UUID `token` names (itself or a unique prefix, case-insensitive); None otherwise."""
    wanted = token.lower()
    found = [u for u in uuids if u.lower() == wanted] or [u for u in uuids if u.lower().startswith(wanted)]
    return found[0] if len(found) == 1 else None


def visible_devices(count: int, visible: str | None = None, uuids: UuidLookup | None = None) -> list[int | str]:
    """The devices `visible` (a worker's device), else CUDA_VISIBLE_DEVICES, lets a process use: NVML indices,
    and the UUID of each MIG slice named. `uuids` is called only when a UUID or MIG id appears."""
    raw = visible if visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count))
    out: list[int | str] = []
    known: Mapping[str, int] | None = None
    for token in (t.strip() for t in raw.split(",")):
        if token.upper().startswith(("GPU-", "MIG-")):
            known = known if known is not None else (uuids() if uuids is not None else {})
            match = _uuid_match(token, known)
            if match is None:
                log.warning(
                    "CUDA_VISIBLE_DEVICES names %r, which NVML does not know (or is ambiguous): left out", token
                )
                continue
            entry: int | str = match if match.upper().startswith("MIG-") else known[match]
        else:
            try:
                entry = int(token)
            except ValueError:
                break  # CUDA stops at the first entry it cannot read ("" included: "0,,1" is [0])
            if not 0 <= entry < count:
                break
        if entry in out:
            break
        out.append(entry)
    return out


def visible_indices(count: int, visible: str | None = None, uuids: UuidLookup | None = None) -> list[int]:
    """`visible_devices` as NVML card indices (a MIG slice as its card's index, once)."""
    out: list[int] = []
    known: Mapping[str, int] = {}
    for entry in visible_devices(count, visible, uuids):
        if isinstance(entry, str):
            known = known or (uuids() if uuids is not None else {})
            entry = known[entry]
        if entry not in out:
            out.append(entry)
    return out


def nvml_uuids(pynvml: Any) -> Callable[[], dict[str, int]]:
    """A `uuids` lookup reading NVML (already initialised): each card's UUID and its MIG slices' -> card index."""

    def lookup() -> dict[str, int]:
        found: dict[str, int] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            found[_text(pynvml.nvmlDeviceGetUUID(handle))] = index
            try:
                slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
            except pynvml.NVMLError:  # no MIG on this card or driver
                continue
            for slot in range(slots):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except pynvml.NVMLError:  # an empty slot
                    continue
                found[_text(pynvml.nvmlDeviceGetUUID(mig))] = index
        return found

    return lookup


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_entry(nvml: Any, index: int) -> int | str | None:
    """Visible CUDA device `index` as NVML names it (an NVML index, or a GPU-/MIG- id), None when fewer are
    visible; call after `nvmlInit`. The probe and the claim's room both start here."""
    visible = visible_devices(nvml.nvmlDeviceGetCount(), uuids=nvml_uuids(nvml))
    return visible[index] if index < len(visible) else None
