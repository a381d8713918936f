"""The run directory: atomic writes, Parquet I/O with checksums, the manifest.

Every artifact is written to a temporary name in its own folder and renamed into place
(`os.replace`), so a crash never leaves a half-written file under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ensemble.errors import UsageError

MANIFEST = "manifest.json"
PREPROCESSING = "preprocessing.json"
PREDICTIONS = "predictions.parquet"
METRICS = "metrics.parquet"
HISTORY = "history.parquet"
SPLITS = ("train", "validation", "test")
EVAL_SPLITS = ("validation", "test")  # the splits a run predicts and evaluates


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path (ending in `suffix`) beside `path`; rename it onto `path` when
    the block succeeds, delete it when the block raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write `text` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_parquet(path: str | Path, table: pa.Table) -> None:
    """Write a table atomically, with Parquet page checksums."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, write_page_checksum=True)


def read_parquet(path: str | Path) -> pa.Table:
    """Read a Parquet file, verifying page checksums.

    Raises:
        UsageError: missing file, or a file that is not valid Parquet (names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"File not found: {path}")
    try:
        return pq.read_table(path, page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UsageError(f"Damaged or invalid Parquet file {path}: {exc}") from None


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def member_model_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / "members" / f"member-{index}.keras"


def member_predictions_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / "members" / f"member-{index}.predictions.parquet"


def member_history_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / "members" / f"member-{index}.history.parquet"


def write_splits(run_dir: Path, x: dict[str, np.ndarray], y: dict[str, np.ndarray],
                 rows: dict[str, np.ndarray]) -> None:
    """Store the scaled splits as `data/<split>.npz` (x float32, y int32 class index, row
    int64 position in the source) so between-graph clients share them without re-splitting."""
    for name in SPLITS:
        with atomic_path(Path(run_dir) / "data" / f"{name}.npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, x=x[name], y=y[name], row=rows[name])


def read_split(run_dir: Path, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read `data/<name>.npz` (no pickle): `(x [n, f] float32, y [n] int32, row [n] int64)`.

    Raises:
        UsageError: the run directory holds no prepared split `name`.
    """
    path = Path(run_dir) / "data" / f"{name}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            return z["x"], z["y"], z["row"]
    except FileNotFoundError:
        raise UsageError(f"Run directory {run_dir} has no prepared {name} split ({path}).") from None


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """Read `manifest.json` of a run.

    Raises:
        UsageError: not a run directory, or a manifest that is not JSON.
    """
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise UsageError(f"Not a run directory (no {MANIFEST}): {run_dir}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"Damaged manifest {path}: {exc}") from None


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Write `manifest.json` atomically."""
    write_text(Path(run_dir) / MANIFEST, json.dumps(manifest, indent=1, default=str))


def artifact_hashes(run_dir: str | Path) -> dict[str, str]:
    """sha256 of every file of the run except the manifest: `{relative path: hex}`."""
    run_dir = Path(run_dir)
    return {
        str(p.relative_to(run_dir)): sha256_file(p)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }


def recorded_hashes(manifest: dict[str, Any]) -> dict[str, str]:
    """Every sha256 the manifest records: the run's artifacts and each member's files."""
    out = dict(manifest.get("artifacts", {}))
    for m in manifest.get("members", []):
        out.update(m.get("sha256", {}))
    return out


def verify(run_dir: str | Path, manifest: dict[str, Any], path: str | Path) -> Path:
    """Check a run file against the sha256 the manifest records for it (if any).

    Returns:
        The path.

    Raises:
        UsageError: the file is missing or its sha256 differs (names the file).
    """
    path = Path(path)
    expected = recorded_hashes(manifest).get(os.path.relpath(path, run_dir))
    if expected is None:
        return path
    if not path.is_file():
        raise UsageError(f"Artifact missing: {path}")
    if sha256_file(path) != expected:
        raise UsageError(f"Damaged artifact {path}: its sha256 does not match the manifest.")
    return path
