"""`ensemble compare`'s cost model: a training run's wall time as a fixed part plus a part per
epoch, `wall = fixed + epochs x per_epoch`, so that a verdict measured on a few epochs of a
sample can be carried to the user's epochs and rows.

- **per epoch** (marginal seconds): what one more epoch adds, from the run's `history.parquet`
  (`seconds` of each epoch: its traced steps and its validation prediction), epochs after the
  first (which also pays for tracing), median. In-graph: the epoch's seconds (one graph trains
  every member). Between-graph: per client, the sum over its queue of members of each member's
  epoch seconds; the slowest client (clients run at once: the critical path). With one epoch
  (`--epochs 1`) nothing past the first epoch is measured: the per-epoch cost, the split and
  the crossover are not computed (None, `n/a`; the text suggests `--epochs 2` or more).
- **fixed**: `wall - epochs x per_epoch`: process start-up, TensorFlow import, data
  preparation, tracing, the first epoch's warm-up, writing artifacts, (between-graph) client
  start-up and the aggregator.
- **per row**: `per_epoch / training rows`, in microseconds: what an epoch costs per row, the
  figure that carries from a sample to the full data (fixed costs do not grow with the epochs,
  and mostly not with the rows; preparation does, a little).
- **crossover**: the epoch count `e* = (fixed_b - fixed_a) / (per_a - per_b)` at which the two
  modes' lines `fixed + e x per_epoch` meet (`fixed_a + e* per_a = fixed_b + e* per_b`), and
  likewise the training rows at the configured epochs.
- **crossover band**: the range of `e*` the repeats' spreads allow, each mode's fixed and
  per-epoch seconds anywhere in their min-max ranges (interval arithmetic on the ratio);
  unbounded above when the per-epoch ranges overlap (the lines may be parallel). The chart
  shades it and draws the median crossover dashed and labelled when it is uncertain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ensemble.replication.modes import Mode


COST_MEASURES = ("fixed_seconds", "epoch_seconds", "row_epoch_us")
COST_DIGITS = {"fixed_seconds": 2, "epoch_seconds": 4, "row_epoch_us": 3}


def epoch_seconds(mode: Mode, history: Sequence[dict], timings: dict, n_train: int
                  ) -> tuple[float | None, int]:
    """The marginal seconds of one epoch of a training run and the epochs it trained.

    Args:
        mode: the run's mode object (`ensemble.replication.modes.Mode`; its `epoch_seconds`).
        history: the run's `history.parquet` rows (`member`, `epoch`, `seconds`).
        timings: the manifest's `timings` (`steady_rows`, `steady_seconds`; between-graph:
            `clients`, member index (str) -> `{"client": queue, "steady": {member: [rows,
            seconds]}}`).
        n_train: rows of the training split.

    Returns:
        (seconds per epoch, or None with one epoch (it also pays for tracing: no epoch past
        it was measured) or when a member has neither a second epoch nor a steady call;
        epochs trained: the most any member trained).
    """
    epochs = len({r["epoch"] for r in history})
    if epochs < 2:
        return None, epochs
    return mode.epoch_seconds(history, timings, n_train), epochs


def split_cost(wall: float, per_epoch: float | None, epochs: int, n_train: int) -> dict:
    """`{"fixed_seconds", "epoch_seconds", "row_epoch_us"}` of one training run (None when the
    per-epoch cost is unknown): `fixed = wall - epochs x per_epoch`."""
    if per_epoch is None:
        return dict.fromkeys(COST_MEASURES)
    return {"fixed_seconds": wall - epochs * per_epoch, "epoch_seconds": per_epoch,
            "row_epoch_us": per_epoch / max(n_train, 1) * 1e6}


def crossover(fixed_a: float, per_a: float, fixed_b: float, per_b: float) -> float | None:
    """The (real, > 0) epoch count `e*` with `fixed_a + e* per_a = fixed_b + e* per_b`, or None
    when the lines do not cross at a positive count (one mode is faster at every count)."""
    if per_a == per_b:
        return None
    e = (fixed_b - fixed_a) / (per_a - per_b)
    return e if e > 0 else None


def _positive_ratios(n_lo: float, n_hi: float, d_lo: float, d_hi: float
                     ) -> tuple[float, float] | None:
    """The range of the positive values of `n / d`, `n` in `[n_lo, n_hi]`, `d` in `[d_lo,
    d_hi]` with `d_lo >= 0` (`d` > 0): `(low, high)` (`high` inf when `d` can near 0), or None
    when no ratio is positive."""
    if n_hi <= 0 or d_hi <= 0:
        return None
    low = n_lo / d_hi if n_lo > 0 else 0.0
    return low, (n_hi / d_lo if d_lo > 0 else float("inf"))


def crossover_band(a: dict, b: dict) -> dict | None:
    """The crossover of two modes' train summary rows and how sure it is.

    Args:
        a, b: rows with `fixed_seconds_{median,min,max}`, `epoch_seconds_{median,min,max}`
            and `repeats`.

    Returns:
        None when a per-epoch cost is unknown; else `{"epochs": the medians' crossover or
        None, "low", "high": the range of crossovers the min-max spreads allow (None, None
        when they allow none; `high` inf when unbounded), "uncertain": one repeat or the two
        modes' fixed or per-epoch ranges overlap, "word": "indicative" (one repeat: no
        spread), "uncertain" or None}`.
    """
    if a.get("epoch_seconds_median") is None or b.get("epoch_seconds_median") is None:
        return None
    e = crossover(a["fixed_seconds_median"], a["epoch_seconds_median"],
                  b["fixed_seconds_median"], b["epoch_seconds_median"])
    f, p = "fixed_seconds", "epoch_seconds"
    # e* = n / d: n = fixed_b - fixed_a, d = per_a - per_b, each over its range
    n_lo, n_hi = b[f + "_min"] - a[f + "_max"], b[f + "_max"] - a[f + "_min"]
    d_lo, d_hi = a[p + "_min"] - b[p + "_max"], a[p + "_max"] - b[p + "_min"]
    parts = [_positive_ratios(n_lo, n_hi, max(d_lo, 0.0), d_hi),  # d > 0
             _positive_ratios(-n_hi, -n_lo, max(-d_hi, 0.0), -d_lo)]  # d < 0: -n / -d
    parts = [x for x in parts if x is not None]
    low, high = (min(x[0] for x in parts), max(x[1] for x in parts)) if parts else (None, None)
    alone = a.get("repeats", 1) <= 1 or b.get("repeats", 1) <= 1
    level = _overlap(a, b, p) or _overlap(a, b, f)
    return {"epochs": e, "low": low, "high": high, "uncertain": alone or level,
            "word": "indicative" if alone else "uncertain" if level else None}


def faster_at(epochs: float, a: dict, b: dict) -> dict:
    """The summary row (`fixed_seconds_median`, `epoch_seconds_median`) of the mode whose
    modelled time `fixed + epochs x per_epoch` is lower (`a` on a tie)."""
    cost = [r["fixed_seconds_median"] + epochs * r["epoch_seconds_median"] for r in (a, b)]
    return a if cost[0] <= cost[1] else b


def _overlap(a: dict, b: dict, key: str) -> bool:
    """Whether the min-max ranges of `key` over the repeats of two summary rows overlap."""
    return (a[f"{key}_min"] <= b[f"{key}_max"]) and (b[f"{key}_min"] <= a[f"{key}_max"])


def _us(v: float) -> str:
    return f"{v:,.1f} us" if v < 1e3 else f"{v / 1e3:,.2f} ms"


def cost_lines(a: dict, b: dict, epochs: int, n_train: int, spread) -> list[str]:
    """The printed cost model of the train phase: each mode's fixed and per-epoch seconds and
    per-row epoch cost (`spread(row, key, fmt)`: median [min-max]), the modelled verdict at the
    configured `epochs`, the epoch count at which the faster mode changes (if any), and, when
    the verdict rests on fixed costs (the faster mode has the higher per-epoch cost), that it
    does and from how many training rows the other mode is faster.

    Args:
        a, b: the two modes' train summary rows (`summarise`).
        n_train: training rows of the compared runs.
    """
    if a.get("epoch_seconds_median") is None or b.get("epoch_seconds_median") is None:
        why = ("with --epochs 1 (the one epoch also pays for tracing)" if epochs < 2 else
               "(a member trained no epoch past its first)")
        return [f"train cost per epoch: n/a, not measured {why}: no fixed and per-epoch "
                "split, no crossover; --epochs 2 or more measures it"]
    lines = ["train cost = fixed + epochs x per epoch (fixed: start-up, preparation, tracing, "
             "writing; per epoch: the marginal seconds of one more epoch):"]
    for r in (a, b):
        lines.append(f"  {r['mode']:<15}fixed {spread(r, 'fixed_seconds', '.2f')} s, per epoch "
                     f"{spread(r, 'epoch_seconds', '.4f')} s = "
                     f"{_us(r['row_epoch_us_median'])} per training row")
    model = {r["mode"]: r["fixed_seconds_median"] + epochs * r["epoch_seconds_median"]
             for r in (a, b)}
    win = faster_at(epochs, a, b)
    lose = b if win is a else a
    lines.append(f"at {epochs} epochs (as trained): {win['mode']} {model[win['mode']]:.2f} s "
                 f"against {lose['mode']} {model[lose['mode']]:.2f} s (medians, modelled)")
    lines += _crossover_lines(a, b, win)
    if win["epoch_seconds_median"] > lose["epoch_seconds_median"]:
        rows = crossover(win["fixed_seconds_median"], epochs * win["row_epoch_us_median"] / 1e6,
                         lose["fixed_seconds_median"], epochs * lose["row_epoch_us_median"] / 1e6)
        lines.append(
            f"the verdict rests on fixed costs: per epoch {lose['mode']} is faster "
            f"({_us(lose['row_epoch_us_median'])} against {_us(win['row_epoch_us_median'])} per "
            f"training row), so with more epochs or more rows it wins"
            + (f" (at {epochs} epochs: from about {rows:,.0f} training rows; these runs had "
               f"{n_train:,})" if rows else "")
            + ". Measured on a sample? The per-row cost carries to the full data, the verdict "
              "does not.")
    return lines


def _crossover_lines(a: dict, b: dict, win: dict) -> list[str]:
    """The lines of `cost_lines` on the epoch count at which the faster mode changes: the
    medians' crossover (or none), whether the per-epoch costs are level within the spread,
    and the range of counts the spreads allow (`crossover_band`). `win`: the faster of the
    two train summary rows `a`, `b` at the epochs trained."""
    lines: list[str] = []
    e = crossover(a["fixed_seconds_median"], a["epoch_seconds_median"],
                  b["fixed_seconds_median"], b["epoch_seconds_median"])
    alone = "" if a.get("repeats", 1) > 1 else " (one sample of each: indicative, no verdict)"
    level = a.get("repeats", 1) > 1 and _overlap(a, b, "epoch_seconds")
    if e is None:
        lines.append(f"the faster mode does not change with the epoch count: {win['mode']} "
                     f"at every count{alone}" + " (with the medians)" * level)
    else:
        early, late = faster_at(e / 2, a, b), faster_at(e * 2, a, b)
        lines.append(f"the faster mode changes at {e:.1f} epochs: {early['mode']} below, "
                     f"{late['mode']} from {int(e) + 1} epochs on{alone}")
    if level:
        lines.append(f"per epoch the two modes are level within the spread of "
                     f"{a['repeats']} repeats: " + ("where the faster mode changes is uncertain"
                                                    if e is not None else "it may change"))
    band = crossover_band(a, b)
    if a.get("repeats", 1) > 1 and band["low"] is not None:
        where = (f"from {band['low']:.1f} epochs on" if band["high"] == float("inf")
                 else f"between {band['low']:.1f} and {band['high']:.1f} epochs")
        lines.append(f"the spreads (min-max) of {a['repeats']} repeats "
                     f"{'allow a' if e is None else 'put the'} crossover {where}"
                     + (" (uncertain)" if band["uncertain"] else ""))
    return lines
