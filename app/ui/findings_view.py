"""Where the training doctor's findings show in the dashboard: the run page's banner and list, the stretch of
curve marked on its loss chart, the runs table's icon, Compare's row, and the choices of "Clone with fix".

Pure functions of stored findings (`jobs.doctor.findings.findings_of` over a run's events): the worker computes
them (`jobs.doctor.watch`); nothing here runs a rule.

    findings_html(found)        # the banner and the numbered list (the numbers `tunedeck clone ID --fix N` takes)
    marked_rows(found)          # the loss chart's "doctor: loss_spike" series: the curve the rule saw
    fix_choices(found)          # [("1: loss_spike at step 40: learning_rate 0.0001", 1), ...]
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from app.ui import charts
from jobs.doctor.findings import LOSS_CHART_METRIC, Finding, Severity, findings_of, worst

ICONS = {Severity.FATAL: "⛔", Severity.WARNING: "⚠️", Severity.INFO: "ℹ️"}
COLORS = {
    Severity.FATAL: ("#fee2e2", "#b91c1c"),
    Severity.WARNING: ("#fef3c7", "#b45309"),
    Severity.INFO: ("#e0f2fe", "#0369a1"),
}
MARK_PREFIX = charts.MARK  # the loss chart's series of a finding's stretch: "doctor: loss_spike"


def change_text(change: Mapping[str, Any]) -> str:
    """`learning_rate` 0.0001, `max_grad_norm` 1.0"""
    return ", ".join(f"`{k}` {v}" for k, v in change.items())


def findings_html(found: Sequence[Finding]) -> str:
    """The run page's banner (how many, the gravest first) and its numbered list; "" for a run with none."""
    top = worst(found)
    if top is None:
        return ""
    background, border = COLORS[top]
    count = f"{len(found)} finding" + ("s" if len(found) != 1 else "")
    first = next(f for f in found if f.severity is top)
    items = "".join(
        f'<li data-code="{f.code.value}" data-step="{f.step}">{ICONS[f.severity]} <b>{f.code.value}</b> at step '
        f"{f.step} ({f.severity.value}): {html.escape(f.diagnosis)}. <b>Fix:</b> {html.escape(f.fix)}"
        + (f" (spec: {html.escape(change_text(f.spec_change))})" if f.spec_change else "")
        + "</li>"
        for f in found
    )
    return (
        f'<div id="run-findings" data-worst="{top.value}" style="background:{background};border-left:4px solid '
        f'{border};padding:8px 12px;border-radius:4px">'
        f"<div id='run-findings-banner'><b>{ICONS[top]} Training doctor: {count}.</b> "
        f"{html.escape(first.code.value)} at step {first.step}: {html.escape(first.diagnosis)}.</div>"
        f"<ol style='margin:6px 0 0 0'>{items}</ol></div>"
    )


def marked_rows(found: Sequence[Finding]) -> list[tuple[float, float | None, str]]:
    """The stretch of loss (or eval loss) curve each loss finding saw, as the loss chart's rows."""
    rows: list[tuple[float, float | None, str]] = []
    for f in found:
        if f.code not in LOSS_CHART_METRIC:
            continue
        for point in f.evidence.get("curve") or ():
            if isinstance(point, (list, tuple)) and len(point) == 2 and point[1] is not None:
                rows.append((float(point[0]), float(point[1]), MARK_PREFIX + f.code.value))
    return rows


def fix_choices(found: Sequence[Finding]) -> list[tuple[str, int]]:
    """The findings "Clone with fix" can apply (those naming a spec change), numbered as `tunedeck show` numbers them."""
    return [
        (f"{i}: {f.code.value} at step {f.step}: {change_text(f.spec_change).replace('`', '')}", i)
        for i, f in enumerate(found, 1)
        if f.spec_change
    ]


def icon_text(events: Sequence[Mapping[str, Any]]) -> str:
    """The runs table's and Compare's cell: "⚠️ loss_spike@40, overfitting@120" ("" for none)."""
    found = findings_of(events)
    top = worst(found)
    if top is None:
        return ""
    return ICONS[top] + " " + ", ".join(f"{f.code.value}@{f.step}" for f in found)
