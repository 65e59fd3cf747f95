"""What the training doctor finds: a `Finding` (rule, step, severity, evidence, diagnosis, fix) and what rules read.

Pure records: the rules (`jobs.doctor.rules`, `jobs.doctor.resources`, `jobs.doctor.preference`) build them,
`jobs.doctor.watch` stores each as a run event of kind "finding" (`Finding.event_data`), and the CLI and API
read them back (`findings_of`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from jobs.spec.doctor_codes import RuleCode

EVENT_KIND = "finding"  # the run events the doctor writes (storage.store_events)
CURVE_POINTS = 40  # the most points of curve a finding keeps as evidence (the stretch it saw)

Point = tuple[int, float]  # (step, value); NaN where training logged NaN or inf
Curves = Mapping[str, Sequence[Point]]  # metric name -> its points, oldest step first


# The metric each finding's evidence curve is of, for the rules the run page marks on its loss chart.
LOSS_CHART_METRIC: dict[RuleCode, str] = {
    RuleCode.LOSS_SPIKE: "loss",
    RuleCode.NONFINITE_LOSS: "loss",
    RuleCode.LOSS_FLAT: "loss",
    RuleCode.LOSS_NEAR_ZERO: "loss",
    RuleCode.OVERFITTING: "eval_loss",
}


class Severity(str, Enum):
    """How much a finding matters: `fatal` the run cannot recover, `warning` it is going wrong, `info` worth a look."""

    INFO = "info"
    WARNING = "warning"
    FATAL = "fatal"


@dataclass(frozen=True)
class RunContext:
    """The few spec values the rules and their fixes read (the spec's own names)."""

    learning_rate: float = 2e-4
    warmup_steps: int = 0
    max_grad_norm: float = 1.0
    num_train_epochs: float = 1.0
    beta: float = 0.1
    total_steps: int | None = None
    num_generations: int = 4
    max_completion_length: int = 64
    temperature: float = 1.0
    # the trainer generates its completions (GRPO): its loss is a policy-gradient surrogate near 0 that rises
    # with the KL term, not a measure of fit, so the loss-curve rules (spike, flat, ~0) leave it alone; and its
    # `kl` is the policy's distance from its base, which the KL rule guards (KTO logs a `kl` of its own: below)
    generates: bool = False


@dataclass(frozen=True)
class Finding:
    """One diagnosis of a run at one step: `fix` in words, `spec_change` the spec fields that apply it (may be empty)."""

    code: RuleCode
    step: int
    severity: Severity
    diagnosis: str
    fix: str
    evidence: dict[str, Any]
    spec_change: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        """The one line the run's events show."""
        return f"doctor: {self.code.value} at step {self.step} ({self.severity.value}): {self.diagnosis}"

    def event_data(self) -> dict[str, Any]:
        """The JSON the run event keeps (strict JSON: NaN and inf as None)."""
        data = asdict(self)
        data["code"], data["severity"] = self.code.value, self.severity.value
        return _json_safe(data)


def finding_from_event(event: Mapping[str, Any]) -> Finding | None:
    """A stored finding event back as a `Finding`; None for another kind, or data this version cannot read."""
    data = event.get("data") or {}
    if event.get("kind") != EVENT_KIND:
        return None
    try:
        return Finding(
            code=RuleCode(data["code"]),
            step=int(data["step"]),
            severity=Severity(data["severity"]),
            diagnosis=str(data["diagnosis"]),
            fix=str(data["fix"]),
            evidence=dict(data.get("evidence") or {}),
            spec_change=dict(data.get("spec_change") or {}),
        )
    except (KeyError, ValueError, TypeError):  # written by another version: shown as a plain event instead
        return None


def findings_of(events: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """The findings among a run's events (`Store.run_events`), oldest first."""
    return [f for f in map(finding_from_event, events) if f is not None]


def curve(
    points: Sequence[Point], end: int, before: int = CURVE_POINTS - 5, after: int = 5
) -> list[list[float | None]]:
    """The stretch of curve around index `end` a finding shows: [[step, value], ...], NaN as None."""
    lo, hi = max(0, end - before), min(len(points), end + after + 1)
    return [[s, _finite(v)] for s, v in points[lo:hi]]


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _json_safe(x: Any) -> Any:
    if isinstance(x, float):
        return _finite(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def worst(findings: Sequence[Finding]) -> Severity | None:
    """The gravest severity among `findings` (None for none)."""
    order = list(Severity)
    return max((f.severity for f in findings), key=order.index, default=None)
