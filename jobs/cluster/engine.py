"""What tunedeck asks of a cluster's scheduler (Slurm, Ray): submit a job, read its state, cancel it.

A dispatcher (`jobs.cluster.dispatch`) claims queued runs from the store and hands each to an
`Engine` as a `Submission`: the command that runs the run (the same training child a local worker
starts, wrapped so that it heartbeats, samples memory and honours cancel like one), its
environment (the store URL and the shared data folder) and what it needs (GPUs, a GPU type, a
node). The engine answers with its own job id; `state` reads the job back in the engine's words,
mapped onto the few `Phase`s the dispatcher acts on:

    PENDING    waiting on the cluster (`reason`: the engine's, e.g. Slurm's "Resources")
    RUNNING    started on a node
    SUCCEEDED  the command exited 0
    FAILED     the command failed, or the engine killed it (out of memory, time limit)
    CANCELLED  cancelled, by tunedeck or by someone outside it (scancel, `ray job stop`)
    REQUEUE    the engine took the node away (preemption, node failure): the run goes back to
               the queue and resumes from its last checkpoint
    GONE       the engine no longer knows the job

Engines hold no state of their own beyond a connection: everything that must survive a
restart of the dispatcher (which run is which job) is in the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol


class Phase(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REQUEUE = "requeue"
    GONE = "gone"

    @property
    def ended(self) -> bool:
        return self not in (Phase.PENDING, Phase.RUNNING)


@dataclass(frozen=True)
class Submission:
    """One run handed to an engine."""

    run_id: int
    name: str  # the engine's job name, e.g. "tunedeck-run-7"
    argv: list[str]  # the command the job runs (on the node, in the shared data folder's world)
    env: dict[str, str]  # added to the job's environment: TUNEDECK_DATABASE_URL, TUNEDECK_HOME, ...
    log_path: Path  # where the job's stdout and stderr go (the run's folder, on the shared data folder)
    gpus: int = 1
    gpu_type: str | None = None  # a GPU type the engine knows (Slurm gres type, Ray custom resource)
    node: str | None = None  # the spec's pin_host: only this node
    extra: dict[str, str] = field(default_factory=dict)  # engine settings (partition, account, time, qos...)


@dataclass(frozen=True)
class JobState:
    """A job as the engine reports it."""

    phase: Phase
    raw: str  # the engine's own state name: "PENDING", "NODE_FAIL", "STOPPED", ...
    reason: str | None = None  # the engine's words for why: "Resources", "TimeLimit", "OutOfMemory"...
    node: str | None = None  # where it runs, once it runs

    def describe(self) -> str:
        """One line for the run page: "PENDING (Resources)"."""
        where = f" on {self.node}" if self.node else ""
        return f"{self.raw}{f' ({self.reason})' if self.reason else ''}{where}"


class EngineError(RuntimeError):
    """The engine refused or could not be reached; the message is the engine's own, with what was asked."""


class Engine(Protocol):
    name: str  # "slurm", "ray": stored with the run, shown on its page

    def submit(self, job: Submission) -> str:
        """Hand the job to the engine; returns the engine's job id. Raises EngineError."""
        ...

    def state(self, job_id: str) -> JobState:
        """The job's state now (GONE when the engine has forgotten it). Raises EngineError."""
        ...

    def cancel(self, job_id: str, signal: str = "KILL") -> None:
        """Signal the job ("TERM": let it save and stop; "KILL": end it). No error if it has ended."""
        ...
