"""Training data: bundled samples, local files and hub data sets, checked, converted and shaped for trl.

A dataset reference is one of
- `sample:<name>` (train split) or `sample:<name>:eval` - files shipped in jobs/data/samples/,
  written by jobs/data/samples/make_samples.py;
- a local `.jsonl`, `.json`, `.csv` or `.parquet` file, `.jsonl.gz`/`.json.gz` too (read by
  `jobs.data.files`: UTF-8 with or without BOM, CRLF, JSON arrays and `{"data": [...]}`
  wrappers; never unpickled; row numbers of a .jsonl file are its line numbers);
- a hub data set `org/name` (its `train` split; fails fast when HF_HUB_OFFLINE=1 and it is
  not cached).
Alpaca and ShareGPT rows are detected and converted (`jobs.data.formats`), after the spec's
`dataset_columns` renamed the user's columns.

    info = check_dataset("sample:chat-format", Trainer.SFT)     # DatasetInfo, or DataError
    loaded = load_data(spec)                                    # train/eval for trl + what was converted

Every row is validated before training starts, and problems name the first bad rows
("rows 3, 7: `messages` is not a list of {role, content}").
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import datasets

from jobs.data.files import SUFFIXES, FileProblem, Rows, file_kind, file_rows
from jobs.data.formats import Conversion, detect_conversion, rename_columns, renamed
from jobs.data.rows import (
    COLUMNS,
    FORMS_HINT,
    RENAMES,
    Issues,
    RowFormat,
    check_rows,
    detect_format,
    only_columns,
    reward_columns,
    trainer_fit,
)
from jobs.errors import Problem, ProblemError
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec

__all__ = [
    "RowFormat",
    "DatasetInfo",
    "DataError",
    "LoadedData",
    "check_dataset",
    "load_data",
    "load_datasets",
    "length_warnings",
    "list_samples",
    "SAMPLES_DIR",
    "SUFFIXES",
]

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class DatasetInfo:
    """What a check of a data set found."""

    ref: str
    format: RowFormat
    n_rows: int
    columns: list[str]
    preview: list[dict[str, Any]] = field(default_factory=list)  # first 5 rows, converted, trl's columns only
    warnings: list[str] = field(default_factory=list)
    source_format: str = "trl"  # "trl" (already trl's columns), "alpaca" or "sharegpt"
    conversion: str | None = None  # what was converted, in words; None when nothing was
    column_map: dict[str, str] = field(default_factory=dict)  # dataset_columns applied: {trl column: file column}
    reward_columns: list[str] = field(default_factory=list)  # grpo: columns passed on to the reward functions
    repeated_turns: list[tuple[int, list[dict[str, Any]]]] = field(
        default_factory=list
    )  # rows with a role twice in a row

    def record(self) -> dict[str, Any]:
        """What the run's resolved config keeps about this data set."""
        return {
            "ref": self.ref,
            "format": self.format.value,
            "source_format": self.source_format,
            "conversion": self.conversion,
            "dataset_columns": self.column_map or None,
            "rows": self.n_rows,
        }


class DataError(ProblemError):
    """Raised with every problem found in a data set (field `dataset` or `eval_dataset`)."""

    subject = "with the data"


def list_samples() -> list[str]:
    """The bundled sample refs (train splits); append `:eval` for a sample's held-out split."""
    return sorted(f"sample:{p.name[: -len('.train.jsonl')]}" for p in SAMPLES_DIR.glob("*.train.jsonl"))


# ---------------------------------------------------------------------- resolving a ref
@dataclass(frozen=True)
class _Source:
    ref: str
    path: Path | None = None  # a file (samples included)
    hub: str | None = None  # a hub data set name


