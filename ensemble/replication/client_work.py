"""A client's work (`ensemble.replication.client` is its process): train or predict a queue of
members of a prepared run, one graph per member.

A client is a long-lived process pinned to its device(s): it reads a prepared run directory
(config, scaled splits, placement) and trains its queue of members one after another, each in
its own graph (a `group.MemberGroup` of one member, the same per-member step as in-graph), and
writes each member's model, history and predictions as soon as that member is done: a member,
not a process, is the unit of work, failure and resume. The aggregator combines the members'
prediction files, never their models.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from ensemble.core import artifacts
from ensemble.core import interrupt
from ensemble.core import runlock
from ensemble.core.manifest import Manifest, MemberRecord
from ensemble.tasks import tables
from ensemble.tasks.eval_writer import CHUNK_ROWS, output_files
from ensemble.tasks.predicted import SplitPredictions
from ensemble import tasks
from ensemble.replication.cluster import naming_unreachable_tasks
from ensemble.core.errors import UsageError
from ensemble.data.npz import is_npz
from ensemble.replication.protocol import ClientRequest
from ensemble.replication.visible import local_devices, local_replica_devices



def _member_entry(manifest: Manifest, index: int) -> MemberRecord:
    members = manifest.members
    if not 0 <= index < len(members):
        raise UsageError(
            f"Expected `--member` in 0..{len(members) - 1}. Received: member={index}")
    return members[index]


def _start_client(manifest: Manifest, indices: Sequence[int], threads: int | None,
                  devices_: Sequence[str] | None = None, cluster: dict | None = None):
    """Configure this process's TensorFlow for its members; return (cfg, local device names,
    cluster).

    The members' devices are `devices_` or the manifest's; on a cluster (`cluster` or the
    manifest's) the client connects to it and uses the remote devices as they are.
    """
    from ensemble.config import schema
    from ensemble.replication import devices
    from ensemble.replication.cluster import connect, task_of

    cfg = schema.from_dict(manifest.config)
    cluster = cluster or manifest.cluster
    wanted = list(devices_) if devices_ else [_member_entry(manifest, i).device
                                               for i in indices]
    groups = None if devices_ else [_member_entry(manifest, i).replicas or [d]
                                    for i, d in zip(indices, wanted)]
    if groups is not None and any(len(g) > 1 for g in groups):  # data-parallel members
        env, groups, n_cpus = local_replica_devices(groups)
        local = [g[0] for g in groups]
    else:
        (env, local), groups, n_cpus = local_devices(wanted), None, 0
    os.environ.update(env)
    # inter-op: the client's share of the cores; intra-op (the threads of one op): the run's
    # `training.intra_op_threads`, as in-graph (members equal across modes), or the share
    devices.set_threads(cfg.training.intra_op_threads or threads, threads)
    if n_cpus > 1:
        devices.split_cpu(n_cpus)
    devices.configure(cfg)
    if cluster is not None:
        spans = groups is not None and len({d.split("/device:")[0] for g in groups
                                            for d in g}) > 1
        cluster = cluster if spans else task_of(cluster, local[0])  # replicas on other tasks
        connect(cluster)
    return cfg, local, cluster, groups


def run_client(run_dir: Path, indices: int | Sequence[int], threads: int | None = None,
               callbacks: Callable[[int], Sequence] | None = None,
               on_member_done: Callable[[int, float], None] | None = None) -> list[Path]:
    """Train members `indices` of a prepared run one after another, each in its own graph,
    and write each one's files atomically as soon as it is done.

    Writes `members/member-<i>.keras`, `.history.parquet` and `.predictions.parquet`
    (validation and test rows, the columns of docs/reference/run-directory.md). Saves
    checkpoints under
    `checkpoints/member-<i>/` (every `training.checkpoint_every` epochs) and resumes from them
    when they exist.

    Args:
        threads: TensorFlow inter-op threads for this client, and intra-op ones when
            `training.intra_op_threads` is 0 (None: TF's default).
        callbacks: member index -> its `training.Callback`s (progress).
        on_member_done: called with (member index, its work seconds) after its files are
            written.

    Returns:
        The members' predictions paths.

    Holds each member's lock (`runlock`) while it runs and records each member's status and
    its files' sha256 in the manifest as soon as it ends.

    Raises:
        UsageError: not a prepared run, an index out of range, or the run (or a member) held
            by another process.
        cluster.ClusterError: on a cluster, a member's task is unreachable.
        interrupt.Interrupted: SIGINT/SIGTERM; the member is recorded as interrupted.
    """
    indices = [indices] if isinstance(indices, int) else list(indices)
    manifest = Manifest.load(run_dir)
    for index in indices:
        _member_entry(manifest, index)
    runlock.require_free(run_dir)  # no writer but the launcher that started this client
    with runlock.member_locks(run_dir, indices):
        cfg, local, cluster, groups = _start_client(manifest, indices, threads)
        work = MemberWork.open(run_dir, manifest, cfg)
        out = []
        with naming_unreachable_tasks(cluster):
            for k, (index, device) in enumerate(zip(indices, local)):
                start = time.perf_counter()
                path = _run_member(work, index, device,
                                   callbacks(index) if callbacks is not None else (),
                                   groups[k] if groups else None)
                if path is None:  # diverged: no files
                    continue
                out.append(path)
                if on_member_done is not None:
                    on_member_done(index, time.perf_counter() - start)
    return out


def _run_member(work: "MemberWork", index: int, device: str, callbacks: Sequence,
                replicas: Sequence[str] | None) -> Path | None:
    """Train member `index`, write its files (its predictions a chunk of rows at a time, as
    they are predicted) and record its outcome (completed, diverged: None, interrupted or
    failed: re-raised with `member` set on an `Interrupted`)."""
    try:
        with _placement_log(work.run_dir, index):
            outputs = train_member(work, index, device, callbacks, replicas, streamed=True)
            if isinstance(outputs, MemberOutputs):  # predicted while written
                path = outputs.write(work.run_dir, index)
    except BaseException as exc:
        stopped = isinstance(exc, interrupt.Interrupted)
        if stopped:
            exc.member = index
        record_member(work.run_dir, index, "interrupted" if stopped else "failed")
        raise
    if isinstance(outputs, int):  # diverged in that epoch
        record_member(work.run_dir, index, "diverged", outputs)
        return None
    record_member(work.run_dir, index, "completed")
    return path


def record_member(run_dir: Path, index: int, status: str, epoch: int | None = None) -> None:
    """Record a member's status in the manifest, with its files' sha256 when completed (the
    client's own record, which the aggregator verifies); read-modify-write under the lock."""
    from ensemble.core.artifacts import member_files

    hashes = ({os.path.relpath(p, run_dir): artifacts.file_sha256(p)
               for p in member_files(run_dir, index)} if status == "completed" else None)

    def change(manifest: Manifest) -> None:
        entry = manifest.members[index]
        entry.status = status
        # `divergence.STATUS`: the epoch its values turned non-finite (None: not diverged)
        entry.diverged_epoch = epoch
        if hashes is not None:
            entry.sha256 = hashes

    Manifest.update(run_dir, change)


def _placement_log(run_dir: Path, index: int):
    """TensorFlow's placement log of member `index` to `RUN/placement/member-<i>.log` when the
    launcher asks for it (`--log-device-placement`), else nothing."""
    import contextlib

    from ensemble.replication import placement_log

    if os.environ.get(placement_log.ENV) != "1":
        return contextlib.nullcontext()
    return placement_log.capture(Path(run_dir) / "placement" / f"member-{index}.log")


@dataclass(frozen=True)
class MemberWork:
    """What training a prepared run's members needs, read once for every member
    (`train_member`): the manifest, its resolved config (`schema.Config`), the splits
    (`split` -> `(x [n, *row_shape], y [n], rows [n] int64)`), the preprocessing
    (`kinds.read_preprocessing`), where member checkpoints go (`checkpoints/member-<i>/`
    under it), and the run directory when this process may write into it (None: a worker
    that never opens it, as under the Ray engine; TensorBoard scalars then are not written).
    """

    manifest: Manifest
    cfg: Any
    split: dict
    pre: Any
    checkpoints: Path
    run_dir: Path | None = None

    @classmethod
    def open(cls, run_dir: Path, manifest: Manifest, cfg) -> "MemberWork":
        """The work of the prepared run in `run_dir`, its files verified against `manifest`.

        Raises:
            UsageError: a split or the preprocessing is missing or damaged.
        """
        from ensemble.data import kinds

        run_dir = Path(run_dir)
        return cls(manifest, cfg,
                   {s: artifacts.read_split(run_dir, s, manifest) for s in artifacts.SPLITS},
                   kinds.run_preprocessing(run_dir, manifest), run_dir / "checkpoints", run_dir)


@dataclass(frozen=True)
class MemberOutputs:
    """What training one member yields: its Keras 3 file's bytes (`model`), its history
    (`tables.history_table`) and its validation and test predictions
    (`tables.predictions_table`'s rows), written by `write` as the run's member files.

    `predictions` is one table in memory (a Ray task's result, shipped to the launcher), or
    an iterable of row chunks of it, predicted as they are written (`write` then holds one
    chunk of rows at a time).
    """

    model: bytes
    history: pa.Table
    predictions: pa.Table | Iterable[pa.Table]

    def write(self, run_dir: Path, index: int) -> Path:
        """Write `members/member-<i>.keras`, `.history.parquet` and `.predictions.parquet`
        atomically (the predictions a Parquet row group per chunk); returns the predictions
        path."""
        with artifacts.atomic_path(artifacts.member_model_path(run_dir, index),
                                   suffix=".keras") as tmp:
            Path(tmp).write_bytes(self.model)
        artifacts.write_parquet(artifacts.member_history_path(run_dir, index), self.history)
        out = artifacts.member_predictions_path(run_dir, index)
        if isinstance(self.predictions, pa.Table):
            artifacts.write_parquet(out, self.predictions)
            return out
        artifacts.write_parquet_chunks(out, self.predictions)
        return out


def train_member(work: MemberWork, index: int, device: str, callbacks: Sequence = (),
                 replicas: Sequence[str] | None = None,
                 streamed: bool = False) -> MemberOutputs | int:
    """Train member `index` of `work` on `device` (data parallel over `replicas` when more
    than one); returns its `MemberOutputs`, or the epoch in which it diverged
    (`ensemble.replication.divergence`). Writes nothing but its checkpoints (under
    `work.checkpoints`) and, with a `work.run_dir`, its TensorBoard scalars. `callbacks`:
    its `training.Callback`s. `streamed`: the outputs' predictions are row chunks predicted
    as `MemberOutputs.write` writes them (memory flat in the rows); else one table."""
    import tempfile

    from ensemble.replication.group import MemberGroup
    from ensemble.models.members import save_member
    from ensemble.replication.training import Schedule

    manifest, cfg, split = work.manifest, work.cfg, work.split
    classes = np.asarray(manifest.dataset.classes)
    (x_tr, y_tr, _), (x_val, y_val, _) = split["train"], split["validation"]
    task = tasks.for_run(manifest)
    member = MemberGroup.build(cfg, x_tr.shape[1:], len(classes), [device], [index],
                               n_train=len(x_tr), pre=work.pre, task=task)
    if replicas is not None and len(replicas) > 1:  # data parallelism over the client's devices
        member.train_replicas = [list(replicas)]
    if cfg.training.tensorboard and work.run_dir is not None:
        from ensemble.replication.tensorboard import MemberScalars

        callbacks = [*callbacks, MemberScalars(work.run_dir)]
    work.checkpoints.mkdir(parents=True, exist_ok=True)
    with output_files(work.checkpoints) as files:  # the epochs' validation outputs, on disk
        history = member.fit(x_tr, y_tr, (x_val, y_val), Schedule.of(cfg.training),
                             work.checkpoints / f"member-{index}", callbacks,
                             allocate=files.new)
        member.validation_outputs = None  # its file goes with the folder
    if member.divergence.epochs:
        return member.divergence.epochs[index]
    with tempfile.TemporaryDirectory(prefix="ensemble-member-") as tmp:
        path = Path(tmp) / f"member-{index}.keras"
        save_member(member.models[0], path)
        model = path.read_bytes()
    chunks = prediction_chunks(member, index, split, classes)
    return MemberOutputs(model, tables.history_table(history, task.score_names),
                         chunks if streamed else pa.concat_tables(list(chunks)))


def prediction_chunks(member, index: int, split: dict, classes: np.ndarray,
                      chunk_rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """Member `index`'s validation and test prediction rows (`tables.predictions_table`'s,
    in its order), predicted and built about `chunk_rows` rows at a time.

    Args:
        member: its `group.MemberGroup` of one member; split: `split` -> `(x [n, *row_shape],
            y [n], rows [n] int64)` (arrays or memory maps); classes: `[n_classes]` labels
            (empty: regression).

    Each chunk is a whole number of `member.predict`'s calls (`group.predict_rows`), so the
    rows are predicted in the same calls as one `predict` of the split: the same values.
    """
    from ensemble.replication.group import predict_rows

    for s in artifacts.EVAL_SPLITS:
        x, y, rows = split[s]
        call = predict_rows(x.shape[1:])
        step = call * max(1, chunk_rows // call)
        for lo in range(0, len(x), step) if len(x) else [0]:
            hi = lo + step
            probs = member.predict(x[lo:hi])[0][0]
            yield tables.predictions_table(
                s, SplitPredictions({index: probs}, None, rows[lo:hi], y[lo:hi], lo), classes,
                task=member.task)


def predict_client(request: ClientRequest, cluster: dict | None = None) -> list[Path]:
    """Predict the rows of `request.predict` with members `request.members`, each in its own
    graph on its device (`request.devices`, default: the member's device in the run; on
    `cluster`, a loaded spec).

    `request.predict` is either, for a table run, a `.npz` (`x` `[n_rows, n_features]` float32
    scaled, optional `y` class indices): each member's prediction rows go to `request.out` (a
    `.parquet` file for one member) or `out/member-<i>.parquet`; or a data source (`.parquet` /
    `.csv` file or folder; for an array run an `.npz` or image folder too), streamed in
    batches of `request.batch_size` rows (`InputStream`): the input is read once and every batch goes through each member; `out/member-<i>.parquet` then holds
    only its outputs (`c<k>` float32 per output) and `y` (class index, null when unknown),
    one row per input row in order, for `ensemble.runs.between.aggregate_stream`.

    Returns:
        The written paths, one per member.
    """
    from ensemble.replication.group import MemberGroup
    from ensemble.models.members import load_run_member

    run_dir, indices, out = Path(request.run), list(request.members), Path(request.out)
    manifest = Manifest.load(run_dir)
    for index in indices:
        _member_entry(manifest, index)
    runlock.require_free(run_dir)
    # a table run's `.npz` holds scaled rows (`_read_npz`); an array run's is a data source
    npz = is_npz(request.predict) and bool(manifest.dataset.feature_names)
    if npz:
        x, y = _read_npz(Path(request.predict), len(manifest.dataset.feature_names))
        if (len(indices) > 1 or not str(out).endswith(".parquet")) and out.is_file():
            raise UsageError(f"client: --out {out} is a file; expected a folder for the "
                             f"members' files")
    _, local, cluster, _ = _start_client(manifest, indices, request.threads, request.devices,
                                         cluster)
    task = tasks.for_run(manifest)
    groups = {index: MemberGroup([load_run_member(run_dir, manifest, index, device)],
                                 [device], [index], task=task)
              for index, device in zip(indices, local)}
    if not npz:
        return _predict_stream(request, manifest, groups)
    classes = np.asarray(manifest.dataset.classes)
    paths = []
    for index, group in groups.items():
        probs = group.predict(x)[0][0]
        table = tables.predictions_table(
            "predict", SplitPredictions({index: probs}, None, np.arange(len(x)), y), classes,
            task=task)
        target_path = (Path(out) if len(indices) == 1 and str(out).endswith(".parquet")
                       else Path(out) / f"member-{index}.parquet")
        artifacts.write_parquet(target_path, table)
        paths.append(target_path)
    return paths


def _read_npz(path: Path, n_features: int) -> tuple[np.ndarray, np.ndarray | None]:
    """`(x [n_rows, n_features] float32, y [n_rows] class indices or None)` of a client's
    `--predict X.npz` (no pickle).

    Raises:
        UsageError: missing, unreadable or not `.npz`, no `x`, or `x` of another shape.
    """
    import zipfile

    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files") or "x" not in z.files:
                raise UsageError(f"client: --predict {path} holds no array `x`; expected an "
                                 ".npz with x [n_rows, n_features] and optional y.")
            x, y = z["x"], (z["y"] if "y" in z.files else None)
    except UsageError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UsageError(f"client: cannot read --predict {path} as .npz: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    if x.ndim != 2 or x.shape[1] != n_features:
        raise UsageError(f"client: expected --predict x of shape [n_rows, {n_features}]. "
                         f"Received: {list(x.shape)}")
    return x.astype(np.float32, copy=False), y


def _predict_stream(request: ClientRequest, manifest: Manifest, groups: dict) -> list[Path]:
    """`predict_client` of a streamed source: `groups` (member -> its `MemberGroup`) write
    `out/member-<i>.parquet` batch by batch."""
    import contextlib

    from ensemble.data import kinds
    from ensemble.data.prediction_io import PredictionWriter, prefetch

    run_dir = Path(request.run)
    pre = kinds.read_preprocessing(artifacts.verify(run_dir, manifest,
                                                    run_dir / artifacts.PREPROCESSING))
    target = request.target or manifest.dataset.target_or("target")
    stream = kinds.input_stream(pre, request.predict, target, quiet=True,
                                batch_rows=request.batch_size)
    paths = {i: Path(request.out) / f"member-{i}.parquet" for i in groups}
    ytype = tasks.for_run(manifest).target_type()  # the y_true column's type
    with contextlib.ExitStack() as stack:
        writers = {i: stack.enter_context(PredictionWriter(p)) for i, p in paths.items()}
        for b in prefetch(stream):
            y = pa.array(b.y, ytype) if b.y is not None else pa.nulls(len(b.x), ytype)
            for i, group in groups.items():
                probs = group.predict(b.x)[0][0]
                cols = {f"c{k}": pa.array(probs[:, k]) for k in range(probs.shape[1])}
                writers[i].write(pa.table({**cols, "y": y}))
    return list(paths.values())
