"""The run record: `manifest.json` as typed dataclasses, loaded, saved and updated under the run's
manifest lock.

Every module reads and writes a run's manifest through `Manifest` (`load`, `save`, `update`);
none subscripts the JSON. The file's content is the run-directory contract (docs: run
directory): the fields below keep their JSON names, keys this version does not know (a newer
writer's, a task's `dataset` entries) are kept in `extra` and written back unchanged, and a
manifest from before `schema_version` (version 0) loads as it is. A manifest written by a newer
schema than `SCHEMA_VERSION` is refused in one line (its fields may mean something else).

It lives in `ensemble.core` so that every layer that reads a run (models, replication, runs,
pipelines) can use it; `ensemble.runs.context.RunContext` holds it with what the runs layer
derives from it (the resolved config, the task, the preprocessing).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from ensemble.core import artifacts, runlock
from ensemble.core.errors import UsageError

SCHEMA_VERSION = 1  # 1: the typed record (adds `schema_version`); 0: manifests from before it


class _Record:
    """JSON object <-> dataclass: the fields by their names, every other key in `extra`.

    `_ALWAYS` names the fields written even when None (as the run-directory contract has them,
    e.g. `cluster: null`); other None fields are left out, as older writers left them out.
    """

    _ALWAYS: ClassVar[frozenset[str]] = frozenset()
    _NESTED: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """The record of a JSON object (already checked by `manifest_schema.validate`)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        known = {k: cls._NESTED.get(k, _same)(data[k]) for k in names if k in data}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the fields in their order (None ones left out unless `_ALWAYS`),
        then the unknown keys as they were read."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.name not in self._ALWAYS):
                continue
            out[f.name] = _plain(value)
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out


def _same(value: Any) -> Any:
    return value


def _plain(value: Any) -> Any:
    """A field's JSON value: records as objects, lists of records as lists of objects."""
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass
class MemberRecord(_Record):
    """One member of a run (`members[i]`).

    Attributes:
        index: its index in the ensemble (0-based).
        seed: its seed, `member_seed(run seed, index)`.
        device: its home device (a device name; a list for old multi-device records).
        replicas: its replicas' devices (`[device]` without data parallelism).
        status: `pending`, `completed`, `failed`, `interrupted` or `diverged`.
        hparams: its resolved `{"builder", "params", "learning_rate"}`.
        flops_per_row: forward FLOPs per input row (`ensemble.models.cost`).
        sha256: `{relative path: hex}` of its files, recorded by a between-graph client.
        diverged_epoch: the epoch (from 0) its loss or outputs turned non-finite.
        node: where it trained under the Ray engine: `{"id": the Ray node id, "ip": its
            address, "device": the worker's device, "gpus": the GPU ids Ray assigned}`.
    """

    index: int
    seed: int | None = None
    device: Any = None
    replicas: list[str] | None = None
    status: str = "pending"
    hparams: dict[str, Any] | None = None
    flops_per_row: float | None = None
    sha256: dict[str, str] | None = None
    diverged_epoch: int | None = None
    node: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _ALWAYS = frozenset({"device"})


@dataclass
class DatasetRecord(_Record):
    """The run's data (`dataset`): where it came from and what the members see.

    Attributes:
        name, source, target: the data set's name, its path or built-in name, the target column.
        rows: rows per split `{"train": n, "validation": n, "test": n}`.
        columns: the input's feature columns before encoding; sha256: the source's hex digest.
        feature_names: the encoded feature names (the model's inputs).
        classes: the class labels (empty for regression); input_shape: one row's shape.
        identifiers: the columns carried through to predictions.
        target_loc, target_scale: a regression target's standardisation (target units).
        named_columns: a run from arrays: whether its columns came with names (a DataFrame).
    """

    name: str | None = None
    source: str | None = None
    target: str | None = None
    rows: dict[str, int] = field(default_factory=dict)
    columns: list[str] | None = None
    sha256: str | None = None
    feature_names: list[str] | None = None
    classes: list[Any] | None = None
    input_shape: list[int] | None = None
    identifiers: list[str] | None = None
    target_loc: float | None = None
    target_scale: float | None = None
    named_columns: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _ALWAYS = frozenset({"rows"})

    def update(self, entries: dict[str, Any]) -> None:
        """Set entries by their JSON names (a task's `target_entries()`): fields by name,
        other keys into `extra`."""
        names = {f.name for f in dataclasses.fields(self)} - {"extra"}
        for key, value in entries.items():
            if key in names:
                setattr(self, key, value)
            else:
                self.extra[key] = value

    def target_or(self, default: str = "target") -> str:
        """The target column's name (`default` when the run records none)."""
        return self.target or default