def _resolve(ref: str, field_name: str) -> _Source:
    ref = (ref or "").strip()
    if not ref:
        raise DataError(
            [Problem(field_name, "is empty", f"use one of {', '.join(list_samples())} or a path to a data file")]
        )
    if ref.startswith("sample:"):
        name, _, split = ref[len("sample:") :].partition(":")
        split = split or "train"
        path = SAMPLES_DIR / f"{name}.{split}.jsonl"
        if split not in ("train", "eval") or f"sample:{name}" not in list_samples():
            raise DataError(
                [
                    Problem(
                        field_name,
                        f"`{ref}` is not a bundled sample",
                        f"use one of {', '.join(list_samples())} (add `:eval` for the held-out split)",
                    )
                ]
            )
        if not path.is_file():
            raise DataError(
                [
                    Problem(
                        field_name,
                        f"sample file {path} is missing",
                        "run `python jobs/data/samples/make_samples.py` or reinstall tunedeck",
                    )
                ]
            )
        return _Source(ref, path=path)
    path = Path(ref).expanduser()
    if path.is_dir():
        raise DataError(
            [Problem(field_name, f"`{ref}` is a folder", "point at one .jsonl, .json, .csv or .parquet file")]
        )
    if path.is_file():
        if file_kind(path) is None:
            raise DataError(
                [
                    Problem(
                        field_name,
                        f"`{path.suffix or path.name}` files are not supported",
                        "convert it to .jsonl (one JSON object per line, may be gzipped), .json, .csv or .parquet",
                    )
                ]
            )
        return _Source(ref, path=path)
    if _HUB_NAME.match(ref) and file_kind(path) is None:
        return _Source(ref, hub=ref)
    if file_kind(path) is not None or "/" in ref or "\\" in ref:
        raise DataError(
            [
                Problem(
                    field_name, f"file `{ref}` does not exist", f"check the path (relative paths start at {Path.cwd()})"
                )
            ]
        )
    raise DataError(
        [
            Problem(
                field_name,
                f"`{ref}` is not a sample, a file or a hub data set name",
                f"use {', '.join(list_samples())}, a .jsonl/.json/.csv/.parquet path, or org/name",
            )
        ]
    )


# ---------------------------------------------------------------------- reading rows
def _load_hub(name: str, field_name: str) -> datasets.Dataset:
    try:
        return datasets.load_dataset(name, split="train")
    except Exception as exc:  # offline, not found, gated, no train split: all mean "cannot use it"
        offline = datasets.config.HF_HUB_OFFLINE
        problem = (
            f"hub data set `{name}` is not in the local cache and the hub is off (HF_HUB_OFFLINE=1)"
            if offline
            else f"hub data set `{name}` could not be loaded ({type(exc).__name__}: {str(exc)[:200]})"
        )
        raise DataError(
            [
                Problem(
                    field_name,
                    problem,
                    "check the name, or download the data and point at a local .jsonl/.parquet file",
                )
            ]
        ) from exc


@dataclass
class _Inspected:
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


def _inspect(
    ref: str, trainer: Trainer, field_name: str, max_bad_rows: int, column_map: dict[str, str] | None = None
) -> _Inspected:
    """Validate every row of `ref` (after dataset_columns and format conversion); DataError lists all problems."""
    trainer = Trainer(trainer)
    column_map = dict(column_map or {})
    source = _resolve(ref, field_name)
    issues = Issues(field_name, max_bad_rows)
    ds: datasets.Dataset | None = None
    if source.hub:
        ds = _load_hub(source.hub, field_name)
        hub = ds
        columns, raw = list(ds.column_names), lambda: enumerate(hub, 1)
    else:
        assert source.path is not None
        try:
            columns, raw, ds = file_rows(source.path, ref, field_name, issues)
        except FileProblem as exc:
            raise DataError(exc.problems) from exc
    mapping_problems = _mapping_problems(columns, column_map, field_name)
    if mapping_problems:
        raise DataError(issues.problems() + mapping_problems)
    mapped = renamed(columns, column_map)
    first = [rename_columns(row, column_map) for _, row in islice(raw(), 20)]
    conversion = detect_conversion(mapped, first)
    fmt_columns = list(conversion.columns) if conversion else mapped
    fmt = detect_format(fmt_columns)
    if trainer is Trainer.GRPO and "prompt" in fmt_columns:
        fmt = RowFormat.PROMPT_ONLY  # grpo generates the answers: only the prompts are read
    if fmt is None:
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
        raise DataError(
            issues.problems() + [Problem(field_name, f"has no column trl can train on (found {found})", fix)]
        )
    rows: Rows = lambda: _converted(raw, column_map, conversion, None)  # noqa: E731
    checked = check_rows(_converted(raw, column_map, conversion, issues), fmt, issues)
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
    if problems:
        raise DataError(problems)
    warnings = list(checked.warnings)
    used = set(COLUMNS[fmt]) | set(conversion.reads if conversion else ())
    passed = reward_columns(mapped) if fmt is RowFormat.PROMPT_ONLY and conversion is None else []
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
    )
    return _Inspected(info, rows, None if (conversion or column_map) else ds, checked.style)


