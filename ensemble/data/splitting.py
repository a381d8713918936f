"""Stratified train/test split: scikit-learn's draws, without its per-row Python lists.

`sklearn.model_selection.train_test_split(rows, stratify=y)` (its `StratifiedShuffleSplit`)
collects each class's shuffled rows with `list.extend`, one Python integer per row, and turns
the list back into an array: about 8 of the 10 seconds two splits take on 8M labels
(`docs/benchmarks.md`, prepare profile), a third of preparing a numeric table. This module
makes the same draws from the same `numpy.random.RandomState`, in the same order, with
scikit-learn's own allocation of rows to classes (`_approximate_mode`), and concatenates
arrays instead of lists, so it returns the very rows scikit-learn returns:
`tests/test_splitting.py` checks equality with `train_test_split` over seeds, sizes, class
imbalance, ties and label types. Whatever scikit-learn refuses (a class of one row, fewer
training or test rows than classes) is handed to scikit-learn, so its errors are its own; if
its private helpers move in a later release, the split is scikit-learn's, at its speed.
"""
from __future__ import annotations

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
    from sklearn.model_selection import train_test_split

    if sort not in ((), ("test",), ("train", "test")):  # a sorted train, shuffled test
        raise ValueError(f"sort={sort!r}; expected (), ('test',) or ('train', 'test')")

    def library() -> tuple[np.ndarray, np.ndarray]:
        parts = train_test_split(rows, test_size=test_size, random_state=seed, stratify=y)
        return tuple(np.sort(p) if name in sort else p
                     for name, p in zip(("train", "test"), parts))

    try:
        # the names `StratifiedShuffleSplit` itself calls, wherever a release defines them
        from sklearn.model_selection._split import _approximate_mode, _validate_shuffle_split
    except ImportError:  # a release that moved them: scikit-learn's own (slower) split
        return library()
    rows, y = np.asarray(rows), np.asarray(y)
    if (y.ndim != 1 or len(y) != len(rows)
            or (y.dtype.kind in "fc" and np.isnan(y).any())):  # scikit-learn refuses NaN
        return library()
    n_train, n_test = _validate_shuffle_split(len(y), test_size, None,
                                              default_test_size=0.25)
    classes, class_counts = np.unique(y, return_counts=True)
    n_classes = len(class_counts)
    if class_counts.min() < 2 or n_train < n_classes or n_test < n_classes:
        return library()  # scikit-learn words the refusal
    class_rows = _class_rows(y, classes, class_counts)
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(class_counts, n_train, rng)
    t_i = _approximate_mode(class_counts - n_i, n_test, rng)
    train, test = [], []
    for i in range(n_classes):
        shuffled = class_rows[i].take(rng.permutation(class_counts[i]), mode="clip")
        train.append(shuffled[:n_i[i]])
        test.append(shuffled[n_i[i]:n_i[i] + t_i[i]])
    parts = []
    for name, at in (("train", np.concatenate(train)), ("test", np.concatenate(test))):
        parts.append(np.sort(rows[at]) if name in sort else rows[rng.permutation(at)])
    return parts[0], parts[1]


def _class_rows(y: np.ndarray, classes: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """Each class's positions in `y`, in order: scikit-learn's stable argsort of the class
    codes, split by class (one comparison per class when they are few)."""
    if len(classes) <= 16:
        return [np.flatnonzero(y == c) for c in classes]
    return np.split(np.argsort(y, kind="stable"), np.cumsum(counts)[:-1])
