"""Lazy splits: a dataset too big to hold as Python objects is served from its memory-mapped
Arrow table, one `Example` built per access (`split[i]`), so `train_data[i]` indexing works
unchanged and memory stays flat however long the run (in-dataset images are decoded per access
and dropped with their Example).

What a lazy split checks, against a loaded one (which builds and checks every row and every
medium up front):

- up front: the layout against the schema (the mapped columns exist); every row's text columns
  (prompt or messages, gold answer, steps, choices, id), read without the media columns, which
  only give their item counts (so `<image>` placeholders are matched against the images of every
  row, and every prompt's length is bounded without its media, `mmrlvr.data.lengths`); and every
  medium of a sample of `SAMPLE` rows spread over the split (decoded and sized,
  as a loaded split checks all of them). Bad rows raise, or with `on_error: skip` are dropped
  and recorded, as in a loaded split.
- when a row is drawn: its media are built and checked (a file must exist and be within the
  size limit by its header; an in-dataset image is decoded then, once), and a prompt the scan
  left open (near the limit with its media) is measured exactly. A failure raises a
  `DataError` naming the file and row; with `on_error: skip` the row is replaced by the next one
  that builds, with a warning, and added to the load report.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mmrlvr.data.formats import Layout
from mmrlvr.data.lengths import PromptBudget
from mmrlvr.data.media import MediaLimits, access_problem
from mmrlvr.data.rows import DataError, DataWarning, Example, LoadReport, SkippedRow, row_error

SAMPLE = 256
"""Rows of a lazy split whose media are all decoded and checked up front."""
_MAX_REPLACED = 64


class LazySplit(Sequence):
    """A split of a big Arrow/parquet dataset: a Sequence of Examples built on access.

    `split[i]` builds the i-th usable row; `len(split)` counts the rows that passed the up-front
    checks; a slice gives a list of Examples.
    """

    def __init__(self, source: Any, layout: Layout, positions: np.ndarray,
                 build: Callable[[dict, str, int], Example], limits: MediaLimits, on_error: str,
                 report: LoadReport, budget: PromptBudget | None = None):
        self.source, self.layout, self.positions = source, layout, positions
        self._build, self._limits, self._budget = build, limits, budget
        self._on_error, self._report = on_error, report

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"row {index} of a split of {n}")
        index %= n
        for k in range(min(n, _MAX_REPLACED)):
            example = self._row(int(self.positions[(index + k) % n]))
            if example is not None:
                return example
        raise DataError(f"{self.source.label}: {_MAX_REPLACED} rows in a row failed when drawn; "
                        "see the warnings (data.on_error=skip)")

    def __repr__(self) -> str:
        return f"LazySplit({self.source.label!r}, {len(self)} rows, layout {self.layout.name})"

    def _row(self, pos: int) -> Example | None:
        """The Example at table position `pos`, or None when it is bad and skipped."""
        file, line = self.source.where(pos)
        example = None
        try:
            example = self._build(self.source.row(pos), file, line)
            problem = access_problem(example, self._limits) if self._limits.decode else None
            if problem is None and self._budget is not None:
                problem = self._budget.problem(example)
            if problem:
                raise row_error(file, line, problem, example.id)
        except DataError as err:
            if self._on_error == "raise":
                raise DataError(f"{err} (found when the row was drawn: a lazy split checks media "
                                f"on a sample up front); to drop bad rows instead, set "
                                f"data.on_error=skip", file=err.file, row=err.row, id=err.id,
                                reason=err.reason) from None
            skipped = SkippedRow(err.file or file, err.row or line, err.id, err.reason or str(err))
            self._report.skipped.append(skipped)
            warnings.warn(f"{self.source.label}: skipped a bad row when it was drawn and took "
                          f"the next one: {skipped}", DataWarning, stacklevel=3)
            return None
        return example


def sample_positions(n: int, k: int = SAMPLE) -> np.ndarray:
    """`k` indices spread evenly over range(n), the first and last included."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))
