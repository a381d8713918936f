"""Stratified train/test split: scikit-learn's draws, without its per-row Python lists.

`sklearn.model_selection.train_test_split(rows, stratify=y)` (its `StratifiedShuffleSplit`)
collects each class's shuffled rows with `list.extend`, one Python integer per row, and turns
the list back into an array: about 8 of the 10 seconds two splits take on 8M labels
(`docs/benchmarks.md`, prepare profile), a third of preparing a numeric table. This module
makes the same draws from the same `numpy.random.RandomState`, in the same order, with
scikit-learn's own allocation of rows to classes (`approximate_mode`), and concatenates
arrays instead of lists, so it returns the very rows scikit-learn returns:
`tests/test_splitting.py` checks equality with `train_test_split` over seeds, sizes, class
imbalance, ties and label types. The allocation (`approximate_mode`) and the split sizes
(`split_sizes`) are scikit-learn's few lines, kept here so that drawing a split does not
import scikit-learn (about 2 s of CPU, a fixed part of preparing any run); the tests check
both against scikit-learn's own. Whatever scikit-learn refuses (a class of one row, fewer
training or test rows than classes) is handed to scikit-learn, so its errors are its own.
"""
from __future__ import annotations

import math

import numpy as np


def stratified_split(rows: np.ndarray, y: np.ndarray, test_size: float, seed: int,
                     sort: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """`train_test_split(rows, test_size=test_size, random_state=seed, stratify=y)`.

    Args:
        rows: `[n]` the values to split (row indices).
        y: `[n]` class labels (any sortable dtype), one per row.
        test_size: the test share, a float in (0, 1) (rows: ceil(test_size * n)).
        seed: the `RandomState` seed.
        sort: the parts returned sorted instead of in scikit-learn's shuffled order: `()`,
            `("test",)` or `("train", "test")` (the same rows: scikit-learn's last draws
            only order them, and a caller that sorts them need not pay for the shuffles).

    Returns:
        (train values, test values), in scikit-learn's (shuffled) order unless sorted.

    Raises:
        ValueError: what scikit-learn raises for the same arguments (a class with one
            row, fewer training or test rows than classes, a bad `test_size`).
    """
    if sort not in ((), ("test",), ("train", "test")):  # a sorted train, shuffled test
        raise ValueError(f"sort={sort!r}; expected (), ('test',) or ('train', 'test')")

    def library() -> tuple[np.ndarray, np.ndarray]:
        from sklearn.model_selection import train_test_split

        parts = train_test_split(rows, test_size=test_size, random_state=seed, stratify=y)
        return tuple(np.sort(p) if name in sort else p
                     for name, p in zip(("train", "test"), parts))

    rows, y = np.asarray(rows), np.asarray(y)
    if (y.ndim != 1 or len(y) != len(rows)
            or (y.dtype.kind in "fc" and np.isnan(y).any())):  # scikit-learn refuses NaN
        return library()
    try:
        n_train, n_test = split_sizes(len(y), test_size)
    except ValueError:
        return library()  # scikit-learn words the refusal
    classes, class_counts = np.unique(y, return_counts=True)
    n_classes = len(class_counts)
    if class_counts.min() < 2 or n_train < n_classes or n_test < n_classes:
        return library()  # scikit-learn words the refusal
    class_rows = _class_rows(y, classes, class_counts)
    rng = np.random.RandomState(seed)
    n_i = approximate_mode(class_counts, n_train, rng)
    t_i = approximate_mode(class_counts - n_i, n_test, rng)
    train, test = [], []
    for i in range(n_classes):
        shuffled = class_rows[i].take(rng.permutation(class_counts[i]), mode="clip")
        train.append(shuffled[:n_i[i]])
        test.append(shuffled[n_i[i]:n_i[i] + t_i[i]])
    parts = []
    for name, at in (("train", np.concatenate(train)), ("test", np.concatenate(test))):
        parts.append(np.sort(rows[at]) if name in sort else rows[rng.permutation(at)])
    return parts[0], parts[1]


def split_sizes(n: int, test_size: float) -> tuple[int, int]:
    """`(n_train, n_test)` of a split of `n` rows with the float share `test_size` of them
    drawn: `n_test = ceil(test_size * n)`, the rest training rows (scikit-learn's
    `_validate_shuffle_split` for a float `test_size` and no `train_size`).

    Raises:
        ValueError: `test_size` not a float in (0, 1), or no training row left.
    """
    if np.asarray(test_size).dtype.kind != "f" or not 0 < test_size < 1:
        raise ValueError(f"test_size={test_size} should be a float in the (0, 1) range")
    n_test = math.ceil(test_size * n)
    if n - n_test <= 0:
        raise ValueError(f"With n_samples={n}, test_size={test_size} and train_size=None, "
                         "the resulting train set will be empty.")
    return n - n_test, n_test


def approximate_mode(class_counts: np.ndarray, n_draws: int,
                     rng: np.random.RandomState) -> np.ndarray:
    """`[n_classes]` rows drawn from each class: the approximate mode of the multivariate
    hypergeometric distribution (scikit-learn's `utils.extmath._approximate_mode`, the same
    arithmetic and the same `rng.choice` draws breaking ties): each class's share of
    `n_draws` rounded down, the rows left added to the classes with the largest remainders,
    ties drawn at random. Sums to `n_draws`."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add_now = min(len(inds), need_to_add)
            floored[rng.choice(inds, size=add_now, replace=False)] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(int)


def _class_rows(y: np.ndarray, classes: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """Each class's positions in `y`, in order: scikit-learn's stable argsort of the class
    codes, split by class (one comparison per class when they are few)."""
    if len(classes) <= 16:
        return [np.flatnonzero(y == c) for c in classes]
    return np.split(np.argsort(y, kind="stable"), np.cumsum(counts)[:-1])


TRAIN, VALIDATION, TEST = 0, 1, 2  # the split codes of `stratified_assignment`


def code_dtype(n_classes: int) -> np.dtype:
    """The smallest unsigned integer type that holds class codes `0 .. n_classes - 1`."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if n_classes <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def stratified_assignment(codes: np.ndarray, n_classes: int, test_size: float,
                          validation_size: float, seed: int) -> np.ndarray:
    """Each row's split, one byte per row: the rows `sources.split` draws with scikit-learn.

    The same draws as `stratified_split(arange(n), y, test_size, seed)` followed by
    `stratified_split(rest, y[rest], validation_size / (1 - test_size), seed)` (two
    `train_test_split(..., stratify=y)` calls): the same `RandomState(seed)` draws in the same
    order, each class's rows shuffled in place (`RandomState.shuffle` draws what
    `permutation` draws), the pool of training and validation rows held as 4-byte positions
    and no index list returned. Memory: `[n]` int8 of the result, the pool (4 or 8 bytes per
    row of it, 1 byte per row of its codes) and one class's positions (8 bytes per row of
    the largest class) at a time; more than 16 classes, one stable argsort of the codes
    (8 bytes per row) in their place.

    Args:
        codes: `[n]` class codes `0 .. n_classes - 1` (any integer type; `code_dtype`).
        n_classes: the classes' count; test_size, validation_size: shares of all rows in
            (0, 1), their sum below 1.
        seed: the `RandomState` seed (`data.split_seed`).

    Returns:
        `[n]` int8: `TRAIN` (0), `VALIDATION` (1) or `TEST` (2) per row.

    Raises:
        ValueError: what scikit-learn raises for the same split (a class with one row,
            fewer training, validation or test rows than classes, a bad share).
    """
    codes = np.asarray(codes)
    n = len(codes)
    which = np.zeros(n, np.int8)
    index = np.int32 if n < 2 ** 31 else np.int64
    pool = _draw(codes, n_classes, test_size, seed, which, TEST, index)
    rest_share = validation_size / (1.0 - test_size)
    picked = _draw(codes[pool], n_classes, rest_share, seed, None, VALIDATION, index)
    which[pool[picked]] = VALIDATION
    return which


