"""The `ensemble evaluate` table of a regression run: members, the mean and best member, each
ensemble aggregator, per split; then the ensemble's gains on test, the fitted aggregators'
parameters and one sentence on what the ensemble gained (`Regression.format_table`)."""

from __future__ import annotations

import textwrap

import pyarrow as pa

from ensemble.tasks.regression.metrics import LOWER_IS_BETTER
from ensemble.tasks.report import fitted_lines, members_and_best, rows_and_splits, split_block

COLUMNS = ("rmse", "mae", "nll", "mixture_nll", "crps", "coverage_90", "coverage_95",
           "calibration_error", "r2")
HEADERS = ("rmse", "mae", "nll", "mix_nll", "crps", "cov_90", "cov_95", "cal_err", "r2")
NAME_WIDTH, COL = 27, 8  # 27 + 9 * 8 = 99 columns
GAIN_COLUMNS = ("rmse", "nll", "crps")


def cell(value: float | None) -> str:
    """`value` in at most 7 characters (4 significant digits; a whole number of up to 7
    characters, such as an RMSE of prices, `556234`, rounded to the unit rather than to 2
    significant digits); `n/a` for None."""
    if value is None:
        return "n/a"
    whole = (".0f",) if abs(value) >= 1e4 else ()  # where .4g turns to an exponent
    for fmt in (*whole, ".4g", ".3g", ".2g"):
        text = f"{value:{fmt}}"
        if len(text) < COL:
            return text
    return f"{value:.0e}"


def _line(name: str, cells) -> str:
    return f"{name:<{NAME_WIDTH}}" + "".join(f"{c:>{COL}}" for c in cells)


def _mean(members: list[dict], m: str) -> float | None:
    values = [r[m] for r in members]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def _references(rows: list[dict]):
    members, best = members_and_best(rows)
    return {m: _mean(members, m) for m in COLUMNS}, best, members


def _block(split: str, rows: list[dict]) -> list[str]:
    return split_block(split, rows, _references, COLUMNS, cell, _line)


def _gains(split: str, rows: list[dict]) -> list[str]:
    _, best, members = _references(rows)
    ens = [r for r in rows if r["aggregator"] is not None]
    if not members or not ens:
        return []
    lines = [(f"  {r['aggregator']} vs {ref} member",
              [cell(r[f"gain_vs_{ref}_{m}"]) for m in GAIN_COLUMNS])
             for r in ens for ref in ("mean", "best") if ref == "mean" or best is not None]
    width = max(NAME_WIDTH, *(len(name) + 1 for name, _ in lines))  # long aggregator names
    out = [f"ensemble gain on {split} (positive = ensemble better)",
           f"{'':<{width}}" + "".join(f"{c:>{COL}}" for c in GAIN_COLUMNS)]
    out += [f"{name:<{width}}" + "".join(f"{c:>{COL}}" for c in cells) for name, cells in lines]
    e = ens[0]
    if e.get("disagreement") is not None:
        out.append(f"diversity on {split}: std of the member means {cell(e['disagreement'])}, "
                   f"mean epistemic std {cell(e['mean_epistemic_std'])} (target units)")
    return out


def _describe(name: str, p: dict) -> str | None:
    """The text of a fitted aggregator's parameters (`report.fitted_lines`)."""
    return f"s = {p['scale']:.3f} (predictive std x s)" if name == "std-scaling" else None


def verdict(rows: list[dict], split: str, validation_nll: dict | None = None) -> str:
    """One sentence: the NLL and RMSE of the ensemble that `predict` answers with (the lowest
    `validation_nll` `{aggregator: NLL}`, `ensemble.tasks.choice`; else the first) against the
    mean member on `split`."""
    from ensemble.tasks.choice import default_aggregator

    mean, _, members = _references(rows)
    ens = [r for r in rows if r["aggregator"] is not None]
    if not ens or not members:
        return ""
    names = [r["aggregator"] for r in ens]
    chosen = default_aggregator(names, {"validation_nll": validation_nll or {}})
    e = ens[names.index(chosen)]
    text = (f"The {len(members)}-member ensemble ({e['model']}"
            + (", chosen on validation" if len(ens) > 1 and validation_nll else "")
            + f") has {split} RMSE {cell(e['rmse'])}")
    if mean["rmse"]:
        text += f" against {cell(mean['rmse'])} for the mean member"
    if e["nll"] is None or mean["nll"] is None:  # point members (`loss = "mse"`): no NLL
        return text + " (target units)."
    text += f", and NLL {cell(e['nll'])} against {cell(mean['nll'])}"
    return text + " (NLL in nats per row, target units)."


def format_table(metrics: pa.Table, fit: dict | None = None, extra=()) -> str:
    """Render the regression evaluation table (splits: validation, test, others); `extra`
    lines go before the closing sentence.

    Raises:
        UsageError: the metrics hold no row.
    """
    rows, splits, last = rows_and_splits(metrics)
    better = ["lower" if m in LOWER_IS_BETTER else "higher" if m == "r2" else "~nom"
              for m in COLUMNS]
    lines = [_line("model", HEADERS), _line("(better)", better)]
    for s in splits:
        lines += _block(s, [r for r in rows if r["split"] == s])
    lines += _gains(last, [r for r in rows if r["split"] == last])
    lines += fitted_lines(fit, _describe)
    lines += ["cov_90/cov_95: share of rows inside the central 90%/95% interval (nominal "
              "0.90/0.95);", "cal_err: mean |p - observed| over quantile levels 0.05..0.95"]
    lines += list(extra)
    from ensemble.tasks.choice import choice_scores

    # the run's choice (`aggregators.json`, out of fold: what predict answers with), else the
    # table's own
    val = choice_scores(fit) or {
        r["aggregator"]: r["nll"] for r in rows
        if r["split"] == "validation" and r["aggregator"] is not None}
    sentence = textwrap.fill(verdict([r for r in rows if r["split"] == last], last, val),
                             NAME_WIDTH + len(COLUMNS) * COL)
    return "\n".join(lines + ([sentence] if sentence else []))
