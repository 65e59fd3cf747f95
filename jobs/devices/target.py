"""The device runs will train on: the one a worker published to the store, else this machine's.

In a deployment where the dashboard runs without a GPU (the compose `ui` container) and the
worker runs with one, checks and displays must use the worker's device, not the UI process's.
Each worker detects its `DeviceFacts` when it starts (`jobs.devices.probe.detect`) and publishes
them (`Store.publish_device`, plain JSON); the checks (`jobs.checks.pipeline`) and the GPU panel
read them back with `target(store)`. With no worker registered, `target` falls back to this
machine's facts and says so in its `note`.

    chosen = target(store)                # Target(facts, note, worker_id)
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.devices.facts import DeviceFacts
from storage.roles import WorkerDirectory

LIVE_WITHIN_S = 10.0  # a worker that beat within this many seconds is running


@dataclass(frozen=True)
class Target:
    """The device runs will train on, and where that knowledge comes from."""

    facts: DeviceFacts
    note: str
    worker_id: str | None = None


def _rank(facts: DeviceFacts) -> tuple[bool, int]:
    return facts.cuda, facts.total_bytes


def target(store: WorkerDirectory, local: DeviceFacts | None = None) -> Target:
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
    if local is None:
        from jobs.devices.probe import local_facts

        local = local_facts()
    return Target(local, f"no worker has published its device yet; using this machine's: {local.summary()}")
