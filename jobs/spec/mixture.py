"""`dataset` as a list of sources: several data sets per job, each with an optional row cap and column mapping.

A spec keeps `dataset` as one text (the form's text box, the database and every stored run hold
that); one source is the text it always was. Several are separated by commas, each optionally
followed by its own options in brackets:

    data/a.jsonl, sample:chat-format [max_rows=200], data/b.csv [max_rows=500, prompt=question, completion=answer]

YAML and JSON specs may give a list instead, which `JobSpec.from_dict` turns into that text:

    dataset: [data/a.jsonl, {path: data/b.csv, max_rows: 500, columns: {prompt: question}}]

`max_rows` keeps a source's first N rows; `columns` (the `target=yours` pairs of `dataset_columns`)
maps that source's columns *instead of* `dataset_columns`, which applies to every source without
its own. Pure: nothing is read here (`jobs.data.mixing` loads, caps and mixes the sources).

    sources, problems = parse_sources("a.jsonl, b.json [max_rows=500]")
    # ([DataSource("a.jsonl"), DataSource("b.json", 500)], [])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.spec.columns import COLUMN_TARGETS, columns_text, parse_columns

SOURCE_KEYS = ("path", "max_rows", "columns")
EXAMPLE = "write sources separated by commas, e.g. `a.jsonl, b.json [max_rows=500]`"


@dataclass(frozen=True)
class DataSource:
    """One source of the training rows: a sample, a file or a hub id, its row cap and its own column mapping."""

    ref: str
    max_rows: int | None = None
    columns: str | None = None  # target=source pairs, as dataset_columns; None: dataset_columns applies

    @property
    def column_map(self) -> dict[str, str] | None:
        """{trl column: the source's column}, or None when the source has no mapping of its own."""
        return parse_columns(self.columns)[0] if self.columns else None

    def text(self) -> str:
        """The source in the stored form: `ref` or `ref [max_rows=N, target=yours, ...]`."""
        options = ([f"max_rows={self.max_rows}"] if self.max_rows is not None else []) + (
            [self.columns] if self.columns else []
        )
        return f"{self.ref} [{', '.join(options)}]" if options else self.ref


def _split(text: str) -> list[str] | None:
    """`text` cut at the commas outside brackets; None when a bracket is not closed or closed twice."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        return None
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_sources(text: str) -> tuple[list[DataSource], list[tuple[str, str]]]:
    """The stored `dataset` text -> ([sources], [(problem, fix)]); a plain single reference is one source."""
    parts = _split(text)
    if parts is None:
        return [], [(f"`{text}` has an unmatched `[` or `]`", "close each source's options: `b.json [max_rows=500]`")]
    sources: list[DataSource] = []
    problems: list[tuple[str, str]] = []
    for n, part in enumerate(parts, 1):
        if not part:
            if len(parts) > 1:
                problems.append((f"source {n} of the list is empty", "remove the extra comma; " + EXAMPLE))
            continue
        ref, bracket, rest = part.partition("[")
        ref = ref.strip()
        if not ref:
            problems.append((f"source {n} (`{part}`) has options but no data set", "put the path before `[`"))
            continue
        if bracket and not rest.rstrip().endswith("]"):
            problems.append((f"`{part}` has text after its `]`", "end each source with its options: `b.json [...]`"))
            continue
        source, found = _options(ref, rest.rstrip()[:-1] if bracket else "")
        problems.extend(found)
        sources.append(source)
    seen: set[str] = set()
    for s in sources:
        if s.ref in seen:
            problems.append((f"`{s.ref}` is listed twice", "list each source once (use max_rows to cap one)"))
        seen.add(s.ref)
    return sources, problems


def _options(ref: str, options: str) -> tuple[DataSource, list[tuple[str, str]]]:
    """The source `ref` with the options of its brackets (`max_rows=N`, column pairs)."""
    max_rows: int | None = None
    pairs: list[str] = []
    problems: list[tuple[str, str]] = []
    for item in (o.strip() for o in options.split(",")):
        key, _, value = (x.strip() for x in item.partition("="))
        if not item:
            continue
        if key == "max_rows":
            if not value.isdigit() or int(value) < 1:
                problems.append((f"`{ref}` has max_rows `{value}`", "write a whole number of rows >= 1: max_rows=500"))
            else:
                max_rows = int(value)
        elif key in COLUMN_TARGETS:
            pairs.append(item)
        else:
            problems.append(
                (
                    f"`{ref}` has an unknown option `{key}`",
                    f"use max_rows=N or column pairs target=yours ({', '.join(COLUMN_TARGETS)})",
                )
            )
    columns = ", ".join(pairs) or None
    if columns:
        problems.extend((f"`{ref}` columns: {p}", fix) for p, fix in parse_columns(columns)[1])
    return DataSource(ref, max_rows, columns), problems


def sources_text(raw: list[Any]) -> str | None:
    """A YAML/JSON list of sources (text, or {path, max_rows, columns}) as the stored text; None when an item is
    neither (the caller reports it, with LIST_FIX)."""
    out: list[str] = []
    for item in raw:
        if isinstance(item, str):
            out.append(item.strip())
        elif isinstance(item, dict) and "path" in item and set(item) <= set(SOURCE_KEYS):
            columns = item.get("columns")
            cols = columns_text(columns) if isinstance(columns, dict) else (str(columns) if columns else None)
            cap = item.get("max_rows")
            options = ([f"max_rows={cap}"] if cap is not None else []) + ([cols] if cols else [])
            ref = str(item["path"]).strip()
            out.append(f"{ref} [{', '.join(options)}]" if options else ref)  # parse_sources checks the options
        else:
            return None
    return ", ".join(out)


LIST_FIX = f"give each item as a path, sample or hub id, or as a mapping with keys {', '.join(SOURCE_KEYS)}"
