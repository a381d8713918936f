"""The `ensemble evaluate` table of a classification run: every member, the mean member, the best
member (chosen on the validation split), each ensemble aggregator, per split; then each
ensemble's gain over the mean and the best member on test, absolute and relative; the fitted
aggregators' parameters; diversity; and one sentence saying what the ensemble gained.
"""
from __future__ import annotations

import math
import textwrap

import pyarrow as pa

from ensemble.tasks.choice import choice_scores, default_aggregator
from ensemble.tasks.classification.aggregators import REGISTRY
from ensemble.tasks.classification.metrics import LOWER_IS_BETTER, METRICS
from ensemble.tasks.classification.running import RANK_METRICS
from ensemble.tasks.table_parts import PRIOR
from ensemble.tasks.report import (fitted_lines, kept_members, members_and_best, number,
                                   rows_and_splits, split_block)

NAME_WIDTH, COL = 35, 16  # 35 + 4 * 16 = 99 columns; a cell holds at most 15 characters
# (a gain of 1,000% or more, `-0.0500 (-2133%)`, holds 16: `_line` still keeps a space before it)


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
    """`name` and the cells right-aligned in columns of `COL`, at least one space before each
    cell (a wider cell pushes the rest of its line right rather than touching its neighbour)."""
    return f"{name:<{NAME_WIDTH}}" + "".join(f" {c:>{COL - 1}}" for c in cells)


def _references(rows: list[dict]) -> tuple[dict, dict | None, list[dict]]:
    members, best = members_and_best(rows)
    mean = {m: sum(r[m] for r in members) / len(members) for m in METRICS} if members else {}
    return mean, best, members


def _split_block(split: str, rows: list[dict]) -> list[str]:
    return split_block(split, rows, _references, METRICS, number, _line)


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


def _rank_block(split: str, rows: list[dict]) -> list[str]:
    """The ranking and class-balance metrics of `split`'s models (ROC AUC one-vs-rest macro,
    average precision, balanced accuracy), and the per-class recall of the answering
    ensemble's first row; nothing when the table has no such column."""
    if not rows or "roc_auc" not in rows[0]:
        return []
    shown = [r for r in rows if r["member"] is not None or r["aggregator"] is not None
             or r["model"] == PRIOR]
    out = [f"ranking and class balance on {split}",
           _line("model", ["roc_auc", "avg_precision", "balanced_acc"])]
    out += [_line("  " + r["model"], [number(r[m]) for m in RANK_METRICS]) for r in shown]
    ens = next((r for r in rows if r["aggregator"] is not None), None)
    if ens is not None:
        recall = [(k[len("recall_"):], v) for k, v in ens.items()
                  if k.startswith("recall_") and v is not None]
        pairs = ", ".join(f"{c}\x00{number(v, 3)}" for c, v in recall)  # \x00: no break
        out.append(textwrap.fill(f"recall per class ({ens['model']}): {pairs}",
                                 NAME_WIDTH + 4 * COL).replace("\x00", " "))
    return out


def verdict(metrics: pa.Table, split: str = "test", fit: dict | None = None) -> str:
    """One sentence on what the ensemble gained on `split`: the ensemble with the lowest
    validation NLL (`choice.default_aggregator`, as predict chooses: on the run's
    `aggregators.json` `fit` when given, out of fold, else on the table's validation rows;
    the first aggregator when neither has one), its NLL change against the
    mean member and the best member (chosen on validation), and its accuracy change. `fit`
    also gives how many members a fitted selection kept."""
    rows = [r for r in metrics.to_pylist() if r["split"] == split]
    mean, best, members = _references(rows)
    cands = [r for r in rows if r["aggregator"] is not None and r["nll"] is not None]
    if not cands or not members:
        return ""
    names = [r["aggregator"] for r in cands]
    val = {a: v for a, v in choice_scores(fit).items()
           if a in names and isinstance(v, (int, float)) and math.isfinite(v)} or {
        r["aggregator"]: r["nll"] for r in metrics.to_pylist()
        if r["split"] == "validation" and r["aggregator"] in names and r["nll"] is not None}
    ens = cands[names.index(default_aggregator(names, {"validation_nll": val}))]

    def change(ref: float) -> str:
        rel = (ref - ens["nll"]) / ref if ref else 0.0
        word = "lowers" if rel >= 0 else "raises"
        return word, f"{abs(100 * rel):.0f}%"

    w1, c1 = change(mean["nll"])
    kept = kept_members(fit, ens["aggregator"], len(members))
    text = ((f"The {len(members)}-member ensemble" if kept == len(members)
             else f"The ensemble of {kept} of the {len(members)} members")
            + f" ({ens['model']}"
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


def _describe(name: str, p: dict) -> str | None:
    """The text of a fitted aggregator's parameters (`report.fitted_lines`), its decision
    threshold (`ensemble.tasks.classification.threshold`) after them."""
    text = None
    if name == "greedy":
        text = f" ({p['size']} of {len(p['order'])} rounds kept)"
    elif name == "weighted":
        text = f" ({p.get('source', 'fitted')})"
    elif name == "stacking":
        text = f"logistic regression, C = {p['C']:.3g} ({p['folds']}-fold cross-validation)"
    elif name == "temperature":
        text = f"T = {p['temperature']:.3f}"
    if p.get("threshold") is None:
        return text
    how = (f"the best {p['threshold_metric']} on these rows" if p.get("threshold_metric")
           else "the config's")
    rule = f"y_pred = positive where p >= {p['threshold']:.4g} ({how})"
    return rule if text is None else f"{text}; {rule}"


def format_table(metrics: pa.Table, fit: dict | None = None, extra=()) -> str:
    """Render the evaluation table: splits in the order validation, test, others; `extra`
    lines (accuracy against confidence) go before the closing sentence.

    Raises:
        UsageError: the metrics hold no row.
    """
    rows, splits, last = rows_and_splits(metrics)
    better = ["higher" if m not in LOWER_IS_BETTER else "lower" for m in METRICS]
    lines = [_line("model", list(METRICS)), _line("(better)", better)]
    for s in splits:
        lines += _split_block(s, [r for r in rows if r["split"] == s])
    lines += _gain_block(last, [r for r in rows if r["split"] == last])
    lines += _rank_block(last, [r for r in rows if r["split"] == last])
    lines += fitted_lines(fit, _describe)
    for name in dict.fromkeys(r["aggregator"] for r in rows if r["aggregator"] in REGISTRY
                              and not REGISTRY[r["aggregator"]].probabilities):
        lines.append(f"ensemble-{name}: vote shares are not probabilities, so NLL, Brier and "
                     "ECE are n/a")
    lines += list(extra)
    sentence = textwrap.fill(verdict(metrics, last, fit), NAME_WIDTH + 4 * COL)
    return "\n".join(lines + ([sentence] if sentence else []))
