"""Memory at the named points of a run's first optimizer step, kept next to the run (`phases.json`).

`jobs.train.phase_probe.PhaseProbe` measures it while the child trains; `tunedeck show`, the run
page and the compare tab set it against the prediction's phase figures with `phase_rows`, so the
command line and the dashboard compare them one way.

    record(store, run_id, measured)   # {"source": "rss", "device": "cpu", "phases": {"load": {...}, ...}}
    load_phases(store, run_id)        # that dict, or None
    phase_rows(load_prediction(store, run_id), load_phases(store, run_id))   # [PhaseRow("load", ...), ...]

A phase's record is {"bytes": memory when it ended, "peak_bytes": the highest point inside it}; on
CUDA the figures are torch's reserved bytes (with "allocated_bytes" / "peak_allocated_bytes" beside
them), on the CPU the process's RSS. docs/memory.md "Memory by phase" says how to read the table.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from jobs.units import human_bytes
from storage.roles import RunFolders

PHASES = ("load", "forward", "backward", "optimizer")
PHASES_FILE = "phases.json"
HEADER = ("phase", "predicted", "measured (peak)", "error")


def record(store: RunFolders, run_id: int, measured: dict[str, Any]) -> None:
    """Keep `measured` with the run, replacing what an earlier attempt kept (readers never see half a file)."""
    path = store.run_dir(run_id) / PHASES_FILE
    part = path.with_name(PHASES_FILE + ".part")
    part.write_text(json.dumps(measured))
    os.replace(part, path)


def load_phases(store: RunFolders, run_id: int) -> dict[str, Any] | None:
    """The phases measured in the run's first step, or None."""
    try:
        data = json.loads((store.run_path(run_id) / PHASES_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("phases"), dict) else None


@dataclass(frozen=True)
class PhaseRow:
    """One phase: predicted and measured bytes (None: not there), comparable with each other."""

    phase: str
    predicted: int | None
    measured: int | None

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, the sign of `prediction_error_text`: + is over-predicted."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured

    def cells(self) -> tuple[str, str, str, str]:
        """The row as HEADER's columns: ('load', '410.2 MiB', '402.0 MiB', '+2%')."""
        error = "-" if self.error is None else f"{100 * self.error:+.0f}%"
        return self.phase, human_bytes(self.predicted), human_bytes(self.measured), error

    def summary(self) -> str:
        """One cell of the compare table: '+2% (410.2 MiB predicted, 402.0 MiB measured)'."""
        if self.measured is None:
            return ""
        if self.error is None:
            return f"{human_bytes(self.measured)} measured (no phase prediction)"
        return (
            f"{100 * self.error:+.0f}% ({human_bytes(self.predicted)} predicted, {human_bytes(self.measured)} measured)"
        )


def _measured_by_torch(prediction: dict[str, Any] | None, phases: dict[str, Any] | None) -> bool:
    """Whether the figures are torch's (CUDA): by the measurement, else by the device predicted for."""
    if phases is not None:
        return phases.get("source") == "torch"
    return ((prediction or {}).get("device") or {}).get("kind") == "cuda"


def phase_rows(prediction: dict[str, Any] | None, phases: dict[str, Any] | None) -> list[PhaseRow]:
    """A row per phase of PHASES from a saved prediction and a `phases.json` (either may be None or old).

    On CUDA the prediction's CUDA context (`cuda_context_bytes`) is outside torch's allocator, so it is
    taken out of each predicted figure before the comparison with torch's max reserved; on the CPU the
    prediction counts the runtime's RSS and is compared as it is. [] when neither has a phase figure."""
    predicted = (prediction or {}).get("phases") or {}
    measured = (phases or {}).get("phases") or {}
    context = int((prediction or {}).get("cuda_context_bytes") or 0) if _measured_by_torch(prediction, phases) else 0
    rows = []
    for name in PHASES:
        p, m = predicted.get(name), measured.get(name)
        peak = m.get("peak_bytes", m.get("bytes")) if isinstance(m, dict) else None
        rows.append(
            PhaseRow(
                name,
                int(p) - context if isinstance(p, (int, float)) else None,
                int(peak) if isinstance(peak, (int, float)) else None,
            )
        )
    return rows if any(r.predicted is not None or r.measured is not None for r in rows) else []


def phase_notes(prediction: dict[str, Any] | None, phases: dict[str, Any] | None, finished: bool) -> list[str]:
    """What the reader of the phase table needs to know: why a column is empty, what was measured."""
    notes = []
    if phases is None:
        if finished:
            notes.append(
                "not recorded (the run ended before its first optimizer step, or ran before tunedeck recorded phases)"
            )
        return notes
    source = phases.get("source")
    if source == "torch":
        context = int((prediction or {}).get("cuda_context_bytes") or 0)
        notes.append(
            "measured: torch's max reserved in each phase; predicted: without the CUDA context"
            + (f" ({human_bytes(context)})" if context else "")
        )
    else:
        notes.append("measured: the process's peak RSS in each phase (the Python runtime and libraries included)")
    if prediction is not None and not prediction.get("phases"):
        notes.append("the saved prediction has no phase figures (made before tunedeck predicted phases)")
    elif prediction is None:
        notes.append("no prediction was saved with this run")
    missing = [name for name in PHASES if name not in phases.get("phases", {})]
    if missing:
        notes.append(
            f"not reached: {', '.join(missing)} (the run stopped inside its first step)"
            if finished
            else f"not measured yet: {', '.join(missing)}"
        )
    if phases.get("note"):
        notes.append(str(phases["note"]))
    return notes


def table_lines(rows: list[PhaseRow]) -> list[str]:
    """The rows as an aligned text table under HEADER (the command line's form)."""
    cells = [HEADER, *(r.cells() for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]


def table_markdown(rows: list[PhaseRow]) -> str:
    """The rows as a markdown table under HEADER (the dashboard's form)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(r.cells()) + " |" for r in rows])
