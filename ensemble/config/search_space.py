"""Hyperparameter search spaces: the `[search]` table, checked up front, sampled into members.

A hyperparameter ensemble (Wenzel et al. 2020, "Hyperparameter Ensembles for Robustness and
Uncertainty Quantification") samples N candidate members from a space, trains them as one
run and keeps the greedy selection (Caruana et al. 2004) of at most K of them. This module is
the space: pure Python and numpy, no TensorFlow, so a bad space fails before TensorFlow loads.

    [search]
    seed = 0
    hidden = [[64], [128], [256, 128]]                       # choices
    activation = ["relu", "gelu"]
    dropout = { low = 0.0, high = 0.3 }                      # uniform float range
    learning_rate = { low = 3e-4, high = 1e-2, log = true }  # log-uniform range
    l2 = [0.0, 1e-5, 1e-4]
    [search.params]                                          # the builder's own parameters
    width = [16, 32, 64]                                     # choices (any values)
    blocks = { low = 1, high = 3, integer = true }           # integer range

Keys: `hidden` takes choices (each a list of layer widths, or one width) or an integer range
`{ low, high, integer = true }` (one hidden layer of that width; `log = true` allowed);
`activation` takes choices; `dropout`, `learning_rate` and `l2` take choices or float ranges
`{ low, high }` (`log = true`: log-uniform, both bounds positive). Keys left out keep the
config's value. `[search.params]` samples keyword arguments of the config's builder
(`[model] builder`): each name takes choices of any value, or a range (`{ low, high }`, with
`integer = true` for whole numbers, `log = true` allowed); the builder checks the values when
the members are built. Candidate `i` is drawn from `numpy.random.default_rng([seed, i])` alone, so
the first N candidates are the same whatever N is.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from ensemble.models.builtin import ACTIVATIONS
from ensemble.core.errors import UsageError

KEYS = ("hidden", "activation", "dropout", "learning_rate", "l2")
RANGE_KEYS = ("low", "high", "log", "integer")
STRATIFY_SEED_OFFSET = 1  # the stratified run's seed: training.seed + 1 (new member seeds)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_value(key: str, value: Any) -> Any:
    """One value of `key` checked and normalised (hidden -> list of widths).

    Raises:
        UsageError: a value `key` cannot take; names `search.<key>`.
    """
    name = f"search.{key}"
    if key == "hidden":
        widths = [value] if isinstance(value, int) and not isinstance(value, bool) else value
        if (not isinstance(widths, list) or not widths
                or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0
                           for w in widths)):
            raise UsageError(f"Expected `{name}` choices to be lists of positive layer widths "
                             f"(or one width). Received: {value!r}")
        return list(widths)
    if key == "activation":
        if value not in ACTIVATIONS:
            raise UsageError(f"Expected `{name}` choices from {', '.join(ACTIVATIONS)}. "
                             f"Received: {value!r}")
        return value
    if not _number(value):
        raise UsageError(f"Expected `{name}` values to be numbers. Received: {value!r}")
    value = float(value)
    if key == "dropout" and not 0.0 <= value < 1.0:
        raise UsageError(f"Expected `{name}` values in [0, 1). Received: {value!r}")
    if key == "learning_rate" and not value > 0:
        raise UsageError(f"Expected `{name}` values to be positive. Received: {value!r}")
    if key == "l2" and value < 0:
        raise UsageError(f"Expected `{name}` values to be >= 0. Received: {value!r}")
    return value


def _check_dim(key: str, spec: Any) -> dict[str, Any]:
    """One key's space as `{"choices": [...]}` or `{"low", "high", "log", "integer"}`."""
    name = f"search.{key}"
    if isinstance(spec, list):
        if not spec:
            raise UsageError(f"Expected `{name}` to list at least one choice. Received: []")
        return {"choices": [_check_value(key, v) for v in spec]}
    if not isinstance(spec, dict):
        raise UsageError(f"Expected `{name}` to be a list of choices or a range table "
                         f"{{ low, high }}. Received: {spec!r}")
    unknown = sorted(set(spec) - set(RANGE_KEYS))
    if unknown:
        raise UsageError(f"Unknown key `{name}.{unknown[0]}`; a range has "
                         f"{', '.join(RANGE_KEYS)}.")
    if key == "activation":
        raise UsageError(f"Expected `{name}` to be a list of choices (an activation has no "
                         f"range). Received: {spec!r}")
    low, high = spec.get("low"), spec.get("high")
    log, integer = spec.get("log", False), spec.get("integer", False)
    if not (_number(low) and _number(high)):
        raise UsageError(f"Expected `{name}` to have numbers `low` and `high`. "
                         f"Received: {spec!r}")
    if not isinstance(log, bool) or not isinstance(integer, bool):
        raise UsageError(f"Expected `{name}.log` and `{name}.integer` to be true or false. "
                         f"Received: {spec!r}")
    if (key == "hidden") != integer:
        what = ("an integer range (integer = true): the width of one hidden layer"
                if key == "hidden" else "a float range (no integer = true)")
        raise UsageError(f"Expected `{name}` to be {what}. Received: {spec!r}")
    if integer and not (isinstance(low, int) and isinstance(high, int)):
        raise UsageError(f"Expected `{name}` integer bounds. Received: low={low!r}, "
                         f"high={high!r}")
    if low > high:
        raise UsageError(f"Expected `{name}` to have low <= high. Received: low={low!r}, "
                         f"high={high!r}")
    if log and not (low > 0 and high > 0):
        raise UsageError(f"Expected `{name}` (log = true) to have positive bounds. "
                         f"Received: low={low!r}, high={high!r}")
    _check_value(key, low)
    _check_value(key, high)
    return {"low": low, "high": high, "log": log, "integer": integer}


