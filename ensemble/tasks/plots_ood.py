"""Pictures of what the ensemble is for (matplotlib, the `bench` extra), written atomically:

- `ood_entropy.png`: histograms of the predictive entropy (regression: the predictive std) on
  the test split and on the OOD inputs, for the best member and the first aggregator
  (Lakshminarayanan et al. 2017, Fig. 3);
- `confidence.png`: accuracy and share of rows kept against the confidence threshold tau, for
  every member and aggregator (their Fig. 6; regression: RMSE of the rows kept against the
  share kept, by predictive std);
- `shift.png`: NLL and ECE (regression: NLL and RMSE) against corruption severity, the members
  in gray and the ensemble in color, averaged over corruptions (Ovadia et al. 2019, Fig. 2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from ensemble.tasks.report import pyplot as _pyplot, save_figure

LABELS = {"entropy": "predictive entropy (nats)", "std": "predictive std"}  # x axis of a score


def entropy_histograms(folder: Path, scores_in: list[dict], scores_out: list[dict],
                       fit: dict | None, task) -> Path:
    """`folder/ood_entropy.png` from `Task.ood_scores` of both sets (the run's `task`): the
    predictive entropy where the task scores it, else its first score (regression: the
    predictive std), of the best member and the first aggregator of probabilities."""
    plt = _pyplot()
    scores = scores_in[0]["scores"]
    key = "entropy" if "entropy" in scores else next(iter(scores))
    best = (fit or {}).get("best_member")
    member = next((k for k, r in enumerate(scores_in) if r["member"] == best), 0)
    ens = next((k for k, r in enumerate(scores_in)
                if r["aggregator"] is not None and r["aggregator"] in task.aggregators
                and task.aggregators[r["aggregator"]].probabilities), None)
    shown = [member] + ([ens] if ens is not None else [])
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 4), sharex=True)
    for ax, k in zip(np.atleast_1d(axes), shown):
        a, b = scores_in[k]["scores"][key], scores_out[k]["scores"][key]
        bins = np.linspace(0, max(a.max(), b.max(), 1e-9), 30)
        ax.hist(a, bins=bins, alpha=0.6, density=True, label="test (in distribution)")
        ax.hist(b, bins=bins, alpha=0.6, density=True, label="OOD")
        name = scores_in[k]["model"] + (" (best member, chosen on validation)"
                                        if k == member and best is not None else "")
        ax.set(xlabel=LABELS.get(key, key), ylabel="density", title=name)
        ax.legend()
    return save_figure(fig, Path(folder) / "ood_entropy.png")


def confidence_plot(folder: Path, curves: dict[str, tuple], regression: bool) -> Path:
    """`folder/confidence.png`; `curves`: model -> (x `[k]`, accuracy or RMSE `[k]`, share
    kept `[k]`) of `ensemble.tasks.risk_coverage`."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 1 if regression else 2, figsize=(5 if regression else 10, 4))
    axes = np.atleast_1d(axes)
    for model, (x, metric, kept) in curves.items():
        style = dict(color="tab:gray", alpha=0.5, lw=1) if model.startswith("member") else \
            dict(lw=2)
        axes[0].plot(kept if regression else x, metric, label=model, **style)
        if not regression:
            axes[1].plot(x, kept, label=model, **style)
    if regression:
        axes[0].set(xlabel="share of rows kept (lowest predictive std first)",
                    ylabel="RMSE of the rows kept", title="RMSE against share kept")
    else:
        axes[0].set(xlabel="confidence threshold tau", ylabel="accuracy on rows with p >= tau",
                    title="accuracy against confidence")
        axes[1].set(xlabel="confidence threshold tau", ylabel="share of rows kept",
                    title="rows kept")
    axes[0].legend(fontsize=7)
    return save_figure(fig, Path(folder) / "confidence.png")


def shift_plot(folder: Path, table: pa.Table, task) -> Path:
    """`folder/shift.png` from a `shift.parquet` table of a run of `task`: NLL and the task's
    next shift metric (ECE; RMSE for regression)."""
    plt = _pyplot()
    rows = table.to_pylist()
    keys = ("nll", *[m for m in task.shift_metrics if m not in ("nll", "accuracy")])[:2]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    sev = sorted({r["severity"] for r in rows})
    for ax, k in zip(axes, keys):
        for model in dict.fromkeys(r["model"] for r in rows):
            ys = [np.mean([r[k] for r in rows if r["model"] == model and r["severity"] == s
                           and r[k] is not None] or [np.nan]) for s in sev]
            if np.all(np.isnan(ys)):  # hard voting: no NLL or ECE
                continue
            member = model.startswith("member")
            ax.plot(sev, ys, marker=".", label=model,
                    **(dict(color="tab:gray", alpha=0.6) if member else dict(lw=2)))
        ax.set(xlabel="severity (mean over corruptions)", ylabel=k, xticks=sev,
               title=f"{k} under dataset shift")
        ax.legend(fontsize=7)
    return save_figure(fig, Path(folder) / "shift.png")
