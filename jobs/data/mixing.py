"""Several data sets per job: each source checked and converted on its own, capped, then mixed and shuffled.

`dataset` lists its sources (`jobs.spec.mixture`). Each is read with its own format detection and
conversion (`jobs.data.inspection`), with its own column mapping or else `dataset_columns`; its
problems and warnings are named after it ("source 2 of 3 (`b.json`): rows 4, 9: ..."). Its first
`max_rows` rows are kept, and the rows of all sources are concatenated and shuffled with the spec's
`seed`. All sources must come out in one row format (trl trains one per job). A single source is
read exactly as before: no label, no shuffle. `jobs.data.loading` reads the sources (`check_sources`
for the checks, `load_data` for training) and calls these:

    info = combined(pairs, spec.dataset)           # [(source, DatasetInfo)] as one (rows counted after the caps)
    train = mix([(source, ds), ...], seed=spec.seed)   # capped, concatenated, shuffled

Each training row carries its origin through the mixing and the `eval_split` shuffle: two columns
(`ORIGIN_COLUMNS`: its source's index in `dataset`, its row number there as the checks name it) added
to each source before the mix and taken off before trl sees the rows, so a figure counted on the
training rows names them as the user's files number them (`jobs.checks.answers`):

    ds = with_origins(ds, 0, numbers)              # numbers: None for 1, 2, 3, ...
    origins = origins_of(train)                    # (rows, 2) int64 array, in training order
    train = without_origins(train)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from jobs.data.dataset_info import DatasetInfo
from jobs.data.sources import DataError
from jobs.errors import Problem
from jobs.spec.mixture import DataSource, parse_sources

if TYPE_CHECKING:
    import datasets

ORIGIN_COLUMNS = ("tunedeck_source", "tunedeck_row")  # each row's source index and row number, while mixing


def sources_of(text: str, field: str = "dataset") -> list[DataSource]:
    """The sources `dataset` (or `eval_dataset`) lists; DataError with the spec's own problems when the text cannot
    be read."""
    sources, problems = parse_sources(text)
    if problems:
        raise DataError([Problem(field, problem, fix) for problem, fix in problems])
    return sources


def source_label(source: DataSource, index: int, count: int) -> str:
    """How problems and warnings name a source: `source 2 of 3 (`b.json`)`; '' for a job's only source."""
    return f"source {index} of {count} (`{source.ref}`)" if count > 1 else ""


def labelled(problems: list[Problem], label: str) -> list[Problem]:
    """`problems` with the source named in each (unchanged when `label` is '')."""
    return [Problem(p.field, f"{label}: {p.problem}", p.fix) for p in problems] if label else list(problems)


def columns_for(source: DataSource, column_map: dict[str, str]) -> dict[str, str]:
    """The mapping a source is read with: its own `columns`, else `dataset_columns` (`column_map`)."""
    own = source.column_map
    return own if own is not None else column_map


def _shape(info: DatasetInfo) -> str:
    conversational = info.format.value == "messages" or any(
        isinstance(row.get("prompt"), list) for row in info.preview or []
    )
    return f"{info.format.value} ({'conversational' if conversational else 'plain text'})"


def format_problems(pairs: list[tuple[DataSource, DatasetInfo]], field: str = "dataset") -> list[Problem]:
    """A problem when the sources come out in different row formats (trl trains one per job)."""
    shapes = {source.ref: _shape(info) for source, info in pairs}
    if len(set(shapes.values())) <= 1:
        return _image_mix_problems(pairs, field)
    found = ", ".join(f"`{ref}` {shape}" for ref, shape in shapes.items())
    fix = "convert the sources to one format (e.g. all chat messages), or train them in separate jobs"
    if set(shapes.values()) == {"messages (conversational)", "prompt_completion (conversational)"}:
        # Not converted here: prompt/completion rows train on the answer only, messages rows on the whole chat.
        fix = (
            "write the prompt/completion source's rows as chat `messages` (its prompt turns, then the answer as an "
            "assistant turn; Alpaca files too), or train the two kinds in separate jobs"
        )
    return [Problem(field, f"the sources come out in different row formats ({found}), and a job trains on one", fix)]


def _image_mix_problems(pairs: list[tuple[DataSource, DatasetInfo]], field: str) -> list[Problem]:
    """Text rows join image rows as image rows without pictures (`mix`), turns of text only: tool calls cannot."""
    if not any(info.images.count for _, info in pairs):
        return []
    tooled = [f"`{source.ref}`" for source, info in pairs if not info.images.count and info.tools.count]
    if not tooled:
        return []
    return [
        Problem(
            field,
            f"{', '.join(tooled)} hold(s) tool calls, which cannot join the image rows of the other sources",
            "train the tool-calling rows and the image rows in separate jobs",
        )
    ]


def capped(n_rows: int, source: DataSource) -> int:
    return min(n_rows, source.max_rows) if source.max_rows is not None else n_rows


