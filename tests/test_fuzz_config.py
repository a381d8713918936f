"""Property test over every config key: any value of any type (non-finite and extreme numbers
included) is either accepted into a `Config` a run can use, or refused with a `UsageError`
naming the key; never another exception. Config validation only, in-process: seconds."""

import dataclasses
import json
import math
from typing import get_type_hints

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ensemble.config import bounds
from ensemble.config import schema
from ensemble.core.errors import UsageError


def _keys(cls=schema.Config, prefix=()):
    """Every leaf key of the config tree as a path of names (nested tables walked)."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _keys(tp, prefix + (f.name,))
        else:
            yield prefix + (f.name,)


KEYS = sorted(_keys())
OVERRIDE_KEYS = [f.name for f in dataclasses.fields(schema.MemberOverride)]

EXTREME_FLOATS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 3.5e38, 1e-300]
EXTREME_INTS = [0, -1, 1, 2 ** 31, 2 ** 32, 2 ** 63 - 1, 2 ** 63, -2 ** 63, 10 ** 30, -10 ** 30]
scalars = st.one_of(
    st.sampled_from(EXTREME_FLOATS), st.sampled_from(EXTREME_INTS),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-2 ** 70, 2 ** 70),
    st.booleans(), st.text(max_size=8), st.sampled_from(["auto", "mean", "relu", "cpu:2"]))
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(
    st.text(max_size=5), scalars, max_size=2))


def _table(assignments):
    table: dict = {}
    for path, value in assignments:
        node = table
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[path[-1]] = value
    return table


def _numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


def _check(table):
    try:
        cfg = schema.from_dict(table)
    except UsageError as exc:
        text = str(exc)
        assert "\n" not in text and text, text
        named = {p[-1] for p, _ in _flatten(table)} | {p[0] for p, _ in _flatten(table)}
        assert any(n in text for n in named) or "config" in text, (table, text)
        return
    d = cfg.to_dict()
    json.dumps(d, allow_nan=False)  # every float finite
    for x in _numbers(d):
        assert -2 ** 63 <= x < 2 ** 63 and math.isfinite(x), (table, x)
    assert 0 < cfg.training.learning_rate <= bounds.UPPER["training.learning_rate"]
    assert 0 <= cfg.training.seed <= bounds.SEED_MAX and 0 <= cfg.data.split_seed <= bounds.SEED_MAX
    for i in range(cfg.members.count):  # every member resolves
        hp = schema.member_hparams(cfg, i)
        assert math.isfinite(hp["learning_rate"])
        assert 0 <= hp["params"].get("dropout", 0) < 1 or hp["builder"] != "mlp"
    assert schema.from_dict(d) == cfg  # what a run records reloads to the same config


def _flatten(table, prefix=()):
    for k, v in table.items():
        if isinstance(v, dict):
            yield from _flatten(v, prefix + (k,))
        yield prefix + (k,), v


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(KEYS), values), min_size=1, max_size=4))
def test_any_value_of_any_key_is_a_usable_config_or_one_line_naming_the_key(assignments):
    _check(_table(assignments))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KEYS), st.sampled_from(EXTREME_FLOATS + EXTREME_INTS))
def test_extreme_numbers_in_every_key(key, value):
    _check(_table([(key, value)]))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(OVERRIDE_KEYS), values, st.integers(-2, 5))
def test_member_overrides(key, value, index):
    _check({"members": {"count": 4, "override": [{"index": index, key: value}]}})


def test_every_key_is_covered():
    assert len(KEYS) >= 30 and ("training", "learning_rate") in KEYS
    for path in KEYS:  # non-finite numbers are refused wherever a number goes
        for bad in (math.nan, math.inf):
            try:
                schema.from_dict(_table([(path, bad)]))
            except UsageError as exc:
                assert path[-1] in str(exc)
            else:
                raise AssertionError(f"{'.'.join(path)} = {bad} accepted")
