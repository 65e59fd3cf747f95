"""The launch form's data panels, beside the data preview: the tokens the model learns from, and the data audit.

Both are computed on demand (a button), from the form's current spec, through the path the API takes
(`jobs.checks.shown_data`: the access policy's refusals first, the model's tokenizer from this machine's files).

- Tokens: a row by number (0: the first 3 training rows), each token a span: `tok-trained` (in the loss, green),
  `tok-masked` (grey), `tok-special` (bold, framed: EOS, end-of-turn, BOS), `tok-cut` (past max_length, struck
  through, after a ✂ mark `tok-cut-mark`); a run of image placeholder tokens is one `tok-image` block.
- Audit: the length histogram of the training rows (bars, the max_length bound marked) and the findings, each
  with its rows and its fix.

    panels = build_panels()                    # inside the form's data section
    wire_panels(panels, form.inputs, policy)   # buttons -> HTML, private events
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem, ProblemError

STYLE = (
    "<style>.tok-row{font-family:monospace;white-space:pre-wrap;line-height:1.7;margin:.3em 0 1em}"
    ".tok-trained{background:#d1fadf;color:#05603a}.tok-masked{color:#98a2b3}"
    ".tok-special{font-weight:bold;outline:1px solid #98a2b3}.tok-cut{color:#d92d20;text-decoration:line-through}"
    ".tok-cut-mark{color:#d92d20;font-weight:bold}.tok-image{background:#e0eaff;color:#3538cd;padding:0 .3em}"
    ".audit-bar{display:inline-block;height:.8em;background:#84adff;vertical-align:middle}"
    ".audit-over{background:#fda29b}.audit-hist td{padding:0 .4em;font-family:monospace}</style>"
)
IMAGE_TOKENS = ("<image>", "<|image_pad|>", "<image_soft_token>", "<|vision_pad|>", "<fake_token_around_image>")


@dataclass
class DataPanels:
    row: gr.Number
    tokens_btn: gr.Button
    audit_btn: gr.Button
    tokens: gr.HTML
    audit: gr.HTML


def build_panels() -> DataPanels:
    """The panels' components, in one closed accordion (the form's height stays as it was)."""
    with gr.Accordion("Tokens the model learns from · data audit", open=False, elem_id="data-panels"):
        with gr.Row(equal_height=True):
            row = gr.Number(
                value=0, precision=0, minimum=0, label="Row (0: the first rows)", elem_id="token-row", scale=1
            )
            tokens_btn = gr.Button("Show tokens", size="sm", elem_id="tokens-btn", scale=1)
            audit_btn = gr.Button("Audit the data", size="sm", elem_id="audit-btn", scale=1)
        tokens = gr.HTML(elem_id="token-panel")
        audit = gr.HTML(elem_id="audit-panel")
    return DataPanels(row, tokens_btn, audit_btn, tokens, audit)


def wire_panels(panels: DataPanels, ins: list[Any], policy: AccessPolicy | None, **private: Any) -> None:
    """The buttons: the form's values (and the row number) in, the panel's HTML out; events off the API."""
    panels.tokens_btn.click(partial(tokens_html, policy=policy), [panels.row, *ins], panels.tokens, **private)
    panels.audit_btn.click(partial(audit_html, policy=policy), ins, panels.audit, **private)


def _spec(values: tuple[Any, ...]) -> Any:
    from app.ui.form_spec import spec_from_form, values_of

    return spec_from_form(values_of(values))


def tokens_html(row: Any, *values: Any, policy: AccessPolicy | None = None) -> str:
    """The tokens of row `row` (0 or empty: the first rows) of the form's spec, as HTML; or the problems."""
    from jobs.checks.shown_data import tokens_record

    try:
        number = int(row or 0)
        if number < 0 or number != float(row or 0):
            raise ProblemError([Problem("row", f"`{row}` is not a row number", "type 1 or more, or 0")])
        record = tokens_record(_spec(values), [number] if number else (), policy=policy or AccessPolicy.dashboard())
    except ProblemError as exc:  # the spec, the data, the tokenizer, or a trainer the view does not cover
        return problems_html(exc.problems)
    parts = [STYLE, '<div id="token-view">']
    for shown in record["rows"]:
        where = f"row {shown['row']} of {shown['source']}"
        facts = f"{shown['kept']} tokens, <span class='trained-count'>{shown['trained']}</span> trained"
        if shown["cut"]:
            facts += f", {shown['cut']} cut at max_length {record['max_length']}"
        if shown["dropped"]:
            facts += " · trl drops this row: nothing of it is left in the loss"
        notes = "".join(f" · {html.escape(n)}" for n in shown["notes"])
        parts.append(f"<p class='tok-head'><b>{html.escape(where)}</b>: {facts}{notes}</p>")
        for seq in shown["sequences"]:
            label = f"<i>{html.escape(seq['name'])}</i>: " if len(shown["sequences"]) > 1 else ""
            parts.append(f'<div class="tok-row">{label}{token_spans(seq["tokens"])}</div>')
    return "".join(parts) + "</div>"