def combined(pairs: list[tuple[DataSource, DatasetInfo]], ref: str) -> DatasetInfo:
    """The mixture as one DatasetInfo: rows counted after each cap (`parts`: each source's info, its rows the ones
    used), warnings and conversions named per source."""
    if len(pairs) == 1 and pairs[0][0].max_rows is None:
        return pairs[0][1]
    n = len(pairs)
    labels = [source_label(s, i, n) or f"`{s.ref}`" for i, (s, _) in enumerate(pairs, 1)]
    infos = [info for _, info in pairs]
    first = infos[0]
    columns = list(dict.fromkeys(c for info in infos for c in info.columns))
    preview = [row for rows in zip(*(info.preview for info in infos), strict=False) for row in rows][:5] or list(
        first.preview
    )
    conversions = [f"{label}: {info.conversion}" for label, info in zip(labels, infos, strict=True) if info.conversion]
    return dataclasses.replace(
        first,
        ref=ref,
        n_rows=sum(capped(info.n_rows, s) for s, info in pairs),
        columns=columns,
        preview=preview,
        warnings=[f"{label}: {w}" for label, info in zip(labels, infos, strict=True) for w in info.warnings],
        source_format=" + ".join(dict.fromkeys(info.source_format for info in infos)),
        conversion="; ".join(conversions) or None,
        column_map={},
        reward_columns=sorted(set.intersection(*(set(info.reward_columns) for info in infos))),
        repeated_turns=[],  # row numbers belong to a source: the checks read each source's own
        parts=[dataclasses.replace(info, n_rows=capped(info.n_rows, s)) for s, info in pairs],
    )


def mix(parts: list[tuple[DataSource, datasets.Dataset]], seed: int, field: str = "dataset") -> datasets.Dataset:
    """The sources' rows, each source cut to its `max_rows`, concatenated and shuffled with `seed` (a single
    source: cut only, in its own order); DataError when their columns cannot be joined."""
    import datasets

    cut = [ds.select(range(n)) if (n := capped(len(ds), source)) < len(ds) else ds for source, ds in parts]
    if len(cut) == 1:
        return cut[0]
    if any("tools" in ds.column_names for ds in cut):  # tool schemas in some sources: none in the others
        cut = [ds if "tools" in ds.column_names else ds.add_column("tools", [None] * len(ds)) for ds in cut]
        cut = [ds.cast_column("tools", datasets.Value("string")) for ds in cut]
    if any("images" in ds.column_names for ds in cut) and not all("images" in ds.column_names for ds in cut):
        from jobs.data.images import text_as_image_rows  # text chat beside image chat (LLaVA's own mixes)

        target = next(ds.features for ds in cut if "images" in ds.column_names)
        try:
            cut = [ds if "images" in ds.column_names else text_as_image_rows(ds, target) for ds in cut]
        except (ValueError, TypeError, KeyError):
            pass  # not chat beside image chat: the join below names the sources
    features = cut[0].features
    try:
        same = [ds if ds.features == features else ds.cast(features) for ds in cut]
        return datasets.concatenate_datasets(same).shuffle(seed=seed).flatten_indices()
    except (ValueError, TypeError, KeyError) as exc:  # pyarrow's errors subclass ValueError/TypeError
        names = ", ".join(f"`{source.ref}`" for source, _ in parts)
        raise DataError(
            [
                Problem(
                    field,
                    f"the rows of {names} cannot be mixed: their columns differ ({type(exc).__name__}: {exc})"[:400],
                    "give every source the same columns (same extra columns for grpo), or train them in separate jobs",
                )
            ]
        ) from exc


def with_origins(ds: datasets.Dataset, source: int, numbers: list[int] | None) -> datasets.Dataset:
    """`ds` with each row's origin: `source` (its index in `dataset`) and its row number (`numbers`, or 1, 2, ...)."""
    rows = np.arange(1, len(ds) + 1) if numbers is None else np.asarray(numbers, dtype=np.int64)
    ds = ds.add_column(ORIGIN_COLUMNS[0], np.full(len(ds), source, dtype=np.int64))
    return ds.add_column(ORIGIN_COLUMNS[1], rows)


def origins_of(ds: datasets.Dataset) -> np.ndarray | None:
    """Each row's (source index, row number), in the rows' order; None when the rows carry no origins."""
    if not set(ORIGIN_COLUMNS) <= set(ds.column_names):
        return None
    table = ds.select_columns(list(ORIGIN_COLUMNS)).with_format("numpy")  # cheap: two int columns
    return np.stack([np.asarray(table[c], dtype=np.int64) for c in ORIGIN_COLUMNS], axis=1)


def without_origins(ds: datasets.Dataset) -> datasets.Dataset:
    """`ds` without the origin columns (trl sees only its own)."""
    found = [c for c in ORIGIN_COLUMNS if c in ds.column_names]
    return ds.remove_columns(found) if found else ds
