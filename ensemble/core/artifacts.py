"""The run directory: atomic, durable writes, Parquet I/O with checksums, the manifest.

Every artifact is written to a temporary name in its own folder, flushed to disk (`fsync`),
given the permissions the umask allows (as `open` would; `mkstemp` alone gives 0600) and
renamed into place (`os.replace`), and then the folder itself is flushed so that the rename
survives a power loss: a crash never leaves a half-written or empty file under the final name.
Every artifact read from a run is checked against the sha256 the manifest records (`verify`);
a file with no recorded hash is an error, not a pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ensemble.core import splitfiles, staging
from ensemble.core.staging import fsync_dir
from ensemble.core.errors import UsageError

MANIFEST = "manifest.json"
PREPROCESSING = "preprocessing.json"
PREDICTIONS = "predictions.parquet"
METRICS = "metrics.parquet"
HISTORY = "history.parquet"
SPLITS = ("train", "validation", "test")
EVAL_SPLITS = ("validation", "test")  # the splits a run predicts and evaluates


_UMASK: list[int] = []
_UMASK_LOCK = threading.Lock()


def _file_mode() -> int:
    """`0o666` less this process's umask (read once: reading it means setting it)."""
    with _UMASK_LOCK:
        if not _UMASK:
            mask = os.umask(0o022)
            os.umask(mask)
            _UMASK.append(mask)
    return 0o666 & ~_UMASK[0]


def _fsync_tree(path: Path) -> str | None:
    """Flush `path` (a file, or every file under a folder) to disk; returns a file's sha256,
    read in the same pass as the flush (None for a folder)."""
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    h = hashlib.sha256() if path.is_file() else None
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while h is not None and (chunk := os.read(fd, 1 << 20)):
                h.update(chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
    return None if h is None else h.hexdigest()


# sha256 of the files this process wrote: {resolved path: (size, mtime_ns, inode, hex)}
_WRITTEN: dict[str, tuple[int, int, int, str]] = {}


def remember(path: str | Path, digest: str) -> None:
    """Record `digest`, the sha256 of file `path` that this process wrote and hashed as it
    wrote it (`atomic_path` does it for its files; other writers, such as the splits'
    `splitfiles.SplitWriter`, call it): `file_sha256` and `written_here` then know the file
    while its size, modification time and inode stay the same."""
    path = Path(path)
    _WRITTEN[str(path.resolve())] = (*stamp(path), digest)


def stamp(path: str | Path) -> tuple[int, int, int]:
    """`(size in bytes, modification time in ns, inode)` of file `path`: what tells that a
    file is still the one a process wrote.

    Raises:
        OSError: `path` cannot be stat'ed.
    """
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def written_here(path: str | Path) -> bool:
    """Whether `path` is still the file this process last wrote there (`atomic_path`): same
    size, modification time and inode."""
    known = _WRITTEN.get(str(Path(path).resolve()))
    if known is None:
        return False
    try:
        return known[:3] == stamp(path)
    except OSError:
        return False


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes: as hashed when this process wrote it (`atomic_path`), if
    its size, modification time and inode are still those it had then; else read."""
    if written_here(path):
        return _WRITTEN[str(Path(path).resolve())][3]
    return sha256_file(path)


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a staging path (`ensemble.core.staging`, ending in `suffix`) beside `path`; when the
    block succeeds, flush it (`fsync`, hashing a file in the same read: `file_sha256`), give it
    the umask's permissions, rename it onto `path` and flush the folder; delete it when the
    block raises (a full disk included).

    A FIFO, a device or `/dev/stdout` is yielded itself and written through, never replaced
    (`ensemble.core.outputs.writes_through`)."""
    from ensemble.core.outputs import writes_through

    path = Path(path)
    if writes_through(path):
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging.new_path(path, suffix)  # owned name; stale ones of dead writers swept
    try:
        yield tmp
        digest = _fsync_tree(tmp)
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        if digest is not None:
            remember(path, digest)
    except OSError as exc:  # pyarrow's and numpy's write errors name no file: name it
        if exc.errno is None or exc.filename is not None:
            raise
        raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from exc
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


def write_parquet_chunks(path: str | Path, chunks, meta: dict | None = None) -> None:
    """Write the Arrow tables `chunks` (one schema) atomically to one Parquet file, a row group
    each as they come (memory flat in the rows), with page checksums and, when given, the
    key-value metadata `meta` on every chunk's schema."""
    with atomic_path(path) as tmp:
        writer = None
        try:
            for t in chunks:
                if meta is not None:
                    t = t.replace_schema_metadata(meta)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, t.schema, write_page_checksum=True)
                writer.write_table(t)
        finally:
            if writer is not None:
                writer.close()


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


