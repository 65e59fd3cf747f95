"""Device memory sampling: NVML when there is an NVIDIA GPU, the host's RAM otherwise.

`GpuProbe` reads one sample of every visible GPU (used/total bytes, utilization, temperature,
power) through NVML (`import pynvml`, the nvidia-ml-py binding). Without a GPU it remembers
why (e.g. "no NVIDIA GPU: NVML Shared Library Not Found"), logs that once, and samples the
training process tree's RSS against the machine's RAM instead (source "host"; 0 when idle).

`Sampler` is a daemon thread started by the worker: once a second while a run is active (every
`idle_interval` seconds otherwise) it writes samples to the store, a few per transaction, and
at the end of each run records the run's peak with `store.set_peak_memory`.

    probe = GpuProbe()
    print(probe.device_info().summary())
    points = probe.sample(run_id=None, child_pid=None)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psutil

from jobs.devices.visible import nvml_uuids, visible_indices
from storage.models import MemorySource
from storage.roles import MemoryRecord
from storage.settings import idle_memory_retention_s
from storage.store import MemoryPoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    total_bytes: int


@dataclass(frozen=True)
class DeviceInfo:
    """What the UI shows about the machine's accelerators (or why there are none)."""

    available: bool
    reason: str | None = None
    driver: str | None = None
    devices: tuple[GpuDevice, ...] = ()
    host_total_bytes: int = 0

    def summary(self) -> str:
        """One line per device, or the reason there is none."""
        gib = 1024**3
        if not self.available:
            return f"{self.reason}; sampling host RAM ({self.host_total_bytes / gib:.1f} GiB)"
        lines = [f"GPU {d.index}: {d.name}, {d.total_bytes / gib:.1f} GiB" for d in self.devices]
        return "\n".join(lines + [f"NVIDIA driver {self.driver}"])


class ProcessTree:
    """Resident memory of a process and all its descendants, read cheaply once a second.

    The descendants are looked up (a walk over every process of the machine) only every
    `refresh_s` seconds; each reading in between costs one /proc read per process of the tree."""

    def __init__(self, pid: int, refresh_s: float = 10.0) -> None:
        self.pid = pid
        self.refresh_s = refresh_s
        self._procs: list[psutil.Process] = []
        self._looked_up = float("-inf")

    def rss(self) -> int:
        """Bytes resident now (0 when the process is gone)."""
        now = time.monotonic()
        if now - self._looked_up >= self.refresh_s or not self._procs:
            try:
                root = psutil.Process(self.pid)
                self._procs = [root, *root.children(recursive=True)]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._procs = []
                return 0
            self._looked_up = now
        total, alive = 0, []
        for p in self._procs:
            try:
                total += p.memory_info().rss
                alive.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        if not alive or alive[0] is not self._procs[0]:
            self._procs = []  # the root is gone: nothing of the tree counts any more
            return 0
        self._procs = alive
        return total


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuProbe:
    """Reads device memory; NVML is initialised once, its absence is remembered once."""

    def __init__(self, visible: str | None = None) -> None:
        self.reason: str | None = None
        self._nvml: Any = None
        self._handles: list[tuple[int, Any]] = []
        self._tree: ProcessTree | None = None  # the sampled child's process tree, kept between samples
        try:
            import pynvml
        except ImportError as exc:
            self.reason = f"no NVIDIA GPU: pynvml is not installed ({exc})"
        else:
            try:
                pynvml.nvmlInit()
                count = pynvml.nvmlDeviceGetCount()
                wanted = visible_indices(count, visible, nvml_uuids(pynvml))
                self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in wanted]
                self._nvml = pynvml
                if not self._handles:
                    self.reason = "no NVIDIA GPU: NVML sees no visible device"
                    self._nvml = None
            except pynvml.NVMLError as exc:  # the base of NVMLError_LibraryNotFound, _DriverNotLoaded, ...
                self.reason = f"no NVIDIA GPU: {_text(exc) or type(exc).__name__}"
        if self.reason:
            log.info("%s; memory graphs show host RAM of the training process tree", self.reason)

    @property
    def has_gpu(self) -> bool:
        return self._nvml is not None

    def device_info(self) -> DeviceInfo:
        host_total = psutil.virtual_memory().total
        if not self.has_gpu:
            return DeviceInfo(False, reason=self.reason, host_total_bytes=host_total)
        nv = self._nvml
        devices = []
        for index, handle in self._handles:
            devices.append(
                GpuDevice(index, _text(nv.nvmlDeviceGetName(handle)), int(nv.nvmlDeviceGetMemoryInfo(handle).total))
            )
        return DeviceInfo(
            True, driver=_text(nv.nvmlSystemGetDriverVersion()), devices=tuple(devices), host_total_bytes=host_total
        )

    def sample(self, run_id: int | None, child_pid: int | None) -> list[MemoryPoint]:
        """One point per GPU (source nvml), or one host point; cheap (~tens of us per device)."""
        now = time.time()
        rss = (self._tree_of(child_pid).rss() or None) if child_pid is not None else None
        if not self.has_gpu:
            if child_pid is not None and rss is None:
                return []  # the child has just exited: a 0-byte point would only be noise
            vm = psutil.virtual_memory()
            # RAM of the training process tree; idle: 0 (no training process), so the graph keeps
            # one meaning instead of jumping to whatever else the machine runs.
            used = rss or 0
            return [
                MemoryPoint(
                    time=now,
                    source=MemorySource.HOST.value,
                    run_id=run_id,
                    used_bytes=used,
                    total_bytes=vm.total,
                    process_rss=rss,
                )
            ]
        nv = self._nvml
        points = []
        for index, handle in self._handles:
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            points.append(
                MemoryPoint(
                    time=now,
                    source=MemorySource.NVML.value,
                    run_id=run_id,
                    device_index=index,
                    used_bytes=int(mem.used),
                    total_bytes=int(mem.total),
                    utilization=_optional(nv, lambda h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu), handle),
                    temperature=_optional(
                        nv, lambda h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), handle
                    ),
                    power_watts=_optional(nv, lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0, handle),
                    process_rss=rss,
                )
            )
        return points

    def _tree_of(self, pid: int) -> ProcessTree:
        if self._tree is None or self._tree.pid != pid:
            self._tree = ProcessTree(pid)
        return self._tree