@dataclass
class ModelRecord(_Record):
    """The run's model (`model`): the config's builder and parameters, and the sha256 of each
    builder's source file (`builders`: `{spec: hex}`, None for a built-in or a source not
    found), with the digests replaced by `--trust-builder` (`builders_trusted`:
    `{spec: [old hex, ...]}`)."""

    builder: str | None = None
    params: dict[str, Any] | None = None
    builders: dict[str, str | None] = field(default_factory=dict)
    builders_trusted: dict[str, list[str | None]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _model(data: dict[str, Any] | None) -> ModelRecord | None:
    return None if data is None else ModelRecord.from_dict(data)


def _members(items: list[dict[str, Any]]) -> list[MemberRecord]:
    return [MemberRecord.from_dict(m) for m in items]


def _dataset(data: dict[str, Any]) -> DatasetRecord:
    return DatasetRecord.from_dict(data)


@dataclass
class Manifest(_Record):
    """A run's `manifest.json` (the run-directory contract; docs: run directory).

    Attributes:
        schema_version: the record's version (`SCHEMA_VERSION`; 0: written before it).
        run_id, mode, status: the run's id, replication mode and status (`running`,
            `completed`, `failed`, `interrupted`).
        pid, host, created: the process that last opened the run for writing, and when the
            run was created (ISO 8601, UTC).
        config, config_sha256: the resolved config (`Config.to_dict()`) and its sha256.
        dataset: `DatasetRecord`; task: the task's spec (None in runs from before tasks:
            `ensemble.tasks.for_run` gives them its default task).
        model: `ModelRecord` (None in runs from before builders).
        devices, cluster, placement: the devices, the cluster spec (or None), the placement.
        members: one `MemberRecord` per member, by index.
        versions, tensorflow_build: library versions and TensorFlow's build information.
        timings: seconds (and a few counts and byte sizes) by name: `prepare_seconds`,
            `train_seconds`, `steady_rows`, `process_peak_rss_bytes`, ...
        artifacts: `{relative path: sha256 hex}` of every file of the run.
        defaults: the `"auto"` config keys and the values chosen (`ensemble.config.auto`).
        search: a search run's record; aggregated_members: the members the ensemble uses when
            `aggregate` chose them; failed_by: the command whose fault failed the run.
        extra: keys this version does not know, written back as read.
    """

    schema_version: int = SCHEMA_VERSION
    run_id: str | None = None
    mode: str | None = None
    status: str | None = None
    pid: int | None = None
    host: str | None = None
    created: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    config_sha256: str | None = None
    dataset: DatasetRecord = field(default_factory=DatasetRecord)
    task: str | None = None
    model: ModelRecord | None = None
    devices: list[Any] | None = None
    cluster: dict[str, Any] | None = None
    placement: dict[str, Any] | None = None
    members: list[MemberRecord] = field(default_factory=list)
    versions: dict[str, Any] | None = None
    tensorflow_build: dict[str, Any] | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] | None = None
    search: dict[str, Any] | None = None
    aggregated_members: list[int] | None = None
    failed_by: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # `mode` and `status` are strings or absent (`manifest_schema`): never written as null
    _ALWAYS = frozenset({"run_id", "config", "dataset", "members", "cluster", "tensorflow_build",
                         "timings"})
    _NESTED = {"dataset": _dataset, "members": _members, "model": _model}

    @classmethod
    def load(cls, run_dir: str | Path) -> "Manifest":
        """The manifest of run `run_dir`.

        Raises:
            UsageError: not a run directory, a manifest that is not JSON or of the wrong
                shape (names the field), or one written by a newer schema.
        """
        manifest = cls.from_dict({"schema_version": 0, **artifacts.read_manifest(run_dir)})
        _check_version(manifest, run_dir)
        return manifest

    def save(self, run_dir: str | Path) -> None:
        """Write it as `run_dir/manifest.json` atomically (`artifacts.atomic_path`), stamped
        with this `SCHEMA_VERSION`. Only the run's writer (or the holder of the manifest lock:
        `update`) calls it."""
        self.schema_version = SCHEMA_VERSION
        artifacts.write_manifest(run_dir, self.to_dict())

    @staticmethod
    def update(run_dir: str | Path, change: Callable[["Manifest"], None],
               known: "Manifest | None" = None) -> "Manifest":
        """`manifest.update`: read (or take `known`), `change` in place and write, under the
        manifest lock."""
        return update(run_dir, change, known)

    def member(self, index: int) -> MemberRecord:
        """The record of member `index`.

        Raises:
            UsageError: the run has no such member (names the run's member count).
        """
        found = [m for m in self.members if m.index == index]
        if not found:
            raise UsageError(f"Expected a member index in 0..{len(self.members) - 1}. "
                             f"Received: {index}")
        return found[0]

    def hashes(self) -> dict[str, str]:
        """Every sha256 the manifest records: `{relative path: hex}` of the run's artifacts
        and of each member's files."""
        out = dict(self.artifacts)
        for m in self.members:
            out.update(m.sha256 or {})
        return out

    def record_hashes(self, run_dir: str | Path, paths) -> None:
        """Record the sha256 of `paths` (files of run `run_dir`) in `artifacts`."""
        for p in paths:
            self.artifacts[os.path.relpath(p, run_dir)] = artifacts.file_sha256(p)

    def diverged(self) -> dict[int, int]:
        """`{index: diverged_epoch}` of the members recorded as diverged."""
        return {m.index: m.diverged_epoch or 0 for m in self.members if m.status == "diverged"}

    def builder_sha256(self, spec: str) -> str | None:
        """The sha256 the run records for builder `spec`'s source file (None: none)."""
        return self.model.builders.get(spec) if self.model is not None else None


