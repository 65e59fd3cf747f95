"""The launch form's token panel: the first training rows as the trainer builds them, each token marked.

The same tokens as `tunedeck data show` (`jobs.data.tokens.view`: trl's own preparation and collator, the
model's tokenizer from this machine's files). Trained tokens get the `tok-trained` class (green), masked ones
`tok-masked` (grey), special tokens `tok-special` (bold), tokens past max_length `tok-cut` (struck through).
Data the server's access policy keeps from its users is refused before it is read (`AccessPolicy.problems`),
and a model's own code runs only where the server allows it.

    html = tokens_html(*form_values, policy=policy)       # wired by app.ui.form to the panel's button
"""

from __future__ import annotations

import html
from typing import Any

from jobs.checks.access import AccessPolicy

STYLE = (
    "<style>.tok-row{font-family:monospace;white-space:pre-wrap;line-height:1.6;margin-bottom:1em}"
    ".tok-trained{background:#d1fadf;color:#05603a}.tok-masked{color:#98a2b3}"
    ".tok-special{font-weight:bold}.tok-cut{color:#d92d20;text-decoration:line-through}</style>"
)
SHOWN_ROWS = 3


def tokens_html(*args: Any, policy: AccessPolicy | None = None) -> str:
    """The first training rows' tokens as HTML, or the problem that keeps them from being shown."""
    from app.ui.form_spec import spec_from_form, values_of
    from jobs.data.loading import load_data
    from jobs.data.tokens.viewed_rows import training_views
    from jobs.errors import ProblemError
    from jobs.models.tokenizer import local_tokenizer

    policy = policy or AccessPolicy.open()
    try:
        spec = spec_from_form(values_of(args))
        refused = policy.problems(spec)
        if refused:
            return _problems(refused)
        tokenizer = local_tokenizer(spec.model, spec.trust_remote_code and policy.allow_remote_code)
        if tokenizer is None:
            return f"<p>The tokenizer of {html.escape(spec.model)} is not on this machine yet.</p>"
        viewed = training_views(spec, load_data(spec), tokenizer, first=SHOWN_ROWS)
    except ProblemError as exc:  # the spec, the data, or a trainer the view does not cover
        return _problems(exc.problems)
    refs = [s.ref for s in spec.dataset_sources] or [spec.dataset]
    parts = [STYLE, '<div id="token-view">']
    for view, (source, number) in zip(viewed.views, viewed.origins):
        where = f"row {number} of {refs[source] if source < len(refs) else spec.dataset}"
        dropped = " · trl drops this row: nothing of it is left in the loss" if view.dropped else ""
        parts.append(f"<p><b>{html.escape(where)}</b>: {view.trained_count} tokens trained{dropped}</p>")
        for seq in view.sequences:
            label = f"<i>{html.escape(seq.name)}</i>: " if len(view.sequences) > 1 else ""
            parts.append(f'<div class="tok-row">{label}{"".join(_span(t) for t in seq.tokens)}</div>')
    return "".join(parts) + "</div>"


def _span(token: Any) -> str:  # token: jobs.data.tokens.view.Token
    kind = "tok-cut" if token.cut else "tok-trained" if token.trained else "tok-masked"
    special = " tok-special" if token.special else ""
    return f'<span class="{kind}{special}" title="id {token.id}">{html.escape(token.text)}</span>'


def _problems(problems: list[Any]) -> str:
    items = "".join(f"<li><b>{html.escape(p.field)}</b>: {html.escape(p.problem)}. Fix: {html.escape(p.fix)}</li>"
                    for p in problems)  # fmt: skip
    return f"<ul>{items}</ul>"
