"""Raw values into a spec's types: coercion, bounds, and the closest field name for an unknown key.

`parse_values(cls, data)` turns a plain mapping (YAML, JSON, form values) into typed values for
the fields of the dataclass `cls` and lists every problem at once; `JobSpec.from_dict` builds
the spec from them. `bounds_problems` reads the ge/gt/le that `jobs.spec.field.spec_field` put
next to each field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
from collections.abc import Iterable
from enum import Enum
from typing import Any, get_type_hints

from jobs.errors import Problem
from jobs.spec.columns import columns_text
from jobs.spec.doctor_codes import stop_on_text
from jobs.spec.field import INT64_MAX, INT64_MIN, unwrap_optional
from jobs.spec.trackers import report_to_text


def parse_values(cls: type, data: dict[Any, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """({field: typed value} for the keys that parse, [problems of the others]) for the dataclass `cls`."""
    problems: list[Problem] = []
    known, hints = _fields(cls)
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key == "dataset_columns" and isinstance(raw, dict):
            raw = columns_text(raw)  # YAML/JSON mapping -> the one stored form, target=source pairs
        if key == "sample_prompts" and isinstance(raw, list):
            raw = "\n".join(str(p).strip() for p in raw)  # a YAML/JSON list -> the stored form, one per line
        if key == "report_to" and isinstance(raw, (list, tuple, str)):
            raw = report_to_text(raw)  # a list, or the libraries' "none" -> the stored form, names joined by commas
        if key == "rewards" and isinstance(raw, list):
            # a YAML/JSON list of declared rewards -> the stored form, JSON text (jobs.spec.rewards reads it)
            raw = json.dumps(raw, default=str)
        elif key == "doctor_stop_on" and isinstance(raw, (list, tuple, str)):
            raw = stop_on_text(raw)  # a list -> the stored form, codes joined by commas
        if key not in known:
            close = closest(str(key), known)
            fix = f"did you mean `{close}`?" if close else "remove it; see the field table in docs/spec.md"
            name = str(key).strip() or "spec"
            problems.append(Problem(name, "has a field with an empty name" if name == "spec" else "unknown field", fix))
            continue
        value, problem = coerce(key, raw, hints[key])
        if problem:
            problems.append(problem)
        else:
            values[key] = value
    return values, problems


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The dataclass's field names (in order, for the suggestions) and types, resolved once per class: resolving
    the types was most of a parse, and the planner parses ~50 variants per prediction."""
    return tuple(f.name for f in dataclasses.fields(cls)), get_type_hints(cls)


def coerce(name: str, raw: Any, tp: Any) -> tuple[Any, Problem | None]:
    """One raw value as the field's type `tp`: (value, None), or (None, what is wrong with it)."""
    base, optional = unwrap_optional(tp)
    blank = isinstance(raw, str) and raw.strip() == ""
    if raw is None or (blank and (base is not str or optional)):
        if optional:
            return None, None
        return None, Problem(name, "is missing a value", "give a value or remove the line to use the default")
    if isinstance(base, type) and issubclass(base, Enum):
        try:
            return base(str(raw).strip().lower()), None
        except ValueError:
            choices = ", ".join(m.value for m in base)
            return None, Problem(name, f"`{raw}` is not one of the choices", f"use one of: {choices}")
    if base is bool:
        if isinstance(raw, bool):
            return raw, None
        if isinstance(raw, str) and raw.strip().lower() in {"true", "yes", "on", "1", "false", "no", "off", "0"}:
            return raw.strip().lower() in {"true", "yes", "on", "1"}, None
        return None, Problem(name, f"expected true or false, got `{raw}`", "write true or false")
    if base is int:
        if isinstance(raw, bool):
            return None, Problem(name, f"expected a whole number, got `{raw}`", "write a whole number such as 8")
        if isinstance(raw, int):
            return raw, None
        if isinstance(raw, float) and raw.is_integer():
            return int(raw), None
        if isinstance(raw, str):
            try:
                return int(raw.strip()), None
            except ValueError:
                try:
                    as_float = float(raw.strip())
                    if as_float.is_integer():
                        return int(as_float), None
                except ValueError:
                    pass
        return None, Problem(name, f"expected a whole number, got `{raw}`", "write a whole number such as 8")
    if base is float:
        if isinstance(raw, bool):
            return None, Problem(name, f"expected a number, got `{raw}`", "write a number such as 0.0002 or 2e-4")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            return None, Problem(name, f"expected a number, got `{raw}`", "write a number such as 0.0002 or 2e-4")
        if not math.isfinite(value):
            return None, Problem(name, f"must be a finite number, got `{raw}`", "write a finite number")
        return value, None
    if base is str:
        if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
            return str(raw).strip(), None
        return None, Problem(name, f"expected text, got {type(raw).__name__}", "write a single text value")
    raise TypeError(f"unsupported spec field type {tp!r}")  # pragma: no cover - programming error


def bounds_problems(f: dataclasses.Field[Any], value: Any) -> list[Problem]:
    """The field's value outside the ge/gt/le declared with it (or not finite), as a problem; a whole number
    also within a 64-bit integer on a side the field declares no bound (`jobs.spec.field.INT64_MAX`)."""
    if value is None or isinstance(value, (bool, str, Enum)):
        return []
    m = f.metadata
    ge, gt, le = m.get("ge"), m.get("gt"), m.get("le")
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(f.name, f"must be a finite number, got {value}", "write a finite number")]
    lo = f">= {_num(ge)}" if ge is not None else f"> {_num(gt)}" if gt is not None else None
    if (ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le):
        rng = " and ".join(x for x in (lo, f"<= {_num(le)}" if le is not None else None) if x)
        return [Problem(f.name, f"{_num(value)} is out of range", f"use a value {rng}")]
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:  # a side the field leaves open
        low = lo or f">= {INT64_MIN}"
        return [
            Problem(
                f.name,
                f"{value} is out of range (past a 64-bit integer)",
                f"use a value {low} and <= {le if le is not None else INT64_MAX}",
            )
        ]
    return []


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def closest(key: str, known: Iterable[str]) -> str | None:
    """The known name an unknown key was most likely meant to be, if any is close."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return match[0] if match else None
