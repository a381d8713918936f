"""A run's builder files, verified before they are imported: their sha256 against the manifest's.

Importing a builder's module runs its code, so a file that changed since training (whoever can
edit it would get code run by the next user of the run) is refused with one line naming it;
`trust` accepts the change and records the new sha256 (`model.builders_trusted` keeps the old
ones). The file is hashed without being imported.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from ensemble.core.errors import UsageError
from ensemble.core.manifest import Manifest
from ensemble.models.builders import builder_file


def check_builders(run_dir: str | Path, manifest: Manifest, trust: bool = False) -> None:
    """Refuse a run whose user builder file changed since training (sha256, see the module
    docstring); with `trust`, record the new sha256 in the manifest instead (under its lock).

    Raises:
        UsageError: a builder file recorded with a sha256 that is now missing or differs
            (names the file and `--trust-builder`).
    """
    recorded = manifest.model.builders if manifest.model is not None else {}
    changed = {}
    for spec, expected in recorded.items():
        now = check_builder(spec, expected, trust)
        if now != expected:
            changed[spec] = now
    if changed:

        def change(m: Manifest) -> None:
            old = m.model.builders_trusted = m.model.builders_trusted or {}
            for spec, sha in changed.items():
                old.setdefault(spec, []).append(m.model.builders[spec])
                m.model.builders[spec] = sha

        manifest.model = Manifest.update(run_dir, change).model


def check_builder(spec: str, expected: str | None, trust: bool = False) -> str | None:
    """Check one builder's source file against its recorded sha256 `expected` (None: a
    built-in, or a source that was not found at training: nothing to check); returns its
    sha256 now.

    Raises:
        UsageError: the file is missing, or differs and not `trust` (names the file and
            `--trust-builder`).
    """
    if expected is None:
        return None
    path = builder_file(spec)
    if path is None:
        raise UsageError(f"Builder file of {spec!r}, recorded in the run's manifest, is "
                         "missing; restore it to use the run.")
    now = hashlib.sha256(path.read_bytes()).hexdigest()
    if now != expected and not trust:
        raise UsageError(f"Builder file {path} changed since the run was trained (its sha256 "
                         "differs from the manifest's); it is not imported. Restore it, or "
                         "pass --trust-builder to accept the change.")
    return now
