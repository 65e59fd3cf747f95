"""Work a worker carries out beside training, asked for through the store (the dashboard never loads a model).

The dashboard writes a request (an export, a push, a chat turn) to the store; a worker where the
run's weights are picks it up and writes back its progress and result. Each kind of request is a
`Service`: a thread (or a few) the worker starts with its loop and stops with it. A service is
made from the worker's `Place` by a factory; `tunedeck worker` (`app.cli.main`) gives the worker
the factories of every kind of request (`Worker(services=...)`), tests give the ones they test.

Where a request may be carried out: on the host whose worker trained the run (its `worker_id` is
`host:pid`), or on any host when the data folder is shared between the hosts
(`TUNEDECK_SHARED_DATA=1`, e.g. an NFS mount every worker sees at TUNEDECK_HOME): `weights_here`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from storage.roles_worker import WorkerServices
from storage.store import RunRecord

log = logging.getLogger(__name__)

SHARED_DATA_ENV = "TUNEDECK_SHARED_DATA"


@dataclass(frozen=True)
class Place:
    """Where a worker is: what a service needs to know to pick requests it can carry out."""

    store: WorkerServices  # what the services do with the store, all of them (the worker has the whole `Store`)
    worker_id: str
    host: str
    device: str  # the worker's device name (a GPU index or UUID, or a CPU stand-in)
    on_cpu: bool  # the worker trains on the CPU (no GPU lease to respect)
    shared_data: bool  # every host sees the same data folder


class Service(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None:
        """Stop taking requests; finish or abandon (recorded as such) the one under way; return soon."""
        ...

    def pending(self) -> bool:
        """Whether a request this service can carry out is queued or under way (a burst worker waits for it)."""
        ...


Factory = Callable[[Place], Service]


def shared_data() -> bool:
    """TUNEDECK_SHARED_DATA: 1/true/yes means every worker's host sees the same data folder."""
    return os.environ.get(SHARED_DATA_ENV, "").strip().lower() in ("1", "true", "yes")


def run_host(run: RunRecord) -> str | None:
    """The host whose worker trained (or trains) the run: its weights are in that host's data folder."""
    if not run.worker_id:
        return None
    return run.worker_id.rsplit(":", 1)[0].rsplit("@", 1)[-1]  # "host:pid", or a cluster job's "slurm-job@host:pid"


def weights_here(run: RunRecord, place: Place) -> bool:
    """Whether this worker can reach the run's weights: its own host's run, or a shared data folder."""
    return place.shared_data or run_host(run) == place.host


def start_all(place: Place, factories: Sequence[Factory]) -> list[Service]:
    """Start every service; one that fails to start is logged and left out (training goes on)."""
    started: list[Service] = []
    for factory in factories:
        try:
            service = factory(place)
            service.start()
        except Exception:
            log.exception("could not start a worker service (%s)", getattr(factory, "__name__", factory))
            continue
        started.append(service)
    return started


def any_pending(services: Sequence[Service]) -> bool:
    """Whether any service has work queued that it can carry out, or under way (the store's errors propagate)."""
    return any(service.pending() for service in services)


def stop_all(services: list[Service]) -> None:
    for service in services:
        try:
            service.stop()
        except Exception:
            log.exception("stopping the %s service failed", service.name)
