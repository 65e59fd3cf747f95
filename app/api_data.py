"""The API's endpoints on a spec's data before launch: `tokens` (a row as the trainer builds it, each token in the
loss or masked) and `audit` (the data audit's findings and the length histogram), as `tunedeck data show` and
`tunedeck data audit` print them (`jobs.checks.shown_data`, one path with the launch form's panels).

`app.api.Endpoints` takes them from `DataEndpoints`; like the other endpoints they answer bad input with a
`gr.Error` naming the parameter and the fix, and a dashboard behind a login reads only its data folders.
No `from __future__ import annotations`: Gradio reads the type hints at run time.
"""

from typing import Any

import gradio as gr

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem, ProblemError
from jobs.spec.job import JobSpec, SpecError


def _fail(problems: list[Problem]) -> gr.Error:
    """Problems as the API's error: each names the parameter and the fix (`gradio_client`'s AppError)."""
    return gr.Error("; ".join(str(p) for p in problems), title="tunedeck: bad input")


def _spec(spec_yaml: str) -> JobSpec:
    try:
        return JobSpec.from_yaml(spec_yaml or "")
    except SpecError as exc:
        raise _fail(exc.problems) from None


class DataEndpoints:
    """The data endpoints of `app.api.Endpoints` (which sets `policy`: what callers may reach on the server)."""

    policy: AccessPolicy | None

    def tokens(self, spec_yaml: str, row: int = 0) -> dict[str, Any]:
        """What the model is trained on: a row of the spec's data as the trainer builds it, each token in the loss or masked.

        Parameters:
            spec_yaml: the job spec as YAML text (as for submit).
            row: the row's number in the (first) data file, as the file numbers it (JSON lines: its line); 0: the first 3 training rows.
        Returns:
            {total, max_length, rows: [{row, source, trained, kept, cut, dropped, untrained, notes, sequences: [{name, tokens: [{id, text, special, trained, cut}]}]}]}: trained is in the loss, cut is past max_length; dropped rows are ones trl drops (nothing left in the loss).
        """
        from jobs.checks.shown_data import tokens_record

        if not isinstance(row, int) or isinstance(row, bool) or row < 0:
            raise _fail(
                [Problem("row", f"`{row}` is not a row number", "pass a row number from 1, or 0 for the first rows")]
            )
        spec = _spec(spec_yaml)
        try:
            return tokens_record(spec, [row] if row else (), policy=self._reading_policy())
        except ProblemError as exc:
            raise _fail(exc.problems) from None

    def audit(self, spec_yaml: str) -> dict[str, Any]:
        """The audit of the spec's data: duplicates, eval overlap, empty or short answers, repeated answers, chosen equal to rejected, label balance, characters that are not text, a mixture's shares; and the training rows' lengths against max_length.

        Parameters:
            spec_yaml: the job spec as YAML text (as for submit).
        Returns:
            {train_rows, eval_rows, findings: [{code, severity, count, rows: [{field, source, row}], problem, fix}], histogram: {unit, max_length, bins: [{upto, rows}], over_max_length}}; lengths are tokens when the spec's checks measured them already, else characters.
        """
        from jobs.checks.shown_data import audit_record

        spec = _spec(spec_yaml)
        try:
            return audit_record(spec, policy=self._reading_policy())
        except ProblemError as exc:
            raise _fail(exc.problems) from None

    def _reading_policy(self) -> AccessPolicy:
        return self.policy or AccessPolicy.dashboard()