def _draw(codes, n_classes, share, seed, which, mark, index):
    """One `stratified_split` of the rows of `codes` with `share` of them drawn: the rows
    drawn are set to `mark` in `which` (or, `which` None, their positions returned, in any
    order); else the training pool in scikit-learn's shuffled order (`index` positions)."""
    n = len(codes)
    counts = np.bincount(codes, minlength=n_classes)
    present = counts > 0
    n_train, n_test = split_sizes(n, share)
    k = int(present.sum())
    if counts[present].min() < 2:
        raise ValueError("The least populated class in y has only 1 member, which is too few. "
                         "The minimum number of groups for any class cannot be less than 2.")
    if n_train < k or n_test < k:
        raise ValueError(f"The train_size = {n_train} and test_size = {n_test} should be "
                         f"greater or equal to the number of classes = {k}")
    counts = counts[present]
    labels = np.flatnonzero(present)
    rng = np.random.RandomState(seed)
    n_i = approximate_mode(counts, n_train, rng)
    t_i = approximate_mode(counts - n_i, n_test, rng)
    order = np.argsort(codes, kind="stable") if k > 16 else None
    starts = np.concatenate([[0], np.cumsum(counts)])
    pool = np.empty(n_train, index)
    drawn = [] if which is None else None
    at = 0
    for i, c in enumerate(labels):
        rows = (np.flatnonzero(codes == c) if order is None
                else order[starts[i]:starts[i + 1]].copy())
        rng.shuffle(rows)  # = rows.take(rng.permutation(len(rows)))
        pool[at:at + n_i[i]] = rows[:n_i[i]]
        at += n_i[i]
        if which is None:
            drawn.append(rows[n_i[i]:n_i[i] + t_i[i]].astype(index))
        else:
            which[rows[n_i[i]:n_i[i] + t_i[i]]] = mark
        del rows
    if which is None:
        return np.concatenate(drawn)
    rng.shuffle(pool)  # scikit-learn's shuffled training rows: the next split's order
    return pool
