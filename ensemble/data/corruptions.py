"""Corruptions at severities 1-5 for the dataset-shift evaluation (`ensemble evaluate --shift`).

Images (`[n, H, W]` or `[n, H, W, C]`, intensities in [0, 1]): Gaussian noise, shot noise,
Gaussian blur, contrast and brightness as defined by Hendrycks and Dietterich 2019
("Benchmarking Neural Network Robustness to Common Corruptions and Perturbations",
`make_cifar_c.py`), with their CIFAR-10-C severity parameters; the blur's sigma (pixels) is
scaled by `min(H, W) / 32`, the other parameters are in intensity units and need no scaling.

Tables (`[n, n_features]`, the model's scaled inputs): Gaussian noise with std `c` times each
feature's training std, and feature dropout: each entry replaced by its feature's training
median with probability `c`.

Every corruption is a pure function of `(x, severity, rng)`; `corrupt` seeds the generator from
`(seed, corruption, severity)`, so a run's shift evaluation is reproducible.
"""

from __future__ import annotations

import zlib

import numpy as np

from ensemble.core.errors import UsageError

SEVERITIES = (1, 2, 3, 4, 5)
# Hendrycks & Dietterich, make_cifar_c.py (CIFAR-10-C, 32x32 images)
IMAGE_PARAMS = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),  # noise std
    "shot_noise": (500, 250, 100, 75, 50),  # Poisson rate per unit intensity
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),  # sigma in pixels at 32x32
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),  # factor towards the image mean
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),  # added to HSV value
}
TABLE_PARAMS = {
    "gaussian_noise": (0.2, 0.4, 0.6, 0.8, 1.0),  # noise std in training stds
    "feature_dropout": (0.1, 0.2, 0.3, 0.4, 0.5),  # probability an entry -> training median
}


def _param(table: dict, name: str, severity: int):
    if name not in table:
        raise UsageError(f"Expected a corruption from {', '.join(table)}. Received: {name!r}")
    if severity not in SEVERITIES:
        raise UsageError(f"Expected a severity from 1 to 5. Received: severity={severity!r}")
    return table[name][severity - 1]


def _spatial(x: np.ndarray) -> tuple[int, int]:
    if x.ndim not in (3, 4):
        raise UsageError(f"Expected images [n, H, W] or [n, H, W, C]. Received shape: {x.shape}")
    return x.shape[1], x.shape[2]


def gaussian_noise(x, c, rng):
    """`clip(x + N(0, c^2), 0, 1)`."""
    return np.clip(x + rng.normal(size=x.shape, scale=c), 0.0, 1.0)


def shot_noise(x, c, rng):
    """`clip(Poisson(x c) / c, 0, 1)`."""
    return np.clip(rng.poisson(np.clip(x, 0.0, 1.0) * c) / c, 0.0, 1.0)


def gaussian_blur(x, sigma, rng=None):
    """Gaussian filter of std `sigma` pixels over H and W of each image and channel (scipy's
    `gaussian_filter`, `mode="nearest"`), clipped to [0, 1]."""
    from scipy.ndimage import gaussian_filter

    s = [0.0, sigma, sigma] + [0.0] * (x.ndim - 3)
    return np.clip(gaussian_filter(x, sigma=s, mode="nearest"), 0.0, 1.0)


def contrast(x, c, rng=None):
    """`clip((x - m) c + m, 0, 1)`, `m` each image's mean over pixels and channels."""
    m = x.mean(axis=tuple(range(1, x.ndim)), keepdims=True)
    return np.clip((x - m) * c + m, 0.0, 1.0)


def brightness(x, c, rng=None):
    """HSV value `v -> min(v + c, 1)` with hue and saturation kept. For RGB images the pixel is
    scaled by `v'/v` (RGB is linear in v at fixed hue and saturation; a black pixel becomes gray
    `v'`); for one channel `v` is the intensity."""
    if x.ndim == 3 or x.shape[-1] == 1:
        return np.clip(x + c, 0.0, 1.0)
    v = x.max(axis=-1, keepdims=True)
    v2 = np.minimum(v + c, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(np.where(v > 0, x * (v2 / np.where(v > 0, v, 1.0)), v2), 0.0, 1.0)


IMAGE = {"gaussian_noise": gaussian_noise, "shot_noise": shot_noise,
         "gaussian_blur": gaussian_blur, "contrast": contrast, "brightness": brightness}


def corrupt_images(x: np.ndarray, name: str, severity: int, rng: np.random.Generator
                   ) -> np.ndarray:
    """Corrupt images `[n, H, W(, C)]` in [0, 1]; returns float32 of the same shape.

    Raises:
        UsageError: an unknown corruption or severity, or not an image batch.
    """
    c = _param(IMAGE_PARAMS, name, severity)
    h, w = _spatial(x)
    if name == "gaussian_blur":
        c = c * min(h, w) / 32.0
    return IMAGE[name](np.asarray(x, np.float64), c, rng).astype(np.float32)


def corrupt_table(x: np.ndarray, name: str, severity: int, rng: np.random.Generator,
                  train_std: np.ndarray, train_median: np.ndarray) -> np.ndarray:
    """Corrupt table rows `[n, n_features]`.

    Args:
        train_std, train_median: `[n_features]` of the training split (same space as `x`).

    Raises:
        UsageError: an unknown corruption or severity, or shapes that do not match.
    """
    c = _param(TABLE_PARAMS, name, severity)
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or np.shape(train_std) != (x.shape[1],) \
            or np.shape(train_median) != (x.shape[1],):
        raise UsageError(f"Expected rows [n, n_features] and [n_features] statistics. Received "
                         f"shapes: {x.shape}, {np.shape(train_std)}, {np.shape(train_median)}")
    if name == "gaussian_noise":
        out = x + rng.normal(size=x.shape) * c * np.asarray(train_std, np.float64)
    else:
        out = np.where(rng.random(x.shape) < c, np.asarray(train_median, np.float64), x)
    return out.astype(np.float32)


def names(image: bool) -> tuple[str, ...]:
    """The corruptions of images or of tables."""
    return tuple(IMAGE_PARAMS if image else TABLE_PARAMS)


def rng_for(seed: int, name: str, severity: int) -> np.random.Generator:
    """The generator of one corruption and severity: `(seed, crc32(name), severity)`."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), int(severity)])
