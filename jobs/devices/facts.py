"""The device a worker trains on, as plain facts, published to the store for everyone else to read.

In a deployment where the dashboard runs without a GPU (the compose `ui` container) and the
worker runs with one, checks and displays must use the worker's device, not the UI process's.
Each worker detects its `DeviceFacts` when it starts and publishes them (`Store.publish_device`,
plain JSON); the capability checks at submit (`jobs.queue.submit`) and the GPU panel read them back
with `target(store)`. With no worker registered, `target` falls back to this machine's facts and
says so in its `note`.

Detection asks NVML first: it needs no CUDA context, so the worker process does not claim GPU
memory for itself. torch is asked only where NVML is missing and the process has already
imported torch (the training child, not the worker).

    facts = detect()                      # DeviceFacts(kind="cuda", name="NVIDIA H200", ...)
    store.publish_device(worker_id, facts.host, facts.to_dict())
    chosen = target(store)                # Target(facts, note, worker_id)
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass, fields
from typing import Any

from jobs.config.mapping import Device

LIVE_WITHIN_S = 10.0  # a worker that beat within this many seconds is running


@dataclass(frozen=True)
class DeviceFacts:
    kind: str  # "cuda" | "cpu"
    name: str  # "NVIDIA H200" | "cpu"
    total_bytes: int  # GPU memory; host RAM on CPU
    compute_capability: str | None = None  # "9.0"
    bf16: bool = False
    fp16: bool = False
    driver: str | None = None
    host: str = ""
    index: int | None = None  # CUDA device index on its host

    @property
    def cuda(self) -> bool:
        return self.kind == "cuda"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceFacts:
        """Facts from plain data; keys a newer tunedeck added are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> DeviceFacts:
        return cls.from_dict(json.loads(text))

    def device(self) -> Device:
        """The mapping's view of this device (what the capability checks take)."""
        cc = tuple(int(x) for x in self.compute_capability.split(".")) if self.compute_capability else None
        return Device(cuda=self.cuda, bf16=self.bf16, compute_capability=cc, name=self.name)  # type: ignore[arg-type]

    def summary(self) -> str:
        """'NVIDIA H200 (cuda:0 on gpu-box), 139.8 GiB, compute 9.0, bf16' or 'cpu on laptop, 31.2 GiB RAM'."""
        gib = self.total_bytes / 1024**3
        if not self.cuda:
            return f"cpu on {self.host or 'this machine'}, {gib:.1f} GiB RAM"
        where = f"cuda:{self.index if self.index is not None else 0}" + (f" on {self.host}" if self.host else "")
        extras = [f"compute {self.compute_capability}"] if self.compute_capability else []
        extras += ["bf16"] if self.bf16 else ["no bf16"]
        extras += [f"driver {self.driver}"] if self.driver else []
        return f"{self.name} ({where}), {gib:.1f} GiB, " + ", ".join(extras)


def cpu_facts() -> DeviceFacts:
    import psutil

    return DeviceFacts(
        kind="cpu", name="cpu", total_bytes=int(psutil.virtual_memory().total), host=socket.gethostname()
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_facts(index: int) -> DeviceFacts | None:
    """Facts of visible CUDA device `index` from NVML; None without NVML or such a device."""
    try:
        import pynvml

        from jobs.devices.sampler import _visible_indices  # CUDA_VISIBLE_DEVICES -> NVML's physical indices

        pynvml.nvmlInit()
        visible = _visible_indices(pynvml.nvmlDeviceGetCount())
        if index >= len(visible):
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(visible[index])
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return DeviceFacts(
            kind="cuda",
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=f"{major}.{minor}",
            bf16=major >= 8,
            fp16=True,
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            host=socket.gethostname(),
            index=index,
        )
    except Exception:  # noqa: BLE001 - pynvml missing, NVMLError_LibraryNotFound, ...: no NVML facts
        return None


def _torch_facts(index: int) -> DeviceFacts | None:
    """Facts from torch, only when NVML gave none and this process already imported torch (the
    worker does not: importing it costs seconds, and CUDA must not be initialised there)."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch

        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        props = torch.cuda.get_device_properties(index)
        return DeviceFacts(
            kind="cuda",
            name=props.name,
            total_bytes=int(props.total_memory),
            compute_capability=f"{props.major}.{props.minor}",
            bf16=props.major >= 8,
            fp16=True,
            driver=None,
            host=socket.gethostname(),
            index=index,
        )
    except Exception:  # noqa: BLE001
        return None


def detect(index: int | None = None) -> DeviceFacts:
    """This machine's device: CUDA device `index` (default: TUNEDECK_DEVICE when a number, else 0), else the CPU."""
    if index is None:
        raw = os.environ.get("TUNEDECK_DEVICE", "0")
        index = int(raw) if raw.isdigit() else 0
    return _nvml_facts(index) or _torch_facts(index) or cpu_facts()


@functools.lru_cache(maxsize=1)
def local_facts() -> DeviceFacts:
    """This process's device, detected once (the dashboard asks every second)."""
    return detect()


# ---------------------------------------------------------------------- reading published facts
@dataclass(frozen=True)
class Target:
    """The device runs will train on, and where that knowledge comes from."""

    facts: DeviceFacts
    note: str
    worker_id: str | None = None


def _rank(facts: DeviceFacts) -> tuple[bool, int]:
    return facts.cuda, facts.total_bytes


def target(store: Any, local: DeviceFacts | None = None) -> Target:
    """The device of the running worker with the largest GPU; else the last published; else this machine's."""
    published = store.published_devices()
    live = {w.get("worker_id") for w in store.live_workers(within_s=LIVE_WITHIN_S)}
    running = [p for p in published if p["worker_id"] in live]
    if running:
        best = max(running, key=lambda p: _rank(DeviceFacts.from_dict(p["facts"])))
        facts = DeviceFacts.from_dict(best["facts"])
        return Target(facts, f"worker {best['worker_id']}: {facts.summary()}", best["worker_id"])
    if published:
        last = published[0]
        facts = DeviceFacts.from_dict(last["facts"])
        return Target(
            facts, f"worker {last['worker_id']} (not running now; last published): {facts.summary()}", last["worker_id"]
        )
    facts = local or local_facts()
    return Target(facts, f"no worker has published its device yet; using this machine's: {facts.summary()}")
