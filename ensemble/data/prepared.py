"""The prepared splits of a run written from a source a chunk of rows at a time.

`write_splits` transforms each chunk of a source (`kinds.scan`) with the run's fitted
preprocessing and appends its rows of each split to that split's memory-mapped files
(`ensemble.core.splitfiles`), so preparing never holds more than one chunk of encoded rows.
Unknown categories (in the validation and test rows) are counted over the whole source and
reported in one notice.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ensemble.core import splitfiles
from ensemble.core.notices import notice

SPLITS = ("train", "validation", "test")


def write_splits(run_dir, scan, pre, rows: dict[str, np.ndarray], y: np.ndarray) -> None:
    """Write `data/<split>.{x,y,row}.npy` of every split.

    Args:
        scan: the source (`kinds.scan`): `chunks()` of `(first row, rows)`, and
            `file_rows`, the rows' positions in the source (the files' `row`).
        pre: the fitted preprocessing (`encode_scaled(chunk, first_row)`).
        rows: `{split: sorted [n_split] positions of y}` (`sources.split`).
        y: `[n_rows]` encoded targets of every row.

    Raises:
        UsageError: a chunk the preprocessing refuses (named row); nothing is left under
            the final names then.
    """
    which = np.full(len(y), -1, np.int8)
    for i, s in enumerate(SPLITS):
        which[rows[s]] = i
    writers: dict[str, splitfiles.SplitWriter] = {}
    unknown: Counter = Counter()
    try:
        for start, chunk in scan.chunks():
            x, unk = pre.encode_scaled(chunk, start)
            unknown.update(unk)
            if not writers:
                writers = {s: splitfiles.SplitWriter(run_dir, s, len(rows[s]), x.shape[1:],
                                                     x.dtype, y.dtype) for s in SPLITS}
            part = which[start:start + len(x)]
            for i, s in enumerate(SPLITS):
                take = np.flatnonzero(part == i)
                if len(take):
                    writers[s].write(x[take], y[start + take], scan.file_rows(start + take))
        for w in writers.values():
            w.commit()
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    if unknown:
        notice("unknown categories ignored (all-zero encoding): " + ", ".join(
            f"{n} rows in {c!r}" for c, n in unknown.items()))
