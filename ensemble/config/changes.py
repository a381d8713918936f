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


# keys added to the config since runs were recorded without them -> the value such a run
# trained with (its behaviour before the key existed)
ADDED = {("training", "min_delta"): 0.0}


def resume_changes(recorded: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The changes (`config_changes`) between a run's recorded config `recorded` (its
    manifest's) and the config `new` a resume is given. A key of `ADDED` that `recorded`
    lacks counts as the value the run trained with, and its change says how to resume
    (`--set training.min_delta=0.0`), so that a run recorded before the key existed can be."""
    old = {section: dict(values) if isinstance(values, dict) else values
           for section, values in recorded.items()}
    added = {}
    for (section, key), value in ADDED.items():
        if isinstance(old.get(section), dict) and key not in old[section]:
            old[section][key] = added[f"{section}.{key}"] = value
    out = []
    for change in config_changes(old, new):
        key = change.split(":", 1)[0]
        if key in added:
            change += (f" (a key added since the run started, which trained with "
                       f"{added[key]!r}: resume with --set {key}={added[key]!r})")
        out.append(change)
    return out