def _optional(nv: Any, read: Callable[[Any], float], handle: Any) -> float | None:
    """`read(handle)`; some readings are unsupported on some boards (MIG, passive cooling): None, not an error."""
    try:
        return read(handle)
    except nv.NVMLError:  # NVMLError_NotSupported and its kin: NVML's own answer that there is no such reading
        return None


@dataclass
class _RunPeak:
    run_id: int
    peak: int = 0
    source: str = MemorySource.HOST.value


class Sampler(threading.Thread):
    """Background thread writing memory samples for the current run (or None when idle)."""

    def __init__(
        self,
        store: MemoryRecord,
        probe: GpuProbe | None = None,
        interval: float = 1.0,
        idle_interval: float = 5.0,
        batch_size: int = 3,
        retention_s: float | None = None,
        thin_every_s: float = 600.0,
        worker_id: str | None = None,
    ) -> None:
        super().__init__(name="tunedeck-sampler", daemon=True)
        self.store = store
        self.worker_id = worker_id  # stamped on every sample: whose device it is
        self.probe = probe or GpuProbe()
        self.interval = interval
        self.idle_interval = idle_interval
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._run: _RunPeak | None = None
        self._child_pid: int | None = None
        self._buffer: list[MemoryPoint] = []
        self._stop_event = threading.Event()
        self._wake = threading.Event()
        self.retention_s = retention_s if retention_s is not None else idle_memory_retention_s()
        self.thin_every_s = thin_every_s
        self._last_thin = 0.0

    # -- called by the worker -------------------------------------------------
    def set_run(self, run_id: int | None, child_pid: int | None = None) -> None:
        """Switch the sampled run; finishing a run flushes its samples and records its peak."""
        with self._lock:
            previous = self._run
            self._run = _RunPeak(run_id) if run_id is not None else None
            self._child_pid = child_pid
        if previous is not None and (run_id is None or previous.run_id != run_id):
            self._finish(previous)
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self._wake.set()
        if self.is_alive():
            self.join(timeout)
        with self._lock:
            previous, self._run = self._run, None
        if previous is not None:
            self._finish(previous)
        self._flush()

    # -- the thread -------------------------------------------------------------
    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.sample_once()
            # a thread boundary: a sampling hiccup (NVML, psutil, the store) is logged with its traceback
            # and must never take the worker down; the next tick tries again
            except Exception:
                log.exception("memory sampling failed")
            with self._lock:
                active = self._run is not None
            if not active:
                self.thin_idle(time.time())
            self._wake.wait(self.interval if active else self.idle_interval)
            self._wake.clear()

    def sample_once(self) -> list[MemoryPoint]:
        """Take one sample now, track the peak, write when the batch is full."""
        with self._lock:
            run, child_pid = self._run, self._child_pid
        points = self.probe.sample(run.run_id if run else None, child_pid)
        if self.worker_id is not None:
            points = [replace(p, worker_id=self.worker_id) for p in points]
        with self._lock:
            if run is not self._run:
                return []  # the run ended while sampling: its peak is already recorded
            if run is not None:
                for p in points:
                    if p.used_bytes is not None and p.used_bytes > run.peak:
                        run.peak, run.source = p.used_bytes, p.source
            self._buffer.extend(points)
            full = len(self._buffer) >= self.batch_size * max(1, len(points))
        if full or run is None:
            self._flush()
        return points

    def thin_idle(self, now: float) -> int:
        """Every `thin_every_s`, thin idle samples older than the retention window (one a minute stays)."""
        if now - self._last_thin < self.thin_every_s:
            return 0
        self._last_thin = now
        try:
            return self.store.thin_idle_memory(now - self.retention_s)
        except Exception:  # bookkeeping on the sampler's thread: logged with its traceback, never takes the worker down
            log.exception("thinning idle memory samples failed")
            return 0

    def _flush(self) -> None:
        with self._lock:
            batch, self._buffer = self._buffer, []
        if batch:
            self.store.add_memory_samples(batch)

    def _finish(self, run: _RunPeak) -> None:
        self._flush()
        if run.peak > 0:
            self.store.set_peak_memory(run.run_id, run.peak, run.source)