def token_spans(tokens: list[dict[str, Any]]) -> str:
    """One span per token; the ✂ mark before the first cut token; a run of image tokens as one block."""
    out: list[str] = []
    cut_marked = False
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t["text"] in IMAGE_TOKENS:
            j = i
            while j < len(tokens) and tokens[j]["text"] == t["text"]:
                j += 1
            kind = "tok-trained" if t["trained"] else "tok-masked"
            out.append(f'<span class="tok-image {kind}" title="{j - i} image tokens">[image × {j - i}]</span>')
            i = j
            continue
        if t["cut"] and not cut_marked:
            out.append('<span class="tok-cut-mark" title="max_length: the tokens after this are cut">✂</span>')
            cut_marked = True
        kind = "tok-cut" if t["cut"] else "tok-trained" if t["trained"] else "tok-masked"
        special = " tok-special" if t["special"] else ""
        out.append(f'<span class="{kind}{special}" title="id {t["id"]}">{html.escape(t["text"])}</span>')
        i += 1
    return "".join(out)


def audit_html(*values: Any, policy: AccessPolicy | None = None) -> str:
    """The audit of the form's spec's data as HTML: the length histogram, then each finding; or the problems."""
    from jobs.checks.shown_data import audit_record

    try:
        record = audit_record(_spec(values), policy=policy or AccessPolicy.dashboard())
    except ProblemError as exc:
        return problems_html(exc.problems)
    hist = record["histogram"]
    parts = [STYLE, '<div id="audit-view">']
    parts.append(f"<p>{record['train_rows']} training rows, {record['eval_rows']} eval rows</p>")
    bins = hist["bins"]
    if bins:
        top = max(b["rows"] for b in bins) or 1
        edge = hist["max_length"] if hist["unit"] == "tokens" else None
        over = f"; {hist['over_max_length']} longer than max_length {edge}" if edge else ""
        parts.append(f"<p>Lengths of the training rows ({hist['unit']}{over}):</p><table class='audit-hist'>")
        previous = 0
        for b in bins:
            over_cls = " audit-over" if edge is not None and previous >= edge else ""
            mark = " ← max_length" if edge is not None and b["upto"] == edge else ""
            width = round(200 * b["rows"] / top)
            parts.append(
                f"<tr><td>≤ {b['upto']}</td><td><span class='audit-bar{over_cls}' style='width:{width}px'></span>"
                f"</td><td>{b['rows']}{mark}</td></tr>"
            )
            previous = b["upto"]
        parts.append("</table>")
    findings = record["findings"]
    if not findings:
        parts.append("<p class='audit-none'>No finding.</p>")
    else:
        parts.append("<ul class='audit-findings'>")
        for f in findings:
            rows = ", ".join(f"{r['row']}" + ("" if r["field"] == "dataset" else " (eval)") for r in f["rows"])
            where = f" (rows {html.escape(rows)})" if rows else ""
            parts.append(
                f"<li class='audit-{html.escape(f['severity'])}'><b>{html.escape(f['code'])}</b>: "
                f"{html.escape(f['problem'])}{where}. Fix: {html.escape(f['fix'])}</li>"
            )
        parts.append("</ul>")
    return "".join(parts) + "</div>"


def problems_html(problems: list[Problem]) -> str:
    items = "".join(
        f"<li><b>{html.escape(p.field)}</b>: {html.escape(p.problem)}. Fix: {html.escape(p.fix)}</li>" for p in problems
    )
    return f"<ul class='panel-problems'>{items}</ul>"
