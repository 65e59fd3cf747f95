"""Training data: bundled samples, local files and hub data sets, checked and shaped for trl.

A dataset reference is one of
- `sample:<name>` (train split) or `sample:<name>:eval` - files shipped in jobs/samples/,
  written by jobs/samples/make_samples.py;
- a local `.jsonl`, `.json`, `.csv` or `.parquet` file (read through `datasets`; never
  unpickled; row numbers of a .jsonl file are its line numbers);
- a hub data set `org/name` (its `train` split; fails fast when HF_HUB_OFFLINE=1 and it is
  not cached).

    info = check_dataset("sample:chat-format", Trainer.SFT)     # DatasetInfo, or DataError
    train, eval_ = load_datasets(spec)                          # what SFTTrainer/DPOTrainer take

Every row is validated before training starts, and problems name the first bad rows
("rows 3, 7: `messages` is not a list of {role, content}").
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from jobs.data_rows import COLUMNS, FORMS_HINT, RENAMES, Issues, RowFormat, check_rows, detect_format, trainer_fit
from jobs.spec import JobSpec, Problem, Trainer

__all__ = ["RowFormat", "DatasetInfo", "DataError", "check_dataset", "load_datasets", "length_warnings",
           "list_samples", "SAMPLES_DIR"]

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
EXTENSIONS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class DatasetInfo:
    """What a check of a data set found."""

    ref: str
    format: RowFormat
    n_rows: int
    columns: list[str]
    preview: list[dict[str, Any]] = field(default_factory=list)  # first 5 rows, trl's columns only
    warnings: list[str] = field(default_factory=list)


class DataError(ValueError):
    """Raised with every problem found in a data set (field `dataset` or `eval_dataset`)."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) with the data:\n{lines}")


def list_samples() -> list[str]:
    """The bundled sample refs (train splits); append `:eval` for a sample's held-out split."""
    return sorted(f"sample:{p.name[: -len('.train.jsonl')]}" for p in SAMPLES_DIR.glob("*.train.jsonl"))


# ---------------------------------------------------------------------- resolving a ref
@dataclass(frozen=True)
class _Source:
    ref: str
    path: Path | None = None  # a file (samples included)
    hub: str | None = None    # a hub data set name


def _resolve(ref: str, field_name: str) -> _Source:
    ref = (ref or "").strip()
    if not ref:
        raise DataError([Problem(field_name, "is empty", f"use one of {', '.join(list_samples())} or a path to a data file")])
    if ref.startswith("sample:"):
        name, _, split = ref[len("sample:"):].partition(":")
        split = split or "train"
        path = SAMPLES_DIR / f"{name}.{split}.jsonl"
        if split not in ("train", "eval") or f"sample:{name}" not in list_samples():
            raise DataError([Problem(field_name, f"`{ref}` is not a bundled sample",
                                     f"use one of {', '.join(list_samples())} (add `:eval` for the held-out split)")])
        if not path.is_file():
            raise DataError([Problem(field_name, f"sample file {path} is missing",
                                     "run `python jobs/samples/make_samples.py` or reinstall tunedeck")])
        return _Source(ref, path=path)
    path = Path(ref).expanduser()
    if path.is_dir():
        raise DataError([Problem(field_name, f"`{ref}` is a folder", "point at one .jsonl, .json, .csv or .parquet file")])
    if path.is_file():
        if path.suffix.lower() not in EXTENSIONS:
            raise DataError([Problem(field_name, f"`{path.suffix or path.name}` files are not supported",
                                     "convert it to .jsonl (one JSON object per line), .json, .csv or .parquet")])
        return _Source(ref, path=path)
    if _HUB_NAME.match(ref) and path.suffix.lower() not in EXTENSIONS:
        return _Source(ref, hub=ref)
    if path.suffix.lower() in EXTENSIONS or "/" in ref or "\\" in ref:
        raise DataError([Problem(field_name, f"file `{ref}` does not exist",
                                 f"check the path (relative paths start at {Path.cwd()})")])
    raise DataError([Problem(field_name, f"`{ref}` is not a sample, a file or a hub data set name",
                             f"use {', '.join(list_samples())}, a .jsonl/.json/.csv/.parquet path, or org/name")])


