"""The runs a sharing worker trains at once on its device: one thread per run, each watching its own child.

    pool = RunPool(policy, capacity_bytes=facts.total_bytes)
    run = pool.claim(store, worker_id, device, pid, host)      # the next run, if it fits next to the others
    pool.start(run, worker.execute, worker.stop)             # its child, heartbeat, cancel and outcome
    pool.wait_slot(timeout)                                  # until a run ends (or the timeout)
    pool.join()                                              # every run's thread has ended

Each run goes through `Worker.execute` exactly as a lone run does (its own process group, OOM
restarts, outcome); only the claim differs (`storage.store_leases.DeviceShare`), and the bytes each
run reserved give its CUDA cap (`jobs.worker.share.memory_fraction`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from jobs.worker.share import SharePolicy, memory_fraction, reserves
from storage.roles_worker import DeviceClaims
from storage.store import DeviceShare, RunRecord

log = logging.getLogger(__name__)

HEAD = 4  # queued runs whose reservation a claim reads (the head may be taken meanwhile: the next is read)


class RunPool:
    """Runs sharing one device, each in its own thread; see the module docstring."""

    def __init__(self, policy: SharePolicy, capacity_bytes: int) -> None:
        self.policy = policy
        self.capacity_bytes = capacity_bytes
        self.reserved: dict[int, int] = {}  # bytes each shared run reserved at its claim
        self.finished: set[int] = set()
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        self._slot = threading.Event()

    @property
    def active(self) -> list[int]:
        with self._lock:
            return list(self._threads)

    def full(self) -> bool:
        return len(self.active) >= self.policy.limit

    def claim(
        self, store: DeviceClaims, worker_id: str, device: str, pid: int, host: str, skip: Collection[int] = ()
    ) -> RunRecord | None:
        """The next queued run not in `skip`, when it fits on the device next to the runs already there (one
        transaction)."""
        # The claim takes the queue's head for this device: only the first few can be it (a file read each).
        queued = [r for r in store.queued() if r.id not in skip]
        mine = [r for r in queued if r.pin_host in (None, host) and r.pin_device in (None, device)]
        reserve = reserves(store, mine[:HEAD], self.policy)
        share = DeviceShare(limit=self.policy.limit, capacity_bytes=self.capacity_bytes, reserve=reserve)
        run = store.claim_next_on_device(worker_id, device, pid, host=host, share=share, skip=skip)
        if run is not None and run.id in reserve:
            with self._lock:
                self.reserved[run.id] = reserve[run.id]
            log.info("run %s: claimed to share the device, reserving %d bytes", run.id, reserve[run.id])
        return run

    def fraction(self, run_id: int) -> float | None:
        """The CUDA memory fraction of a shared run (None: it runs alone, uncapped)."""
        with self._lock:
            reserved = self.reserved.get(run_id)
        return memory_fraction(reserved, self.capacity_bytes) if reserved is not None else None

    def start(self, run: RunRecord, execute: Callable[[RunRecord], object], on_error: Callable[[str], None]) -> None:
        """Train `run` in a thread of its own (`execute` is `Worker.execute`).

        An error `execute` does not handle would end a lone worker; here it calls `on_error` (the
        worker's `stop`), so the worker stops warm with all its runs, as it would with one."""

        def body() -> None:
            try:
                execute(run)
            except Exception as exc:
                log.exception("run %s: the worker's thread for it failed", run.id)
                on_error(f"the worker's thread for run {run.id} failed ({type(exc).__name__}: {exc})")
            finally:
                with self._lock:
                    self._threads.pop(run.id, None)
                    self.reserved.pop(run.id, None)
                    self.finished.add(run.id)
                self._slot.set()

        thread = threading.Thread(target=body, name=f"run-{run.id}", daemon=True)
        with self._lock:
            self._threads[run.id] = thread
        self._slot.clear()
        thread.start()

    def wait_slot(self, timeout: float) -> None:
        """Sleep until a run ends or `timeout` passes."""
        self._slot.wait(timeout)
        self._slot.clear()

    def join(self) -> None:
        """Wait for every run's thread (a stopping worker has already asked their children to stop)."""
        while True:
            with self._lock:
                threads = list(self._threads.values())
            if not threads:
                return
            for thread in threads:
                thread.join()