# ---------------------------------------------------------------------- public API
def check_dataset(
    ref: str, trainer: Trainer, field: str = "dataset", max_bad_rows: int = 5, column_map: dict[str, str] | None = None
) -> DatasetInfo:
    """Check every row of `ref` for `trainer`; raises DataError naming the first bad rows."""
    return _inspect(ref, trainer, field, max_bad_rows, column_map).info


def _features(fmt: RowFormat, style: str | None) -> datasets.Features:
    message = [{"role": datasets.Value("string"), "content": datasets.Value("string")}]
    cell = message if style == "conversational" else datasets.Value("string")
    return datasets.Features(
        {c: (message if c == "messages" else datasets.Value("bool") if c == "label" else cell) for c in COLUMNS[fmt]}
    )


def _load(
    ref: str, trainer: Trainer, field_name: str, column_map: dict[str, str]
) -> tuple[datasets.Dataset, DatasetInfo]:
    """The checked, converted data set with trl's columns only, and its info."""
    checked = _inspect(ref, trainer, field_name, 5, column_map)
    info, ds = checked.info, checked.ds
    keep, features = COLUMNS[info.format], _features(info.format, checked.style)
    extra = info.reward_columns
    if ds is None:  # JSON files, and anything converted: built from the checked rows
        rows = [{**only_columns(row, info.format), **{c: row.get(c) for c in extra}} for _, row in checked.rows()]
        if not extra:
            return datasets.Dataset.from_list(rows, features=features), info
        try:  # the extra columns' types are inferred; the prompt keeps its checked type
            return datasets.Dataset.from_list(
                rows,
                features=datasets.Features(
                    {**features, **datasets.Dataset.from_list([{c: r[c] for c in extra} for r in rows]).features}
                ),
            ), info
        except (ValueError, TypeError) as exc:  # pyarrow's errors are ValueError/TypeError subclasses
            raise DataError(
                [
                    Problem(
                        field_name,
                        f"columns {', '.join(extra)} do not hold one type each ({exc})",
                        "give each extra column one type in every row, or remove it",
                    )
                ]
            ) from exc
    features = datasets.Features({**features, **{c: ds.features[c] for c in extra}})
    keep = (*keep, *extra)
    drop = [c for c in ds.column_names if c not in keep]
    if all(ds.features.get(c) == features[c] for c in keep):
        return (ds.remove_columns(drop) if drop else ds), info
    return ds.map(
        lambda row: {**only_columns(row, info.format), **{c: row[c] for c in extra}},
        remove_columns=drop,
        features=features,
        desc=f"Shaping {field_name}",
    ), info


def _default_eval(ref: str) -> str | None:
    ref = ref.strip()
    if ref.startswith("sample:") and ref.count(":") == 1:
        return f"{ref}:eval"
    return None


@dataclass
class LoadedData:
    """Train and eval data shaped for trl, with what was detected and converted in each."""

    train: datasets.Dataset
    eval: datasets.Dataset | None
    train_info: DatasetInfo
    eval_info: DatasetInfo | None

    def record(self) -> dict[str, Any]:
        """The data part of a run's resolved config."""
        return {
            "dataset": self.train_info.record(),
            "eval_dataset": self.eval_info.record() if self.eval_info else None,
            "train_rows": len(self.train),
            "eval_rows": len(self.eval) if self.eval is not None else 0,
        }


