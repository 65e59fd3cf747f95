"""Checking a data set: every row validated after `dataset_columns` and the Alpaca/ShareGPT conversion.

Alpaca and ShareGPT rows are detected and converted (`jobs.data.formats`), after the spec's
`dataset_columns` renamed the user's columns; each converted row is handed to
`jobs.data.validation.RowCheck`.

    info = check_dataset("sample:chat-format", Trainer("sft"))     # DatasetInfo, or DataError

Every row is validated before training starts, and problems name the first bad rows
("rows 3, 7: `messages` is not a list of {role, content}").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.data.dataset_info import DatasetInfo
from jobs.data.files import FileProblem, Rows, file_rows
from jobs.data.formats import Conversion, detect_conversion, rename_columns, renamed
from jobs.data.image_pairs import pair_image_conversion
from jobs.data.images import ImageRows, image_conversion, unread_images_problem
from jobs.data.row_formats import COLUMNS, FORMS_HINT, RENAMES, RowFormat, detect_format, reward_columns
from jobs.data.sources import DataError, Source, load_hub, resolve
from jobs.data.trainer_rows import trainer_fit
from jobs.data.validation import Checked, Issues, RowCheck
from jobs.errors import Problem
from jobs.spec.enums import Trainer
from jobs.spec.trainer_records import record_for
from storage.data_folders import also_readable, readable_folders

if TYPE_CHECKING:
    import datasets


Visit = Callable[[int, dict[str, Any], RowFormat, list[str]], None]  # (row number, row, its format, reward columns)


@dataclass
class Inspected:
    """A checked data set: its info, its converted rows and, for tables and hub data, the Dataset."""

    info: DatasetInfo
    rows: Rows
    ds: datasets.Dataset | None
    style: str | None


def _converted(
    raw: Rows, column_map: dict[str, str], conversion: Conversion | None, issues: Issues | None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows with dataset_columns applied and converted to trl's columns; conversion problems go to `issues`."""
    for number, row in raw():
        row = rename_columns(row, column_map)
        if conversion is not None:
            converted, problems = conversion.convert(row)
            for message, fix in problems:
                if issues is not None:
                    issues.add(number, message, fix)
            if converted is None:
                continue
            row = converted
        yield number, row


def _mapping_problems(columns: list[str], column_map: dict[str, str], field_name: str) -> list[Problem]:
    found = ", ".join(f"`{c}`" for c in columns) or "none"
    return [
        Problem(
            "dataset_columns",
            f"maps `{target}` to `{source}`, but {field_name} has no `{source}` column (found {found})",
            f"name one of the columns found, or remove `{target}={source}`",
        )
        for target, source in column_map.items()
        if source not in columns
    ]


def _image_conversion(
    columns: list[str], first: list[dict[str, Any]], base: Path | None, trainer: Trainer
) -> Conversion | None:
    """Rows with images: dpo's image pairs (`jobs.data.image_pairs`) for dpo, else image chat (`jobs.data.images`)."""
    pairs = pair_image_conversion(columns, first, base) if record_for(trainer).image_pairs else None
    return pairs or image_conversion(columns, first, base)


def inspect_dataset(
    ref: str,
    trainer: Trainer,
    field_name: str,
    max_bad_rows: int,
    column_map: dict[str, str] | None = None,
    keep_rows: bool = False,
    limit: int | None = None,
    visit: Visit | None = None,
) -> Inspected:
    """Validate every row of `ref` (after dataset_columns and format conversion); DataError lists all problems.

    `keep_rows`: the file is read once and the converted rows are held (`Inspected.rows` iterates over
    them), for a caller that keeps every row anyway; else each iteration reads the file again. `limit`: only
    the first rows of a JSON lines file or a hub data set are read (the form's preview of a big file). `visit`:
    called with each converted row as it is validated, while no row has a problem (the audit reads a file in
    this one pass and holds none of it; a problem means a DataError at the end).
    Images the rows name may also lie in the data file's own folder when it is a bundled sample or the
    unpacked folder of a zip (`storage.data_folders.also_readable`)."""
    source = resolve(ref, field_name)
    own = own_folders(source.path) if source.path is not None and readable_folders() is not None else ()
    with also_readable(own):
        return _inspect(source, ref, Trainer(trainer), field_name, max_bad_rows, column_map, keep_rows, limit, visit)


