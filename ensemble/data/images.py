"""Image folders: `DIR/<class>/*.png|jpg|jpeg|bmp|gif` read as `uint8` arrays with Pillow.

Laid out as `keras.utils.image_dataset_from_directory` reads them (classes are the sub-folder
names, files in name order). Pillow is the library `keras.utils.load_img` uses; reading with it
directly checks every file before TensorFlow loads (importing Keras for `load_img` would cost
seconds before the first check).

Hostile files are refused with one line naming the file (`open_image`): a decompression bomb
(more than `MAX_IMAGE_PIXELS` pixels, Pillow's own limit, set here explicitly; Pillow's
warning between 1x and 2x the limit is turned into the same refusal), a truncated or
unidentifiable file, any other Pillow refusal. A file (or a link to one) whose real path lies
outside the image folder is refused too: links are not followed out of the folder.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.data.containers import ArrayData
from ensemble.data.csv_format import table_format

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
MAX_IMAGE_PIXELS = 89_478_485  # Pillow's default (a 0.25 GiB RGB image), stated explicitly
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # Pillow modes read as one channel


def image_files(folder: Path, root: Path | None = None, nested: bool = False) -> list[Path]:
    """The image files directly in `folder`, or with `nested` in it and its sub-folders at
    any depth (a class folder's, as `keras.utils.image_dataset_from_directory` reads them;
    links to folders not followed), sorted by path (hidden files and folders left out).

    Raises:
        UsageError: a file whose real path (links resolved) is outside `root` (default
            `folder`), the image folder given by the user; names the link and its target.
    """
    import os

    if nested:
        found = []
        for top, dirs, names in os.walk(folder):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found += [Path(top) / n for n in names]
    else:
        found = list(folder.iterdir())
    files = sorted(p for p in found if p.is_file()
                   and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
    inside = Path(root or folder).resolve()
    for p in files:
        real = p.resolve()
        if not real.is_relative_to(inside):
            raise UsageError(f"Image {p} links to {real}, outside the image folder {inside}; "
                             "links are not followed out of it: copy the file in instead.")
    return files


def folder_labels(names) -> np.ndarray:
    """Class folder names as labels: int64 when every name is an integer as Python writes it
    (`7`, `-1`), else the names as strings (`07` stays `07`, not merged with a folder `7`;
    `²` is a name, not a number)."""
    names = [str(n) for n in names]
    try:
        numbers = [int(n) for n in names]
    except ValueError:
        return np.asarray(names)
    return np.asarray(numbers, np.int64) if [str(n) for n in numbers] == names \
        else np.asarray(names)


@contextmanager
def open_image(path: Path):
    """`PIL.Image.open(path)` with decompression bombs (beyond `MAX_IMAGE_PIXELS`, Pillow's
    warning included) and every other Pillow refusal raised as one line naming the file.

    Raises:
        UsageError: the file cannot be read as an image, or is too large.
    """
    import warnings

    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                yield im
    except UsageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise UsageError(f"Cannot read image {path}: larger than {MAX_IMAGE_PIXELS} pixels "
                         f"(a decompression bomb?): {exc}") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as exc:
        raise UsageError(f"Cannot read image {path}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def load_image_folder(path: str, image_size=None, color_mode: str = "auto",
                      require_target: bool = True) -> ArrayData:
    """Read `DIR/<class>/*.png|...` (or, unlabelled, `DIR/*.png|...`) as uint8 images.

    Raises:
        UsageError: no images, an empty class folder, an unreadable image (named), or images
            of different sizes without `image_size`.
    """
    root = Path(path)
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if classes:
        files, labels = [], []
        for c in classes:
            found = image_files(root / c, root, nested=True)
            if not found:
                raise UsageError(f"Class folder {root / c} holds no images "
                                 f"({', '.join(IMAGE_SUFFIXES)}); remove it or add images.")
            files += found
            labels += [c] * len(found)
        y = folder_labels(labels)
    else:
        files, y = image_files(root, root), None
        if require_target:
            tables = sorted(filter(None, map(table_format, root.iterdir())))
            if tables and not files:  # a folder of tables, not of images
                raise UsageError(f"Folder {path} holds .{tables[0]} files; training reads one "
                                 f".csv or .parquet file, or a folder of .parquet files (or "
                                 f"of images, one sub-folder per class): pass one of the "
                                 f"files, or join them into one")
            raise UsageError(f"Image folder {path} has no class sub-folders; expected "
                             f"{path}/<class>/*.png (one sub-folder per class).")
    if not files:
        raise UsageError(f"Image folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)}).")
    sizes, grey = {}, True  # sizes must agree (name the first two files that differ)
    for f in files:
        with open_image(f) as im:
            sizes.setdefault(im.size, f)
            grey = grey and im.mode in GREY_MODES
        if not image_size and len(sizes) > 1:
                (s0, f0), (s1, f1) = list(sizes.items())[:2]
                raise UsageError(f"Images differ in size: {f0} is {s0[1]}x{s0[0]}, {f1} is "
                                 f"{s1[1]}x{s1[0]} (height x width, as image_size); to "
                                 f"resize them all "
                                 f"(bilinear), set image_size = [height, width] in the "
                                 f"config's [data] table, or pass --set data.image_size="
                                 f"[{s0[1]},{s0[0]}]")
    if color_mode == "auto":
        color_mode = "grayscale" if grey else "rgb"
    return ArrayData(str(path), ImageFiles(files, image_size, color_mode), y,
                     np.asarray([str(f) for f in files], dtype=object), color_mode=color_mode)


class ImageFiles:
    """The images of an image folder as a lazily decoded `[n, h, w, channels]` uint8 array:
    indexing (a slice or an index array) decodes the rows asked for with `read_images`, so a
    folder is never decoded whole unless asked to (`numpy.asarray`).

    Args:
        files: the image paths, in row order; image_size, color_mode: as `read_images`.
    """

    dtype = np.dtype(np.uint8)
    ndim = 4

    def __init__(self, files, image_size, color_mode: str):
        self.files = list(files)
        self.image_size, self.color_mode = image_size, color_mode
        self.shape = (len(self.files), *self[0:1].shape[1:])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, idx) -> np.ndarray:
        chosen = np.asarray(self.files, dtype=object)[idx]
        if np.ndim(chosen) == 0:
            return read_images([chosen], self.image_size, self.color_mode).x[0]
        if not len(chosen):
            return np.zeros((0, *self.shape[1:]), np.uint8)
        return read_images(list(chosen), self.image_size, self.color_mode).x

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        x = self[:]
        return x if dtype is None else x.astype(dtype)

    def sha256(self, h) -> None:
        """Add the files' names and bytes to the hash `h`."""
        for f in self.files:
            h.update(str(f).encode())
            with open(f, "rb") as fh:
                h.update(fh.read())


