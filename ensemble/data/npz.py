"""`.npz` inputs, read with `allow_pickle=False` (`ensemble.data.arrays` has the other array
sources and their scaling).

Either `x` `[n, ...]` and optional `y` `[n]` (or `[n, 1]`), or Keras's layout `x_train,
y_train, x_test, y_test`, whose test part becomes the run's test split. `y` holds class labels
(ints or strings) or numbers: non-integer numbers are a regression target, as a table's
(`ensemble.data.sources._labels`); `[data] task` (`ensemble.tasks.registry.resolve`) decides
the task, so `--task regression` takes integer targets too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.data.columns import FLOAT32_MAX
from ensemble.data.containers import ArrayData

NPZ_KEYS = ("x", "y")
KERAS_KEYS = ("x_train", "y_train", "x_test", "y_test")


def is_npz(path) -> bool:
    """`path` names an `.npz` file (by its suffix)."""
    return str(path).endswith(".npz")


def _labels(y: np.ndarray, name: str, required: bool = True) -> np.ndarray | None:
    """Targets `[n]` (or `[n, 1]`) as int64 or str class labels, or float64 when they are
    non-integer numbers (a regression target, as a table's: `sources._labels`; the task is
    `ensemble.runs.prepare.resolve_task`'s to decide). Not `required` (predict), NaN or inf
    is a row without a label (kept, float64: `arrays.ArrayStream` leaves its `y_true` null),
    as a table's missing label.

    Raises:
        UsageError: another shape, NaN or inf (when `required`), numbers beyond float32
            (the model's dtype), or bytes that are not UTF-8.
    """
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise UsageError(f"Expected labels of shape [n] in {name}. Received: {list(y.shape)}")
    if y.dtype.kind == "S":  # bytes (h5py's strings, np.char.encode): UTF-8 text
        texts = []
        for i, b in enumerate(y.tolist()):
            try:
                texts.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                raise UsageError(f"Labels y in {name} are bytes, and row {i}'s ({b!r}) are not "
                                 "UTF-8 text; expected labels as text (UTF-8) or numbers"
                                 ) from None
        return np.asarray(texts, dtype=str)
    if y.dtype.kind == "U":
        return y.astype(str)
    if y.dtype.kind not in "iubf":
        raise UsageError(f"Expected labels y in {name} to be numbers or strings. Received "
                         f"dtype {y.dtype}")
    if y.dtype.kind == "f":
        bad = ~np.isfinite(y)
        if np.any(bad) and required:
            raise UsageError(f"Labels in {name} hold {int(bad.sum())} missing or non-finite "
                             f"target(s) (NaN or inf; first at row {int(np.argmax(bad))}); "
                             "expected class labels or finite numbers")
        ok = y[~bad]
        if ok.size and np.abs(ok).max() > FLOAT32_MAX:
            raise UsageError(f"Labels in {name} hold {np.abs(ok).max():.6g}, beyond float32 "
                             f"(the model's dtype: |y| <= {FLOAT32_MAX:.4g}); expected class "
                             "labels or numbers that fit")
        if np.any(bad) or not np.all(ok == np.round(ok)) or (
                ok.size and np.abs(ok).max() >= 2.0 ** 63):
            return y.astype(np.float64)  # non-integer numbers (a regression target), or NaN
    return y.astype(np.int64)


def labelled(y: np.ndarray) -> np.ndarray:
    """`[n]` bool, the rows of labels `y` `[n]` (`load_npz` at predict) that have one: NaN or
    inf in float labels is a missing label, whatever the task."""
    return np.isfinite(y) if np.issubdtype(y.dtype, np.floating) else np.ones(len(y), bool)


def _x(x: np.ndarray, name: str) -> np.ndarray:
    if x.ndim < 2:
        raise UsageError(f"Expected x of shape [n, ...] in {name}. Received: {list(x.shape)}")
    if 0 in x.shape[1:]:  # rows of no value: TensorFlow aborts the process on them
        raise UsageError(f"Expected rows of at least one value in x of {name}. Received: rows "
                         f"of shape {list(x.shape[1:])}, which hold no value.")
    if x.dtype == np.uint8:
        return x
    if x.dtype.kind not in "iuf":
        raise UsageError(f"Expected numbers in x of {name}. Received dtype {x.dtype}")
    x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise UsageError(f"Expected finite numbers in x of {name}. Received: NaN, inf or "
                         "values beyond float32.")
    return x


def load_npz(path: str, require_target: bool = True) -> ArrayData:
    """Read an `.npz` in either layout (see the module docstring): `x` `[n, ...]` uint8 or
    float32, `y` `[n]` (`_labels`; None without labels; when not `require_target`, NaN or
    inf where a row has none), Keras's test part as `test_rows`.

    Raises:
        UsageError: missing or unreadable file, pickled (object) arrays, missing keys, `x` and
            `y` of different lengths, non-numeric `x`, or labels `_labels` refuses; one line
            naming the file.
    """
    import zipfile

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"Data file not found: {path}")
    try:
        with np.load(p, allow_pickle=False) as z:
            keys = set(z.files)
            if set(KERAS_KEYS) <= keys:
                parts = {k: z[k] for k in KERAS_KEYS}
            elif "x" in keys:
                parts = {k: z[k] for k in NPZ_KEYS if k in keys}
            else:
                raise UsageError(f"{path} holds {sorted(keys)}; expected arrays x and y, or "
                                 "Keras's x_train, y_train, x_test, y_test.")
    except UsageError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc).lower():
            raise UsageError(f"{path} holds pickled (object) arrays, which are not read "
                             "(allow_pickle=False); save numbers or strings.") from None
        raise UsageError(f"Cannot read {path} as .npz: {exc}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(f"Cannot read {path} as .npz: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if "x_train" in parts:
        x, y, test = _keras_layout(parts, path, require_target)
    else:
        x, y, test = _x(parts["x"], path), parts.get("y"), None
        if y is not None:
            y = _labels(y, path, require_target)
            if y is not None and len(y) != len(x):
                raise UsageError(f"Expected one label per row of {path}. Received: x and y "
                                 f"differ in length ({len(x)} and {len(y)}).")
    if require_target and y is None:
        raise UsageError(f"{path} has no labels y; expected arrays x and y to train.")
    ids = np.asarray([f"{p.name}[{i}]" for i in range(len(x))], dtype=object)
    return ArrayData(str(path), x, y, ids, test)


def _keras_layout(parts: dict, path: str, required: bool):
    """`(x [n_train + n_test, ...], y [n_train + n_test] or None, test rows)` of Keras's
    layout: the train part then the test part.

    Raises:
        UsageError: a part whose `x` and `y` differ in length, parts of other row shapes,
            strings in one part's labels and numbers in the other's, or labels `_labels`
            refuses.
    """
    xs = [_x(parts["x_train"], path), _x(parts["x_test"], path)]
    ys = [_labels(parts["y_train"], path, required),
          _labels(parts["y_test"], path, required)]
    for x, y, part in zip(xs, ys, ("train", "test")):
        if y is not None and len(x) != len(y):
            raise UsageError(f"Expected one label per row of {path}. Received: x_{part} and "
                             f"y_{part} differ in length ({len(x)} and {len(y)}).")
    if ys[0] is not None and ys[1] is not None and \
            (ys[0].dtype.kind == "U") != (ys[1].dtype.kind == "U"):
        kinds = ["strings" if y.dtype.kind == "U" else "numbers" for y in ys]
        raise UsageError(f"Expected labels of one kind in y_train and y_test of {path}. "
                         f"Received: {kinds[0]} and {kinds[1]}.")
    if xs[0].shape[1:] != xs[1].shape[1:]:
        raise UsageError(f"Expected rows of one shape in x_train and x_test of {path}. "
                         f"Received: {list(xs[0].shape[1:])} and {list(xs[1].shape[1:])}.")
    x = np.concatenate(xs) if xs[0].dtype == xs[1].dtype else \
        np.concatenate([a.astype(np.float32) for a in xs])
    y = None if any(a is None for a in ys) else np.concatenate(ys)
    test = np.arange(len(xs[0]), len(x))
    return x, y, test