def own_folders(path: Path) -> tuple[Path, ...]:
    """The folder a file of a bundled sample or of an unpacked zip lies in (its images are there: readable with
    it, `storage.data_folders.also_readable`); () for any other file."""
    from jobs.data.sources import SAMPLES_DIR
    from storage.data_folders import under_folders

    if under_folders(path, [SAMPLES_DIR]):
        return (SAMPLES_DIR,)
    from storage.settings import cache_dir

    zips = cache_dir() / "zips"  # jobs.data.archive unpacks each zip into zips/<key>/
    if under_folders(path, [zips]):
        inside = path.resolve().relative_to(zips.resolve()).parts
        return (zips / inside[0],) if inside else ()
    return ()


def _inspect(
    source: Source,
    ref: str,
    trainer: Trainer,
    field_name: str,
    max_bad_rows: int,
    column_map: dict[str, str] | None,
    keep_rows: bool,
    limit: int | None,
    visit: Visit | None = None,
) -> Inspected:
    column_map = dict(column_map or {})
    issues = Issues(field_name, max_bad_rows)
    columns, raw, ds = _source_rows(source, ref, field_name, issues, keep_rows, limit)
    mapping_problems = _mapping_problems(columns, column_map, field_name)
    if mapping_problems:
        raise DataError(issues.problems() + mapping_problems)
    mapped = renamed(columns, column_map)
    first = [rename_columns(row, column_map) for _, row in islice(raw(), 20)]
    base = source.path.parent if source.path is not None else None
    conversion = _image_conversion(mapped, first, base, trainer)
    unread = None if conversion else unread_images_problem(mapped, trainer.value, field_name)
    if unread is not None:
        raise DataError(issues.problems() + [unread])
    conversion = conversion or detect_conversion(mapped, first, trainer)
    fmt_columns = list(conversion.columns) if conversion else mapped
    fmt = detect_format(fmt_columns)
    if record_for(trainer).generates and "prompt" in fmt_columns:
        fmt = RowFormat.PROMPT_ONLY  # grpo generates the answers: only the prompts are read
    if fmt is None:
        raise DataError(issues.problems() + [_no_format_problem(columns, mapped, field_name)])
    rows: Rows = lambda: _converted(raw, column_map, conversion, None)  # noqa: E731
    passed = reward_columns(mapped) if fmt is RowFormat.PROMPT_ONLY and conversion is None else []
    check = RowCheck(fmt, issues)
    kept: list[tuple[int, dict[str, Any]]] = []
    sizes: list[tuple[int, int, int]] = []
    for number, row in _converted(raw, column_map, conversion, issues):  # read here, validated below
        check.add(number, row)
        sizes += [(number, int(w), int(h)) for w, h in row.get("image_sizes") or ()]
        if keep_rows:
            kept.append((number, row))
        if visit is not None and not issues:
            visit(number, row, fmt, passed)
    if keep_rows:
        rows = lambda: iter(kept)  # noqa: E731
    checked = check.result()
    problems = _checked_problems(checked, fmt, fmt_columns, ref, trainer, field_name)
    if problems:
        raise DataError(problems)
    warnings = _column_warnings(checked, fmt, conversion, mapped, passed, trainer)
    info = DatasetInfo(
        ref,
        fmt,
        checked.n_rows,
        columns,
        checked.preview,
        warnings,
        conversion.source if conversion else "trl",
        conversion.description if conversion else None,
        column_map,
        passed,
        checked.repeated_turns,
        checked.tools,
        images=ImageRows.of(sizes),
    )
    return Inspected(info, rows, None if (conversion or column_map) else ds, checked.style)