def read_images(files, image_size, color_mode, resized: list | None = None,
                labels: list | None = None) -> ArrayData:
    """Images `files` as `ArrayData` `[n, h, w, channels]` uint8 (resized to `image_size`
    `[h, w]` when given; `color_mode` `grayscale` or `rgb`), labelled `labels` (each file's
    class folder name; default its parent folder's name). Resizing is
    `keras.utils.load_img(target_size=..., interpolation="bilinear")`'s: Pillow's
    `resize(BILINEAR)` after the colour conversion. A 16-bit grey image keeps its top byte
    (`v >> 8`, as `image_dataset_from_directory`'s `tf.io.decode_image`; Pillow's own
    conversion clips every value above 255 to white).

    Args:
        resized: when given, `(file, (width, height))` of every image whose size was changed
            is appended to it (for the caller's notice).

    Raises:
        UsageError: an unreadable image (named), or images of different sizes.
    """
    from PIL import Image

    mode = {"grayscale": "L", "rgb": "RGB"}[color_mode]
    images = []
    for f in files:
        with open_image(f) as im:
            if im.mode in ("I", "I;16", "I;16B", "I;16L"):  # 16-bit grey (a PNG's): top byte
                im = Image.fromarray(np.clip(np.asarray(im) >> 8, 0, 255).astype(np.uint8), "L")
            im = im.convert(mode)
            if image_size:
                if resized is not None and im.size != (image_size[1], image_size[0]):
                    resized.append((f, im.size))
                im = im.resize((image_size[1], image_size[0]), Image.BILINEAR)
            a = np.asarray(im, dtype=np.uint8)
        images.append(a[:, :, None] if a.ndim == 2 else a)
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise UsageError(f"Images differ in size ({sorted(shapes)[:2]}); the run reads "
                         "them at one size (its [data] image_size).")
    labels = [Path(f).parent.name for f in files] if labels is None else list(labels)
    y = folder_labels(labels)
    return ArrayData(str(Path(files[0]).parent), np.stack(images), y,
                     np.asarray([str(f) for f in files], dtype=object))
