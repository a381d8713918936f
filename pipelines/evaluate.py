"""`ensemble evaluate`: the table of the ensemble against its members, validation then test.

Metrics are recomputed from the predictions file (never trusted from elsewhere), written to
the metrics Parquet, and printed in a 100-column table: every member, the mean member, the best
member (chosen on the validation split), each ensemble aggregator; then each ensemble's gain
over the mean and the best member on test, absolute and relative; the fitted aggregators'
parameters; diversity; and one sentence saying what the ensemble gained.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ensemble import artifacts, fitted, posthoc, run, runlock, search_report, tables
from ensemble.errors import UsageError
from ensemble.metrics import LOWER_IS_BETTER, METRICS

SPLIT_ORDER = ("validation", "test", "predict", "train")
NAME_WIDTH, COL = 35, 16  # 35 + 4 * 16 = 99 columns; a cell holds at most 15 characters


def number(value: float | None, digits: int = 4, signed: bool = False) -> str:
    """`value` rounded to `digits`, never `-0.0000` (a value that rounds to zero prints
    unsigned); `n/a` for None."""
    if value is None:
        return "n/a"
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return text.lstrip("+-") if float(text) == 0 else text


def _gain_cell(gain: float | None, reference: float | None, metric: str) -> str:
    """`+0.0123 (+5.1%)`: absolute gain and gain relative to the reference (positive =
    ensemble better); relative gains of 10% or more without decimals."""
    if gain is None or reference is None:
        return "n/a"
    if reference == 0:
        return number(gain, 4, True)
    rel = 100 * gain / abs(reference)
    return f"{number(gain, 4, True)} ({number(rel, 0 if abs(rel) >= 9.95 else 1, True)}%)"


def _line(name: str, cells: list[str]) -> str:
    return f"{name:<{NAME_WIDTH}}" + "".join(f"{c:>{COL}}" for c in cells)


def _references(rows: list[dict]) -> tuple[dict, dict | None, list[dict]]:
    members = [r for r in rows if r["member"] is not None]
    mean = {m: sum(r[m] for r in members) / len(members) for m in METRICS} if members else {}
    best_idx = next((r["best_member"] for r in rows if r.get("best_member") is not None), None)
    best = next((r for r in members if r["member"] == best_idx), None)
    return mean, best, members


def _split_block(split: str, rows: list[dict], references=None, columns=METRICS, fmt=None,
                 line=None) -> list[str]:
    """One split's rows of the table: every member, the mean and the best member, every
    aggregator. `references`, `columns`, `fmt` and `line` default to the classification
    table's (`pipelines.evaluate_regression` passes its own)."""
    fmt, line = fmt or number, line or _line
    mean, best, members = (references or _references)(rows)
    out = [f"{split} ({rows[0]['n']} rows)"]
    out += [line("  " + r["model"], [fmt(r[m]) for m in columns]) for r in members]
    if members:
        out.append(line("  mean member", [fmt(mean[m]) for m in columns]))
    if best is not None:
        out.append(line(f"  best member ({best['model']})", [fmt(best[m]) for m in columns]))
    out += [line("  " + r["model"], [fmt(r[m]) for m in columns])
            for r in rows if r["aggregator"] is not None]
    return out


def _gain_block(split: str, rows: list[dict]) -> list[str]:
    mean, best, members = _references(rows)
    ensembles = [r for r in rows if r["aggregator"] is not None]
    if not members or not ensembles:
        return []
    out = [f"ensemble gain on {split} (positive = ensemble better; relative to the reference)"]
    for r in ensembles:
        out.append(_line(f"{r['model']} vs mean member",
                         [_gain_cell(r[f"gain_vs_mean_{m}"], mean[m], m) for m in METRICS]))
        if best is not None:
            out.append(_line(f"{r['model']} vs best member",
                             [_gain_cell(r[f"gain_vs_best_{m}"], best[m], m) for m in METRICS]))
    e = ensembles[0]
    if e.get("disagreement") is not None:
        mi = [f"{r['model']} {number(r['mean_mutual_information'])}" for r in ensembles
              if r.get("mean_mutual_information") is not None][:1]
        out.append(f"diversity on {split}: disagreement {number(e['disagreement'])}, mean "
                   f"pairwise KL {number(e['mean_pairwise_kl'])} nats"
                   + (f",\n  mean mutual information ({mi[0]} nats)" if mi else ""))
    return out


