"""Several runs on one device: what a run reserves there, and the memory cap of its training child.

    policy = SharePolicy.parse(limit=4, margin="10%")   # `tunedeck worker --share 4 --share-margin 10%`
    policy.reserve(3 * GIB)                              # 3.3 GiB: the predicted peak plus the margin
    reserves(store, store.queued(), policy)             # {run_id: bytes} of the queued runs that may share
    memory_fraction(3.3 * GIB, 80 * GIB)                 # 0.04125: the child's torch.cuda memory fraction

A run may share when its spec says `share_device: true`, it has a saved prediction
(`jobs.queue.saved_prediction`: its data figure, else the max_length bound) and it has not outgrown a
share before (`run_alone`). The store decides, in the claim's transaction, whether it fits next to
the runs already on the device (`storage.store_leases`). The default policy (limit 1) shares nothing:
one run per device, as before.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

from jobs.queue.saved_prediction import load_prediction, predicted_bytes
from jobs.units import parse_bytes
from storage.roles import RunFolders, ShareRequeue
from storage.store import RunRecord

log = logging.getLogger(__name__)

GIB = 1024**3
DEFAULT_MARGIN = "10%"


class ShareError(ValueError):
    """A --share or --share-margin value that cannot be used: the flag, the problem and the fix."""

    def __init__(self, flag: str, problem: str, fix: str) -> None:
        super().__init__(f"{flag}: {problem}; {fix}")
        self.flag, self.problem, self.fix = flag, problem, fix


@dataclass(frozen=True)
class SharePolicy:
    """At most `limit` runs on the device; each reserves its predicted peak plus a margin (bytes and/or a fraction of it)."""

    limit: int = 1
    margin_bytes: int = 0
    margin_fraction: float = 0.1

    @property
    def enabled(self) -> bool:
        return self.limit > 1

    def reserve(self, predicted: int) -> int:
        """The bytes a run predicted to peak at `predicted` reserves on the device."""
        return int(predicted + self.margin_bytes + math.ceil(self.margin_fraction * predicted))

    @classmethod
    def parse(cls, limit: int = 1, margin: str = DEFAULT_MARGIN) -> SharePolicy:
        """From the worker's flags: `limit` runs per device (>= 1), `margin` as '10%', '2GiB', '512MiB' or '1.5' (GiB)."""
        if limit < 1:
            raise ShareError(
                "--share", f"{limit} is below 1", "give the most runs per device, 1 or more (1: one at a time)"
            )
        text = margin.strip().lower().replace(" ", "")
        if text.endswith("%"):
            try:
                pct = float(text[:-1])
            except ValueError:
                pct = -1.0
            if not 0 <= pct <= 1000:
                raise ShareError(
                    "--share-margin", f"{margin!r} is not 0-1000%", "give a percentage of the prediction, e.g. 10%"
                )
            return cls(limit=limit, margin_bytes=0, margin_fraction=pct / 100)
        size = parse_bytes(text)
        if size is None:
            raise ShareError(
                "--share-margin",
                f"{margin!r} is not a size",
                "give a size (2GiB, 512MiB), or a percentage (10%; 0% for none)",
            )
        return cls(limit=limit, margin_bytes=size, margin_fraction=0.0)


def wants_share(run: RunRecord) -> bool:
    """Whether the run's spec opted in (`share_device: true`) and it never outgrew a share (`run_alone`)."""
    if run.run_alone:
        return False
    try:
        return bool(json.loads(run.spec_json).get("share_device", False))
    except (ValueError, AttributeError):  # unreadable spec: the claim fails it (`spec_problem`), alone
        return False


def reserves(store: RunFolders, runs: Iterable[RunRecord], policy: SharePolicy) -> dict[int, int]:
    """{run_id: bytes reserved} for the runs that may share; the others are left out (they run alone)."""
    out = {}
    for run in runs:
        if not wants_share(run):
            continue
        predicted = predicted_bytes(load_prediction(store, run.id))
        if predicted:
            out[run.id] = policy.reserve(predicted)
    return out


def memory_fraction(reserved: int, total: int) -> float:
    """The share of the device's memory a run's reservation is (torch.cuda.set_per_process_memory_fraction's argument)."""
    if total <= 0:
        raise ShareError("device", "its total memory is unknown", "share only devices whose memory is known")
    return min(1.0, reserved / total)


def requeue_alone(store: ShareRequeue, run_id: int) -> bool:
    """A shared run ran out of memory within its cap, recovery spent: back to the queue, to run alone."""
    why = "ran out of memory within its share of the device; queued again to run alone"
    if not store.requeue_alone(run_id, why):
        return False
    log.warning("run %s %s", run_id, why)
    return True
