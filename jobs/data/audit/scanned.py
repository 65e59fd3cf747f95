"""What an audit keeps of a spec's rows: each row is added once as it is read (`jobs.data.audit.reading`) and let
go; the findings read this tally, never the rows.

Per row: its place (source, number: 12 bytes), its key (16 bytes; a dict entry for the first of each key), its
length, and the entries of the answers it gives; for each distinct row its MinHash signature (512 bytes), once
its chunk is signed. Per finding: a count and its first rows. So an audit's memory grows with the rows by about
a kilobyte each at most, not with the file's size (a row of a 200 MB file is not held).

    data = AuditData()
    data.add(make_row("dataset", 0, 7, row, fmt))      # training rows first, then eval rows
    len(data.train), data.copies.result(), data.content.repeated(), data.lengths()
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from jobs.data.audit.copies import CopyScan
from jobs.data.audit.rows import Places, Row
from jobs.data.audit.tallies import ContentTally
from jobs.data.row_formats import RowFormat


@dataclass
class AuditData:
    """The tally of a spec's data sets, rows in file order per source, each source cut to its `max_rows`."""

    format: RowFormat | None = None
    train: Places = field(default_factory=Places)
    eval: Places = field(default_factory=Places)
    refs: dict[str, list[str]] = field(default_factory=dict)  # each field's source refs, by index
    per_source: dict[str, list[int]] = field(default_factory=dict)  # each field's rows per source, after the caps
    eval_split: bool = False  # eval rows are held out of the training rows at load time
    copies: CopyScan = field(default_factory=CopyScan)
    content: ContentTally = field(default_factory=ContentTally)
    _lengths: array = field(default_factory=lambda: array("q"))

    def add(self, row: Row, thinking: bool = False) -> None:
        """One row, looked at and let go: training rows first, then the eval rows; `thinking`: it carries
        reasoning (`jobs.data.thinking.has_thinking`: the caller asks, which keeps this module's imports few)."""
        if row.field == "dataset":
            index = len(self.train)
            self.train.append(row.source, row.number)
            self._lengths.append(len(row.text))
            self.copies.add_train(row.key, row.text)
            self.content.add_train(index, row, thinking)
        else:
            self.eval.append(row.source, row.number)
            self.copies.add_eval(row.key, row.text)
        self.content.add_text(row)

    def lengths(self) -> np.ndarray:
        """Each training row's characters (its words, as the near-duplicate search reads them)."""
        return np.array(self._lengths, dtype=np.int64)

    def place(self, field_name: str, index: int) -> tuple[str, int, int]:
        """(field, source, number) of a training or eval row by its index."""
        return (field_name, *(self.train if field_name == "dataset" else self.eval).at(index))
