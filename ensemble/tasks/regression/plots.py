"""`ensemble evaluate --plots` of a regression run: PNG pictures (matplotlib, the `bench` extra).

Three figures of the test split (else the first split with targets), each for the best member
(chosen on validation) and the ensemble `ensemble predict` answers with (the aggregator with
the lowest validation NLL, `ensemble.tasks.choice`; labelled so):

- `pit.png`: the PIT histogram, `Phi((y - mu) / std)` of every row under its predictive
  Gaussian (moment-matched for ensembles); flat when the predictive distribution is calibrated
  (Gneiting, Balabdaoui and Raftery 2007), U-shaped when it is too narrow, humped when too wide;
- `coverage.png`: interval coverage against the nominal level of central intervals
  `mu +- z_{(1+level)/2} std`, levels 0.05 to 0.95; calibrated on the diagonal;
- `error_vs_std.png`: absolute error `|y - mu|` against the predicted std, with the line
  `|error| = std * sqrt(2/pi)` (the mean absolute error of a calibrated Gaussian).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from scipy.stats import norm

from ensemble.tasks.model_arrays import PredictionArrays
from ensemble.tasks.report import (ANSWER, answering, legend_below, members_and_best,
                                   plotted_split, pyplot, save_figure)

LEVELS = np.linspace(0.05, 0.95, 19)


def _rows(preds: PredictionArrays, model: str, split: str
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y `[n]`, mu `[n]`, std `[n]`) of `model` on `split`, rows with a known target."""
    a = preds.get(split, model)
    return a.y, a.values[:, 0], a.values[:, 1]


def _shown(rows: list[dict], run_dir) -> list[dict]:
    """The best member (chosen on validation) and the ensemble `predict` answers with
    (`report.answering`), when present."""
    _, best = members_and_best(rows)
    return [r for r in (best, answering(rows, run_dir)) if r is not None]


def coverage_curve(y: np.ndarray, mu: np.ndarray, std: np.ndarray,
                   levels: np.ndarray = LEVELS) -> np.ndarray:
    """Share of rows inside the central interval `mu +- z std` of each nominal level.

    Args:
        y, mu, std: `[n_rows]` targets, predictive means and standard deviations (target units).
        levels: `[n_levels]` nominal levels in (0, 1).

    Returns:
        `[n_levels]` observed coverage.
    """
    z = norm.ppf((1 + np.asarray(levels)) / 2)
    return (np.abs(y - mu)[None, :] <= z[:, None] * std[None, :]).mean(axis=1)


def write_plots(folder: Path, preds: PredictionArrays, metrics: pa.Table, run_dir: Path | None
                ) -> list[Path]:
    """Write `pit.png`, `coverage.png` and `error_vs_std.png` of a predictions file's arrays
    (`model_arrays.read`) into `folder`; returns their paths.

    Raises:
        UsageError: matplotlib is not installed (names the extra to install).
    """
    plt = pyplot()
    split, rows = plotted_split(metrics)
    shown = [(r["model"] + (" (best member)" if r["member"] is not None else ANSWER),
              _rows(preds, r["model"], split)) for r in _shown(rows, run_dir)]
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (y, mu, std) in shown:
        ax.hist(norm.cdf((y - mu) / std), bins=10, range=(0, 1), density=True, histtype="step",
                linewidth=2, label=label)
    ax.axhline(1.0, color="k", linestyle=":", label="calibrated")
    ax.set(xlabel="PIT = Phi((y - mean) / std)", ylabel="density", title=f"PIT histogram on {split}")
    legend_below(ax)
    written.append(save_figure(fig, folder / "pit.png"))

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k:", label="calibrated")
    for label, (y, mu, std) in shown:
        ax.plot(LEVELS, coverage_curve(y, mu, std), marker="o", label=label)
    ax.set(xlabel="nominal level of the central interval", ylabel="observed coverage",
           title=f"Interval coverage on {split}")
    legend_below(ax)
    written.append(save_figure(fig, folder / "coverage.png"))

    fig, ax = plt.subplots(figsize=(5, 5))
    top = 0.0
    for label, (y, mu, std) in shown:
        ax.scatter(std, np.abs(y - mu), s=8, alpha=0.6, label=label)
        top = max(top, float(std.max(initial=0.0)))
    ax.plot([0, top], [0, top * np.sqrt(2 / np.pi)], "k:", label="calibrated mean |error|")
    ax.set(xlabel="predicted std (target units)", ylabel="|error| (target units)",
           title=f"Error against predicted std on {split}")
    legend_below(ax)
    written.append(save_figure(fig, folder / "error_vs_std.png"))
    return written
