"""What the form and the field table of docs/spec.md read about each spec field: `FieldInfo`, `field_infos()` and friends.

Everything here comes from the declarations in `jobs.spec.sections` (type, default, and what
`jobs.spec.field.spec_field` attached: group, help, bounds, label, applicability), so the form
(`app.ui.form`), the field table of docs/spec.md (`tests/test_docs.py`) and the checks share one source.

    infos = {f.name: f for f in field_infos()}
    infos["lora_r"].title                        # "LoRA rank (lora_r)"
    infos["lora_r"].applies({"method": "oft"})   # False: OFT has no rank
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, get_type_hints

from jobs.spec.enums import Method
from jobs.spec.field import Group, plain, unwrap_optional
from jobs.spec.job import JobSpec


@dataclass(frozen=True)
class FieldInfo:
    """What the form and the field table of docs/spec.md need to know about one spec field."""

    name: str
    group: Group
    help: str
    kind: str  # "str" | "int" | "float" | "bool" | "enum"
    optional: bool
    default: Any
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    methods: tuple[str, ...] = ()  # the methods this field applies to; empty: every method
    label: str = ""
    when: tuple[tuple[str, frozenset[str]], ...] = ()  # (deciding field, values it applies under)
    advanced: bool = False

    @property
    def title(self) -> str:
        """The form's label: the words people use, with the spec name beside them."""
        return f"{self.label} ({self.name})"

    def applies(self, values: dict[str, Any]) -> bool:
        """Whether this field applies under these values of its deciding fields (plain or enum).

        A deciding value that is missing or not one of its choices counts as applying: the field
        stays in view while the spec reports that value's own problem."""
        for name, allowed in self.when:
            value = plain(values.get(name))
            if value in _CHOICES.get(name, ()) and value not in allowed:
                return False
        return True


def field_infos() -> list[FieldInfo]:
    """Every JobSpec field with its group, help, type, bounds, label and applicability, in declaration order."""
    hints = get_type_hints(JobSpec)
    out = []
    for f in fields(JobSpec):
        base, optional = unwrap_optional(hints[f.name])
        if isinstance(base, type) and issubclass(base, Enum):
            kind, choices = "enum", tuple(m.value for m in base)
        else:
            kind, choices = base.__name__, ()
        m = f.metadata
        methods = tuple(x.value for x in Method if x in m["methods"]) if m.get("methods") else ()
        when = tuple((name, frozenset(plain(v) for v in allowed)) for name, allowed in m.get("when", {}).items())
        label = m.get("label") or f.name.replace("_", " ").capitalize()
        out.append(
            FieldInfo(
                f.name,
                m["group"],
                m["help"],
                kind,
                optional,
                plain(f.default),
                choices,
                m.get("ge"),
                m.get("gt"),
                m.get("le"),
                methods,
                label,
                when,
                bool(m.get("advanced")),
            )
        )
    return out


def deciding_fields() -> list[str]:
    """The fields whose value decides whether others apply (today: trainer and method)."""
    return sorted({name for info in field_infos() for name, _ in info.when})


def _enum_choices() -> dict[str, tuple[str, ...]]:
    hints = get_type_hints(JobSpec)
    out = {}
    for f in fields(JobSpec):
        base, _ = unwrap_optional(hints[f.name])
        if isinstance(base, type) and issubclass(base, Enum):
            out[f.name] = tuple(m.value for m in base)
    return out


def applies_to(field_name: str, method: Method | str) -> bool:
    """Whether a spec field matters for a method (the form hides the ones that do not)."""
    methods = next(f.metadata.get("methods") for f in fields(JobSpec) if f.name == field_name)
    return methods is None or Method(method) in methods


_CHOICES: dict[str, tuple[str, ...]] = _enum_choices()  # enum field -> its values, for FieldInfo.applies
