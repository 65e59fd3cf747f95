"""Where a training step peaks, and what each part holds there: `jobs.memory.predict.predict`'s last step.

A step peaks in its backward (activations and logits alive), at its optimizer step (every gradient and the
optimizer's temporaries alive) or, for a generating trainer (GRPO), in the generation or scoring phase that
comes before the training step (`jobs.memory.rollout`). docs/memory.md "Phases", "Generation and scoring".

    peak = peak_phase(p, fixed, (backward, step, grads, opt_temp, accumulated), (optimizer, acts, logits), roll)
    peak.phase, peak.gradients, peak.held         # held: optimizer, activations, logits, generation/scoring
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.memory.rollout import Rollout


@dataclass(frozen=True)
class Term:
    """One part's bytes (unrounded, so the phases add up exactly) and the formula that produced them."""

    bytes: float
    formula: str


@dataclass(frozen=True)
class Peak:
    phase: str
    gradients: Term
    held: tuple[Term, Term, Term, Term]  # optimizer, activations, logits, generation or scoring
    notes: tuple[str, ...] = ()


def peak_phase(
    p: int, fixed: float, figures: tuple[float, float, float, float, float], held: tuple[Term, Term, Term],
    roll: Rollout,
) -> Peak:  # fmt: skip
    """Where the step peaks: in the backward (activations alive), at the optimizer step (all gradients alive) or,
    for a generating trainer, in its generation or scoring phase (docs/memory.md "Generation and scoring").
    `p`: the trainable parameters; `fixed`: what every phase of a later step holds (weights, adapter, a reward
    model, optimizer state)."""
    backward, step, grads, opt_temp, accumulated = figures
    optimizer, acts, logits = held
    idle = Term(0.0, f"generation: {roll.generation_formula}; scoring: {roll.scoring_formula}")
    if fixed + max(roll.generation_bytes, roll.scoring_bytes) > max(backward, step):
        gen = roll.generation_bytes >= roll.scoring_bytes
        phase = "generation" if gen else "scoring"
        before = (
            Term(roll.generation_bytes, roll.generation_formula)
            if gen
            else Term(roll.scoring_bytes, roll.scoring_formula)
        )
        return Peak(
            phase,
            Term(0.0, f"none: freed after the last optimizer step ({p:,} x 4 B in the backward)"),
            (optimizer, Term(0.0, acts.formula), Term(0.0, logits.formula), before),
            (f"the peak is in the {phase} phase, before the training step's activations exist",),
        )
    if backward >= step:
        gf = (
            "earlier micro-batches' gradients, " if accumulated else "none yet; "
        ) + f"{p:,} x 4 B once the backward ends"
        return Peak("backward", Term(accumulated, gf), (optimizer, acts, logits, idle))
    return Peak(
        "optimizer step",
        Term(grads, f"{p:,} trainable params x 4 B (fp32)"),
        (Term(optimizer.bytes + opt_temp, optimizer.formula), Term(0.0, acts.formula), Term(0.0, logits.formula), idle),
        ("the peak is at the optimizer step: activations are freed by then",),
    )
