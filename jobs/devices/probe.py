"""Asking this machine what device it has: the one module that probes CUDA, NVML and the host.

- `detect(index)`: the `DeviceFacts` of CUDA device `index`, else the CPU. NVML is asked first: it
  needs no CUDA context, so the worker process does not claim GPU memory for itself. torch is
  asked only where NVML is missing and the process has already imported torch (the training child,
  not the worker). `local_facts()` is the same, detected once per process, with the runtime baseline
  this host's worker measured, when it is cached (`cached_baseline`; the check path never
  spawns the measurement).
- `runtime_key()` / `cached_baseline()` / `remember_baseline(b)`: the cache of the training
  child's runtime baseline (`jobs.train.baseline`, measured by `jobs.worker.runtime`: its runtime_bytes and
  trainer_bytes), one JSON file `$TUNEDECK_HOME/cache/runtime.json` with an entry per host and interpreter,
  valid while the versions of python, torch, transformers, trl, peft, datasets and tunedeck stay the same. An
  entry written before the baseline measured each trainer's own classes (no trainer_bytes) is measured again.
- `detect_device()`: the capability view (`Device`) of the device the training process uses, from
  torch itself (bf16 support as torch reports it); only the training child calls it.
- `gpu_info()` / `has_cuda()`: every visible NVIDIA GPU (NVML, through `jobs.devices.sampler`), or
  why there is none, for the dashboard's GPU panel; never imports torch into the web server.

Checks and displays use the device a run will meet (`jobs.devices.target`), which is this
machine's only while no worker has published its own.

    facts = detect()                      # DeviceFacts(kind="cuda", name="NVIDIA H200", ...)
    device = detect_device()              # Device(cuda=True, bf16=True, ...) in the training child
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from jobs.devices.facts import CPU, Device, DeviceFacts, RuntimeBaseline
from jobs.units import parse_bytes
from storage.settings import cache_dir

log = logging.getLogger(__name__)


CPU_MEMORY_ENV = "TUNEDECK_CPU_MEMORY"  # the memory a CPU worker trains in (e.g. 8GiB); default: the host's RAM


def cpu_facts() -> DeviceFacts:
    """The CPU as a device: the host's RAM, or less when TUNEDECK_CPU_MEMORY says so (a host shared with other
    work); the memory prediction refuses what will not fit in it."""
    import psutil

    total = int(psutil.virtual_memory().total)
    budget = parse_bytes(os.environ.get(CPU_MEMORY_ENV) or None)
    if budget:
        total = min(total, budget)
    return DeviceFacts(kind="cpu", name="cpu", total_bytes=total, host=socket.gethostname())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_facts(index: int) -> DeviceFacts | None:
    """Facts of visible CUDA device `index` from NVML; None without NVML or such a device. A MIG slice
    (CUDA_VISIBLE_DEVICES=MIG-...) has its own memory and its card's name and capability."""
    from jobs.devices.visible import visible_entry  # CUDA_VISIBLE_DEVICES -> NVML's devices

    try:
        import pynvml
    except ImportError:  # nvidia-ml-py not installed: no NVML facts
        return None
    try:
        pynvml.nvmlInit()
        entry = visible_entry(pynvml, index)
        if entry is None:
            return None
        if isinstance(entry, str):
            handle = pynvml.nvmlDeviceGetHandleByUUID(entry)
            card = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        else:
            handle = card = pynvml.nvmlDeviceGetHandleByIndex(entry)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(card)
        return DeviceFacts(
            kind="cuda",
            name=_text(pynvml.nvmlDeviceGetName(card)),
            total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            compute_capability=f"{major}.{minor}",
            bf16=major >= 8,
            fp16=True,
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            host=socket.gethostname(),
            index=index,
        )
    # NVML's own errors only (the base of NVMLError_LibraryNotFound, _DriverNotLoaded, ...): no NVML
    # facts, torch's or the CPU's instead. A bug here must not quietly turn a GPU into a CPU.
    except pynvml.NVMLError:
        return None


def torch_facts(index: int) -> DeviceFacts | None:
    """Facts from torch, only when this process already imported torch (the worker does not:
    importing it costs seconds, and CUDA must not be initialised there)."""
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
    # torch raises RuntimeError for a broken CUDA install or device (torch.AcceleratorError is one):
    # no torch facts, the CPU's instead
    except RuntimeError:
        return None


