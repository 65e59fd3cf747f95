"""What a check of a data set found (`DatasetInfo`): its row format, row count, preview, warnings and conversions.

`jobs.data.inspection` makes one per data set; `jobs.data.mixing` joins those of several sources into
one, keeping each source's own in `parts`. Kept apart from the checking so that the mixing (on the
training path) can read it without importing the checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.data.images import ImageRows
from jobs.data.row_formats import RowFormat
from jobs.data.tool_turns import ToolRows


@dataclass(frozen=True)
class DatasetInfo:
    """What a check of a data set found."""

    ref: str
    format: RowFormat
    n_rows: int
    columns: list[str]
    preview: list[dict[str, Any]] = field(default_factory=list)  # first 5 rows, converted, trl's columns only
    warnings: list[str] = field(default_factory=list)
    source_format: str = "trl"  # "trl" (already trl's columns), "alpaca", "sharegpt" or "chat" (chat + answers)
    conversion: str | None = None  # what was converted, in words; None when nothing was
    column_map: dict[str, str] = field(default_factory=dict)  # dataset_columns applied: {trl column: file column}
    reward_columns: list[str] = field(default_factory=list)  # grpo: columns passed on to the reward functions
    repeated_turns: list[tuple[int, list[dict[str, Any]]]] = field(
        default_factory=list
    )  # rows with a role twice in a row
    tools: ToolRows = field(default_factory=ToolRows)  # rows with tool schemas, tool calls or tool results
    parts: list[DatasetInfo] = field(default_factory=list)  # several sources (jobs.data.mixing): each one's own
    images: ImageRows = field(default_factory=ImageRows)  # the images the rows hold (jobs.data.images)

    def record(self) -> dict[str, Any]:
        """What the run's resolved config keeps about this data set."""
        return {
            "ref": self.ref,
            "format": self.format.value,
            "source_format": self.source_format,
            "conversion": self.conversion,
            "dataset_columns": self.column_map or None,
            "rows": self.n_rows,
            **({"images": self.images.count} if self.images.count else {}),
            **({"sources": [part.record() for part in self.parts]} if self.parts else {}),
        }