@contextmanager
def opened(path: str | Path, what: str = "run file") -> Iterator[None]:
    """Read run file `path` in the block: any failure but a `UsageError` (a library's error on
    damaged or foreign content: pyarrow, JSON, Keras, a shape mismatch) becomes one line
    naming the file.

    Raises:
        UsageError: `Damaged or foreign <what> '<path>': <error type>: <its first line>`.
    """
    try:
        yield
    except (UsageError, UnicodeError):  # a path pyarrow cannot encode is not a damaged file
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the content broke, name the file
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        kind = "" if type(exc) is ValueError and first else f"{type(exc).__name__}: "
        raise UsageError(f"Damaged or foreign {what} {str(path)!r}: {kind}{first}") from None


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
    """Store splits held in memory as `data/<split>.{x,y,row}.npy` (`splitfiles`: x float32
    or uint8, y the encoded targets, row int64 position in the source) so between-graph
    clients share them without re-splitting."""
    for name in SPLITS:
        splitfiles.write(run_dir, name, x[name], y[name], rows[name])


def read_split(run_dir: Path, name: str, manifest=None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A prepared split `(x [n, *row_shape], y [n], row [n] int64)`, read-only memory maps
    (`splitfiles.read`), its files verified against `manifest`'s sha256 when given.

    Raises:
        UsageError: the run directory holds no prepared split `name`, or it is damaged.
    """
    if manifest is not None:
        for path in splitfiles.files(run_dir, name):
            verify(run_dir, manifest, path)
    return splitfiles.read(run_dir, name)


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """Read `manifest.json` of a run.

    Raises:
        UsageError: not a run directory, a manifest that is not JSON, or JSON of the wrong
            shape (`ensemble.core.manifest_schema`: names the field).
    """
    from ensemble.core.manifest_schema import validate

    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise UsageError(f"Not a run directory (no {MANIFEST}): {str(run_dir)!r}")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise UsageError(f"Damaged manifest {str(path)!r}: {str(exc)[:200]}") from None
    except OSError as exc:
        raise UsageError(f"Cannot read manifest {str(path)!r}: {exc.strerror or exc}") from None
    return validate(manifest, str(path))


def write_manifest(run_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Write `manifest.json` atomically."""
    write_text(Path(run_dir) / MANIFEST, json.dumps(manifest, indent=1, default=str))


def artifact_hashes(run_dir: str | Path, known: dict[Path, str] | None = None
                    ) -> dict[str, str]:
    """sha256 of every file of the run except the manifest: `{relative path: hex}`; `known`
    gives some already (`{path under run_dir: hex}`); the files this process wrote are not
    read again (`file_sha256`)."""
    run_dir, known = Path(run_dir), known or {}
    return {
        str(p.relative_to(run_dir)): known.get(p) or file_sha256(p)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }


def recorded_hashes(manifest) -> dict[str, str]:
    """Every sha256 the manifest records: the run's artifacts and each member's files.

    `manifest`: a `ensemble.core.manifest.Manifest` (its `hashes()`) or the manifest's JSON."""
    if hasattr(manifest, "hashes"):
        return manifest.hashes()
    out = dict(manifest.get("artifacts", {}))
    for m in manifest.get("members", []):
        out.update(m.get("sha256", {}))
    return out


def read_verified(run_dir: str | Path, manifest, path: str | Path) -> bytes:
    """The bytes of run file `path`, checked against the sha256 the manifest records, read
    once (the hash is of the bytes returned).

    Raises:
        UsageError: as `verify`.
    """
    path = Path(path)
    rel = os.path.relpath(path, run_dir)
    expected = recorded_hashes(manifest).get(rel)
    if expected is None or not path.is_file():
        verify(run_dir, manifest, path)  # its message: never written, missing or unhashed
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected:
        raise UsageError(f"Damaged artifact {path}: its sha256 does not match the manifest.")
    return data


def verify(run_dir: str | Path, manifest, path: str | Path) -> Path:
    """Check a run file against the sha256 the manifest (a `Manifest` or its JSON) records for it.

    Returns:
        The path.

    Raises:
        UsageError: no sha256 recorded for the file, the file is missing, or its sha256
        differs (each names the file).
    """
    path = Path(path)
    rel = os.path.relpath(path, run_dir)
    expected = recorded_hashes(manifest).get(rel)
    if not path.is_file() and expected is None:  # never written: nothing was lost
        raise UsageError(f"Run {run_dir} has no {rel}: its manifest records none, so it was "
                         "never written.")
    if not path.is_file():
        raise UsageError(f"Artifact missing: {path}")
    if expected is None:
        raise UsageError(f"No sha256 recorded for {path} in {Path(run_dir) / MANIFEST}; "
                         "the file cannot be trusted (the run is unfinished, or the file was "
                         "added by hand).")
    if file_sha256(path) != expected:
        raise UsageError(f"Damaged artifact {path}: its sha256 does not match the manifest.")
    return path


def member_files(run_dir: Path, index: int) -> list[Path]:
    """The files a completed member leaves in `members/`."""
    return [member_model_path(run_dir, index), member_history_path(run_dir, index),
            member_predictions_path(run_dir, index)]
