"""The launch form's pure edge: form values <-> `JobSpec`, and the form's problems as text.

The form holds one component per spec field (`jobs.spec.job.field_infos()`), in `NAMES` order; its
values become a `JobSpec` only here. A field that does not apply to the chosen trainer and method
(`FieldInfo.when`) takes its default, so the spec says only what the run uses. No Gradio here.

    data = form_data(values)            # plain values for the checks (`jobs.checks.pipeline.check`)
    spec = spec_from_form(values)       # or SpecError with every problem
"""

from __future__ import annotations

from typing import Any

from jobs.errors import Problem
from jobs.spec.field_info import FieldInfo, deciding_fields, field_infos
from jobs.spec.job import JobSpec

INFOS: list[FieldInfo] = field_infos()
NAMES: list[str] = [f.name for f in INFOS]
DECIDING: list[str] = deciding_fields()
CONDITIONAL: list[str] = [f.name for f in INFOS if f.when]


def info(name: str) -> FieldInfo:
    return next(f for f in INFOS if f.name == name)


def values_of(args: tuple[Any, ...]) -> dict[str, Any]:
    """An event's component values (NAMES order) by field name."""
    return dict(zip(NAMES, args))


def form_data(values: dict[str, Any]) -> dict[str, Any]:
    """Form values -> plain spec values: empty optional inputs mean None, fields that do not apply take
    their defaults."""
    optional = {f.name for f in INFOS if f.optional}
    data: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, str):
            value = value.strip()
        if name in optional and (value is None or value == ""):
            value = None
        data[name] = value
    for f in INFOS:
        if f.name in data and not f.applies(data):
            data[f.name] = f.default
    return data


def spec_from_form(values: dict[str, Any]) -> JobSpec:
    """Form values -> JobSpec (`form_data`); raises SpecError with every problem."""
    return JobSpec.from_dict(form_data(values))


def form_values(spec: JobSpec) -> list[Any]:
    """A spec as the list of component values, in NAMES order (for Clone and Load YAML)."""
    d = spec.to_dict() | {"report_to": [t.value for t in spec.tracker_list]}  # the form's checkbox group
    return [("" if d[n] is None and info(n).kind == "str" else d[n]) for n in NAMES]


def problems_markdown(problems: list[Problem]) -> str:
    """Every problem as one bullet: field: problem. Fix: ..."""
    if not problems:
        return ""
    lines = "\n".join(f"- **{p.field}**: {p.problem}. Fix: {p.fix}" for p in problems)
    return f"### ⚠ {len(problems)} problem(s): nothing was queued\n{lines}"


def visibility(values: dict[str, Any]) -> dict[str, bool]:
    """Which conditional fields show under these trainer/method (deciding) values."""
    return {name: info(name).applies(values) for name in CONDITIONAL}
