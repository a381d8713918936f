"""Array inputs: `.npz` files, folders of images, the built-in `digits_images`, and their scaling.

A row is an array `[*input_shape]` (an image `[height, width, channels]`), not a table row.

- `.npz` (`ensemble.data.npz`): `x` `[n, ...]` and optional `y` `[n]` (class labels, or
  numbers for regression), or Keras's layout `x_train, y_train, x_test, y_test`, whose test
  part becomes the run's test split.
- An image folder `DIR/<class>/*.png|jpg|jpeg|bmp|gif`, laid out as
  `keras.utils.image_dataset_from_directory` reads it (classes are the sub-folder names, files
  in name order); for prediction also a folder of images without class sub-folders. `[data]
  image_size = [h, w]` resizes (bilinear), `color_mode` is `auto` (grey when every image is
  grey, else RGB), `grayscale` or `rgb`. Images are
  read with Pillow, the library `keras.utils.load_img` uses, so that every file is checked
  before TensorFlow loads.
- `digits_images`: scikit-learn's digits as `8 x 8 x 1` images (values 0..16 mapped to 0..255).

Images stay `uint8` in the run (4x less than float32) up to the training step, which casts each
batch; the member's model starts with the scaling (`ArrayPreprocessing.scaling_layer`): `x /
255` for `uint8` images, per-element standardisation (training mean and standard deviation)
for float arrays. So the export takes raw pixels.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.data.containers import ArrayData, Batch
from ensemble.data.images import IMAGE_SUFFIXES, image_files, load_image_folder, read_images
from ensemble.data import npz
from ensemble.data.npz import is_npz, load_npz


def is_array_source(source: str) -> bool:
    """An `.npz` file, `digits_images`, or a folder (of images; a folder holding `.parquet`
    files is a table's shards)."""
    if source == "digits_images" or is_npz(source):
        return True
    folder = Path(source)
    return folder.is_dir() and next(folder.rglob("*.parquet"), None) is None


def load_digits_images() -> ArrayData:
    """scikit-learn's digits as `[1797, 8, 8, 1]` uint8 images (0..16 mapped to 0..255)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
    ids = np.asarray([f"digits[{i}]" for i in range(len(x))], dtype=object)
    return ArrayData("digits_images", x, d.target.astype(np.int64), ids)


def load(cfg, require_target: bool = True) -> ArrayData:
    """The array source named by `cfg.source` (a `config.DataConfig`).

    Raises:
        UsageError: see `load_npz` and `load_image_folder`.
    """
    if cfg.source == "digits_images":
        ds = load_digits_images()
    elif cfg.source.endswith(".npz"):
        ds = load_npz(cfg.source, require_target)
    else:
        ds = load_image_folder(cfg.source, cfg.image_size or None, cfg.color_mode,
                               require_target)
    return ds  # a single class is refused with the task (`tasks.registry.for_target`)


@dataclass(frozen=True)
class ArrayPreprocessing:
    """The scaling of array inputs, fitted on the training rows; applied inside each member.

    Attributes:
        input_shape: one row's shape.
        classes: sorted class labels.
        dtype: `uint8` (images: `x / 255`) or `float32` (standardised per element with
            `mean`, `std` `[*input_shape]` of the training rows).
    """

    kind = "arrays"  # its input kind (`ensemble.data.kinds`)

    input_shape: tuple[int, ...]
    classes: np.ndarray
    dtype: str
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    image_size: tuple[int, ...] | None = None
    color_mode: str = "rgb"

    feature_names: tuple = ()
    categories: dict | None = None

    @property
    def output_names(self) -> list[str]:
        return []

    @property
    def columns(self) -> tuple:
        return ()

    @classmethod
    def fit(cls, ds: ArrayData, train_rows: np.ndarray, classes: np.ndarray,
            image_size=None, color_mode: str = "rgb") -> "ArrayPreprocessing":
        """Fit on `ds.x[train_rows]` (nothing to fit for uint8 images)."""
        shape = tuple(int(d) for d in ds.x.shape[1:])
        if ds.x.dtype == np.uint8:
            return cls(shape, np.asarray(classes), "uint8", image_size=image_size,
                       color_mode=getattr(ds, "color_mode", color_mode))
        x = ds.x[train_rows].astype(np.float64)
        std = x.std(axis=0)
        return cls(shape, np.asarray(classes), "float32", x.mean(axis=0).astype(np.float32),
                   np.where(std > 0, std, 1.0).astype(np.float32), image_size, color_mode)

    def transform(self, ds) -> np.ndarray:
        """The rows as stored and fed to the members (scaling happens in the model)."""
        return ds.x if self.dtype == "uint8" else ds.x.astype(np.float32)

    def encode_scaled(self, ds, first_row: int = 0) -> tuple[np.ndarray, dict]:
        """`(transform(ds) as an array, {})`: the rows of a chunk as stored (tables'
        `Preprocessing.encode_scaled` also counts unknown categories)."""
        return np.asarray(self.transform(ds)), {}

    @classmethod
    def identity(cls, input_shape, classes) -> "ArrayPreprocessing":
        """Float arrays fed as they are (the scikit-learn estimator: scale in a Pipeline)."""
        return cls(tuple(int(d) for d in input_shape), np.asarray(classes), "float32")

    def scaling_layer(self):
        """The Keras layer that starts every member: `Rescaling(1/255)` or
        `Normalization(mean, variance)`; None for `identity`."""
        import keras

        if self.dtype == "float32" and self.mean is None:
            return None
        if self.dtype == "uint8":
            return keras.layers.Rescaling(1.0 / 255.0, name="scaling")
        # one mean and variance per element: every axis of the row is a Keras "feature" axis
        axes = tuple(range(1, len(self.input_shape) + 1))
        return keras.layers.Normalization(axis=axes, mean=self.mean, variance=np.square(self.std),
                                          name="scaling")

    def check_input(self, ds: ArrayData) -> None:
        """Raises UsageError when new rows have another shape than the training rows."""
        if tuple(ds.x.shape[1:]) != self.input_shape:
            raise UsageError(f"Input {ds.name} has rows of shape {list(ds.x.shape[1:])}; the "
                             f"run was trained on {list(self.input_shape)}.")

    def to_json(self) -> str:
        return json.dumps({
            "kind": "arrays", "input_shape": list(self.input_shape),
            "classes": self.classes.tolist(), "dtype": self.dtype,
            "mean": None if self.mean is None else self.mean.ravel().tolist(),
            "std": None if self.std is None else self.std.ravel().tolist(),
            "image_size": None if self.image_size is None else list(self.image_size),
            "color_mode": self.color_mode}, indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "ArrayPreprocessing":
        shape = tuple(d["input_shape"])
        arr = (lambda v: None if v is None else np.asarray(v, np.float32).reshape(shape))
        return cls(shape, np.asarray(d["classes"]), d["dtype"], arr(d.get("mean")),
                   arr(d.get("std")), tuple(d["image_size"]) if d.get("image_size") else None,
                   d.get("color_mode", "rgb"))


class ArrayStream:
    """New array rows for a trained run, in batches of at most `batch_rows`: the interface of
    `stream.InputStream` (`check`, `n_rows`, iteration of `stream.Batch`es with `ids`, each
    row's file path or array index). An image folder is read batch by batch; an `.npz` at
    once (its arrays are in one file).

    Labels (an `.npz`'s `y`, an image's class folder) fill `y` as a table's target column
    does (`stream.InputStream`): a label the run never saw, or an `.npz` label that is NaN or
    inf (missing), leaves that row's `y_true` null, with one notice naming or counting them
    (unless `quiet`); an image at the top of the folder has none.

    Raises:
        UsageError: unreadable source, rows of another shape than the run's.
    """

    def __init__(self, pre: ArrayPreprocessing, source: str, batch_rows: int,
                 quiet: bool = False, target: str | None = None):
        if batch_rows < 1:
            raise UsageError(f"Expected --batch-size >= 1. Received: {batch_rows}")
        self.pre, self.source, self.batch_rows = pre, str(source), int(batch_rows)
        self.quiet, self.target = quiet, target  # `--target`: refused (`check_target`)
        self.unknown_labels = Counter()  # label the run never saw -> its rows
        self.missing_labels = 0  # rows of an .npz whose y is NaN or inf (no label)
        self._files = None
        self._class_of = {}  # an image's class: the sub-folder of the source holding it
        self._whole = None
        self._resize_noted = False
        if Path(self.source).is_dir():
            root = Path(self.source)
            subs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
            self._class_of = {f: d.name for d in subs
                              for f in image_files(d, root, nested=True)}
            self._files = list(self._class_of) + image_files(root)
            if not self._files:
                raise UsageError(f"Image folder {source} holds no images "
                                 f"({', '.join(IMAGE_SUFFIXES)}).")
        elif not is_array_source(self.source):
            raise UsageError(f"The run was trained on arrays (rows of shape "
                             f"{list(pre.input_shape)}); expected a .npz file or an image "
                             f"folder. Received: {source}")

    @property
    def n_rows(self) -> int | None:
        return len(self._files) if self._files is not None else None

    def check_target(self) -> None:
        """Refuse `--target` (`InputStream.check_target`): an array's labels are its `y` or
        its class folders, not a column.

        Raises:
            UsageError: always (the option was given).
        """
        raise UsageError(f"Cannot use --target {self.target!r}: the run reads arrays, whose "
                         f"labels are {self._label_source()}, not a column; expected no "
                         "--target")

    def _load(self, files=None) -> ArrayData:
        if files is None:
            if self._whole is None:
                from ensemble.data.settings import DataConfig

                cfg = DataConfig(source=self.source,
                                 image_size=self.pre.image_size or (),
                                 color_mode=self.pre.color_mode)
                self._whole = load(cfg, require_target=False) if not self.source.endswith(
                    ".npz") else load_npz(self.source, require_target=False)
            return self._whole
        shape = self.pre.input_shape  # every image at the run's size and channels
        if not (len(shape) == 2 or len(shape) == 3 and shape[-1] in (1, 3)):
            raise UsageError(f"The run was trained on rows of shape {list(shape)}, which no "
                             f"image is; expected a .npz file of such rows. Received the "
                             f"image folder {self.source}")
        size = self.pre.image_size or tuple(shape[:2])
        # the run's rows decide (an .npz or digits_images run records no colour of its own)
        mode = "rgb" if len(shape) == 3 and shape[-1] == 3 else "grayscale"
        resized: list = []
        part = read_images(files, size, mode, resized,
                           [self._class_of.get(f, Path(f).parent.name) for f in files])
        if len(shape) == 2:  # rows [h, w] without a channel axis
            part = dataclasses.replace(part, x=part.x[..., 0])
        if resized and not self._resize_noted:
            from ensemble.core.notices import notice

            self._resize_noted = True
            (f, (w, h)) = resized[0]
            notice(f"images of {self.source} whose size is not the run's {size[0]}x{size[1]} "
                   f"(height x width; first: {f}, {h}x{w}) are resized to it, bilinear as "
                   f"keras.utils.image_dataset_from_directory and load_img resize", once=True)
        return part

    def passthrough_batches(self):
        """`(None, ids)` of each batch: the rows' file paths or array indices, without
        reading the images."""
        n = len(self._files) if self._files is not None else len(self._load().x)
        for lo in range(0, n, self.batch_rows):
            ids = (np.asarray([str(f) for f in self._files[lo:lo + self.batch_rows]],
                              dtype=object) if self._files is not None
                   else self._load().ids[lo:lo + self.batch_rows])
            yield None, ids

    passthrough = False  # ids are always carried (`stream.Batch.ids`)

    def check(self) -> None:
        """Read the first batch and check its rows' shape."""
        first = self._load(self._files[:self.batch_rows] if self._files else None)
        self.pre.check_input(first)

    def survey(self) -> None:
        """`check` and the labels (a between-graph launcher's whole-input pass,
        `InputStream.survey`): decoding every image once more would be slow; each image is
        checked as a client decodes it."""
        self.check()
        for lo in range(0, self._rows(), self.batch_rows):
            self._labels(lo)
        self._notice_unknown()

    def _label_source(self) -> str:
        """Where the labels come from: `the class folders of SOURCE` or `the y array of SOURCE`."""
        where = "the class folders" if self._files is not None else "the y array"
        return f"{where} of {self.source}"

    def _rows(self) -> int:
        return len(self._files) if self._files is not None else len(self._load().x)

    def _labels(self, lo: int) -> np.ndarray | None:
        """The class indices of the batch at row `lo` (`labels.encode_known`: -1 for a label
        the run never saw, counted in `unknown_labels`, and for an image at the top of the
        folder); None when no row has a label (or a regression row has none)."""
        from ensemble.core.labels import encode_known, spread
        from ensemble.data.images import folder_labels

        if self._files is None:
            y = self._load().y
            if y is None:
                return None
            y = y[lo:lo + self.batch_rows]
            has = npz.labelled(y)
            self.missing_labels += int(len(y) - has.sum())  # NaN or inf: no label
            if not has.any():
                return None
            y = y[has]
        else:
            files = self._files[lo:lo + self.batch_rows]
            has = np.asarray([f in self._class_of for f in files])
            if not has.any():
                return None
            y = folder_labels([self._class_of[f] for f, h in zip(files, has) if h])
        codes, unseen = encode_known(y, self.pre.classes)
        self.unknown_labels.update(unseen)
        return spread(codes, has)

    def _notice_unknown(self) -> None:
        from ensemble.core.notices import notice
        from ensemble.data.messages import missing_labels, unknown_labels

        if self.quiet:
            return
        if self.missing_labels:
            notice(missing_labels(self._label_source(), self.missing_labels, self._rows()))
        if self.unknown_labels:
            notice(unknown_labels(self._label_source(), self.unknown_labels,
                                  self.pre.classes))

    def __iter__(self):
        for lo in range(0, self._rows(), self.batch_rows):
            if self._files is not None:
                part = self._load(self._files[lo:lo + self.batch_rows])
                x, ids = part.x, part.ids
            else:
                whole = self._load()
                x, ids = whole.x[lo:lo + self.batch_rows], whole.ids[lo:lo + self.batch_rows]
            self.pre.check_input(ArrayData(self.source, x, None, ids))
            yield Batch(lo, self.pre.transform(ArrayData(self.source, x, None, ids)),
                        self._labels(lo), ids)
        self._notice_unknown()
