"""How a spec field is declared and read: `spec_field()`, the form `Group` it belongs to, two small readers.

Every field of the spec sections (`jobs.spec.sections`) is declared with `spec_field(...)`, which
puts its help text, form group, numeric bounds, label and applicability in the dataclass field's
metadata; `jobs.spec.field_info` reads that metadata for the form and the field table of docs/spec.md, and
`jobs.spec.parse` reads the bounds. Imports nothing of the project, so every section can use it.

    lora_r: int = spec_field(16, Group.METHOD, "Adapter rank ...", ge=1, le=4096, label="LoRA rank")
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from enum import Enum
from typing import Any, get_args, get_origin

# Bounds every numeric field keeps, beside the ones it declares (`jobs.spec.parse.bounds_problems` reads them):
# a whole number without a bound of its own on a side stays within a signed 64-bit integer (what JSON
# readers such as orjson, SQLite and torch hold); a number field declares its own upper bound (a float's is
# finite). Step counts and the seed declare these shared ones next to the field.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
STEP_COUNT_MAX = 10**9  # optimizer steps: a run of more would never end (max_steps, warmup_steps, logging_steps, ...)
SEED_MAX = 2**32 - 1  # numpy's seed range; transformers' set_seed seeds numpy with it


class Group(str, Enum):
    """The form's sections (and those of the field table in docs/spec.md): where a field is shown."""

    RUN = "Run"
    MODEL = "Model"
    DATA = "Data"
    METHOD = "Method"
    MEMORY = "Memory tricks"
    TRAINING = "Training"


def spec_field(
    default: Any,
    group: Group,
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    methods: Iterable[Enum] | None = None,
    label: str | None = None,
    when: Mapping[str, AbstractSet[Enum]] | None = None,
    advanced: bool = False,
) -> Any:
    """A spec field with its help text, form group, numeric bounds, label and applicability attached.

    methods: the methods a method-specific field applies to (None: every method); it joins `when`.
    label: the words people use ("LoRA rank"); the form shows it with the field's name beside it.
    when: deciding field -> the values under which this field applies (None: always).
    advanced: the form keeps it in the group's closed "More" section.
    """
    applies: dict[str, set[Enum]] = {name: set(values) for name, values in (when or {}).items()}
    if methods is not None:
        methods = frozenset(methods)
        applies["method"] = set(methods)
    meta = {
        "group": group,
        "help": help,
        "ge": ge,
        "gt": gt,
        "le": le,
        "label": label,
        "when": applies,
        "advanced": advanced,
        "methods": methods,
    }
    return dataclasses.field(default=default, metadata=meta)


@functools.cache
def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); any other type -> (it, False)."""
    args = get_args(tp)
    if get_origin(tp) is not None and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def plain(value: Any) -> Any:
    """An enum member's value (what YAML/JSON hold); anything else as it is."""
    return value.value if isinstance(value, Enum) else value
