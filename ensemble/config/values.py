"""TOML tables into the config's dataclasses: each value checked against its annotation.

Messages name the key as a TOML file and `--set` spell it (`training.learning_rate`,
`members.hidden[1]`) and the expected type in words ("an integer", "a list of numbers").
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
from typing import Any, get_args, get_origin, get_type_hints

from ensemble.core.errors import UsageError


_TYPE_NAMES = {int: ("an integer", "integers"), float: ("a number", "numbers"),
               str: ("a string", "strings"), bool: ("a boolean (true or false)", "booleans"),
               dict: ("a table", "tables")}


def _type_name(tp: Any) -> str:
    """What a value of `tp` is called in messages, with its article ("an integer")."""
    if get_origin(tp) is tuple:
        item = get_args(tp)[0]
        many = "tables" if dataclasses.is_dataclass(item) else _TYPE_NAMES.get(
            item, (None, f"{getattr(item, '__name__', item)} values"))[1]
        return f"a list of {many}"
    return _TYPE_NAMES.get(tp, (f"a {getattr(tp, '__name__', tp)}",))[0]


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotated type `tp`; return it in that type."""
    if isinstance(tp, types.UnionType):
        for option in get_args(tp):
            try:
                return _coerce(key, value, option)
            except UsageError:
                if option is float and isinstance(value, (int, float)) \
                        and not isinstance(value, bool):
                    raise  # a number, but not a finite one: say so
        names = " or ".join(_type_name(t) for t in get_args(tp) if t is not type(None))
        raise UsageError(f"Expected `{key}` to be {names}. Received: {key}={value!r}")
    if tp is dict:
        if not isinstance(value, dict):
            raise UsageError(f"Expected `{key}` to be a table. Received: {key}={value!r}")
        try:
            plain = json.loads(json.dumps(value, allow_nan=False))  # plain JSON values
        except (TypeError, ValueError):
            raise UsageError(f"Expected `{key}` to hold numbers, strings, booleans, lists and "
                             f"tables (finite, no dates). Received: {key}={value!r}") from None
        _plain_numbers(key, plain)
        return plain
    if get_origin(tp) is tuple:
        item = get_args(tp)[0]
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"Expected `{key}` to be {_type_name(tp)}. Received: {key}={value!r}")
        if dataclasses.is_dataclass(item):
            return tuple(build(item, v, f"{key}[{i}]") for i, v in enumerate(value))
        return tuple(_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return _in_domain(key, value, float)
    if tp in (int, float) and isinstance(value, bool) or not isinstance(value, tp):
        raise UsageError(f"Expected `{key}` to be {_type_name(tp)}. Received: {key}={value!r}")
    return _in_domain(key, value, tp)


INT64 = 2 ** 63


def _plain_numbers(key: str, value: Any) -> None:
    """Every number inside a free-form table (builder or optimiser parameters) within 64 bits
    (integers) or finite (floats, already checked by JSON)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _plain_numbers(f"{key}.{k}", v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _plain_numbers(f"{key}[{i}]", v)
    elif isinstance(value, int) and not isinstance(value, bool):
        _in_domain(key, value, int)


def _in_domain(key: str, value: Any, tp: Any) -> Any:
    """Numbers a run can use: floats finite (no `nan`, `inf`; an integer given for a float must
    fit one), integers within 64 bits. Other values pass unchanged."""
    if tp is float:
        try:
            value = float(value)
        except OverflowError:
            value = float("inf")
        if not math.isfinite(value):
            raise UsageError(f"Expected `{key}` to be a finite number. Received: {key}={value!r}")
    elif tp is int and not -INT64 <= value < INT64:
        raise UsageError(f"Expected `{key}` to be a 64-bit integer. Received: {key}={value!r}")
    return value


def build(cls: type, table: Any, prefix: str) -> Any:
    """The dataclass `cls` from the TOML table `table`, every value checked against its
    annotation; `prefix` names the table in messages (`training`; "" for the whole config).

    Raises:
        UsageError: an unknown key (with the closest known one) or a value of the wrong type,
            naming the key as the TOML and `--set` spell it (`members.hidden[1]`).
    """
    if not isinstance(table, dict):
        if not prefix:
            raise UsageError(f"Expected the config to be a table. Received: {table!r}")
        raise UsageError(f"Expected `{prefix}` to be a table. Received: {prefix}={table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    shared = [k for k in unknown if k in getattr(cls, "run_wide", ())]  # MemberOverride's
    if shared:
        raise UsageError(f"`{prefix}.{shared[0]}`: batch_size and epochs are shared by every "
                         "member of a run; set them in [training], not per member.")
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        at = f"{prefix}." if prefix else ""
        hint = f" (did you mean `{at}{close[0]}`?)" if close else ""
        raise UsageError(f"Unknown config key `{at}{unknown[0]}`{hint}; expected one of: "
                         f"{', '.join(fields)}")
    kwargs = {}
    hints = get_type_hints(cls)
    for name, value in table.items():
        tp = hints[name]
        key = f"{prefix}.{name}" if prefix else name
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, value, key)
        else:
            kwargs[name] = _coerce(key, value, tp)
    return cls(**kwargs)
