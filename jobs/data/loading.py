"""Training data loaded for trl: the checked, converted rows as `datasets.Dataset`s with trl's columns only.

The train data set (its sources checked, converted and capped one by one, then mixed: `jobs.data.mixing`),
and the eval data set (named, a sample's own `:eval` split, or rows held out
with `eval_split`), each checked row by row first (`jobs.data.inspection`).

    loaded = load_data(spec)                                    # train/eval for trl + what was converted
    pairs = check_sources(spec.dataset, spec.trainer)           # each source's DatasetInfo, without keeping rows
    train_ds, eval_ds = load_datasets(spec)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from jobs.data import inspection
from jobs.data.bulk import collector_paused
from jobs.data.dataset_info import DatasetInfo
from jobs.data.inspection import inspect_dataset
from jobs.data.mixing import (
    columns_for,
    combined,
    format_problems,
    labelled,
    mix,
    origins_of,
    source_label,
    sources_of,
    with_origins,
    without_origins,
)
from jobs.data.row_formats import COLUMNS, RowFormat, only_columns
from jobs.data.sources import DataError
from jobs.errors import Problem
from jobs.spec.enums import Trainer
from jobs.spec.evaluation import default_eval_ref
from jobs.spec.job import JobSpec
from jobs.spec.mixture import DataSource

if TYPE_CHECKING:
    import datasets


def _features(fmt: RowFormat, style: str | None, tools: bool = False) -> datasets.Features:
    """trl's columns; `tools`: messages may carry `tool_calls` (any JSON: each call's arguments have their
    own keys) and a tool turn's `name`, and the rows a `tools` column (JSON text, `jobs.data.tool_turns`)."""
    import datasets  # here: the checks read eval_rows without it

    message: dict[str, Any] = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    if tools:
        message |= {"tool_calls": datasets.List(datasets.Json()), "name": datasets.Value("string")}
    cell = [message] if style == "conversational" else datasets.Value("string")
    columns = {
        c: ([message] if c == "messages" else datasets.Value("bool") if c == "label" else cell) for c in COLUMNS[fmt]
    }
    return datasets.Features({**columns, **({"tools": datasets.Value("string")} if tools else {})})


def _load(
    ref: str, trainer: Trainer, field_name: str, column_map: dict[str, str]
) -> tuple[datasets.Dataset, DatasetInfo, list[int] | None]:
    """The checked, converted data set with trl's columns only, its info, and each row's number as the checks
    name it (None: 1, 2, 3, ... as for tables and hub data)."""
    return shaped(inspect_dataset(ref, trainer, field_name, 5, column_map, keep_rows=True), field_name)


def shaped(checked: inspection.Inspected, field_name: str) -> tuple[datasets.Dataset, DatasetInfo, list[int] | None]:
    import datasets

    info, ds = checked.info, checked.ds
    tools = info.tools.count > 0
    keep, features = COLUMNS[info.format], _features(info.format, checked.style, tools)
    extra = info.reward_columns
    if info.images.count:  # image chat or image pairs: content parts and an `images` column
        return _image_rows(checked, info)
    if ds is None:  # JSON files, and anything converted: built from the checked rows, which keep their numbers
        numbers: list[int] = []  # JSON lines: line numbers, blank lines skipped
        rows = []
        for number, row in checked.rows():  # one conversion pass
            numbers.append(number)
            rows.append({**only_columns(row, info.format, tools), **{c: row.get(c) for c in extra}})
        return _from_rows(rows, features, extra, field_name), info, numbers
    features = datasets.Features({**features, **{c: ds.features[c] for c in extra}})
    keep = (*keep, *extra)
    drop = [c for c in ds.column_names if c not in keep]
    if all(ds.features.get(c) == features[c] for c in keep):
        return (ds.remove_columns(drop) if drop else ds), info, None
    return (
        ds.map(
            lambda row: {**only_columns(row, info.format, tools), **{c: row[c] for c in extra}},
            remove_columns=drop,
            features=features,
            desc=f"Shaping {field_name}",
        ),
        info,
        None,
    )


def _image_rows(checked: inspection.Inspected, info: DatasetInfo) -> tuple[datasets.Dataset, DatasetInfo, list[int]]:
    """Image chat (`jobs.data.images`) or dpo's image pairs (`jobs.data.image_pairs`) as trl's vision collators
    read them, and each row's number."""
    import datasets

    from jobs.data.image_pairs import pair_features, trl_pair_row
    from jobs.data.images import image_features, trl_row

    pairs = list(checked.rows())
    if info.format is RowFormat.PREFERENCE:
        rows, features = [trl_pair_row(row) for _, row in pairs], pair_features()
    else:
        rows, features = [trl_row(row) for _, row in pairs], image_features()
    return datasets.Dataset.from_list(rows, features=features), info, [number for number, _ in pairs]


def _from_rows(rows: list[dict[str, Any]], features: Any, extra: list[str], field_name: str) -> datasets.Dataset:
    import datasets

    if not extra:
        return datasets.Dataset.from_list(rows, features=features)
    try:  # the extra columns' types are inferred; the prompt keeps its checked type
        return datasets.Dataset.from_list(
            rows,
            features=datasets.Features(
                {**features, **datasets.Dataset.from_list([{c: r[c] for c in extra} for r in rows]).features}
            ),
        )
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


