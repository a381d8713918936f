"""Verifying a finished run's files before they are used (`predict`, `export`, `aggregate`).

A run directory can be edited between `train` and its next user. Before a run's files are
used, `verify_run` checks:

- the builder files: each user builder's source file must still have the sha256 the manifest
  recorded at training (`model.builders`); it is hashed *without being imported*, since
  importing it runs its code. A changed file is refused with one line naming it; with
  `trust_builder` the change is accepted and the new sha256 recorded in the manifest
  (`model.builders_trusted` keeps the old ones).
- the members: the manifest's member list agrees with its config (`members.count`, indices
  `0..n-1`), and every member of the ensemble (`ensemble_members`: all but the diverged ones,
  or the members a partial between-graph aggregation used) has its model file, matching its
  recorded sha256.
- the predictions: `predictions.parquet` (when the run has one) holds exactly those members.

Every failure is a `UsageError` (one line, exit status 2 at the CLI).
"""

from __future__ import annotations

from pathlib import Path
from ensemble.core import artifacts
from ensemble.core.manifest import Manifest
from ensemble.models.builder_files import check_builders
from ensemble.replication.divergence import STATUS as DIVERGED
from ensemble.core.errors import UsageError


def ensemble_members(manifest: Manifest) -> list[int]:
    """The indices of the members a run's ensemble stacks, in order: every member the
    manifest lists except the diverged ones (`ensemble.replication.divergence`), restricted to
    `aggregated_members` when a partial between-graph aggregation recorded them."""
    used = [m.index for m in manifest.members if m.status != DIVERGED]
    if manifest.aggregated_members is not None:
        chosen = set(manifest.aggregated_members)
        used = [i for i in used if i in chosen]
    return used


def check_members(run_dir: str | Path, manifest: Manifest) -> list[int]:
    """Check the run's member list and every ensemble member's model file (see the module
    docstring); returns `ensemble_members(manifest)`.

    Raises:
        UsageError: a member list that disagrees with the config, a member file missing or
            changed (named), no member left.
    """
    members = manifest.members
    count = (manifest.config.get("members") or {}).get("count")
    if count is not None and count != len(members):
        raise UsageError(f"Run {run_dir}: its manifest lists {len(members)} members but its "
                         f"config trained {count}; the run is damaged.")
    if [m.index for m in members] != list(range(len(members))):
        raise UsageError(f"Run {run_dir}: its manifest's member indices are "
                         f"{[m.index for m in members]}; expected 0..{len(members) - 1}"
                         "; the run is damaged.")
    used = ensemble_members(manifest)
    if not used:
        raise UsageError(f"Run {run_dir} has no member to use (every member diverged).")
    for i in used:
        artifacts.verify(run_dir, manifest, artifacts.member_model_path(run_dir, i))
    return used


def check_predictions(run_dir: str | Path, manifest: Manifest, used: list[int]) -> None:
    """Refuse a run whose `predictions.parquet` (when it has one; verified against its
    sha256) holds other members than `used`.

    Raises:
        UsageError: the members differ (both lists named).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(run_dir) / artifacts.PREDICTIONS
    if not path.is_file():
        return
    artifacts.verify(run_dir, manifest, path)
    found: set[int] = set()
    with artifacts.opened(path, "predictions file"), pq.ParquetFile(path) as file:
        for batch in file.iter_batches(columns=["member"]):  # flat in the rows
            found.update(pc.unique(batch.column(0).drop_null()).to_pylist())
    have = sorted(found)
    if have != sorted(used):
        raise UsageError(f"Run {run_dir}: {artifacts.PREDICTIONS} holds members {have} but the "
                         f"manifest's ensemble is members {sorted(used)}; the run is damaged "
                         "(rerun `ensemble aggregate` if members were removed on purpose).")


def check_preprocessing(run_dir: str | Path, manifest: Manifest, pre=None) -> None:
    """Refuse a `preprocessing.json` (verified against its sha256) that does not fit the run:
    its model input shape or classes differ from the manifest's `dataset`, or its scaler's
    lengths differ from its features (a file from another run, or edited). `pre`: the file's
    content when the caller read it (`kinds.run_preprocessing`).

    Raises:
        UsageError: names the file and the mismatch.
    """
    from ensemble.data import kinds

    path = Path(run_dir) / artifacts.PREPROCESSING
    if pre is None and not path.is_file():
        return
    pre = pre if pre is not None else kinds.run_preprocessing(run_dir, manifest)
    dataset = manifest.dataset
    with artifacts.opened(path, "preprocessing file"):
        shape = tuple(pre.input_shape)
        want = dataset.input_shape
        if want is not None and shape != tuple(want):
            raise ValueError(f"its model input has shape {list(shape)}, the run's members take "
                             f"{list(want)}")
        classes = dataset.classes
        if classes is not None and [str(c) for c in pre.classes.tolist()] != \
                [str(c) for c in classes]:
            raise ValueError(f"its classes {pre.classes.tolist()[:10]} differ from the run's "
                             f"{classes[:10]}")
        for key in ("mean", "scale"):
            values = getattr(pre, key, None)
            if values is not None and len(values) not in (0, shape[0] if shape else 0,
                                                          len(getattr(pre, "feature_names", ()))):
                raise ValueError(f"its `{key}` has {len(values)} values for {shape} inputs")


def verify_run(run_dir: str | Path, manifest: Manifest, trust_builder: bool = False,
               predictions: bool = True, pre=None) -> list[int]:
    """All of the checks above, builders first (before anything imports them); returns the
    ensemble's member indices. `pre`: the run's preprocessing when the caller read it.

    Raises:
        UsageError: see `check_builders`, `check_members`, `check_preprocessing`,
            `check_predictions`.
    """
    check_builders(run_dir, manifest, trust_builder)
    used = check_members(run_dir, manifest)
    check_preprocessing(run_dir, manifest, pre)
    if predictions:
        check_predictions(run_dir, manifest, used)
    return used
