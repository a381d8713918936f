"""The stratified split gives scikit-learn's `train_test_split(..., stratify=y)` rows."""
import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from ensemble.data.splitting import stratified_split


@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
@pytest.mark.parametrize("labels", ["balanced", "imbalanced", "ties", "strings", "many",
                                    "twenty"])  # (over 16 classes: the argsort path)
@pytest.mark.parametrize("test_size", [0.15, 0.3, 0.5])
def test_rows_equal_scikit_learns(seed, labels, test_size):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(60, 400))
    y = {"balanced": lambda: rng.integers(0, 3, n),
         "imbalanced": lambda: rng.choice(4, n, p=[0.7, 0.2, 0.07, 0.03]),
         "ties": lambda: np.repeat(np.arange(4), n // 4),  # equal counts: tie-breaking draws
         "strings": lambda: rng.choice(np.array(["b", "a", "c"], object), n),
         "many": lambda: rng.integers(0, 12, n),
         "twenty": lambda: rng.permutation(np.repeat(np.arange(20), n // 20))}[labels]()
    rows = rng.permutation(len(y)) + 1000  # values that are not positions
    expected = train_test_split(rows, test_size=test_size, random_state=seed, stratify=y)
    got = stratified_split(rows, y, test_size, seed)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)
    sorted_test = stratified_split(rows, y, test_size, seed, sort=("test",))
    np.testing.assert_array_equal(sorted_test[0], expected[0])
    np.testing.assert_array_equal(sorted_test[1], np.sort(expected[1]))
    both = stratified_split(rows, y, test_size, seed, sort=("train", "test"))
    for e, g in zip(expected, both):
        np.testing.assert_array_equal(g, np.sort(e))


def test_refusals_are_scikit_learns():
    y = np.array([0, 0, 0, 0, 1])  # a class of one row
    with pytest.raises(ValueError, match="least populated class"):
        stratified_split(np.arange(5), y, 0.4, 0)
    with pytest.raises(ValueError, match="sort="):
        stratified_split(np.arange(6), np.array([0, 1] * 3), 0.5, 0, sort=("train",))


def test_nan_labels_are_refused_as_scikit_learn_refuses_them():
    y = np.array([0.0, 1.0] * 10 + [np.nan])
    with pytest.raises(ValueError, match="NaN"):
        stratified_split(np.arange(len(y)), y, 0.3, 0)


def test_the_refusal_counts_rare_classes_in_words_that_agree():
    from ensemble.data.messages import split_refusal

    y = np.array(["x", "y", "x", "y", "x"])
    one = split_refusal("t.csv", y, np.array(["x", "y"]), np.array([3, 2]))
    assert "1 of its 2 classes has fewer than 3 rows ('y' 2 rows)" in one
    two = split_refusal("t.csv", y, np.array(["x", "y"]), np.array([2, 2]))
    assert "2 of its 2 classes have fewer than 3 rows" in two
    assert "merge or drop the rarest classes" in one


def test_the_refusal_names_a_few_rare_classes_the_rarest_first():
    """The rare classes are named (was: only counted), the rarest first, `...` beyond three:
    a numeric target may have hundreds."""
    from ensemble.data.messages import split_refusal

    classes, counts = np.array(["a", "b", "c", "d", "e"]), np.array([9, 2, 1, 1, 2])
    msg = split_refusal("t.csv", np.repeat(classes, counts), classes, counts)
    assert ("4 of its 5 classes have fewer than 3 rows ('c' 1 row, 'd' 1 row, 'b' 2 rows, "
            "...)") in msg
    few = split_refusal("t.csv", np.repeat(classes[:2], [9, 1]), classes[:2], np.array([9, 1]))
    assert "('b' 1 row);" in few and "..." not in few


def test_a_numeric_target_with_a_few_text_markers_names_them():
    """A numeric target with one `unknown` and one `?` cell reads as text: auto makes hundreds
    of classes and the split fails; regression refuses text. Both name the markers and the fix
    (empty cells are missing labels) rather than leave the user to find them."""
    import numpy as np

    from ensemble.core.errors import UsageError
    from ensemble.core.labels import text_among_numbers
    from ensemble.data.messages import split_refusal
    from ensemble.tasks import registry

    y = np.array([f"{v}.0" for v in range(100, 140)] + ["unknown", "?", "120.0"])
    assert text_among_numbers(y) == {"?": 1, "unknown": 1}
    assert text_among_numbers(np.array(["cat", "dog", "1"])) is None  # class names
    assert text_among_numbers(np.array(["1", "2"])) is None and text_among_numbers(
        np.array([1.0, 2.0])) is None
    with pytest.raises(UsageError, match=r"holds numbers but for 1 row of '\?', 1 row of "
                                         r"'unknown'; --task regression needs numbers: leave "
                                         r"those cells empty"):
        registry.resolve(y, "regression", "x.csv")
    with pytest.raises(UsageError, match="holds text labels"):
        registry.resolve(np.array(["a", "b", "1"]), "regression", "x.csv")
    classes, counts = np.unique(y, return_counts=True)
    text = split_refusal("x.csv", y, classes, counts)
    assert ("its labels are numbers but for 1 row of '?', 1 row of 'unknown': a numeric "
            "target? Leave those cells empty") in text and "--task regression" in text
    names = np.array(["a", "b", "c", "d"] * 2 + ["e"])
    classes, counts = np.unique(names, return_counts=True)
    assert "merge or drop the rarest classes" in split_refusal("x.csv", names, classes, counts)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("labels", ["imbalanced", "ties", "twenty"])
def test_the_one_byte_assignment_holds_scikit_learns_rows(seed, labels):
    """`stratified_assignment` (one byte per row, class codes in) marks the rows of the two
    `train_test_split(..., stratify=y)` calls a run makes: test first, then validation out
    of the rest in scikit-learn's shuffled order."""
    from ensemble.data.splitting import code_dtype, stratified_assignment

    rng = np.random.default_rng(seed)
    n = int(rng.integers(100, 400))
    y = {"imbalanced": lambda: rng.choice(4, n, p=[0.7, 0.2, 0.07, 0.03]),
         "ties": lambda: np.repeat(np.arange(4), n // 4),
         "twenty": lambda: rng.permutation(np.repeat(np.arange(20), n // 20))}[labels]()
    rest, test = train_test_split(np.arange(len(y)), test_size=0.2, random_state=seed,
                                  stratify=y)
    train, val = train_test_split(rest, test_size=0.1 / 0.8, random_state=seed,
                                  stratify=y[rest])
    which = stratified_assignment(y.astype(code_dtype(y.max() + 1)), y.max() + 1, 0.2, 0.1,
                                  seed)
    assert which.dtype == np.int8
    for code, rows in enumerate((train, val, test)):
        np.testing.assert_array_equal(np.flatnonzero(which == code), np.sort(rows))


def test_the_assignment_refuses_what_scikit_learn_refuses():
    from ensemble.data.splitting import code_dtype, stratified_assignment

    with pytest.raises(ValueError, match="least populated class"):
        stratified_assignment(np.array([0, 0, 0, 0, 1], np.uint8), 2, 0.4, 0.2, 0)
    assert code_dtype(256) == np.uint8 and code_dtype(257) == np.uint16


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_the_allocation_and_sizes_are_scikit_learns(seed):
    """`approximate_mode` and `split_sizes` (kept here so that a split imports no
    scikit-learn) give scikit-learn's allocation, tie draws and sizes, and leave the random
    state where scikit-learn's leave it."""
    from sklearn.model_selection._split import _validate_shuffle_split
    from sklearn.utils.extmath import _approximate_mode

    from ensemble.data.splitting import approximate_mode, split_sizes

    rng = np.random.default_rng(seed)
    for counts in (np.array([4, 2]), np.array([2, 2, 2, 1]), np.array([5, 5, 5, 5]),
                   rng.integers(2, 50, 7), rng.integers(2, 9, 30)):
        for n_draws in (1, int(counts.sum()) // 3, int(counts.sum()) - 1):
            ours, theirs = np.random.RandomState(seed), np.random.RandomState(seed)
            np.testing.assert_array_equal(approximate_mode(counts, n_draws, ours),
                                          _approximate_mode(counts, n_draws, theirs))
            assert ours.randint(1 << 30) == theirs.randint(1 << 30)
    for n, share in ((10, 0.2), (7, 0.15), (1_000_003, 0.1 / 0.8), (3, 0.5)):
        assert split_sizes(n, share) == _validate_shuffle_split(n, share, None)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="test_size"):
            split_sizes(10, bad)
