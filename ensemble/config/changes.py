"""The differences between two configs, as dotted keys: what a resume names when the config it
is given is not the run's."""

from __future__ import annotations

from typing import Any


def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    keys = sorted(set(old) | set(new))
    out = []
    for k in keys:
        a, b, name = old.get(k), new.get(k), f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, name + ".")
        elif isinstance(a, list) and isinstance(b, list) and a != b and any(
                isinstance(v, dict) for v in a + b):  # tables: their count, or their changes
            if len(a) != len(b):
                out.append(f"{name}: {len(a)} entries -> {len(b)}")
            for i, (u, v) in enumerate(zip(a, b) if len(a) == len(b) else ()):
                out += config_changes({f"[{i}]": u}, {f"[{i}]": v}, name)
        elif a != b:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out
