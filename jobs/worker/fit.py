"""Which queued runs a worker's device can hold, judged at the claim (issue 32).

The checks judged a run against the largest live worker's device; a worker with a smaller card must
not take it. At each claim the worker reads each queued run's saved prediction (`prediction.json`,
once per run) and compares what it needs with its device: the whole memory (a run that needs more
waits for a worker with a larger device) and the memory other processes leave free now (a run waits
until they let it go, `jobs.devices.room`). The runs that do not fit are passed over by the claim
(`Store.claim_next_on_device(skip=...)`) and stay queued; each gets one event on its page saying why
(again only when the reason changes).

What a run needs: its predicted peak (`jobs.queue.saved_prediction.predicted_bytes`), plus the worker's
share margin when it would share the device (`SharePolicy.reserve`, what sharing reserves); a run that
runs alone needs its peak, as the submit verdict judged it ("tight" runs start). A prediction made
for another kind of device (a CPU prediction, a GPU worker) says nothing of this one: not judged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from jobs.devices.facts import DeviceFacts
from jobs.devices.room import DeviceRoom, own_pids, read_room
from jobs.queue.saved_prediction import load_prediction, predicted_bytes
from jobs.units import human_bytes
from jobs.worker.share import SharePolicy, wants_share
from storage.roles import QueueNotes
from storage.store import RunRecord

log = logging.getLogger(__name__)
EVENT_KIND = "waiting"


def needed_bytes(saved: dict | None, facts: DeviceFacts) -> int | None:
    """The peak a saved prediction names for this kind of device; None when it names none for it."""
    if not saved or (saved.get("device") or {}).get("kind", facts.kind) != facts.kind:
        return None
    return predicted_bytes(saved)


def fit_problem(needed: int, facts: DeviceFacts, room: DeviceRoom | None, ours: Collection[int] = ()) -> str | None:
    """Why a run needing `needed` bytes cannot start on this device now (None: it can)."""
    where = f"{facts.name} ({human_bytes(facts.total_bytes)})"
    if needed > facts.total_bytes:
        return (
            f"needs {human_bytes(needed)}, more than this worker's {where}: it waits for a worker with a larger device"
        )
    if room is None:
        return None
    available = room.available(ours)
    if needed <= available:
        return None
    others = room.others_text(ours)
    held = f" (held by {others})" if others else ""
    return (
        f"needs {human_bytes(needed)}, but other processes leave only {human_bytes(available)} of {where} "
        f"free{held}: it waits until they release it"
    )


@dataclass
class FitGate:
    """The runs this worker passes over at the claim, and the event each gets once per reason.

    `facts`: the worker's device (set once it is probed; until then nothing is judged); `room`: how the
    memory taken on it is read (NVML by default; tests pass device facts of their own)."""

    store: QueueNotes
    worker_id: str
    policy: SharePolicy = field(default_factory=SharePolicy)
    facts: DeviceFacts | None = None
    room: Callable[[], DeviceRoom | None] | None = None
    passed: set[int] = field(default_factory=set)
    _needs: dict[int, int | None] = field(default_factory=dict)
    _said: dict[int, str] = field(default_factory=dict)

    def passed_over(self, host: str, device: str, children: Iterable[int] = ()) -> set[int]:
        """The queued runs (that this host and device may take) the claim must pass over now."""
        if self.facts is None:
            return set()
        mine = [r for r in self.store.queued() if r.pin_host in (None, host) and r.pin_device in (None, device)]
        self.passed = self.skip(mine, self.facts, own_pids(children))
        return self.passed

    def any_queued(self) -> bool:
        """Whether a queued run is left that this worker did not pass over at its last claim."""
        return any(r.id not in self.passed for r in self.store.queued())

    def read_room(self) -> DeviceRoom | None:
        if self.room is not None:
            return self.room()
        return read_room(self.facts.index or 0) if self.facts is not None else None

    def need(self, run: RunRecord, facts: DeviceFacts) -> int | None:
        if run.id not in self._needs:
            peak = needed_bytes(load_prediction(self.store, run.id), facts)
            self._needs[run.id] = (
                self.policy.reserve(peak) if peak and self.policy.enabled and wants_share(run) else peak
            )
        return self._needs[run.id]

    def skip(self, queued: Iterable[RunRecord], facts: DeviceFacts, ours: Collection[int] = ()) -> set[int]:
        """Ids of the queued runs this device cannot hold now; NVML is read only when a run is judged."""
        out: set[int] = set()
        room: list[DeviceRoom | None] = []
        for run in queued:
            needed = self.need(run, facts)
            if needed is None:
                continue
            if not room:
                room.append(self.read_room() if facts.cuda else None)
            problem = fit_problem(needed, facts, room[0], ours)
            if problem is None:
                self._said.pop(run.id, None)
                continue
            out.add(run.id)
            self._tell(run.id, problem, "size" if needed > facts.total_bytes else "taken")
        return out

    def _tell(self, run_id: int, problem: str, reason: str) -> None:
        if self._said.get(run_id) == reason:  # the same reason with new figures is not news
            return
        self._said[run_id] = reason
        message = f"worker {self.worker_id} passes it over: {problem}"
        log.info("run %s: %s", run_id, message)
        try:
            self.store.add_run_event(run_id, EVENT_KIND, message, data={"worker_id": self.worker_id})
        except Exception:  # bookkeeping: the run stays queued either way (it may have been deleted meanwhile)
            log.exception("run %s: could not record why it waits", run_id)
