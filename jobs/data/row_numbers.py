"""How problems and warnings name rows: by the numbers the user's data file gives them.

The data checks number rows as the file does (`jobs.data.files`: line numbers for JSON lines,
1-based positions for JSON arrays, tables and hub data). Training sees the rows of all sources mixed
and shuffled (`jobs.data.mixing`), then split by `eval_split` (`jobs.data.loading`), so a figure
counted on the training rows (`jobs.checks.answers`) names each row by its origin: the index of its
source in `dataset` and its number in that source. Pure: numbers in, text out.

    rows_text([3, 7], 2)                                   # 'rows 3, 7'
    rows_text([1, 2, 3, 4, 5], 9)                          # 'rows 1, 2, 3, 4, 5 (and 4 more)'
    origins_text([(0, 2), (0, 5), (1, 1)], ["a.jsonl", "b.jsonl"])
    # 'rows 2, 5 of `a.jsonl` and row 1 of `b.jsonl`'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SHOWN_ROWS = 5  # row numbers named per message (per source), the rest counted


def rows_text(numbers: Sequence[int], count: int | None = None, label: str = "row") -> str:
    """'row 4', 'rows 3, 7', or 'rows 1, 2, 3, 4, 5 (and 4 more)': the first `numbers` of `count` rows."""
    count = len(numbers) if count is None else count
    where = f"{label}{'s' if count > 1 else ''} {', '.join(map(str, numbers))}"
    return where + (f" (and {count - len(numbers)} more)" if count > len(numbers) else "")


def origins_text(origins: Iterable[tuple[int, int]], refs: Sequence[str], shown: int = SHOWN_ROWS) -> str:
    """The rows at `origins` ((source index, row number) pairs) as their files number them, the first `shown`
    of each source in file order: 'rows 2, 5 of `a.jsonl` and row 1 of `b.jsonl`'."""
    by_source: dict[int, list[int]] = {}
    for source, number in origins:
        by_source.setdefault(source, []).append(number)
    parts = []
    for source, numbers in sorted(by_source.items()):
        numbers.sort()
        parts.append(f"{rows_text(numbers[:shown], len(numbers))} of `{refs[source]}`")
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)