# ---------------------------------------------------------------------- public API
def check_dataset(
    ref: str,
    trainer: Trainer,
    field: str = "dataset",
    max_bad_rows: int = 5,
    column_map: dict[str, str] | None = None,
    limit: int | None = None,
) -> DatasetInfo:
    """Check every row of `ref` for `trainer` (`limit`: only the first rows); DataError names the first bad rows."""
    return inspect_dataset(ref, trainer, field, max_bad_rows, column_map, limit=limit).info


def _source_rows(
    source: Source, ref: str, field_name: str, issues: Issues, keep_rows: bool, limit: int | None = None
) -> tuple[list[str], Rows, datasets.Dataset | None]:
    """The columns, the raw rows and the Dataset (when reading made one) of a hub dataset or a file."""
    if source.hub:
        hub = load_hub(source.hub, field_name)
        if limit is not None and limit < len(hub):
            hub = hub.select(range(limit))
        return list(hub.column_names), lambda: enumerate(hub, 1), hub
    assert source.path is not None
    try:
        return file_rows(source.path, ref, field_name, issues, keep=keep_rows, limit=limit)
    except FileProblem as exc:
        raise DataError(exc.problems) from exc


def _no_format_problem(columns: list[str], mapped: list[str], field_name: str) -> Problem:
    """No row format fits the columns: which dataset_columns mapping would (from the usual names)."""
    targets: dict[str, str] = {}
    for c in mapped:
        if c in RENAMES:
            targets.setdefault(RENAMES[c], c)
    hints = [f"{target}={c}" for target, c in targets.items()]
    fix = (
        f"map your columns with dataset_columns, e.g. `{', '.join(hints)}`; "
        if hints
        else "map your columns with dataset_columns (target=yours, e.g. prompt=question, completion=answer), or "
    ) + FORMS_HINT
    found = ", ".join(f"`{c}`" for c in columns) or "none"
    return Problem(field_name, f"has no column trl can train on (found {found})", fix)


def _checked_problems(
    checked: Checked, fmt: RowFormat, fmt_columns: list[str], ref: str, trainer: Trainer, field_name: str
) -> list[Problem]:
    """The rows' problems, a missing column named once for all rows, no rows, a format the trainer cannot use."""
    problems = list(checked.problems)
    missing = [c for c in COLUMNS[fmt] if c not in fmt_columns]
    if missing:
        problems = [p for p in problems if not any(f"`{c}` is missing" in p.problem for c in missing)]
        problems.insert(
            0,
            Problem(
                field_name,
                f"has {' and '.join(f'`{c}`' for c in COLUMNS[fmt] if c in fmt_columns)} "
                f"but no {' or '.join(f'`{c}`' for c in missing)} column",
                f"{fmt.value} rows need {' + '.join(f'`{c}`' for c in COLUMNS[fmt])}",
            ),
        )
    if checked.n_rows == 0 and not problems:
        problems.append(Problem(field_name, f"`{ref}` has no rows", "add rows to the file: " + FORMS_HINT))
    misfit = trainer_fit(fmt, trainer, field_name)
    if misfit:
        problems.insert(0, misfit)
    return problems


def _column_warnings(
    checked: Checked,
    fmt: RowFormat,
    conversion: Conversion | None,
    mapped: list[str],
    passed: list[str],
    trainer: Trainer,
) -> list[str]:
    """The rows' warnings, after the columns passed to reward functions and those the trainer drops."""
    warnings = list(checked.warnings)
    used = set(COLUMNS[fmt]) | set(conversion.reads if conversion else ())
    unused = [c for c in mapped if c not in used and c not in passed]
    if passed:
        warnings.insert(
            0,
            f"column(s) {', '.join(f'`{c}`' for c in passed)} are passed to the reward functions "
            "as keyword arguments (a custom reward_function can read them)",
        )
    if unused:
        warnings.insert(
            0, f"column(s) {', '.join(f'`{c}`' for c in unused)} are not used by {trainer.value} and will be dropped"
        )
    return warnings
