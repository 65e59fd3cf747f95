"""The training doctor's rule codes (`jobs.doctor`) and how `doctor_stop_on` names them.

`doctor_stop_on` is stored as one comma-separated text (in YAML also a list), like `report_to`;
`stop_codes(text)` reads it into `RuleCode` members and the words that are none. Here, not in
`jobs.doctor`, so the spec can check the field without importing the rules. Imports nothing of the project.

    stop_codes("loss_spike, nonfinite_loss")   # ([RuleCode.LOSS_SPIKE, RuleCode.NONFINITE_LOSS], [])
    stop_severities("fatal, loss_spike")       # {"fatal"}: every fatal finding stops the run too
"""

from __future__ import annotations

from enum import Enum


class RuleCode(str, Enum):
    """One rule of the training doctor: what a finding is about (docs/runs.md, "The training doctor")."""

    LOSS_SPIKE = "loss_spike"
    GRAD_NORM_EXPLOSION = "grad_norm_explosion"
    NONFINITE_LOSS = "nonfinite_loss"
    LOSS_FLAT = "loss_flat"
    LOSS_NEAR_ZERO = "loss_near_zero"
    OVERFITTING = "overfitting"
    THROUGHPUT_DROP = "throughput_drop"
    MEMORY_CREEP = "memory_creep"
    REWARD_SATURATED = "reward_saturated"
    CHOSEN_LOGPS_FALLING = "chosen_logps_falling"
    GRPO_NO_SIGNAL = "grpo_no_signal"
    COMPLETIONS_CLIPPED = "completions_clipped"
    KL_UNBOUNDED = "kl_unbounded"
    ENTROPY_COLLAPSE = "entropy_collapse"
    FORGETTING = "forgetting"


SEVERITIES = ("info", "warning", "fatal")  # `jobs.doctor.findings.Severity`: a word that stops on every finding of it
RULE_CHOICES = ", ".join(c.value for c in RuleCode) + "; or a severity: " + ", ".join(SEVERITIES)


def stop_on_text(raw: object) -> str | None:
    """A YAML/JSON list (or one text) as the stored form: codes joined by commas; None for none."""
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    words = [w.strip().lower() for x in items if x is not None for w in str(x).split(",")]
    return ",".join(w for w in words if w) or None


def stop_severities(text: str | None) -> set[str]:
    """The severities named in `text` (each stops the run on every finding of it)."""
    return {w.strip().lower() for w in (text or "").split(",")} & set(SEVERITIES)


def stop_codes(text: str | None) -> tuple[list[RuleCode], list[str]]:
    """(the rule codes named in `text`, in order and once each; the words that are neither a rule code nor a severity)."""
    found: list[RuleCode] = []
    unknown: list[str] = []
    for word in (text or "").split(","):
        word = word.strip().lower()
        if not word or word in SEVERITIES:
            continue
        try:
            code = RuleCode(word)
        except ValueError:
            unknown.append(word)
            continue
        if code not in found:
            found.append(code)
    return found, unknown
