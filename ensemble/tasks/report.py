"""Shared pieces of the tasks' evaluation tables: number formatting and one split's block of rows.

Each task renders its own table (`classification.evaluation`, `regression.evaluation`); both
list a split as every member, the mean member, the best member (chosen on validation) and every
ensemble aggregator, which `split_block` draws with the task's columns and cell format.
"""
from __future__ import annotations

from ensemble.core import artifacts
from ensemble.core.errors import UsageError
from ensemble.tasks.table_parts import PRIOR

SPLIT_ORDER = ("validation", "test", "predict", "train")


def number(value: float | None, digits: int = 4, signed: bool = False) -> str:
    """`value` rounded to `digits`, never `-0.0000` (a value that rounds to zero prints
    unsigned); `n/a` for None."""
    if value is None:
        return "n/a"
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return text.lstrip("+-") if float(text) == 0 else text


def members_and_best(rows: list[dict]) -> tuple[list[dict], dict | None]:
    """The member rows among one split's metrics rows, and the best member's row (the member
    `best_member` names, chosen on validation), or None."""
    members = [r for r in rows if r["member"] is not None]
    best_idx = next((r["best_member"] for r in rows if r.get("best_member") is not None), None)
    return members, next((r for r in members if r["member"] == best_idx), None)


def answering(rows: list[dict], run_dir) -> dict | None:
    """The ensemble row among one split's metrics rows of the aggregator `ensemble predict`
    answers with (`ensemble.tasks.choice.default_aggregator`: lowest out-of-fold validation
    NLL in the run's `aggregators.json`; without a run, the first aggregator), or None."""
    import json
    from pathlib import Path

    from ensemble.tasks.choice import default_aggregator

    ensembles = [r for r in rows if r["aggregator"] is not None]
    if not ensembles:
        return None
    path = None if run_dir is None else Path(run_dir) / "aggregators.json"
    fit = json.loads(path.read_text()) if path is not None and path.is_file() else None
    name = default_aggregator([r["aggregator"] for r in ensembles], fit)
    return next(r for r in ensembles if r["aggregator"] == name)


ANSWER = " (what predict answers with)"  # the label of `answering`'s row in the plots


def split_block(split: str, rows: list[dict], references, columns, fmt, line) -> list[str]:
    """One split's rows of an evaluation table: every member, the mean and the best member,
    every aggregator.

    Args:
        rows: the metrics rows of `split` (dicts of `metrics.parquet` columns).
        references: `rows -> (mean member {metric: value}, best member row or None, member rows)`.
        columns: the metric columns shown; fmt: value -> cell text; line: (name, cells) -> text.
    """
    mean, best, members = references(rows)
    n = rows[0]["n"]
    out = [f"{split} ({n} row{'s' * (n != 1)})"]
    out += [line("  " + r["model"], [fmt(r[m]) for m in columns]) for r in members]
    if members:
        out.append(line("  mean member", [fmt(mean[m]) for m in columns]))
    if best is not None:
        out.append(line(f"  best member ({best['model']})", [fmt(best[m]) for m in columns]))
    out += [line("  " + r["model"], [fmt(r[m]) for m in columns])
            for r in rows if r["aggregator"] is not None]
    out += [line("  prior (training split)", [fmt(r[m]) for m in columns])
            for r in rows if r["model"] == PRIOR]
    return out


def rows_and_splits(metrics) -> tuple[list[dict], list[str], str]:
    """A `metrics.parquet` table's rows, its splits in `SPLIT_ORDER` and the split of the
    gains and the closing sentence (`test`, else the last).

    Raises:
        UsageError: the metrics hold no row.
    """
    rows = metrics.to_pylist()
    if not rows:
        raise UsageError("No labelled rows; cannot evaluate.")
    splits = sorted({r["split"] for r in rows}, key=SPLIT_ORDER.index)
    return rows, splits, "test" if "test" in splits else splits[-1]


def fitted_lines(fit: dict | None, describe) -> list[str]:
    """The fitted aggregators' parameters of `fit` (an `aggregators.json`), one line each:
    member weights for `weighted`/`greedy` (with `describe(name, params)` after them), the
    line `describe(name, params)` gives for the task's other fitted aggregators."""
    if not fit or not fit.get("params"):
        return []
    names = [f"member-{i}" for i in fit["members"]]
    n = fit["n_rows"]
    out = [f"fitted on the validation split ({n} row{'s' * (n != 1)}):"]
    for name, p in fit["params"].items():
        if "weights" in p:  # fitted member weights (weighted, greedy)
            ws = ", ".join(f"{n} {w:.2f}" for n, w in zip(names, p["weights"]) if w > 0)
            out.append(f"  {name}: weights {ws}{describe(name, p) or ''}")
        elif describe(name, p):
            out.append(f"  {name}: {describe(name, p)}")
    return out + _choice_line(fit)


def _choice_line(fit: dict) -> list[str]:
    """The line naming the out-of-fold NLLs predict's default is chosen on (none for a run
    from before them)."""
    how, scores = fit.get("out_of_fold"), fit.get("out_of_fold_nll") or {}
    shown = [f"{a} {v:.4f}" for a, v in scores.items() if v is not None]
    if not how or not shown or not how.get("folds"):  # nothing cross-fitted, or one choice
        return []
    blind = ["  the mean gets every one of these rows right: NLL cannot judge a fitted "
             "aggregator's sharpness there, so none is predict's default"] \
        if how.get("mistakes") == 0 and fit.get("params") else []
    return [f"out-of-fold validation NLL ({how['folds']}-fold cross-fitting on {how['rows']} "
            "rows; the lowest is predict's default):", f"  {', '.join(shown)}", *blind]


def kept_members(fit: dict | None, aggregator: str | None, n_members: int) -> int:
    """How many of a run's `n_members` members `aggregator` gives a weight above 0: the
    members greedy selection or fitted weights kept (`fit`, an `aggregators.json`), else all."""
    params = ((fit or {}).get("params") or {}).get(aggregator or "")
    if params and "weights" in params:
        return sum(1 for w in params["weights"] if w > 0)
    return n_members


def plotted_split(metrics) -> tuple[str, list[dict]]:
    """The split the plots show (`test`, else the metrics' first) and its metrics rows."""
    rows = metrics.to_pylist()
    split = "test" if any(r["split"] == "test" for r in rows) else rows[0]["split"]
    return split, [r for r in rows if r["split"] == split]


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only).

    Raises:
        UsageError: matplotlib is not installed (names the extra to install).
    """
    try:
        import matplotlib
    except ImportError:
        raise UsageError("Expected matplotlib for --plots: pip install '.[bench]' in a "
                         "checkout of the project, or pip install 'ensemble-replication[bench]' "
                         "from a package index (or pip install matplotlib).") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend_below(ax) -> None:
    """The legend of `ax` under its axes, outside the data (`save_figure`'s tight bounding
    box keeps it in the PNG)."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, frameon=False)


def save_figure(fig, path):
    """Write `fig` as a PNG at `path` atomically (a temporary file renamed: an interrupted
    plot leaves the earlier file or none, never half a PNG) and close it; returns the path."""
    from pathlib import Path

    path = Path(path)
    try:
        with artifacts.atomic_path(path, ".tmp.png") as tmp:
            fig.savefig(tmp, dpi=100, bbox_inches="tight", format="png")
    finally:
        pyplot().close(fig)
    return path
