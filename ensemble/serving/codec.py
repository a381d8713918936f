"""TF Serving's REST predict format: JSON requests to input arrays, output arrays to JSON.

Follows `tensorflow_serving/g3doc/api_rest.md`, generic over signatures: every check reads the
signature's own input and output specs (names, dtypes, shapes), so classification, regression
(`mean`/`std` outputs), images `[batch, h, w, c]` and several named string or float inputs
all go through the same code.

- Row format: `{"signature_name": S, "instances": [...]}`, one entry per row. With one named
  input an instance is the row's value (or `{name: value}`); with several, an object with
  every input. Answered with `{"predictions": [...]}`: the row's value for a single output,
  else `{output name: value}` per row.
- Columnar format: `{"inputs": value}` (one input) or `{"inputs": {name: value}}`, each value
  batch first; answered with `{"outputs": value}` or `{"outputs": {name: value}}`.
- Strings are UTF-8 text; `{"b64": "..."}` carries raw bytes (both directions: an output that is
  not valid UTF-8, or whose name ends in `_bytes`, is sent as `{"b64": ...}`).

No TensorFlow here: specs are `TensorInfo` (numpy dtype or `object` for strings, shape with
`None` for unknown dimensions); the server builds them from the loaded SavedModel.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np

DEFAULT_SIGNATURE = "serving_default"


class BadRequest(ValueError):
    """A request the signature cannot take (HTTP 400); the message says what was expected."""


@dataclass(frozen=True)
class TensorInfo:
    """One named input or output: `dtype` a numpy dtype (`object` for strings, held as
    bytes), `shape` a tuple with `None` for an unknown dimension (None: unknown rank)."""

    dtype: np.dtype
    shape: tuple | None


@dataclass(frozen=True)
class SignatureInfo:
    """A signature's inputs and outputs `{name: TensorInfo}`."""

    inputs: dict
    outputs: dict

    @property
    def batchable(self) -> bool:
        """Whether requests can be merged along axis 0: every input and output is batch
        first (rank >= 1, first dimension unknown)."""
        return all(t.shape is not None and len(t.shape) >= 1 and t.shape[0] is None
                   for t in (*self.inputs.values(), *self.outputs.values()))


def signature_name(req: dict) -> str:
    """The request's `signature_name` (default `serving_default`). Raises BadRequest."""
    name = req.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise BadRequest(f"expected `signature_name` to be a string; received {name!r}")
    return name


def _is_b64(value) -> bool:
    return isinstance(value, dict) and set(value) == {"b64"}


def _strings(value):
    """Nested lists of text or `{"b64": ...}` leaves to nested lists of bytes."""
    if isinstance(value, list):
        return [_strings(v) for v in value]
    if isinstance(value, str):
        return value.encode("utf-8")
    if _is_b64(value) and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError:
            raise BadRequest("invalid base64 in a {\"b64\": ...} value") from None
    raise BadRequest(f"expected a string (or {{\"b64\": ...}}); received {value!r:.40}")


def _nulls_as_nan(value) -> np.ndarray:
    """Nested lists of numbers and nulls (`None`) as float64 with NaN for the nulls; left as
    an object array when other values (strings) are in it, for `_array` to refuse."""
    def walk(v):
        return [walk(u) for u in v] if isinstance(v, list) else (float("nan") if v is None else v)

    raw = np.asarray(walk(value))
    return raw.astype(np.float64) if raw.dtype.kind in "fiu" else raw


def _holds_bool(value) -> bool:
    """Whether nested lists `value` hold a JSON `true` or `false` anywhere (walked without
    recursion; `numpy.asarray` would take them as 1 and 0 among numbers)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, bool):
            return True
        if isinstance(v, list):
            if any(x is True or x is False for x in v):
                return True
            stack.extend(x for x in v if isinstance(x, list))
    return False


def _array(name: str, value, info: TensorInfo) -> np.ndarray:
    """`value` (nested lists, batch first) as an array of `info`'s dtype and shape."""
    try:
        if info.dtype == object:
            leaves = np.asarray(_strings(value), dtype=object)
            if leaves.dtype != object or any(not isinstance(v, bytes) for v in leaves.flat):
                raise ValueError("ragged")
            arr = leaves
        else:
            raw = np.asarray(value)
            kind, want = raw.dtype.kind, np.dtype(info.dtype).kind
            if kind == "O" and want == "f":  # null: a missing value (NaN), which the export
                raw = _nulls_as_nan(value)  # of a run trained with --impute fills
                kind = raw.dtype.kind
            ok = {"f": "fiu", "c": "fiuc", "i": "iu", "u": "iu", "b": "b"}.get(want, "")
            if want != "b" and kind in "fiu" and _holds_bool(value):  # numpy makes True 1.0
                kind = "b"
            if raw.size and kind not in ok:
                got = {"U": "strings", "O": "objects or nulls", "b": "booleans",
                       "f": "non-integer numbers"}.get(kind, raw.dtype.name)
                raise BadRequest(f"input `{name}` expects {np.dtype(info.dtype).name} "
                                 f"values; received {got}")
            with np.errstate(over="ignore", invalid="ignore"):  # overflow: refused below
                arr = raw.astype(info.dtype)
            if want == "f" and np.isinf(arr).any():  # `null` (NaN) is a missing value
                row = int(np.argwhere(np.isinf(arr))[0][0]) if arr.ndim else 0
                raise BadRequest(f"input `{name}` holds a non-finite number at row {row} "
                                 f"(infinite or beyond {arr.dtype.name}'s range "
                                 f"±{np.finfo(arr.dtype).max:.3g}); expected finite numbers "
                                 "(null or NaN for a missing value)")
    except ValueError as exc:
        if isinstance(exc, BadRequest):
            if str(exc).startswith("input `"):
                raise
            raise BadRequest(f"input `{name}`: {exc}") from None  # a leaf of `_strings`
        raise BadRequest(f"input `{name}`: rows of different shapes (ragged nested lists)"
                         ) from None
    if info.shape is not None:
        want = "[" + ", ".join("-1" if d is None else str(d) for d in info.shape) + "]"
        if arr.ndim != len(info.shape) or any(d is not None and d != a
                                              for d, a in zip(info.shape, arr.shape)):
            raise BadRequest(f"input `{name}` expects shape {want} (-1: any); received "
                             f"shape {list(arr.shape)}")
    return arr


