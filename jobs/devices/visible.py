"""Which NVIDIA devices a process may use: CUDA_VISIBLE_DEVICES (or a worker's own device) as NVML indices.

Shared by the probe (`jobs.devices.probe`) and the sampler (`jobs.devices.sampler`); imports nothing, so
probing the device needs neither the sampler's store nor torch.

    visible_indices(4)              # [0, 1, 2, 3]; with CUDA_VISIBLE_DEVICES=2: [2]
"""

from __future__ import annotations

import os


def visible_indices(count: int, visible: str | None = None) -> list[int]:
    """Devices named by `visible` (a worker's device), else CUDA_VISIBLE_DEVICES, when plain indices; all otherwise."""
    raw = visible if visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() == "":
        return list(range(count))
    try:
        wanted = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:  # UUIDs or MIG ids: do not guess the mapping, show everything
        return list(range(count))
    return [i for i in wanted if 0 <= i < count]
