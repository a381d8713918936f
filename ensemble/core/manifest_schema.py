"""The schema of a run's `manifest.json`, checked as a whole before any field is used.

A manifest that is valid JSON of the wrong shape (an array, `members` as an object,
`artifacts: null`, a member index that is a string) would otherwise fail deep inside a
command with an `AttributeError` or `TypeError`. `validate` walks the schema below (a small
subset of JSON Schema: `type`, `required`, `properties`, `items`, `values`) and refuses the
first field that does not fit with one line naming its path and what was expected. Fields the
schema does not name are allowed (newer manifests add fields); optional fields may be absent.
"""

from __future__ import annotations

from typing import Any

from ensemble.core.errors import UsageError

_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
          "boolean": bool, "null": type(None)}
_WORDS = {"object": "a JSON object", "array": "a JSON array", "string": "a string",
          "integer": "an integer", "number": "a number", "boolean": "true or false",
          "null": "null"}

_HASHES = {"type": "object", "values": {"type": "string"}}
_MEMBER = {"type": "object", "required": ["index"], "properties": {
    "index": {"type": "integer"}, "seed": {"type": ["integer", "null"]},
    "status": {"type": "string"}, "sha256": _HASHES,
    "hparams": {"type": ["object", "null"], "properties": {
        "builder": {"type": ["string", "null"]}}},
    "device": {"type": ["string", "array", "null"]}}}
SCHEMA: dict[str, Any] = {
    "type": "object",  # no field is required: a command says which one it misses
    "properties": {
        "schema_version": {"type": "integer"},
        "run_id": {"type": ["string", "null"]},
        "mode": {"type": "string"},
        "status": {"type": "string"},
        "task": {"type": ["string", "null"]},
        "config": {"type": "object", "properties": {
            section: {"type": "object"} for section in (
                "data", "members", "training", "placement", "aggregation", "model")}},
        "dataset": {"type": "object", "properties": {
            "rows": {"type": "object", "values": {"type": "integer"}},
            "classes": {"type": ["array", "null"]},
            "feature_names": {"type": ["array", "null"], "items": {"type": "string"}},
            "input_shape": {"type": ["array", "null"], "items": {"type": "integer"}},
            "target": {"type": ["string", "null"]}}},
        "model": {"type": ["object", "null"], "properties": {
            "builders": {"type": "object", "values": {"type": ["string", "null"]}}}},
        "members": {"type": "array", "items": _MEMBER},
        "artifacts": _HASHES,
        "timings": {"type": "object"},
        "aggregated_members": {"type": ["array", "null"], "items": {"type": "integer"}},
    }}


def _kind(value: Any) -> str:
    for name, py in _TYPES.items():
        if isinstance(value, py) and not (isinstance(value, bool) and name in ("integer",
                                                                                 "number")):
            return name
    return type(value).__name__


def _check(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """The first problem of `value` against `schema` (`where` is its path), or None."""
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    if kinds and _kind(value) not in kinds:
        want = " or ".join(_WORDS[k] for k in kinds)
        return f"`{where}` should be {want}, not {_WORDS.get(_kind(value), _kind(value))}"
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                return f"`{where}.{key}` is missing" if where else f"`{key}` is missing"
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                problem = _check(value[key], sub, f"{where}.{key}" if where else key)
                if problem:
                    return problem
        if "values" in schema:
            for key, item in value.items():
                problem = _check(item, schema["values"], f"{where}[{key!r}]")
                if problem:
                    return problem
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = _check(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    return None


def validate(manifest: Any, path: str) -> dict[str, Any]:
    """Check a parsed manifest against `SCHEMA`; returns it.

    Raises:
        UsageError: the first field of the wrong type or missing (names the field, what was
            expected and the file `path`).
    """
    problem = _check(manifest, SCHEMA, "")
    if problem is None:
        return manifest
    if problem.startswith("`` "):
        problem = "the manifest" + problem[2:]
    raise UsageError(f"Damaged manifest {path!r}: {problem}; the run cannot be used.")
