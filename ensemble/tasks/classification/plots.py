"""`ensemble evaluate --plots` of a classification run: PNG pictures (matplotlib, the `bench` extra).

Three figures beside the metrics: `reliability.png` (reliability diagram of the ensemble
against the best member on test, 15 equal-width confidence bins as the ECE), `ensemble_size.png`
(test NLL and accuracy of the mean of the first k members, and of greedy selection's first k
picks), and `members.png` (every member against every ensemble, one panel per metric).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from ensemble.core import artifacts
from ensemble.tasks.model_arrays import PredictionArrays
from ensemble.tasks.report import (ANSWER, answering, legend_below, members_and_best,
                                   plotted_split, pyplot, save_figure)
from ensemble.tasks.classification.metrics import ECE_BINS, LOWER_IS_BETTER, METRICS


def _model(preds: PredictionArrays, model: str, split: str):
    a = preds.get(split, model)
    return a.y, a.values


def _reliability(ax, y, p, label):
    conf, correct = p.max(axis=1), (p.argmax(axis=1) == y)
    bins = np.minimum(np.floor(ECE_BINS * conf).astype(int), ECE_BINS - 1)
    xs, accs, counts = [], [], []
    for b in range(ECE_BINS):
        if (bins == b).any():
            xs.append(conf[bins == b].mean())
            accs.append(correct[bins == b].mean())
            counts.append(int((bins == b).sum()))
    line, = ax.plot(xs, accs, marker="o", label=label)
    for x, acc, n in zip(xs, accs, counts):  # each bin's rows: how much a point weighs
        ax.annotate(f"{n}", (x, acc), textcoords="offset points", xytext=(0, 6), ha="center",
                    fontsize=7, color=line.get_color())


def write_plots(folder: Path, preds: PredictionArrays, metrics: pa.Table, run_dir: Path | None
                ) -> list[Path]:
    """Write the PNGs of a predictions file's arrays (`model_arrays.read`) and its metrics
    into `folder`; returns their paths.

    Raises:
        UsageError: matplotlib is not installed (names the extra to install).
    """
    plt = pyplot()
    split, rows = plotted_split(metrics)
    members = [r for r in rows if r["member"] is not None]
    ensembles = [r for r in rows if r["aggregator"] is not None and r["nll"] is not None]
    written = []

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k:", label="perfect calibration")
    _, best = members_and_best(rows)
    answer = answering(ensembles, run_dir)
    for r in ([answer] if answer else []) + ([best] if best else []):
        label = r["model"] + (" (best member, chosen on validation)" if r is best else ANSWER)
        _reliability(ax, *_model(preds, r["model"], split), label)
    ax.set(xlabel="confidence (top probability)", ylabel="accuracy",
           title=f"Reliability on {split} (numbers: rows per bin)")
    legend_below(ax)
    written.append(save_figure(fig, folder / "reliability.png"))

    curve_path = None if run_dir is None else Path(run_dir) / "ensemble_size.parquet"
    if curve_path is not None and curve_path.is_file():
        curve = [r for r in artifacts.read_parquet(curve_path).to_pylist() if r["split"] == split]
        n_members = max((r["k"] for r in curve if r["order"] == "first"), default=0)
        curve = [r for r in curve if r["k"] <= n_members]  # files from before the cut
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, m in zip(axes, ("nll", "accuracy")):
            for order in dict.fromkeys(r["order"] for r in curve):
                pts = [(r["k"], r[m]) for r in curve if r["order"] == order]
                label = ("first k members" if order == "first"
                         else "greedy selection's first k picks")
                ax.plot(*zip(*pts), marker=".", label=label)
            ax.set(xlabel="k (members averaged, with repeats for greedy)", ylabel=m,
                   title=f"{m} on {split}", xlim=(0.5, n_members + 0.5))
            ax.legend()
        written.append(save_figure(fig, folder / "ensemble_size.png"))

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 4), sharey=True)
    for ax, m in zip(axes, METRICS):
        shown = members + ensembles  # same bars in every panel (the y axis is shared)
        ax.barh([r["model"] for r in shown], [r[m] for r in shown],
                color=["tab:gray" if r["member"] is not None else "tab:blue" for r in shown])
        ax.set(title=f"{m} on {split} ({'lower' if m in LOWER_IS_BETTER else 'higher'} "
                     "is better)")
    written.append(save_figure(fig, folder / "members.png"))
    return written