def decode_inputs(req: dict, sig: SignatureInfo) -> tuple[dict, bool]:
    """The request's inputs `{name: array}` (batch first) for signature `sig`.

    Returns:
        (inputs, row_format): row_format True for `instances`, False for `inputs`.

    Raises:
        BadRequest: both or neither of `instances`/`inputs`, a missing or unknown input name,
            a value of the wrong type or shape, or inputs of different batch sizes.
    """
    if ("instances" in req) == ("inputs" in req):
        raise BadRequest("expected exactly one of `instances` (row format) or `inputs` "
                         "(columnar format); received "
                         + ("both" if "instances" in req else "neither"))
    names = list(sig.inputs)
    if "instances" in req:
        rows = req["instances"]
        if not isinstance(rows, list) or not rows:
            raise BadRequest("expected `instances` to be a non-empty list of rows")
        named = [isinstance(r, dict) and not _is_b64(r) for r in rows]
        if len(names) > 1 and not all(named):
            raise BadRequest(f"signature has several inputs ({', '.join(names)}): every "
                             "instance must be an object {input name: value}")
        if any(named) and not all(named):
            raise BadRequest("instances mix objects and plain values")
        if all(named):
            for r in rows:
                _check_names(set(r), names)
            columns = {n: [r[n] for r in rows] for n in names}
        else:
            columns = {names[0]: rows}
        row_format = True
    else:
        value = req["inputs"]
        if isinstance(value, dict) and not _is_b64(value):
            _check_names(set(value), names)
            columns = value
        elif len(names) == 1:
            columns = {names[0]: value}
        else:
            raise BadRequest(f"signature has several inputs ({', '.join(names)}): `inputs` "
                             "must be an object {input name: value}")
        row_format = False
    arrays = {n: _array(n, columns[n], sig.inputs[n]) for n in names}
    sizes = {a.shape[0] for a in arrays.values() if a.ndim}
    if len(sizes) > 1:
        raise BadRequest(f"inputs of different batch sizes: {sorted(sizes)}")
    return arrays, row_format


def _check_names(got: set, names: list) -> None:
    if got != set(names):
        missing, extra = sorted(set(names) - got), sorted(got - set(names))
        raise BadRequest("expected inputs {" + ", ".join(names) + "}"
                         + (f"; missing: {', '.join(missing)}" if missing else "")
                         + (f"; unknown: {', '.join(extra)}" if extra else ""))


def _jsonable(name: str, arr: np.ndarray):
    if arr.dtype == object or arr.dtype.kind == "S":
        def text(b):
            if isinstance(b, bytes) and not name.endswith("_bytes"):
                try:
                    return b.decode("utf-8")
                except UnicodeDecodeError:
                    pass
            return {"b64": base64.b64encode(b).decode("ascii")} if isinstance(b, bytes) else b
        return np.vectorize(text, otypes=[object])(arr).tolist() if arr.size else arr.tolist()
    return arr.tolist()


def encode_outputs(outputs: dict, row_format: bool) -> dict:
    """`{"predictions": [...]}` (row format) or `{"outputs": ...}` for output arrays
    `{name: array}`. Raises BadRequest when the row format meets an output that is not
    batch first (the columnar format carries any shape)."""
    names = sorted(outputs)
    if not row_format:
        if len(names) == 1:
            return {"outputs": _jsonable(names[0], outputs[names[0]])}
        return {"outputs": {n: _jsonable(n, outputs[n]) for n in names}}
    sizes = {outputs[n].shape[0] if outputs[n].ndim else None for n in names}
    if len(sizes) != 1 or None in sizes:
        raise BadRequest("the row format (`instances`) needs outputs of one batch size; "
                         "use the columnar format (`inputs`)")
    values = {n: _jsonable(n, outputs[n]) for n in names}
    if len(names) == 1:
        return {"predictions": values[names[0]]}
    return {"predictions": [{n: values[n][i] for n in names} for i in range(sizes.pop())]}


def dumps(content) -> bytes:
    """Compact JSON (NaN allowed, as TF Serving writes it)."""
    return json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
