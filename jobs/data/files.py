"""Reading rows out of local data files, with row numbers, for `jobs.data.inspection`.

JSON lines (`.jsonl`, `.json`), JSON documents (`.json` or `.jsonl` holding one array of rows, or
an object whose one list of row objects is the data, like `{"data": [...]}`), each also gzipped
(`.jsonl.gz`, `.json.gz`); `.csv` and `.parquet` through `datasets` (Arrow; nothing unpickled).
Text is read as UTF-8 with or without a byte-order mark, with LF or CRLF line ends. Row numbers
are line numbers for JSON lines and 1-based positions for JSON arrays and tables.

    columns, rows, ds = file_rows(path, ref, "dataset", issues)   # rows(): (number, dict) pairs
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.data.embedded_images import undecoded
from jobs.data.row_formats import FORMS_HINT
from jobs.data.validation import Issues
from jobs.errors import Problem, ProblemError
from jobs.spec.columns import COLUMN_TARGETS

if TYPE_CHECKING:
    import datasets

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".jsonl.gz", ".json.gz")
Rows = Callable[[], Iterator[tuple[int, dict[str, Any]]]]


class FileProblem(ProblemError):
    """A file-level problem (the caller wraps it into its DataError)."""


def file_kind(path: Path) -> str | None:
    """The supported suffix of `path` (`.jsonl.gz` counts as one), or None."""
    name = path.name.lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def open_text(path: Path) -> io.TextIOBase:
    """The file as text: gunzipped when .gz, a UTF-8 byte-order mark dropped, CRLF read as LF."""
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return path.open(encoding="utf-8-sig")


def jsonl_rows(path: Path, issues: Issues | None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line; broken lines go to `issues` when given."""
    with open_text(path) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                if issues is not None:
                    issues.add(
                        number,
                        "is not valid JSON",
                        "write one complete JSON object per line",
                        detail=f"row {number}: {exc.msg} at column {exc.colno}",
                    )
                continue
            if not isinstance(obj, dict):
                if issues is not None:
                    issues.add(number, "is not a JSON object", 'write each line as {"column": value, ...}')
                continue
            yield number, obj


def columns_of(rows: Iterator[tuple[int, dict[str, Any]]]) -> tuple[list[str], int]:
    """Every column seen (first-seen order) and the row count."""
    cols: dict[str, None] = {}
    n = 0
    for _, row in rows:
        n += 1
        cols.update(dict.fromkeys(row))
    return list(cols), n


def _row_lists(data: Any) -> dict[str, list[Any]]:
    """Keys of a top-level object whose values are non-empty lists of objects (the candidate row lists).

    An object with a column tunedeck reads (`messages`, `conversations`, `prompt`, ...) is a row, not a wrapper."""
    if set(data) & set(COLUMN_TARGETS):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)}