def verdict(metrics: pa.Table, split: str = "test") -> str:
    """One sentence on what the ensemble gained on `split`: the ensemble with the lowest
    validation NLL (the mean when there is no validation split), its NLL change against the
    mean member and the best member (chosen on validation), and its accuracy change."""
    rows = [r for r in metrics.to_pylist() if r["split"] == split]
    mean, best, members = _references(rows)
    cands = [r for r in rows if r["aggregator"] is not None and r["nll"] is not None]
    if not cands or not members:
        return ""
    val = {r["model"]: r["nll"] for r in metrics.to_pylist()
           if r["split"] == "validation" and r["aggregator"] is not None and r["nll"] is not None}
    ens = min(cands, key=lambda r: val.get(r["model"], 0.0 if r["aggregator"] == "mean" else 1.0))

    def change(ref: float) -> str:
        rel = (ref - ens["nll"]) / ref if ref else 0.0
        word = "lowers" if rel >= 0 else "raises"
        return word, f"{abs(100 * rel):.0f}%"

    w1, c1 = change(mean["nll"])
    text = (f"The {len(members)}-member ensemble ({ens['model']}"
            + (", chosen on validation" if val else "") + f") {w1} {split} NLL by {c1} "
            "against the mean member")
    ref = best or mean
    if best is not None:
        w2, c2 = change(best["nll"])
        text += (f" and {'' if w2 == w1 else w2 + ' it '}by {c2} against the best member "
                 f"({best['model']}, chosen on validation)")
    points = 100 * (ens["accuracy"] - ref["accuracy"])
    return text + f"; accuracy {number(points, 1, True)} points against the " \
        f"{'best' if best is not None else 'mean'} member."


def _fitted_lines(fit: dict | None) -> list[str]:
    """The fitted aggregators' parameters, one line each."""
    if not fit or not fit.get("params"):
        return []
    names = [f"member-{i}" for i in fit["members"]]
    out = [f"fitted on the validation split ({fit['n_rows']} rows):"]
    for name, p in fit["params"].items():
        if name in ("weighted", "greedy"):
            ws = ", ".join(f"{n} {w:.2f}" for n, w in zip(names, p["weights"]) if w > 0)
            extra = (f" ({p['size']} of {len(p['order'])} rounds kept)" if name == "greedy"
                     else f" ({p.get('source', 'fitted')})")
            out.append(f"  {name}: weights {ws}{extra}")
        elif name == "stacking":
            out.append(f"  stacking: logistic regression, C = {p['C']:.3g} "
                       f"({p['folds']}-fold cross-validation)")
        elif name == "temperature":
            out.append(f"  temperature: T = {p['temperature']:.3f}")
    return out


def format_table(metrics: pa.Table, fit: dict | None = None, extra=()) -> str:
    """Render the evaluation table: splits in the order validation, test, others; `extra`
    lines (accuracy against confidence) go before the closing sentence.

    Raises:
        UsageError: the metrics hold no row.
    """
    if "rmse" in metrics.column_names:  # a regression run
        from pipelines import evaluate_regression

        return evaluate_regression.format_table(metrics, fit, extra)
    rows = metrics.to_pylist()
    if not rows:
        raise UsageError("No labelled rows; cannot evaluate.")
    splits = sorted({r["split"] for r in rows}, key=SPLIT_ORDER.index)
    better = ["higher" if m not in LOWER_IS_BETTER else "lower" for m in METRICS]
    lines = [_line("model", list(METRICS)), _line("(better)", better)]
    for s in splits:
        lines += _split_block(s, [r for r in rows if r["split"] == s])
    last = "test" if "test" in splits else splits[-1]
    lines += _gain_block(last, [r for r in rows if r["split"] == last])
    lines += _fitted_lines(fit)
    if any(r["aggregator"] == "vote" for r in rows):
        lines.append("ensemble-vote: vote shares are not probabilities, so NLL, Brier and ECE "
                     "are n/a")
    lines += list(extra)
    sentence = textwrap.fill(verdict(metrics, last), NAME_WIDTH + 4 * COL)
    return "\n".join(lines + ([sentence] if sentence else []))


def evaluate(run_dir: Path | None, predictions: Path | None = None,
             plots: bool = False) -> tuple[pa.Table, str]:
    """Recompute the metrics of a run's (or a predictions file's) predictions and write them.

    Writes `metrics.parquet` in the run (for the run's own predictions) or
    `<predictions stem>.metrics.parquet` beside a given predictions file; files it writes in
    the run get their new sha256 in the manifest. Holds the run lock (`runlock`) meanwhile. The best member is
    the run's (chosen on validation, `aggregators.json`) when the run is known.

    Args:
        plots: also write PNGs (`ensemble.plots`) beside the metrics.

    Returns:
        (metrics table, the printed text).

    Raises:
        UsageError: no run/predictions, a predictions file without labels, a damaged or
            unhashed artifact, an unwritable output, or a run another process holds.
    """
    if run_dir is not None:
        with runlock.writing(run_dir, "ensemble evaluate"):
            return _evaluate(Path(run_dir), predictions, plots)
    return _evaluate(None, predictions, plots)


