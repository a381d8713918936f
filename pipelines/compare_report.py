"""The summary and the printed verdict of `ensemble compare`: median, min and max per mode
and phase over the repeats (`summarise`), and the text (`verdict`): the table, the faster mode
per phase or that the spread does not tell, the training cost model (`compare_cost`) and the
parity of the two modes' members."""

from __future__ import annotations

import statistics

import pyarrow as pa

from pipelines import compare_cost

PHASES = ("train", "predict")
MEASURES = ("wall_seconds", "startup_seconds", "work_seconds", "member_rows_per_second",
            "peak_rss_bytes")
DIGITS = {"wall_seconds": 2, "startup_seconds": 2, "work_seconds": 2,
          "member_rows_per_second": 0, "peak_rss_bytes": 0}
PARITY_BOUND = 1e-5  # what docs/concepts/parity.md promises for members of the two modes


def summarise(runs: list[dict], parities: dict[str, tuple[float, float]],
              setting: str = "on") -> list[dict]:
    """One row per mode and phase: `<measure>_median`, `_min`, `_max` over the repeats of
    every measure (train: also the fixed and per-epoch cost, `compare_cost`; null where a phase
    has none), rounded to the digits the printed table shows (so the file holds exactly the
    printed figures), plus parity and the task's test metrics (`test_<metric>`, last repeat).

    Args:
        parities: `{phase: (max abs difference, share of identical labels)}` (`parity`):
            train compares the members' test probabilities, predict the prediction files.
        setting: `parity_setting` of the run config (`parity_setting` column).
    """
    rows = []
    for mode in dict.fromkeys(r["mode"] for r in runs):  # as they first ran
        for phase in PHASES:
            mine = [r for r in runs if r["mode"] == mode and r["phase"] == phase]
            row = {"mode": mode, "phase": phase, "repeats": len(mine)}
            for key, digits in (*DIGITS.items(), *compare_cost.COST_DIGITS.items()):
                values = [r[key] for r in mine if r.get(key) is not None]
                for stat, f in (("median", statistics.median), ("min", min), ("max", max)):
                    row[f"{key}_{stat}"] = round(float(f(values)), digits) if values else None
            for key in ("epochs", "train_rows"):
                row[key] = next((r[key] for r in mine[::-1] if r.get(key) is not None), None)
            for key in dict.fromkeys(k for r in runs for k in r if k.startswith("test_")):
                last = [r[key] for r in mine if r.get(key) is not None]
                row[key] = round(float(last[-1]), 4) if last else None
            diff, same = parities[phase]
            row["parity_max_abs_diff"] = float(f"{diff:.2e}")
            row["parity_same_labels"] = round(same, 4)
            row["parity_setting"] = setting
            rows.append(row)
    return rows


LEGEND = """\
wall s: whole process, spawn to exit; start-up s: critical path before the first step (process
start, TensorFlow import, data preparation, and between-graph the first client's start-up; not
a sum over parallel clients); rows/s: rows x members (x epochs) per wall second; peak MiB:
driver + concurrent clients. Figures: median [min-max] over the repeats."""


def _spread(r: dict, key: str, fmt: str) -> str:
    if r.get("repeats", 2) == 1:  # one sample: no median, no range
        return f"{r[key + '_median']:{fmt}}"
    return (f"{r[key + '_median']:{fmt}} [{r[key + '_min']:{fmt}}-{r[key + '_max']:{fmt}}]")


def _terms(rows: list[dict]) -> tuple[str, str, str]:
    """(what parity compares, its difference's symbol, what "identical" counts): probabilities
    and labels for classification; for any other task (regression: means and variances, in
    the target's units) its predictions."""
    if "test_accuracy" in rows[0]:
        return "probabilities", "|dp|", "identical labels"
    return "predictions", "|d|", "equal predictions"