def load(run_dir: str | Path) -> Manifest:
    """`Manifest.load(run_dir)`."""
    return Manifest.load(run_dir)


def update(run_dir: str | Path, change: Callable[[Manifest], None],
           known: Manifest | None = None) -> Manifest:
    """Read the manifest, apply `change` (which edits the `Manifest` in place) and write it,
    all under the run's manifest lock (`runlock.update_manifest`): a client's record of its
    member and the launcher's record of the run never overwrite each other. `known`: the
    manifest as this process last saved it, used when the file is still that one (nothing
    is read back).

    Returns:
        The manifest as written.

    Raises:
        UsageError: not a run directory, or a bad manifest (`Manifest.load`); RuntimeError:
            the manifest lock stayed busy (`runlock.MANIFEST_LOCK_SECONDS`).
    """
    written: list[Manifest] = []

    def on_dict(data: dict[str, Any]) -> None:
        manifest = Manifest.from_dict(data)
        _check_version(manifest, run_dir)
        change(manifest)
        manifest.schema_version = SCHEMA_VERSION
        data.clear()
        data.update(manifest.to_dict())
        written.append(manifest)

    runlock.update_manifest(run_dir, on_dict, None if known is None else known.to_dict())
    return written[0]


def _check_version(manifest: Manifest, run_dir) -> None:
    if manifest.schema_version > SCHEMA_VERSION:
        raise UsageError(f"Manifest {str(Path(run_dir) / artifacts.MANIFEST)!r} has "
                         f"schema_version {manifest.schema_version}; this version of ensemble "
                         f"reads up to {SCHEMA_VERSION}: upgrade ensemble to use the run.")
