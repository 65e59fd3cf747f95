"""A search space: which spec fields a search varies, and over what, each checked against the spec's own fields.

    space = parse_space(["learning_rate=loguniform(1e-5,1e-3)", "lora_r=[8,16,32]"], base_spec)
    space.dimensions[0]     # Dimension(field="learning_rate", kind="loguniform", low=1e-5, high=1e-3)

Forms of one dimension (`FIELD=...` on the command line, `FIELD: ...` in a mapping):

- `loguniform(LOW, HIGH)`: a number between LOW and HIGH, sampled on a log scale (LOW > 0);
- `uniform(LOW, HIGH)`: a number between LOW and HIGH;
- `int(LOW, HIGH)`: a whole number from LOW to HIGH (a whole-number field with `uniform`/`loguniform` is one too);
- `[A, B, C]`: one of the listed values of a numeric, true/false or choice field (`optim`, `lr_scheduler_type`).

Text fields (the model, the data, paths, endpoints) are never varied: a search reaches only what its base
spec reaches, which is checked with the caller's access policy when the search starts.

Every field must be a spec field; a range only a numeric one; both ends of a range and every listed value
must be values the spec itself accepts (its bounds and combinations with the base spec's other fields), so
a space that could sample an invalid spec is refused before anything is queued, naming the field.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml

from jobs.errors import Problem, ProblemError
from jobs.spec.field import unwrap_optional
from jobs.spec.job import JobSpec, SpecError

RANGE_KINDS = ("loguniform", "uniform", "int")
_RANGE = re.compile(r"^\s*(loguniform|uniform|int)\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)\s*$")
EXAMPLE = (
    "learning_rate=loguniform(1e-5,1e-3), lora_r=[8,16,32], lora_dropout=uniform(0,0.1), num_train_epochs=int(1,3)"
)


class SpaceError(ProblemError):
    subject = "in the search space"


@dataclass(frozen=True)
class Dimension:
    """One varied field: a range (`kind` loguniform/uniform/int, `low`..`high`) or `choices`."""

    field: str
    kind: str  # loguniform, uniform, int, choice
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()
    whole: bool = False  # the field holds whole numbers: sampled with suggest_int

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.field}=[{', '.join(str(c) for c in self.choices)}]"
        return f"{self.field}={self.kind}({self.low:g}, {self.high:g})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"choices": list(self.choices)}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Dimension:
        return Dimension(**{**data, "choices": tuple(data.get("choices", ()))})


@dataclass(frozen=True)
class Space:
    dimensions: tuple[Dimension, ...]

    @property
    def fields(self) -> list[str]:
        return [d.field for d in self.dimensions]

    def describe(self) -> str:
        return ", ".join(d.describe() for d in self.dimensions)

    def to_list(self) -> list[dict[str, Any]]:
        return [d.to_dict() for d in self.dimensions]

    @staticmethod
    def from_list(data: Iterable[Mapping[str, Any]]) -> Space:
        return Space(tuple(Dimension.from_dict(d) for d in data))


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(JobSpec)
    return {f.name: unwrap_optional(hints[f.name])[0] for f in dataclasses.fields(JobSpec)}


def _split(items: Iterable[str] | Mapping[str, Any]) -> tuple[list[tuple[str, Any]], list[Problem]]:
    if isinstance(items, Mapping):
        return list(items.items()), []
    pairs, problems = [], []
    for item in items:
        name, sep, value = str(item).partition("=")
        if not sep or not name.strip():
            problems.append(Problem("space", f"{item!r} is not FIELD=VALUES", f"write it as e.g. {EXAMPLE}"))
            continue
        pairs.append((name.strip(), value.strip()))
    return pairs, problems


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _dimension(name: str, raw: Any, kind_of: Any) -> Dimension | Problem:
    where = f"space.{name}"
    numeric = kind_of in (int, float)
    if isinstance(raw, str) and _RANGE.match(raw):
        kind, low_text, high_text = _RANGE.match(raw).groups()  # type: ignore[union-attr]
        low, high = _number(low_text), _number(high_text)
        if not numeric:
            return Problem(where, f"{name} is not a numeric field, so it has no range", "list its values: [A, B]")
        if low is None or high is None:
            return Problem(where, f"{raw!r} has an end that is not a number", "write both ends as numbers")
        if not low < high:
            return Problem(where, f"the low end {low:g} is not below the high end {high:g}", "swap or widen them")
        if kind == "loguniform" and low <= 0:
            return Problem(where, f"a log scale cannot start at {low:g}", "start it above 0, or use uniform(...)")
        whole = kind_of is int or kind == "int"
        if kind == "int" and kind_of is float and not (low.is_integer() and high.is_integer()):
            return Problem(where, "int(...) takes whole-number ends", "use uniform(...) for a fractional range")
        if kind_of is int and not (low.is_integer() and high.is_integer()):
            return Problem(
                where, f"{name} holds whole numbers", f"give whole-number ends, e.g. int({int(low)}, {int(high)})"
            )
        return Dimension(name, kind, low, high, whole=whole)
    if isinstance(raw, str):
        try:
            raw = yaml.safe_load(raw)
        except yaml.YAMLError:
            raw = None
    if isinstance(raw, list) and raw:
        if not (numeric or kind_of is bool or isinstance(kind_of, type) and issubclass(kind_of, Enum)):
            return Problem(
                where,
                f"{name} is not a numeric, true/false or choice field",
                "vary numbers (learning_rate, lora_r, ...) or choices (optim, lr_scheduler_type, ...); set the others in the spec",
            )
        if numeric:  # YAML reads 1e-3 (no dot) as text: numbers are read as numbers here
            values = [_number(str(v)) for v in raw]
            if any(v is None for v in values):
                return Problem(where, f"{name} is numeric and {raw!r} lists a value that is not", "list numbers only")
            raw = [int(v) if kind_of is int and float(v).is_integer() else v for v in values]  # type: ignore[arg-type]
        if len(set(map(str, raw))) != len(raw):
            return Problem(where, "a value is listed twice", "list each value once")
        return Dimension(name, "choice", choices=tuple(raw))
    return Problem(where, f"{raw!r} is neither a range nor a list of values", f"write it as e.g. {EXAMPLE}")


def _values_problems(base: JobSpec, dim: Dimension) -> list[Problem]:
    """Each end of a range, each listed value: a problem naming the field when the spec refuses it."""
    values = dim.choices if dim.kind == "choice" else (dim.low, dim.high)
    problems: list[Problem] = []
    for value in values:
        value = int(value) if dim.whole and isinstance(value, float) else value
        try:
            base.replace(**{dim.field: value})
        except SpecError as exc:
            for p in exc.problems:
                problems.append(Problem(f"space.{dim.field}", f"{value!r}: {p.field}: {p.problem}", p.fix))
    return problems


def parse_space(items: Iterable[str] | Mapping[str, Any], base: JobSpec) -> Space:
    """The space of `FIELD=VALUES` strings (or a mapping of field to values), checked against `base`;
    raises SpaceError with every problem."""
    pairs, problems = _split(items)
    types = _field_types()
    dims: list[Dimension] = []
    for name, raw in pairs:
        if name not in types:
            near = [f for f in types if name.lower() in f or f in name.lower()][:3]
            fix = f"did you mean {', '.join(near)}?" if near else "name a field of the job spec (docs/spec.md)"
            problems.append(Problem(f"space.{name}", f"{name} is not a spec field", fix))
            continue
        if name in {d.field for d in dims}:
            problems.append(Problem(f"space.{name}", "given twice", "give each field once"))
            continue
        found = _dimension(name, raw, types[name])
        if isinstance(found, Problem):
            problems.append(found)
            continue
        problems += _values_problems(base, found)
        dims.append(found)
    if not dims and not problems:
        problems.append(Problem("space", "empty", f"vary at least one field, e.g. {EXAMPLE}"))
    if problems:
        raise SpaceError(problems)
    return Space(tuple(dims))


def suggest(trial: Any, space: Space) -> dict[str, Any]:
    """Optuna's values for one trial (`trial`: an optuna.trial.Trial)."""
    out: dict[str, Any] = {}
    for d in space.dimensions:
        if d.kind == "choice":
            out[d.field] = trial.suggest_categorical(d.field, list(d.choices))
        elif d.whole:
            out[d.field] = trial.suggest_int(d.field, int(d.low or 0), int(d.high or 0), log=d.kind == "loguniform")
        else:
            out[d.field] = trial.suggest_float(
                d.field, float(d.low or 0), float(d.high or 0), log=d.kind == "loguniform"
            )
    return out