def _parity_line(rows: list[dict]) -> str:
    """Whether the two modes trained the same members: the setting and what was measured."""
    setting = rows[0].get("parity_setting", "on")
    found = rows[0]["parity_max_abs_diff"]  # train: the members' test predictions
    what, d, _ = _terms(rows)
    if setting != "on":
        return (f"parity {setting}: the members may differ between the modes (found max {d} "
                f"= {found:.2e}); the timings compare runs that computed other numbers")
    if found > PARITY_BOUND:
        return (f"parity on, but NOT met: members' test {what} differ by {found:.2e} "
                f"(> {PARITY_BOUND:g}; see docs/concepts/parity.md)")
    return (f"parity on: the members' test {what} agree within {found:.2e} "
            f"(<= {PARITY_BOUND:g}): both modes trained the same members")


def verdict(table: pa.Table) -> str:
    """The printed summary: one line per mode and phase (median [min-max]; the sample alone
    with one repeat), the column definitions, then per phase the faster mode, or "no clear
    winner" when the two modes' min-max ranges overlap, or, with one repeat, the two samples
    and that one sample gives no spread (no mode is called faster); what each mode's time
    went to; for training the cost model (`compare_cost.cost_lines`: fixed and per-epoch
    seconds, the crossover epoch count, whether the verdict rests on fixed costs); and a last
    line on parity (`parity_setting`, the members' measured difference
    against `PARITY_BOUND`)."""
    rows = table.to_pylist()
    shown = [k for k in rows[0] if k.startswith("test_")][-1:] or ["test_accuracy"]
    metric = shown[0].replace("test_", "test ")
    width = max(10, len(metric) + 1)
    lines = [f"{'mode':<15}{'phase':<9}{'wall s':>20}{'start-up s':>20}{'rows/s':>10}"
             f"{'peak MiB':>10}{metric:>{width}}"]
    for r in rows:
        acc = r.get(shown[0])
        lines.append(f"{r['mode']:<15}{r['phase']:<9}{_spread(r, 'wall_seconds', '.2f'):>20}"
                     f"{_spread(r, 'startup_seconds', '.2f'):>20}"
                     f"{r['member_rows_per_second_median']:>10.0f}"
                     f"{r['peak_rss_bytes_median'] / 2**20:>10.0f}"
                     f"{'' if acc is None or acc != acc else f'{acc:.4f}':>{width}}")
    n = rows[0].get("repeats", 1)
    lines.append(LEGEND if n > 1 else LEGEND.replace(
        "median [min-max] over the repeats", "one sample per mode and phase (--repeats 1)"))
    for phase in PHASES:
        mine = [r for r in rows if r["phase"] == phase]
        a, b = mine[:2]  # the first two modes (in-graph, between-graph) for the cost model
        fast, slow = sorted(mine, key=lambda r: r["wall_seconds_median"])[:2]
        if n == 1:
            head = (f"{phase}: one sample per mode ("
                    + ", ".join(f"{r['mode']} {r['wall_seconds_median']:.2f} s" for r in mine)
                    + "); one sample gives no "
                    "spread, so neither mode is called faster (--repeats 3 or more for a "
                    "verdict)")
        elif fast["wall_seconds_max"] >= slow["wall_seconds_min"]:
            head = (f"{phase}: no clear winner: the difference ({fast['wall_seconds_median']:.2f} "
                    f"s vs {slow['wall_seconds_median']:.2f} s median) is within the spread of "
                    f"{n} repeats")
        else:
            ratio = slow["wall_seconds_median"] / fast["wall_seconds_median"]
            head = f"{phase}: {fast['mode']} is {ratio:.2f}x faster" + (
                f" than {slow['mode']}" if len(mine) > 2 else "") + (
                f" over the {a['epochs']} epoch{'s' * (a['epochs'] != 1)} trained"
                if a.get("epochs") else "")
        went = "; ".join(
            f"{r['mode']} start-up {r['startup_seconds_median']:.2f} s, {phase} and the rest "
            f"{r['work_seconds_median']:.2f} s" for r in mine)
        _, d, same = _terms(rows)
        lines.append(f"{head}; parity max {d} = {a['parity_max_abs_diff']:.2e}, {same} "
                     f"{a['parity_same_labels']:.2%}. Time went to "
                     f"({'one sample' if n == 1 else 'medians'}): {went}")
        if phase == "train" and a.get("epochs"):
            lines += compare_cost.cost_lines(a, b, a["epochs"], a.get("train_rows") or 0,
                                             _spread)
    lines.append(_parity_line(rows))
    return "\n".join(lines)