def parse_space(table: Any) -> tuple[int, dict[str, dict[str, Any]]]:
    """Check a `[search]` table.

    Returns:
        (search seed, `{key: {"choices": [...]}` or `{"low", "high", "log", "integer"}}`) in
        the order of `KEYS`.

    Raises:
        UsageError: not a table, no key to search, an unknown key (with a did-you-mean),
        empty choices, low > high, a log range with a non-positive bound, or a value the key
        cannot take; the one-line message names the key.
    """
    if not isinstance(table, dict):
        raise UsageError(f"Expected `search` to be a table. Received: {table!r}")
    unknown = sorted(set(table) - {"seed", "params", *KEYS})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ["seed", *KEYS], n=1)
        hint = f" (did you mean `search.{close[0]}`?)" if close else ""
        raise UsageError(f"Unknown search key `search.{unknown[0]}`{hint}; expected some of: "
                         f"seed, {', '.join(KEYS)}")
    seed = table.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UsageError(f"Expected `search.seed` to be an integer >= 0. Received: "
                         f"search.seed={seed!r}")
    space = {k: _check_dim(k, table[k]) for k in KEYS if k in table}
    if "params" in table:
        params = table["params"]
        if not isinstance(params, dict) or not params:
            raise UsageError("Expected `search.params` to be a table of builder parameter "
                             f"spaces. Received: {params!r}")
        space["params"] = {name: _check_param(name, spec) for name, spec in params.items()}
    if not space:
        raise UsageError(f"Expected `[search]` to give a space for at least one of "
                         f"{', '.join(KEYS)}, params.")
    return seed, space


def _check_param(name: str, spec: Any) -> dict[str, Any]:
    """A builder parameter's space: choices of any value, or a numeric range."""
    key = f"search.params.{name}"
    if isinstance(spec, list):
        if not spec:
            raise UsageError(f"Expected `{key}` to list at least one choice. Received: []")
        return {"choices": list(spec)}
    if not isinstance(spec, dict) or not set(spec) <= set(RANGE_KEYS):
        raise UsageError(f"Expected `{key}` to be a list of choices or a range table "
                         f"{{ low, high }}. Received: {spec!r}")
    low, high = spec.get("low"), spec.get("high")
    log, integer = spec.get("log", False), spec.get("integer", False)
    if not (_number(low) and _number(high)) or low > high or (log and low <= 0) \
            or (integer and not (isinstance(low, int) and isinstance(high, int))) \
            or not math.isfinite(low) or not math.isfinite(high):
        raise UsageError(f"Expected `{key}` to have finite numbers low <= high (integers with "
                         f"integer = true, positive with log = true). Received: {spec!r}")
    return {"low": low, "high": high, "log": bool(log), "integer": bool(integer)}


