"""The run context: a run's resolved config, manifest, task, preprocessing and paths, built once.

The command that creates a run (`RunContext.create`, from what `prepare` computed) or opens
one (`RunContext.open`, from its files, each verified against its recorded sha256) builds the
context; train, predict, evaluate, aggregate, export and the members table take it instead of
re-reading the manifest, re-resolving the `"auto"` keys or the task, or reading back the
preprocessing the process wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ensemble.config.schema import Config, from_dict
from ensemble.core import artifacts
from ensemble.core.manifest import Manifest


@dataclass(frozen=True)
class RunContext:
    """One run, resolved.

    Attributes:
        path: the run directory.
        manifest: its typed `manifest.json` (`Manifest`; the record the run's writer updates).
        config: the resolved `Config` (no `"auto"` key left: `ensemble.config.auto`).
        task: the run's `Task` (`ensemble.tasks.for_run` of the manifest).
        preprocessing: the fitted preprocessing (`preprocessing.json`, any input kind).
    """

    path: Path
    manifest: Manifest
    config: Config
    task: Any
    preprocessing: Any

    @property
    def input_kind(self) -> str:
        """The run's input kind (`ensemble.data.kinds`): `table`, `arrays`, `images`, ..."""
        return self.preprocessing.kind

    @property
    def classes(self) -> list:
        """The class labels (`[]` for regression)."""
        return list(self.manifest.dataset.classes or [])

    @classmethod
    def create(cls, path: str | Path, config: Config, manifest: Manifest,
               preprocessing) -> RunContext:
        """The context of a run this process prepared: `config` resolved, `manifest` and
        `preprocessing` as it wrote them (nothing is read back)."""
        from ensemble import tasks

        return cls(Path(path), manifest, config, tasks.for_run(manifest), preprocessing)

    @classmethod
    def open(cls, path: str | Path, manifest: Manifest | None = None,
             preprocessing=None) -> RunContext:
        """The context of the run in `path`: its manifest and its `preprocessing.json`
        (verified against its sha256), or those the caller read (`manifest`,
        `preprocessing`), with its config and task.

        Callers that check a run's builder files first (`preflight.verify_run`) load the
        manifest, check, then pass it: resolving the config imports the builders.

        Raises:
            UsageError: not a run directory, a damaged manifest or preprocessing file, or a
                config this version cannot read (names the key).
        """
        from ensemble import tasks
        from ensemble.data import kinds

        path = Path(path).expanduser()
        manifest = manifest if manifest is not None else Manifest.load(path)
        if preprocessing is None:
            preprocessing = kinds.run_preprocessing(path, manifest)
        return cls(path, manifest, from_dict(manifest.config), tasks.for_run(manifest),
                   preprocessing)

    def with_manifest(self, manifest: Manifest) -> RunContext:
        """The same run with `manifest` (the one its writer last saved)."""
        return replace(self, manifest=manifest)

    def file(self, name: str) -> Path:
        """The path of run file `name` (`artifacts.PREDICTIONS`, `members/member-0.keras`)."""
        return self.path / name

    def verified(self, name: str) -> Path:
        """Run file `name`, checked against the sha256 the manifest records
        (`artifacts.verify`).

        Raises:
            UsageError: missing, unhashed or changed (names the file).
        """
        return artifacts.verify(self.path, self.manifest, self.path / name)


def config_of(manifest: Manifest) -> Config:
    """The run's resolved `Config` (its manifest's `config`).

    Raises:
        UsageError: a config the manifest records that this version cannot read (names the key).
    """
    return from_dict(manifest.config)


def dropped_columns(manifest: Manifest) -> tuple[str, ...]:
    """The columns the run's training left out (`data.drop`), read from the recorded config
    as it is: resolving it (`config_of`) would import the run's builder before `predict`'s
    preflight checks the builder file's sha256."""
    return tuple((manifest.config.get("data") or {}).get("drop") or ())