def _one_plain_row(line: str) -> bool:
    """Whether `line` is one complete JSON object that is not a wrapper around a list of rows."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(obj, dict) and not _row_lists(obj)


def json_document(path: Path, ref: str, field_name: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]] | None:
    """Rows of a file holding one JSON document; None when it is JSON lines."""
    with open_text(path) as fh:
        first = next((line for line in fh if line.strip()), "")
        if _one_plain_row(first):
            return None  # JSON lines: the common case decides on the first line, without reading the whole file
        fh.seek(0)
        text = fh.read()
    stripped = text.strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if not stripped.startswith("["):
            return None  # JSON lines: checked line by line, with line numbers
        raise FileProblem(
            [
                Problem(
                    field_name,
                    f"`{ref}` is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                    "fix the JSON, or write one object per line in a .jsonl file",
                )
            ]
        ) from exc
    if isinstance(data, dict):
        lists = _row_lists(data)
        if len(lists) == 1:
            data = next(iter(lists.values()))  # {"data": [...]}, {"train": [...], "version": 2}: unambiguous
        elif len(lists) > 1:
            keys = ", ".join(f"`{k}`" for k in lists)
            raise FileProblem(
                [
                    Problem(
                        field_name,
                        f"`{ref}` holds several lists of rows ({keys}), so which one to train on is ambiguous",
                        "keep one list of rows per file, or one JSON object per line in a .jsonl file",
                    )
                ]
            )
        elif "\n" not in stripped:
            return None  # a single-line object: JSON lines with one row
        else:
            raise FileProblem(
                [
                    Problem(
                        field_name,
                        f"`{ref}` does not hold a list of rows",
                        'write [{"column": value, ...}, ...], or one object per line in a .jsonl file',
                    )
                ]
            )
    if not isinstance(data, list):
        raise FileProblem(
            [
                Problem(
                    field_name,
                    f"`{ref}` does not hold a list of rows",
                    'write [{"column": value, ...}, ...], or one object per line in a .jsonl file',
                )
            ]
        )
    issues = Issues(field_name)
    rows = []
    for number, obj in enumerate(data, 1):
        if isinstance(obj, dict):
            rows.append((number, obj))
        else:
            issues.add(number, "is not a JSON object", 'write each row as {"column": value, ...}')
    if issues:
        raise FileProblem(issues.problems())
    return columns_of(iter(rows))[0], rows


def load_table(path: Path) -> datasets.Dataset:
    """A .csv or .parquet file through `datasets` (CSV: every column as text, BOM dropped)."""
    import datasets

    if file_kind(path) == ".parquet":  # images stored in it are read as bytes, never decoded here
        return undecoded(datasets.load_dataset("parquet", data_files=str(path), split="train"))
    # All columns as strings, empty cells as "" - pandas would turn "42" into an int and "" into NaN.
    with path.open(encoding="utf-8-sig", newline="") as fh:
        header = next(csv.reader(fh), [])
    return datasets.load_dataset(
        "csv",
        data_files=str(path),
        split="train",
        encoding="utf-8-sig",
        features=datasets.Features({c: datasets.Value("string") for c in header}),
        keep_default_na=False,
    )


def file_rows(
    path: Path, ref: str, field_name: str, issues: Issues, keep: bool = False, limit: int | None = None
) -> tuple[list[str], Rows, datasets.Dataset | None]:
    """Columns, a fresh iterator over (row number, row), and the Dataset when reading needed it.

    JSON lines are parsed again by each iteration (a check holds one row at a time); `keep`: parsed once and
    held, for a caller that keeps every row anyway (`jobs.data.loading`); `limit`: JSON lines are read only up
    to that many rows (the form's preview of a big file)."""
    kind = file_kind(path) or ""
    empty = Problem(field_name, f"`{ref}` is empty", "add rows to the file: " + FORMS_HINT)
    if path.stat().st_size == 0:
        raise FileProblem([empty])
    try:
        if kind.startswith(".json"):
            listed = json_document(path, ref, field_name)
            if listed is not None:
                if not listed[1]:
                    raise FileProblem([empty])
                return listed[0], lambda: iter(listed[1]), None
            # Our own pass over the lines: `datasets` reports a broken line without its number.
            if keep:
                parsed = list(islice(jsonl_rows(path, issues), limit))
                columns, n = columns_of(iter(parsed))
            else:
                columns, n = columns_of(islice(jsonl_rows(path, issues), limit))
            if n == 0 and not issues:
                raise FileProblem([empty])
            return columns, (lambda: iter(parsed)) if keep else (lambda: islice(jsonl_rows(path, None), limit)), None
        if kind == ".csv":
            with path.open(encoding="utf-8-sig", newline="") as fh:
                if not fh.read(1 << 16).strip():
                    raise FileProblem([empty])
        ds = load_table(path)
    except UnicodeDecodeError as exc:
        raise FileProblem(
            [
                Problem(
                    field_name,
                    f"`{ref}` is not UTF-8 text ({exc.reason} at byte {exc.start})",
                    "save the file as UTF-8",
                )
            ]
        ) from exc
    except (gzip.BadGzipFile, EOFError) as exc:
        raise FileProblem(
            [
                Problem(
                    field_name,
                    f"`{ref}` is not a complete gzip file ({exc})",
                    "compress it again with gzip, or give the plain .jsonl file",
                )
            ]
        ) from exc
    except FileProblem:
        raise
    except Exception as exc:  # re-raised below as the file's problem, naming the cause
        # csv/parquet go through datasets and pyarrow, whose errors for a malformed table have many types.
        raise FileProblem(
            [
                Problem(
                    field_name,
                    f"`{ref}` could not be read as {kind[1:]} ({type(exc).__name__}: {str(exc)[:200]})",
                    f"check that the file is valid {kind[1:]}",
                )
            ]
        ) from exc
    return list(ds.column_names), lambda: enumerate(ds, 1), ds