def load_space(path: str | Path) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    """The `[search]` table of a TOML config, checked (`parse_space`).

    Returns:
        (seed, space, the raw `[search]` table as written).

    Raises:
        UsageError: unreadable file, or no or a bad `[search]` table.
    """
    try:
        from ensemble.config import bounds

        table = tomllib.loads(bounds.check_depth(Path(path).read_text(),
                                                 f"config file {str(path)!r}"))
    except FileNotFoundError:
        raise UsageError(f"Config file not found: {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"Cannot read config file {path}: {exc}") from None
    if "search" not in table:
        raise UsageError(f"Config {path} has no [search] table; ensemble search samples its "
                         "members from one (see docs/guides/search.md).")
    seed, space = parse_space(table["search"])
    return seed, space, table["search"]


def _draw(rng: np.random.Generator, dim: dict[str, Any], as_int: bool = False) -> Any:
    if "choices" in dim:
        return dim["choices"][int(rng.integers(len(dim["choices"])))]
    low, high = float(dim["low"]), float(dim["high"])
    if dim["integer"]:
        hi = high + 1  # integers low..high, each equally likely (log: by log-width)
        u = (math.exp(rng.uniform(math.log(low), math.log(hi))) if dim["log"]
             else rng.uniform(low, hi))
        value = int(min(max(math.floor(u), low), high))
        return value if as_int else [value]
    u = (math.exp(rng.uniform(math.log(low), math.log(high))) if dim["log"]
         else rng.uniform(low, high))
    return float(f"{min(max(u, low), high):.4g}")  # 4 significant digits: readable records


def sample(space: dict[str, dict[str, Any]], seed: int, n: int) -> list[dict[str, Any]]:
    """`n` candidates' hyperparameters: `[{key: value}]`, candidate `i` drawn from
    `default_rng([seed, i])` only (float ranges rounded to 4 significant digits; `hidden`
    always a list of widths).

    Raises:
        UsageError: `n` < 1.
    """
    if n < 1:
        raise UsageError(f"Expected --candidates >= 1. Received: {n}")
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        out.append({k: ({n: _draw(rng, d, as_int=True) for n, d in dim.items()}
                        if k == "params" else _draw(rng, dim)) for k, dim in space.items()})
    return out


def candidate_tables(base: dict[str, Any], candidates: list[dict[str, Any]], select: int,
                     seed_offset: int = 0) -> dict[str, Any]:
    """The config tables of the run that trains `candidates` as its members: `base` (the
    config's tables without `[search]`) with `members.count`, one `[[members.override]]` per
    candidate, `greedy` first among the aggregators with `select` rounds (ensemble selection
    of at most `select` members, repeats allowed), and `training.seed` + `seed_offset`.

    Raises:
        UsageError: `select` < 1, or `base` already has `[[members.override]]`.
    """
    if select < 1:
        raise UsageError(f"Expected --select >= 1. Received: {select}")
    tables = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items() if k != "search"}
    members = tables.setdefault("members", {})
    if members.get("override"):
        raise UsageError("`members.override`: a search samples every member's hyperparameters; "
                         "remove [[members.override]] from the search config.")
    members["count"] = len(candidates)
    members["override"] = [{"index": i, **c} for i, c in enumerate(candidates)]
    agg = tables.setdefault("aggregation", {})
    names = list(agg.get("aggregators", ["mean", "vote"]))
    agg["aggregators"] = ["greedy", *[a for a in names if a != "greedy"]]
    agg["greedy_rounds"] = select
    if seed_offset:
        training = tables.setdefault("training", {})
        training["seed"] = int(training.get("seed", 0)) + seed_offset
    return tables