def eval_ref_of(spec: JobSpec) -> str | None:
    """The eval data `spec` reads: its `eval_dataset`, else a single sample's own eval split (several sources
    have no default eval data); None with `eval_split` (rows held out instead)."""
    if spec.eval_split is not None:
        return None
    return spec.eval_dataset.strip() if spec.eval_dataset and spec.eval_dataset.strip() else default_eval_ref(spec)


def _load_sources(spec: JobSpec, text: str, field: str) -> tuple[datasets.Dataset, DatasetInfo]:
    """The rows of `dataset` (or `eval_dataset`): every source loaded on its own, capped, then mixed with the seed."""
    sources = sources_of(text, field)
    problems: list[Problem] = []
    loaded: list[tuple[datasets.Dataset, DatasetInfo]] = []
    for i, source in enumerate(sources, 1):
        try:
            ds, info, numbers = _load(source.ref, spec.trainer, field, columns_for(source, spec.column_map))
        except DataError as exc:
            problems.extend(labelled(exc.problems, source_label(source, i, len(sources))))
            continue
        loaded.append((with_origins(ds, i - 1, numbers) if field == "dataset" else ds, info))
    if problems:
        raise DataError(problems)
    pairs = [(source, info) for source, (_, info) in zip(sources, loaded, strict=True)]
    if format_problems(pairs, field):
        raise DataError(format_problems(pairs, field))
    rows = mix([(source, ds) for source, (ds, _) in zip(sources, loaded, strict=True)], spec.seed, field)
    return rows, combined(pairs, text)


@dataclass
class LoadedData:
    """Train and eval data shaped for trl, with what was detected and converted in each."""

    train: datasets.Dataset
    eval: datasets.Dataset | None
    train_info: DatasetInfo
    eval_info: DatasetInfo | None
    origins: np.ndarray | None = None  # each training row's (source index in `dataset`, row number there)

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
    with collector_paused():
        return _load_data(spec)


def _load_data(spec: JobSpec) -> LoadedData:
    problems: list[Problem] = []
    train = eval_ = None
    try:
        train = _load_sources(spec, spec.dataset, "dataset")
    except DataError as exc:
        problems.extend(exc.problems)
    eval_ref = eval_ref_of(spec)
    if eval_ref:  # eval_split holds out rows instead of a sample's eval split
        try:
            eval_ = _load_sources(spec, eval_ref, "eval_dataset")
        except DataError as exc:
            problems.extend(exc.problems)
    if problems:
        raise DataError(problems)
    assert train is not None
    train_ds, train_info = train
    eval_ds, eval_info = eval_ if eval_ else (None, None)
    if spec.dedupe:  # before eval_split holds rows out: no copy lands on both sides
        from jobs.data.audit.dedupe import deduped

        train_ds = deduped(train_ds, eval_ds, train_info.format, origins_of(train_ds), train_info.reward_columns)
    train_ds = with_thinking(spec, train_ds)
    eval_ds = with_thinking(spec, eval_ds) if eval_ds is not None else None
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
    origins = origins_of(train_ds)
    if eval_ds is not None and spec.eval_split is not None:
        eval_ds = without_origins(eval_ds)
    return LoadedData(without_origins(train_ds), eval_ds, train_info, eval_info, origins)


def with_thinking(spec: JobSpec, ds: datasets.Dataset) -> datasets.Dataset:
    """The spec's `thinking` choice applied (`jobs.data.thinking`); chat rows carry `enable_thinking` for the
    chat template (trl reads each row's `chat_template_kwargs`)."""
    from jobs.data.thinking import apply_thinking, template_kwargs

    ds = apply_thinking(ds, spec.thinking)
    kwargs = template_kwargs(spec.thinking)
    if kwargs is not None and "messages" in ds.column_names:  # chat rows: sft's alone
        ds = ds.add_column("chat_template_kwargs", [kwargs] * len(ds))
    return ds


def check_sources(
    text: str,
    trainer: Trainer,
    column_map: dict[str, str] | None = None,
    max_bad_rows: int = 5,
    field: str = "dataset",
    limit: int | None = None,
) -> list[tuple[DataSource, DatasetInfo]]:
    """Every source of `dataset` (or `eval_dataset`: `field`) checked for `trainer` (`limit`: only each one's first
    rows, for the form's preview); DataError listing the problems of all of them."""
    sources = sources_of(text, field)
    problems: list[Problem] = []
    pairs: list[tuple[DataSource, DatasetInfo]] = []
    for i, source in enumerate(sources, 1):
        label = source_label(source, i, len(sources))
        try:
            mapping = columns_for(source, column_map or {})
            info = inspection.check_dataset(source.ref, trainer, field, max_bad_rows, mapping, limit)
        except DataError as exc:
            problems.extend(labelled(exc.problems, label))
            continue
        pairs.append((source, info))
    if not problems:
        problems.extend(format_problems(pairs, field))
    if problems:
        raise DataError(problems)
    return pairs


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
