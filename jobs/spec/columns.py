"""`dataset_columns`: the user's column names mapped to the ones tunedeck reads, as one stored text form.

A spec holds the mapping as `target=source, ...` text (the form's text box and the database keep
that); YAML and JSON specs may give a mapping, which `JobSpec.from_dict` turns into the text form.

    parse_columns("prompt=question, completion=answer")   # ({"prompt": "question", ...}, [])
"""

from __future__ import annotations

from typing import Any

COLUMN_TARGETS = (
    "text",
    "messages",
    "prompt",
    "completion",
    "chosen",
    "rejected",
    "label",
    "instruction",
    "input",
    "output",
    "system",
    "history",
    "conversations",
    "images",
)


def columns_text(mapping: dict[Any, Any]) -> str:
    """A {target: source} mapping in the stored form `target=source, ...`."""
    return ", ".join(f"{k}={v}" for k, v in mapping.items())


def parse_columns(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """`prompt=question, completion=answer` (or `prompt: question`) -> ({target: source}, [(problem, fix)])."""
    mapping: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    example = "write target=your_column pairs separated by commas, e.g. prompt=question, completion=answer"
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        sep = "=" if "=" in part else ":"
        target, _, source = (x.strip() for x in part.partition(sep))
        if not _ or not target or not source:
            problems.append((f"`{part}` is not a target=column pair", example))
        elif target not in COLUMN_TARGETS:
            problems.append(
                (f"`{target}` is not a column tunedeck reads", f"map to one of {', '.join(COLUMN_TARGETS)}")
            )
        elif target in mapping:
            problems.append((f"`{target}` is mapped twice", "map each target column once"))
        elif source in mapping.values():
            problems.append((f"column `{source}` is mapped twice", "map each of your columns to one target"))
        else:
            mapping[target] = source
    if not mapping and not problems:
        problems.append(("is empty", "leave it out, or " + example))
    return mapping, problems