def _evaluate(run_dir: Path | None, predictions: Path | None, plots: bool
              ) -> tuple[pa.Table, str]:
    manifest = artifacts.read_manifest(run_dir) if run_dir is not None else None
    fit = None
    if manifest is not None and (run_dir / fitted.FILENAME).is_file():
        fit = fitted.read(artifacts.verify(run_dir, manifest, run_dir / fitted.FILENAME).parent)
    if predictions is None:
        if run_dir is None:
            raise UsageError("Expected --run PATH or --predictions FILE.parquet.")
        run.require_completed(run_dir, manifest)
        predictions = artifacts.verify(run_dir, manifest, run_dir / artifacts.PREDICTIONS)
        out = run_dir / artifacts.METRICS
    else:
        if not predictions.is_file():
            raise UsageError(f"Expected --predictions to be a Parquet file. Received: "
                             f"{predictions} ({'a folder' if predictions.is_dir() else 'missing'})")
        out = predictions.with_name(predictions.stem + ".metrics.parquet")
    if predictions.suffix != ".parquet":
        raise UsageError(f"Expected --predictions to be a .parquet file of `ensemble predict "
                         f"--layout long`. Received: {predictions}")
    preds = artifacts.read_parquet(predictions)
    meta = preds.schema.metadata or {}
    if not {"model", "split", "y_true"} <= set(preds.column_names) or b"classes" not in meta:
        raise UsageError(f"{predictions} is not a predictions file in the long layout "
                         "(expected the columns model, split, y_true, p_<class>: write it "
                         "with `ensemble predict --layout long`).")
    table = tables.metrics_table(preds, (fit or {}).get("best_member"))
    if table.num_rows == 0:
        raise UsageError(f"{predictions} has no rows with a known y_true; cannot evaluate.")
    if out.exists() and not os.access(out, os.W_OK) or not os.access(out.parent, os.W_OK):
        raise UsageError(f"Cannot write the metrics to {out}: permission denied.")
    artifacts.write_parquet(out, table)
    written = [out]
    from pipelines import confidence

    text = format_table(table, fit, confidence.block(preds))
    if run_dir is not None and predictions == Path(run_dir) / artifacts.PREDICTIONS:

        text = "\n".join([text, *comparison_lines(run_dir)])
    if plots:
        from pipelines import plots as P

        if manifest is not None and (run_dir / posthoc.SIZE_CURVE).is_file():
            artifacts.verify(run_dir, manifest, run_dir / posthoc.SIZE_CURVE)
        text += "\n" + P.write_plots(out.parent, preds, table, run_dir)
        from pipelines import plots_ood

        labelled = preds.filter(pc.is_valid(preds.column("y_true")))
        text += f"\nplot: {plots_ood.confidence_plot(out.parent, *confidence.curves(labelled))}"
        written += [p for p in out.parent.glob("*.png")
                    if p.name in ("reliability.png", "ensemble_size.png", "members.png",
                                  "confidence.png")]
    inside = [p for p in written if run_dir is not None
              and Path(os.path.abspath(p)).is_relative_to(os.path.abspath(run_dir))]
    if inside:  # a hashed artifact is never rewritten without its new hash
        runlock.update_manifest(run_dir, lambda m: artifacts.record_hashes(m, run_dir, inside))
    return table, text


def comparison_lines(run_dir: str | Path) -> list[str]:
    """`comparison` as lines of the `ensemble evaluate` table ([] when not a search)."""
    rows = search_report.comparison(run_dir)
    if not rows:
        return []
    info = artifacts.read_manifest(run_dir)["search"]
    strat = (f", stratified: {info['stratify']} seeds per selected configuration"
             if info.get("stratify") else "")
    out = [f"hyperparameter search: {info['candidates']} candidates, greedy selection of at "
           f"most {info['select']} on validation NLL{strat}"]
    for split in dict.fromkeys(r["split"] for r in rows):
        out.append(f"{split}")
        out += [_line("  " + r["model"], [number(r[m]) for m in METRICS])
                for r in rows if r["split"] == split]
    return out
