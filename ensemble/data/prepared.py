"""The prepared splits of a run written from a source a chunk of rows at a time.

`write_splits` transforms each chunk of a source (`kinds.scan`) with the run's fitted
preprocessing and appends its rows of each split to that split's files
(`ensemble.core.splitfiles`), so preparing holds a few chunks of rows at most (the one being
written and the next, read ahead in a background thread).
Unknown categories (in the validation and test rows) are counted over the whole source and
reported in one notice.
"""

from __future__ import annotations

import numpy as np

from ensemble.core import background, splitfiles
from ensemble.core.notices import notice
from ensemble.data.messages import merge_unknown, unknown_categories
from ensemble.data.sources import Dataset

SPLITS = ("train", "validation", "test")


def prepare_splits(run_dir, scan, which: np.ndarray, y: np.ndarray, classes: np.ndarray):
    """Fit the run's preprocessing on the training rows and write every split's files;
    returns the fitted preprocessing (`scan.fit`'s) and `{path: hex sha256}` of the files
    (hashed as written, `splitfiles.SplitWriter.sha256s`).

    A table without categorical columns (`scan.numeric_only`) is read once: each chunk's rows
    are written as read (float32, the values the encoding starts from) while the statistics
    are gathered, then every split is scaled in place, a chunk at a time, from its files in
    the page cache; the same float32 rows as `write_splits` after `scan.fit`, which reads the
    source twice and is used otherwise (categorical columns, image folders, arrays). Each
    pass reads (or encodes) the next chunk in a background thread (`background.prefetch`)
    while this one writes (and hashes) the last.

    Args:
        which, y: as `write_splits`; classes: the sorted class labels (`scan.fit`).

    Raises:
        UsageError: as `write_splits`; nothing is left under the final names then.
    """
    if not getattr(scan, "numeric_only", False):
        pre = scan.fit(np.flatnonzero(which == SPLITS.index("train")), classes)
        return pre, write_splits(run_dir, scan, pre, which, y)
    with _Splits(run_dir, scan, which, y, rewrite=True) as splits:
        pre = scan.fit(which == SPLITS.index("train"), classes,
                       each=lambda start, chunk: splits.write(start, chunk.x))
        for w in splits.writers.values():
            for lo, z in background.prefetch(_scaled(w, pre, scan)):
                w.rewrite(lo, z)
    return pre, splits.sha256s()


def _scaled(w: splitfiles.SplitWriter, pre, scan):
    """`(first row, scaled rows)` of every chunk of a split's raw rows (each chunk read into
    one buffer: the scaled rows are new arrays)."""
    buf = np.empty((min(scan.chunk_rows, w.n_rows), *w.shapes[0]), w.dtypes[0])
    for lo in range(0, w.n_rows, scan.chunk_rows):
        part = w.read(lo, lo + scan.chunk_rows, out=buf)
        z, _ = pre.encode_scaled(Dataset(scan.name, part, None, pre.feature_names),
                                 w.read(lo, lo + len(part), "row"))
        yield lo, z


class _Splits:
    """The three splits' writers, fed a chunk of rows at a time in source order; committed
    together on a clean exit, all removed on an error."""

    def __init__(self, run_dir, scan, which: np.ndarray, y: np.ndarray,
                 rewrite: bool = False):
        self.run_dir, self.scan, self.which, self.y = run_dir, scan, which, y
        self.rewrite = rewrite  # the rows are scaled in place later (`SplitWriter`)
        self.sizes = np.bincount(which, minlength=len(SPLITS))
        # the files' labels: int32 class codes (the codes held may be narrower), or targets
        self.y_dtype = np.dtype(np.int32) if y.dtype.kind in "iu" else y.dtype
        self.writers: dict[str, splitfiles.SplitWriter] = {}
        self._rows: np.ndarray | None = None  # a chunk's rows of one split, before writing

    def write(self, start: int, x: np.ndarray) -> None:
        """Route the rows `start .. start + len(x)` (positions of y) to their splits."""
        if not self.writers:
            # one at a time: a writer that failed to open leaves the others to abort
            for i, s in enumerate(SPLITS):
                self.writers[s] = splitfiles.SplitWriter(
                    self.run_dir, s, int(self.sizes[i]), x.shape[1:], (x.dtype, self.y_dtype),
                    self.rewrite)
        part = self.which[start:start + len(x)]
        buf = self._rows
        if buf is None or (buf.shape[1:], buf.dtype) != (x.shape[1:], x.dtype) or len(buf) < len(x):
            self._rows = np.empty_like(x)  # reused: no fresh pages to fault in every chunk
        for i, s in enumerate(SPLITS):
            take = np.flatnonzero(part == i)
            if len(take):
                rows = np.take(x, take, axis=0, out=self._rows[:len(take)], mode="clip")
                self.writers[s].write(rows, self.y[start + take].astype(self.y_dtype),
                                      self.scan.file_rows(start + take))

    def sha256s(self) -> dict:
        """`{path: hex sha256}` of the committed files hashed as written
        (`SplitWriter.sha256s`)."""
        return {p: h for w in self.writers.values() for p, h in w.sha256s().items()}

    def __enter__(self) -> "_Splits":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            try:
                for w in self.writers.values():
                    w.commit()
                return
            except BaseException:  # a full disk at the last sync: the others' files go too
                self._abort()
                raise
        self._abort()

    def _abort(self) -> None:
        for w in self.writers.values():
            w.abort()


def write_splits(run_dir, scan, pre, which: np.ndarray, y: np.ndarray) -> dict:
    """Write `data/<split>.{x,y,row}.npy` of every split; returns `{path: hex sha256}`.

    Args:
        scan: the source (`kinds.scan`): `chunks()` of `(first row, rows)`, and
            `file_rows`, the rows' positions in the source (the files' `row`).
        pre: the fitted preprocessing (`encode_scaled(chunk, first_row)`).
        which: `[n_rows]` int8, each row's split: its index in `SPLITS`
            (`sources.assignment`).
        y: `[n_rows]` class codes (any integer type; written as int32) or float targets of
            every row.

    Raises:
        UsageError: a chunk the preprocessing refuses (named row); nothing is left under
            the final names then.
    """
    unknown: dict = {}
    with _Splits(run_dir, scan, which, y) as splits:
        for start, chunk in background.prefetch(scan.chunks()):  # next chunk read meanwhile
            x, unk = pre.encode_scaled(chunk, start)
            merge_unknown(unknown, unk)
            splits.write(start, x)
    if unknown:
        notice(unknown_categories(unknown))
    return splits.sha256s()
