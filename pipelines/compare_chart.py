"""The chart of `ensemble compare` (`comparison.png`): wall time per mode and phase (training
split into its fixed part and its epochs), the modelled training time against the epoch count
(`compare_cost`), and peak memory. Needs matplotlib (the `bench` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble.runs import builtin_modes
from ensemble.core import artifacts
from ensemble.core.notices import notice
from pipelines import compare_cost

PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def colour(mode: str) -> str:
    """A mode's colour: the built-in modes' order (`ensemble.runs.builtin_modes.names`) over
    `PALETTE`, in-graph blue and between-graph orange; any other mode the next colour."""
    known = builtin_modes.names()
    return PALETTE[(known.index(mode) if mode in known else len(known)) % len(PALETTE)]


def _walls(ax, rows: list[dict]) -> None:
    """Wall seconds (median, min-max whiskers); a training bar is its fixed part (hatched)
    under epochs x per epoch, a prediction bar shades its start-up."""
    labels = [f"{r['mode']}\n{r['phase']}" for r in rows]
    med = np.array([r["wall_seconds_median"] for r in rows])
    err = np.array([[m - r["wall_seconds_min"], r["wall_seconds_max"] - m]
                    for m, r in zip(med, rows)]).T
    bars = ax.bar(labels, med, color=[colour(r["mode"]) for r in rows], yerr=err, capsize=4)
    base = [r["fixed_seconds_median"] if r.get("fixed_seconds_median") is not None
            else r["startup_seconds_median"] for r in rows]
    ax.bar(labels, base, color="none", hatch="//", edgecolor="black", linewidth=0,
           label="train: fixed; predict: start-up")
    ax.bar_label(bars, labels=[f"{v:.1f}" for v in med], fontsize=8, padding=2)
    ax.set_ylabel("wall seconds (median; whiskers: min-max)")
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelsize=8)


def _lines(ax, rows: list[dict], epochs: int) -> None:
    """Modelled training seconds `fixed + e x per_epoch` of each mode against the epoch count
    `e`, the configured count and the crossover marked."""
    train = [r for r in rows if r["phase"] == "train"]
    if epochs is None or any(r.get("epoch_seconds_median") is None for r in train):
        ax.text(0.5, 0.5, "per-epoch cost not measured\n(--epochs 2 or more)",
                ha="center", va="center", transform=ax.transAxes, fontsize=9)
        ax.set_axis_off()
        return
    band = compare_cost.crossover_band(*train)
    e = band["epochs"]
    top = max(2 * epochs, 1.5 * e if e else 0, 1.2 * (band["low"] or 0), 2)
    if band["high"] is not None and band["high"] < 5 * top:  # a bounded band: shown whole
        top = max(top, 1.1 * band["high"])
    grid = np.linspace(0, top, 50)
    for r in train:
        ax.plot(grid, r["fixed_seconds_median"] + grid * r["epoch_seconds_median"],
                color=colour(r["mode"]), label=r["mode"])
    ax.axvline(epochs, color="grey", linestyle=":", label=f"configured ({epochs})")
    marks = crossover_marks(band, top)
    if marks["band"]:
        ax.axvspan(*marks["band"], color="grey", alpha=0.2, linewidth=0,
                   label=marks["band_label"])
    if marks["line"] is not None:
        ax.axvline(marks["line"], color="black", linestyle=marks["style"],
                   label=marks["label"])
    ax.set_xlabel("epochs")
    ax.set_ylabel("training seconds (fixed + epochs x per epoch)")
    ax.legend(fontsize=7)


def crossover_marks(band: dict, top: float) -> dict:
    """How the cost panel draws a crossover (`compare_cost.crossover_band`) on an axis of
    epochs 0..`top`: `{"line": the medians' crossover or None, "style": "-" when sure, "--"
    when uncertain, "label": its legend text ("indicative" with one repeat, as the printed
    model says; "uncertain" when the spreads overlap), "band": (low, high) clipped to `top`,
    or None without spreads or crossover, "band_label"}`."""
    e, low, high = band["epochs"], band["low"], band["high"]
    word = band["word"]
    label = None if e is None else (
        f"crossover ({e:.1f}" + (", indicative: one sample" if word == "indicative"
                                 else ", uncertain" if word else "") + ")")
    shade = None
    if low is not None and word != "indicative" and high > low:
        shade = (low, min(high, top))
    upper = "no upper bound" if high == float("inf") else f"{high:.1f}" if shade else ""
    return {"line": e, "style": "--" if band["uncertain"] else "-", "label": label,
            "band": shade,
            "band_label": f"crossover range the spreads allow ({low:.1f} to {upper})"
            if shade else None}


def chart(rows: list[dict], context: dict, path: Path) -> None:
    """Write the chart to `path` (atomically); the title names the data set, member count,
    epochs, devices, cores and repeats. Without matplotlib: one line saying so, no file.

    Args:
        rows: the summary rows (`compare.summarise`).
        context: `data`, `members`, `epochs`, `devices`, `cores`, `repeats`.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        notice("matplotlib not installed (pip install '.[bench]'): no chart written")
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    _walls(axes[0], rows)
    _lines(axes[1], rows, context.get("epochs"))
    labels = [f"{r['mode']}\n{r['phase']}" for r in rows]
    mem = np.array([r["peak_rss_bytes_median"] for r in rows]) / 2**20
    err = np.array([[m - r["peak_rss_bytes_min"] / 2**20, r["peak_rss_bytes_max"] / 2**20 - m]
                    for m, r in zip(mem, rows)]).T
    bars = axes[2].bar(labels, mem, color=[colour(r["mode"]) for r in rows], yerr=err,
                       capsize=4)
    axes[2].bar_label(bars, labels=[f"{v:.0f}" for v in mem], fontsize=8, padding=2)
    axes[2].set_ylabel("peak resident MiB (median; whiskers: min-max)")
    axes[2].tick_params(axis="x", labelsize=8)
    fig.suptitle(f"ensemble compare on {context['data']}: {context['members']} members, "
                 f"{context['epochs']} epochs, devices {context['devices']}, "
                 f"{context['cores']} cores, {context['repeats']} repeats", fontsize=10)
    fig.tight_layout()
    try:
        with artifacts.atomic_path(path, ".png") as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
