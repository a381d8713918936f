"""One-line messages about a table's columns and labels: "did you mean" for a misspelt column
name, and the refusal of a stratified split that cannot be made."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def did_you_mean(name: str, columns: Sequence[str]) -> str:
    """` (did you mean 'X'?)` for the column of `columns` closest to the misspelt `name`
    (a match ignoring case first, then `difflib.get_close_matches`, as the options do), or
    ``."""
    import difflib

    columns = [str(c) for c in columns]
    same = [c for c in columns if c.casefold() == str(name).casefold()]
    close = same or difflib.get_close_matches(str(name), columns, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def split_refusal(name: str, y: np.ndarray, classes: np.ndarray, counts: np.ndarray) -> str:
    """One line on a stratified split that cannot be made: how many classes are too rare
    (never their labels: a numeric target may have hundreds), and `--task regression` when
    the labels are numbers."""
    rare = int(np.sum(counts < 3))
    numeric = np.asarray(y).dtype.kind in "iuf"
    hint = ("; a numeric target to predict as a number? Pass --task regression" if numeric
            else "; merge or drop the rarest classes")
    if not rare:
        return (f"Cannot split {name} into stratified train/validation/test sets: its "
                f"{len(classes):,} classes outnumber the rows of its validation or test split; "
                f"expected fewer classes or more rows{hint}.")
    return (f"Cannot split {name} into stratified train/validation/test sets: {rare:,} of its "
            f"{len(classes):,} classes have fewer than 3 rows (the smallest {counts.min()}); "
            f"expected at least 3 rows per class{hint}.")
