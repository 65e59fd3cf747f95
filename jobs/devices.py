"""The facts about a training device that memory predictions and capability checks need.

    facts = local_facts()          # this machine: the first CUDA device, else the CPU
    facts.total_bytes, facts.bf16
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceFacts:
    kind: str                        # "cuda" | "cpu"
    name: str                        # "NVIDIA H200" | "cpu"
    total_bytes: int                 # GPU memory; host RAM on CPU
    compute_capability: str | None = None   # "9.0"
    bf16: bool = False
    fp16: bool = False
    driver: str | None = None
    host: str = ""
    index: int | None = None          # CUDA device index on its host


def cpu_facts() -> DeviceFacts:
    """The host as a training device: its RAM is the memory a run may use."""
    import os
    import socket

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX host
        total = 0
    return DeviceFacts(kind="cpu", name="cpu", total_bytes=int(total), host=socket.gethostname())


def local_facts() -> DeviceFacts:
    """This machine's first CUDA device (through torch), else the CPU."""
    import socket

    import torch

    if not torch.cuda.is_available():
        return cpu_facts()
    props = torch.cuda.get_device_properties(0)
    return DeviceFacts(kind="cuda", name=props.name, total_bytes=int(props.total_memory),
                       compute_capability=f"{props.major}.{props.minor}", bf16=bool(torch.cuda.is_bf16_supported()),
                       fp16=True, driver=torch.version.cuda, host=socket.gethostname(), index=0)
