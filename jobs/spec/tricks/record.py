"""What a memory trick declares (`TrickRecord`), and what its sweep step returns (`Applied` / `NotApplicable`).

A record's hooks default to "nothing": a trick fills only those it has. Nothing here touches a device,
a file or the database; the device comes in as anything with a `cuda` flag (`jobs.devices.facts.Device`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from jobs.errors import Problem

# The spec (`jobs.spec.job.JobSpec`), generic here: importing it would lengthen every import chain through the
# registry by one, over tests/test_layers.py's bound. The trick modules take and return JobSpec.
S = TypeVar("S")
JobSpec = Any


class HasCuda(Protocol):
    """The one device fact the tricks' checks read (`jobs.devices.facts.Device` has it)."""

    @property
    def cuda(self) -> bool: ...


@dataclass(frozen=True)
class Applied(Generic[S]):
    spec: S
    note: str  # what changed, in words: "micro-batch 16 x 1 -> 8 x 2"


@dataclass(frozen=True)
class NotApplicable:
    reason: str


Packages = tuple[tuple[str, str], ...]  # (python module, pip requirement) pairs


def _no_kwargs(spec: JobSpec) -> dict[str, Any]:
    return {}


def _no_device_problems(spec: JobSpec, device: HasCuda) -> list[Problem]:
    return []


def _no_problems(spec: JobSpec) -> list[Problem]:
    return []


def _no_warnings(spec: JobSpec, device: HasCuda) -> list[str]:
    return []


def _no_packages(spec: JobSpec) -> dict[str, Packages]:
    return {}


@dataclass(frozen=True)
class Speed:
    """A trick's tokens/s relative to without it, for Fit to GPU's ranking (`jobs.memory.planner`)."""

    field: str  # the boolean spec field that turns it on
    kind: str  # the device kind it applies on: "cuda" or "cpu"
    factor: float
    source: str  # measured or published, where


@dataclass(frozen=True)
class DocsRow:
    """One row of docs/memory.md's table of tricks (`jobs.spec.tricks.registry.docs_table` renders them)."""

    trick: str  # in words: "gradient checkpointing"
    field: str  # the spec setting that turns it on, as the docs write it: "`optim: adamw_bnb_8bit`"
    memory: str  # what it saves
    speed: str  # what it costs or gains
    source: str  # "published (who, on what)" or "measured here (which bench)"


@dataclass(frozen=True)
class TrickRecord:
    """One memory trick, as the form, the checks, the mapping, the predictor, the planner and the docs read it."""

    name: str  # as the docs and the sweep name it
    fields: tuple[str, ...]  # the spec fields it owns (declared in jobs.spec.sections.memory)
    summary: str  # its trade-off in one line (the sweep's list, the form, docs/memory.md)
    kwargs: Callable[[JobSpec], dict[str, Any]] = _no_kwargs  # TrainingArguments / trl config keywords
    device_problems: Callable[[JobSpec, HasCuda], list[Problem]] = _no_device_problems
    combination_problems: Callable[[JobSpec], list[Problem]] = _no_problems
    warnings: Callable[[JobSpec, HasCuda], list[str]] = _no_warnings
    packages: Callable[[JobSpec], dict[str, Packages]] = _no_packages  # field -> what it needs installed
    speed: Speed | None = None
    memory_note: str = ""  # said under the prediction when the trick is on and its effect is not modelled
    installs: Packages = ()  # every package some setting of it needs (what the checks look up)
    speed_field: bool = True  # its fields decide a run's speed (runs that differ in it are not the same setup)
    docs: tuple[DocsRow, ...] = ()  # its rows in docs/memory.md's table of tricks, figures with their source


def flag_step(spec: S, name: str) -> Applied[S] | NotApplicable:
    """A boolean trick's sweep step: turn it on (the trick's own `step` says first where it cannot run)."""
    if getattr(spec, name):
        return NotApplicable(f"{name} is already on")
    return Applied(spec.replace(**{name: True}), f"{name} on")  # type: ignore[attr-defined]