def detect(index: int | None = None) -> DeviceFacts:
    """This machine's device: CUDA device `index` (default: TUNEDECK_DEVICE when a number, else 0), else the CPU."""
    if index is None:
        raw = os.environ.get("TUNEDECK_DEVICE", "0")
        index = int(raw) if raw.isdigit() else 0
    return nvml_facts(index) or torch_facts(index) or cpu_facts()


@functools.lru_cache(maxsize=1)
def local_facts() -> DeviceFacts:
    """This process's device, detected once (the dashboard asks every second), with the cached runtime baseline."""
    return detect().with_baseline(cached_baseline())


# What the baseline depends on: an upgrade of any of these measures it again. Edits to tunedeck
# that keep its version do not; delete the cache file to measure again.
RUNTIME_PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "tunedeck")


def runtime_cache_path() -> Path:
    return cache_dir() / "runtime.json"


def runtime_key() -> dict[str, str]:
    """What a cached baseline was measured with: host, interpreter and the versions of the packages it imports."""

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    key = {"host": socket.gethostname(), "executable": sys.executable, "python": platform.python_version()}
    return key | {name: version(name) for name in RUNTIME_PACKAGES}


def _runtime_entries(path: Path) -> list[dict[str, Any]]:
    """The cache file's entries; none when it is missing or unreadable (it is measured and written again)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):  # unreadable or not JSON (edited by hand): measured again, then replaced
        log.warning("ignoring the unreadable runtime cache %s", path, exc_info=True)
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def cached_baseline(key: dict[str, str] | None = None) -> RuntimeBaseline | None:
    """The cached baseline measured with `key` (default: this host and interpreter now); None when there is none.

    An entry without trainer_bytes was written by a tunedeck whose baseline did not measure each trainer's own
    trl classes: it counts as none, so the worker measures again (seconds, once) rather than leave them unknown."""
    key = key or runtime_key()
    for entry in _runtime_entries(runtime_cache_path()):
        if entry.get("key") == key and "trainer_bytes" in entry:
            found = RuntimeBaseline.from_dict(entry)
            if found is not None:
                return found
    return None


def remember_baseline(baseline: RuntimeBaseline, key: dict[str, str] | None = None) -> None:
    """Cache a measured baseline; it replaces the entry of the same host and interpreter (older versions)."""
    key = key or runtime_key()
    path = runtime_cache_path()
    same = {"host": key["host"], "executable": key["executable"]}
    kept = [e for e in _runtime_entries(path) if {k: (e.get("key") or {}).get(k) for k in same} != same]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # written whole, then renamed: readers never see half
    partial.write_text(json.dumps({"entries": [*kept, {"key": key, **baseline.to_dict()}]}, indent=1))
    os.replace(partial, path)


def detect_device() -> Device:
    """What the first visible CUDA device supports, as torch reports it (the training child, which trains
    with torch, asks here; bf16 is torch's `is_bf16_supported`)."""
    import torch

    if not torch.cuda.is_available():
        return CPU
    return Device(
        cuda=True,
        bf16=bool(torch.cuda.is_bf16_supported()),
        compute_capability=tuple(torch.cuda.get_device_capability(0)),  # type: ignore[arg-type]
        name=torch.cuda.get_device_name(0),
    )


@functools.lru_cache(maxsize=1)
def gpu_info() -> Any:
    """`jobs.devices.sampler.DeviceInfo` of this machine's GPUs (or why there are none), probed once per
    process; None when NVML started and then failed to list them."""
    from jobs.devices.sampler import GpuProbe

    probe = GpuProbe()  # NVML missing or failing to start is no error: the probe says why (`reason`)
    if not probe.has_gpu:
        return probe.device_info()  # the reason and the host's memory: NVML is not asked
    import pynvml

    try:
        return probe.device_info()
    except pynvml.NVMLError:  # NVML started, then failed (a GPU fell off the bus): the panel shows the host note
        log.warning("NVML failed while listing the GPUs", exc_info=True)
        return None


def has_cuda() -> bool:
    """Whether this machine has an NVIDIA GPU (NVML), without importing torch into the web server."""
    info = gpu_info()
    return info is not None and bool(getattr(info, "available", False))