def load_data(spec: JobSpec) -> LoadedData:
    """Train and eval data for `spec`, checked and converted; DataError lists every problem of both."""
    problems: list[Problem] = []
    train = eval_ = None
    try:
        train = _load(spec.dataset, spec.trainer, "dataset", spec.column_map)
    except DataError as exc:
        problems.extend(exc.problems)
    eval_ref = (
        spec.eval_dataset.strip() if spec.eval_dataset and spec.eval_dataset.strip() else _default_eval(spec.dataset)
    )
    if eval_ref and spec.eval_split is None:  # eval_split holds out rows instead of a sample's eval split
        try:
            eval_ = _load(eval_ref, spec.trainer, "eval_dataset", spec.column_map)
        except DataError as exc:
            problems.extend(exc.problems)
    if problems:
        raise DataError(problems)
    assert train is not None
    train_ds, train_info = train
    eval_ds, eval_info = eval_ if eval_ else (None, None)
    if spec.eval_split is not None:
        n_eval = eval_rows(len(train_ds), spec.eval_split)
        if isinstance(n_eval, Problem):
            raise DataError([n_eval])
        parts = train_ds.train_test_split(test_size=n_eval, seed=spec.seed, shuffle=True)
        train_ds, eval_ds = parts["train"], parts["test"]
        eval_info = dataclasses.replace(
            train_info, ref=f"{spec.dataset} (eval_split {spec.eval_split:g})", n_rows=n_eval, preview=[], warnings=[]
        )
    if spec.max_train_samples is not None and spec.max_train_samples < len(train_ds):
        train_ds = train_ds.select(range(spec.max_train_samples))
    return LoadedData(train_ds, eval_ds, train_info, eval_info)


def eval_rows(n_rows: int, eval_split: float) -> int | Problem:
    """How many of `n_rows` rows eval_split holds out (a fraction, at least one row, or a count)."""
    n = max(1, round(n_rows * eval_split)) if eval_split < 1 else int(eval_split)
    if n >= n_rows:
        return Problem(
            "eval_split",
            f"would hold out {n} of the {n_rows} training rows, leaving none to train on",
            "use a smaller fraction or row count, or give an eval_dataset",
        )
    return n


def load_datasets(spec: JobSpec) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Train and eval data for `spec`, shaped for trl's trainers; DataError lists all problems."""
    loaded = load_data(spec)
    return loaded.train, loaded.eval


def length_warnings(
    ds: datasets.Dataset,
    tokenizer: Any,
    max_length: int | None,
    sample_size: int = 1000,
    trainer: Trainer = Trainer.SFT,
) -> list[str]:
    """Warn how many rows exceed `max_length` tokens; measures at most `sample_size` rows (cheap).

    The reward trainer drops such rows (trl filters them out) where the others truncate them."""
    if Trainer(trainer) is Trainer.GRPO:
        return []  # grpo keeps prompts whole (GRPOConfig has no max_length); completions stop at max_completion_length
    fate = "dropped (the reward trainer filters them out)" if Trainer(trainer) is Trainer.REWARD else "truncated"
    n = len(ds)
    if not n or not max_length:
        return []
    sampled = n > sample_size
    rows = ds.select(sorted(random.Random(0).sample(range(n), sample_size))) if sampled else ds
    try:
        lengths = [
            max(len(tokenizer(t, add_special_tokens=special)["input_ids"]) for t, special in _texts(row, tokenizer))
            for row in rows
        ]
    except Exception as exc:  # a warning helper must never stop training
        return [f"could not measure row lengths ({type(exc).__name__}: {exc})"]
    over = sum(1 for length in lengths if length > max_length)
    if not over:
        return []
    if sampled:
        return [
            f"about {round(over / len(lengths) * n)} of {n} rows (estimated from {len(lengths)}) are longer "
            f"than max_length {max_length} tokens and will be {fate}"
        ]
    return [f"{over} of {n} rows are longer than max_length {max_length} tokens and will be {fate}"]


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
