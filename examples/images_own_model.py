"""Your own Keras model on a folder of images: a small CNN builder, trained as an ensemble.

The image folder is made here from scikit-learn's digits (`DIR/<class>/*.png`, the layout
`keras.utils.image_dataset_from_directory` reads); point `--images` at your own instead.
Run: `python examples/images_own_model.py [--images DIR] [--members 4] [--epochs 10]`.
"""
import argparse
import contextlib
import tempfile
from pathlib import Path

import keras


def small_cnn(input_shape, n_outputs, *, seed, filters=8, dense=32):
    """A builder: `[batch, h, w, c]` images (raw pixels 0-255) to `[batch, n_outputs]` logits.

    The project adds the scaling (`Rescaling(1/255)`) and the softmax head; `seed` is the
    member's seed (Keras's global seeds are already set from it).
    """
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(dense, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(n_outputs)(x))


def digits_folder(folder: Path, classes=(0, 1, 2, 3)) -> Path:
    """Write digits of `classes` as 16x16 grey PNGs into `folder/<class>/`."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for i, (image, label) in enumerate(zip(d.images, d.target)):
        if label in classes:
            (folder / str(label)).mkdir(parents=True, exist_ok=True)
            pixels = (image * 255 / 16).astype(np.uint8)
            Image.fromarray(pixels).resize((16, 16)).save(folder / str(label) / f"{i}.png")
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", help="a folder DIR/<class>/*.png (default: digits, made here)")
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workdir", help="keep the run here (default: a temporary folder, "
                   "removed at the end)")
    args = p.parse_args()
    with (contextlib.nullcontext(args.workdir) if args.workdir
          else tempfile.TemporaryDirectory(prefix="ensemble-example-")) as work:
        run_example(Path(work), args)


def run_example(work: Path, args: argparse.Namespace) -> None:
    """The example itself, its files in `work`."""
    import ensemble

    images = args.images or str(digits_folder(work / "digits"))
    run = ensemble.train({"data": {"source": images},
                          "members": {"count": args.members},
                          "training": {"epochs": args.epochs, "batch_size": 32}},
                         run_dir=work / "runs" / "cnn", model=small_cnn)
    print(run.summary())
    test = run.metrics.query("split == 'test'")[["model", "accuracy", "nll"]]
    print(test.to_string(index=False))
    # The same from the command line (the builder imported from this file):
    #   ensemble train --data DIR --model examples/images_own_model.py:small_cnn


if __name__ == "__main__":
    main()