# ---------------------------------------------------------------------- reading rows
def _jsonl_rows(path: Path, issues: Issues | None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line; broken lines go to `issues` when given."""
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                if issues is not None:
                    issues.add(number, "is not valid JSON", "write one complete JSON object per line",
                               detail=f"row {number}: {exc.msg} at column {exc.colno}")
                continue
            if not isinstance(obj, dict):
                if issues is not None:
                    issues.add(number, "is not a JSON object", 'write each line as {"column": value, ...}')
                continue
            yield number, obj


def _columns_of(rows: Iterator[tuple[int, dict[str, Any]]]) -> tuple[list[str], int]:
    cols: dict[str, None] = {}
    n = 0
    for _, row in rows:
        n += 1
        cols.update(dict.fromkeys(row))
    return list(cols), n


def _load_file(path: Path) -> datasets.Dataset:
    """The whole file through `datasets` (Arrow; nothing unpickled)."""
    builder = EXTENSIONS[path.suffix.lower()]
    kwargs: dict[str, Any] = {}
    if builder == "csv":
        # All columns as strings, empty cells as "" - pandas would turn "42" into an int and "" into NaN.
        with path.open(encoding="utf-8", newline="") as fh:
            header = next(csv.reader(fh), [])
        kwargs = {"features": datasets.Features({c: datasets.Value("string") for c in header}),
                  "keep_default_na": False}
    return datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)


def _load_hub(name: str, field_name: str) -> datasets.Dataset:
    try:
        return datasets.load_dataset(name, split="train")
    except Exception as exc:  # offline, not found, gated, no train split: all mean "cannot use it"
        offline = datasets.config.HF_HUB_OFFLINE
        problem = (f"hub data set `{name}` is not in the local cache and the hub is off (HF_HUB_OFFLINE=1)" if offline
                   else f"hub data set `{name}` could not be loaded ({type(exc).__name__}: {str(exc)[:200]})")
        raise DataError([Problem(field_name, problem,
                                 "check the name, or download the data and point at a local .jsonl/.parquet file")]) from exc


def _inspect(ref: str, trainer: Trainer, field_name: str, max_bad_rows: int,
             need_dataset: bool) -> tuple[DatasetInfo, datasets.Dataset | None, str | None]:
    """Validate every row of `ref`; returns the info, the loaded data set (if loaded) and its style."""
    trainer = Trainer(trainer)
    source = _resolve(ref, field_name)
    issues = Issues(field_name, max_bad_rows)
    ds: datasets.Dataset | None = None
    if source.hub:
        ds = _load_hub(source.hub, field_name)
        columns, rows = list(ds.column_names), lambda: enumerate(ds, 1)
    else:
        assert source.path is not None
        columns, rows, ds = _file_rows(source.path, ref, field_name, issues)
    fmt = detect_format(columns)
    if fmt is None:
        hints = [f"`{c}` -> `{RENAMES[c]}`" for c in columns if c in RENAMES]
        fix = (f"rename columns ({', '.join(hints)}); " if hints else "") + FORMS_HINT
        found = ", ".join(f"`{c}`" for c in columns) or "none"
        raise DataError(issues.problems() + [Problem(field_name, f"has no column trl can train on (found {found})", fix)])
    checked = check_rows(rows(), fmt, issues)
    problems = list(checked.problems)
    missing = [c for c in COLUMNS[fmt] if c not in columns]
    if missing:
        problems = [p for p in problems if not any(f"`{c}` is missing" in p.problem for c in missing)]
        problems.insert(0, Problem(field_name, f"has {' and '.join(f'`{c}`' for c in COLUMNS[fmt] if c in columns)} "
                                               f"but no {' or '.join(f'`{c}`' for c in missing)} column",
                                   f"{fmt.value} rows need {' + '.join(f'`{c}`' for c in COLUMNS[fmt])}"))
    if checked.n_rows == 0 and not problems:
        problems.append(Problem(field_name, f"`{ref}` has no rows", "add rows to the file: " + FORMS_HINT))
    misfit = trainer_fit(fmt, trainer, field_name)
    if misfit:
        problems.insert(0, misfit)
    if problems:
        raise DataError(problems)
    warnings = list(checked.warnings)
    unused = [c for c in columns if c not in COLUMNS[fmt]]
    if unused:
        warnings.insert(0, f"column(s) {', '.join(f'`{c}`' for c in unused)} are not used by {trainer.value} and will be dropped")
    info = DatasetInfo(ref, fmt, checked.n_rows, columns, checked.preview, warnings)
    if need_dataset and ds is None:
        assert source.path is not None
        try:
            ds = _load_file(source.path)
        except Exception as exc:
            raise DataError([Problem(field_name, f"`{ref}` passed the checks but `datasets` could not load it "
                                     f"({type(exc).__name__}: {str(exc)[:200]})", "report this with the file attached")]) from exc
    return info, ds, checked.style


_Rows = Callable[[], Iterator[tuple[int, dict[str, Any]]]]


def _file_rows(path: Path, ref: str, field_name: str,
               issues: Issues) -> tuple[list[str], _Rows, datasets.Dataset | None]:
    """Columns, a fresh iterator over (row number, row), and the Dataset when reading needed it."""
    suffix = path.suffix.lower()
    empty = Problem(field_name, f"`{ref}` is empty", "add rows to the file: " + FORMS_HINT)
    if path.stat().st_size == 0:
        raise DataError([empty])
    try:
        listed = _json_list(path, ref, field_name) if suffix == ".json" else None
        if suffix in (".jsonl", ".json") and listed is None:
            # Our own pass over the lines: `datasets` reports a broken line without its number.
            columns, n = _columns_of(_jsonl_rows(path, issues))
            if n == 0 and not issues:
                raise DataError([empty])
            return columns, lambda: _jsonl_rows(path, None), None
        if listed is not None:
            if not listed[1]:
                raise DataError([empty])
            return listed[0], lambda: iter(listed[1]), None
        if suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as fh:
                if not fh.read(1 << 16).strip():
                    raise DataError([empty])
        ds = _load_file(path)
    except UnicodeDecodeError as exc:
        raise DataError([Problem(field_name, f"`{ref}` is not UTF-8 text ({exc.reason} at byte {exc.start})",
                                 "save the file as UTF-8")]) from exc
    except DataError:
        raise
    except Exception as exc:
        kind = suffix[1:]
        raise DataError([Problem(field_name, f"`{ref}` could not be read as {kind} ({type(exc).__name__}: {str(exc)[:200]})",
                                 f"check that the file is valid {kind}")]) from exc
    return list(ds.column_names), lambda: enumerate(ds, 1), ds


def _json_list(path: Path, ref: str, field_name: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]] | None:
    """A .json file holding a list of row objects; None when it is JSON lines under a .json name."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.lstrip().startswith("["):
            return None  # JSON lines (what `datasets` also accepts as .json): checked line by line
        raise DataError([Problem(field_name, f"`{ref}` is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                                 "fix the JSON, or write one object per line in a .jsonl file")]) from exc
    if isinstance(data, dict):
        return None if text.strip().count("\n") == 0 else _not_rows(ref, field_name)
    if not isinstance(data, list):
        _not_rows(ref, field_name)
    issues = Issues(field_name)
    rows = []
    for number, obj in enumerate(data, 1):
        if isinstance(obj, dict):
            rows.append((number, obj))
        else:
            issues.add(number, "is not a JSON object", 'write each row as {"column": value, ...}')
    if issues:
        raise DataError(issues.problems())
    columns, _ = _columns_of(iter(rows))
    return columns, rows


def _not_rows(ref: str, field_name: str) -> None:
    raise DataError([Problem(field_name, f"`{ref}` does not hold a list of rows",
                             'write [{"column": value, ...}, ...], or one object per line in a .jsonl file')])


# ---------------------------------------------------------------------- public API
def check_dataset(ref: str, trainer: Trainer, field: str = "dataset", max_bad_rows: int = 5) -> DatasetInfo:
    """Check every row of `ref` for `trainer`; raises DataError naming the first bad rows."""
    return _inspect(ref, trainer, field, max_bad_rows, need_dataset=False)[0]


def _features(fmt: RowFormat, style: str | None) -> datasets.Features:
    message = [{"role": datasets.Value("string"), "content": datasets.Value("string")}]
    cell = message if style == "conversational" else datasets.Value("string")
    return datasets.Features({c: (message if c == "messages" else cell) for c in COLUMNS[fmt]})


def _load(ref: str, trainer: Trainer, field_name: str) -> datasets.Dataset:
    info, ds, style = _inspect(ref, trainer, field_name, 5, need_dataset=True)
    assert ds is not None
    fmt, keep = info.format, COLUMNS[info.format]
    features = _features(fmt, style)
    drop = [c for c in ds.column_names if c not in keep]
    if all(ds.features.get(c) == features[c] for c in keep):
        return ds.remove_columns(drop) if drop else ds

    def shape(row: dict[str, Any]) -> dict[str, Any]:
        return {c: ([{"role": m["role"], "content": m["content"]} for m in row[c]] if isinstance(row[c], list) else row[c])
                for c in keep}

    return ds.map(shape, remove_columns=drop, features=features, desc=f"Shaping {field_name}")


def _default_eval(ref: str) -> str | None:
    ref = ref.strip()
    if ref.startswith("sample:") and ref.count(":") == 1:
        return f"{ref}:eval"
    return None


def load_datasets(spec: JobSpec) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Train and eval data for `spec`, shaped for trl's SFTTrainer / DPOTrainer; DataError lists all problems."""
    problems: list[Problem] = []
    train: datasets.Dataset | None = None
    eval_: datasets.Dataset | None = None
    try:
        train = _load(spec.dataset, spec.trainer, "dataset")
    except DataError as exc:
        problems.extend(exc.problems)
    eval_ref = spec.eval_dataset.strip() if spec.eval_dataset and spec.eval_dataset.strip() else _default_eval(spec.dataset)
    if eval_ref:
        try:
            eval_ = _load(eval_ref, spec.trainer, "eval_dataset")
        except DataError as exc:
            problems.extend(exc.problems)
    if problems:
        raise DataError(problems)
    assert train is not None
    if spec.max_train_samples is not None and spec.max_train_samples < len(train):
        train = train.select(range(spec.max_train_samples))
    return train, eval_


def length_warnings(ds: datasets.Dataset, tokenizer: Any, max_length: int | None, sample_size: int = 1000) -> list[str]:
    """Warn how many rows exceed `max_length` tokens; measures at most `sample_size` rows (cheap)."""
    n = len(ds)
    if not n or not max_length:
        return []
    sampled = n > sample_size
    rows = ds.select(sorted(random.Random(0).sample(range(n), sample_size))) if sampled else ds
    try:
        lengths = [max(len(tokenizer(t, add_special_tokens=special)["input_ids"]) for t, special in _texts(row, tokenizer))
                   for row in rows]
    except Exception as exc:  # a warning helper must never stop training
        return [f"could not measure row lengths ({type(exc).__name__}: {exc})"]
    over = sum(1 for length in lengths if length > max_length)
    if not over:
        return []
    if sampled:
        return [f"about {round(over / len(lengths) * n)} of {n} rows (estimated from {len(lengths)}) are longer "
                f"than max_length {max_length} tokens and will be truncated"]
    return [f"{over} of {n} rows are longer than max_length {max_length} tokens and will be truncated"]


def _texts(row: dict[str, Any], tokenizer: Any) -> list[tuple[str, bool]]:
    """The full sequence(s) trl will tokenize for one row, and whether to add special tokens."""
    if "messages" in row:
        return [_render(row["messages"], tokenizer)]
    if "text" in row:
        return [(row["text"], True)]
    answers = [row[c] for c in ("completion", "chosen", "rejected") if c in row]
    if isinstance(row["prompt"], list):
        return [_render(row["prompt"] + a, tokenizer) for a in answers]
    return [(row["prompt"] + a, True) for a in answers]


def _render(messages: list[dict[str, str]], tokenizer: Any) -> tuple[str, bool]:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False), False
    return "\n".join(m["content"] for m in messages), True
