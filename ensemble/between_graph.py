"""Between-graph replication: one graph per member, trained by long-lived client processes.

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
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble import artifacts, interrupt, runlock, tables, tasks
from ensemble.cluster import naming_unreachable_tasks
from ensemble.data import encode
from ensemble.errors import UsageError

def local_devices(devices: Sequence[str], visible: str | None = None
                  ) -> tuple[dict[str, str], list[str]]:
    """Map the run's device names of a client's members to what the client process sees.

    A client sees only its own devices: for GPUs it sets `CUDA_VISIBLE_DEVICES` to theirs (in
    order of first use) and names them `/device:GPU:0..`; a (logical) CPU device is the
    client's whole `/device:CPU:0`; a cluster device stays as it is. GPU `k` of the run is the
    `k`-th GPU this process may use: the `k`-th entry of the parent's `CUDA_VISIBLE_DEVICES`
    (`visible`, default the environment's) when set, as under Slurm or Kubernetes
    (`CUDA_VISIBLE_DEVICES=2,3`: run GPU 1 is physical GPU 3), else physical GPU `k`.

    Returns:
        (environment variables to set before TensorFlow starts, `[len(devices)]` device names
        in the client).

    Raises:
        UsageError: a run GPU beyond the parent's visible GPUs (names both).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    parent = None if visible is None else [v.strip() for v in visible.split(",") if v.strip()]
    gpus: list[str] = []
    names = []
    for device in devices:
        if "/job:" in device and "/job:localhost" not in device:
            names.append(device)
            continue
        kind, _, index = device.rpartition("device:")[2].partition(":")
        if kind == "GPU":
            if parent is not None:
                if not index.isdigit() or int(index) >= len(parent):
                    raise UsageError(f"Device {device} of the run is not visible here: "
                                     f"CUDA_VISIBLE_DEVICES={visible!r} shows {len(parent)} "
                                     "GPU(s).")
                index = parent[int(index)]
            if index not in gpus:
                gpus.append(index)
            names.append(f"/device:GPU:{gpus.index(index)}")
        else:
            names.append("/device:CPU:0")
    return ({"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}), names


def local_replica_devices(groups: Sequence[Sequence[str]], visible: str | None = None
                          ) -> tuple[dict[str, str], list[list[str]], int]:
    """`local_devices` for a client whose members have several replicas each (data
    parallelism): GPUs as `local_devices` maps them; the distinct (logical) CPU devices, in
    order of first use, become this client's `/device:CPU:0..k-1`, so the client must split
    its CPU into `k` logical devices (`devices.split_cpu`) before TensorFlow initialises;
    cluster devices stay as they are.

    Args:
        groups: `[n_members]` lists of the run's replica device names (replica 0 first).

    Returns:
        (environment variables, `[n_members]` lists of device names in the client, `k`: the
        logical CPU devices the client needs, 0 for none).
    """
    flat = [d for g in groups for d in g]
    env, names = local_devices(flat, visible)
    cpus = list(dict.fromkeys(d for d, n in zip(flat, names) if n == "/device:CPU:0"))
    names = [f"/device:CPU:{cpus.index(d)}" if n == "/device:CPU:0" else n
             for d, n in zip(flat, names)]
    out, at = [], 0
    for g in groups:
        out.append(names[at:at + len(g)])
        at += len(g)
    return env, out, len(cpus)


def local_device(device: str) -> tuple[dict[str, str], str]:
    """`local_devices` of one device: (environment variables, device name in the client)."""
    env, names = local_devices([device])
    return env, names[0]


def _member_entry(manifest: dict, index: int) -> dict:
    members = manifest["members"]
    if not 0 <= index < len(members):
        raise UsageError(
            f"Expected `--member` in 0..{len(members) - 1}. Received: member={index}")
    return members[index]


def _start_client(manifest: dict, indices: Sequence[int], threads: int | None,
                  devices_: Sequence[str] | None = None, cluster: dict | None = None):
    """Configure this process's TensorFlow for its members; return (cfg, local device names,
    cluster).

    The members' devices are `devices_` or the manifest's; on a cluster (`cluster` or the
    manifest's) the client connects to it and uses the remote devices as they are.
    """
    from ensemble import config, devices
    from ensemble.cluster import connect, task_of

    cfg = config.from_dict(manifest["config"])
    cluster = cluster or manifest.get("cluster")
    wanted = list(devices_) if devices_ else [_member_entry(manifest, i)["device"]
                                               for i in indices]
    groups = None if devices_ else [_member_entry(manifest, i).get("replicas") or [d]
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
    (validation and test rows, the columns of DESIGN.md). Saves checkpoints under
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
    manifest = artifacts.read_manifest(run_dir)
    for index in indices:
        _member_entry(manifest, index)
    runlock.require_free(run_dir)  # no writer but the launcher that started this client
    with runlock.member_locks(run_dir, indices):
        cfg, local, cluster, groups = _start_client(manifest, indices, threads)
        split = {s: artifacts.read_split(run_dir, s, manifest) for s in artifacts.SPLITS}
        out = []
        with naming_unreachable_tasks(cluster):
            for k, (index, device) in enumerate(zip(indices, local)):
                start = time.perf_counter()
                cbs = callbacks(index) if callbacks is not None else ()
                try:
                    with _placement_log(run_dir, index):
                        out.append(_train_member(run_dir, manifest, cfg, split, index, device,
                                                 cbs, groups[k] if groups else None))
                except BaseException as exc:
                    stopped = isinstance(exc, interrupt.Interrupted)
                    if stopped:
                        exc.member = index
                    _record_member(run_dir, index, "interrupted" if stopped else "failed")
                    raise
                _record_member(run_dir, index, "completed")
                if on_member_done is not None:
                    on_member_done(index, time.perf_counter() - start)
    return out


def _record_member(run_dir: Path, index: int, status: str) -> None:
    """Record a member's status in the manifest, with its files' sha256 when completed (the
    client's own record, which the aggregator verifies); read-modify-write under the lock."""
    from ensemble.run import member_files

    hashes = ({os.path.relpath(p, run_dir): artifacts.sha256_file(p)
               for p in member_files(run_dir, index)} if status == "completed" else None)

    def change(manifest: dict) -> None:
        entry = manifest["members"][index]
        entry["status"] = status
        if hashes is not None:
            entry["sha256"] = hashes

    runlock.update_manifest(run_dir, change)


def _placement_log(run_dir: Path, index: int):
    """TensorFlow's placement log of member `index` to `RUN/placement/member-<i>.log` when the
    launcher asks for it (`--log-device-placement`), else nothing."""
    import contextlib

    from ensemble import placement_log

    if os.environ.get(placement_log.ENV) != "1":
        return contextlib.nullcontext()
    return placement_log.capture(Path(run_dir) / "placement" / f"member-{index}.log")


def _train_member(run_dir: Path, manifest: dict, cfg, split: dict, index: int, device: str,
                  callbacks: Sequence, replicas: Sequence[str] | None = None) -> Path:
    from ensemble.group import MemberGroup
    from ensemble.members import save_member
    from ensemble.training import Schedule

    classes = np.asarray(manifest["dataset"]["classes"])
    (x_tr, y_tr, _), (x_val, y_val, _) = split["train"], split["validation"]
    from ensemble.preprocessing import Preprocessing

    member = MemberGroup.build(cfg, x_tr.shape[1:], len(classes), [device], [index],
                               n_train=len(x_tr), pre=Preprocessing.of_run(run_dir, manifest),
                               task=tasks.for_run(manifest))
    if replicas is not None and len(replicas) > 1:  # data parallelism over the client's devices
        member.train_replicas = [list(replicas)]
    if cfg.training.tensorboard:
        from ensemble.tensorboard import MemberScalars

        callbacks = [*callbacks, MemberScalars(run_dir)]
    history = member.fit(x_tr, y_tr, x_val, y_val, Schedule.of(cfg.training),
                         run_dir / "checkpoints" / f"member-{index}", callbacks)
    parts = [tables.predictions_table({index: member.predict(split[s][0])[0][0]}, s,
                                      split[s][2], split[s][1], classes, ())
             for s in artifacts.EVAL_SPLITS]
    save_member(member.models[0], artifacts.member_model_path(run_dir, index))
    artifacts.write_parquet(artifacts.member_history_path(run_dir, index),
                            tables.history_table(history))
    out = artifacts.member_predictions_path(run_dir, index)
    artifacts.write_parquet(out, pa.concat_tables(parts))
    return out


def predict_client(run_dir: Path, indices: int | Sequence[int], x_path: Path, out: Path,
                   threads: int | None = None, devices_: Sequence[str] | None = None,
                   cluster: dict | None = None, batch_rows: int | None = None,
                   target: str | None = None) -> list[Path]:
    """Predict the rows of `x_path` with members `indices`, each in its own graph on its
    device (`devices_`, default: the member's device in the run).

    `x_path` is either a `.npz` (`x` `[n_rows, n_features]` float32 scaled, optional `y` class
    indices): each member's prediction rows go to `out` (a `.parquet` file for one member) or
    `out/member-<i>.parquet`; or a data source (`.parquet` / `.csv` file or folder), streamed
    in batches of `batch_rows` (`ensemble.stream.InputStream`): the input is read once and
    every batch goes through each member; `out/member-<i>.parquet` then holds only its
    probabilities (`c<k>` float32 per class index) and `y` (class index, null when unknown),
    one row per input row in order, for `pipelines.between.aggregate_stream`.

    Returns:
        The written paths, one per member.
    """
    from ensemble.group import MemberGroup
    from ensemble.members import load_run_member

    indices = [indices] if isinstance(indices, int) else list(indices)
    manifest = artifacts.read_manifest(run_dir)
    for index in indices:
        _member_entry(manifest, index)
    runlock.require_free(run_dir)
    npz = str(x_path).endswith(".npz")
    if npz:
        x, y = _read_npz(Path(x_path), len(manifest["dataset"]["feature_names"]))
        if (len(indices) > 1 or not str(out).endswith(".parquet")) and Path(out).is_file():
            raise UsageError(f"client: --out {out} is a file; expected a folder for the "
                             f"members' files")
    _, local, cluster, _ = _start_client(manifest, indices, threads, devices_, cluster)
    groups = {}
    for index, device in zip(indices, local):
        groups[index] = MemberGroup([load_run_member(run_dir, manifest, index, device)],
                                    [device], [index])
    if not npz:
        return _predict_stream(run_dir, manifest, groups, str(x_path), Path(out), batch_rows,
                               target)
    classes = np.asarray(manifest["dataset"]["classes"])
    paths = []
    for index, group in groups.items():
        probs = group.predict(x)[0][0]
        table = tables.predictions_table({index: probs}, "predict", np.arange(len(x)), y,
                                         classes, ())
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


def _predict_stream(run_dir: Path, manifest: dict, groups: dict, source: str, out: Path,
                    batch_rows: int | None, target: str | None) -> list[Path]:
    import contextlib

    from ensemble.preprocessing import Preprocessing
    from ensemble.stream import DEFAULT_BATCH_ROWS, PredictionWriter, input_stream, prefetch

    pre = Preprocessing.read(artifacts.verify(run_dir, manifest,
                                              Path(run_dir) / artifacts.PREPROCESSING))
    stream = input_stream(pre, source, target or manifest["dataset"].get("target", "target"),
                         batch_rows=batch_rows or DEFAULT_BATCH_ROWS, quiet=True)
    paths = {i: out / f"member-{i}.parquet" for i in groups}
    with contextlib.ExitStack() as stack:
        writers = {i: stack.enter_context(PredictionWriter(p)) for i, p in paths.items()}
        for b in prefetch(stream):
            ytype = pa.int32() if len(pre.classes) else pa.float64()  # regression: targets
            y = pa.array(b.y, ytype) if b.y is not None else pa.nulls(len(b.x), ytype)
            for i, group in groups.items():
                probs = group.predict(b.x)[0][0]
                cols = {f"c{k}": pa.array(probs[:, k]) for k in range(probs.shape[1])}
                writers[i].write(pa.table({**cols, "y": y}))
    return list(paths.values())


def aggregate_files(paths: Sequence[Path], aggregators: Sequence[str],
                    params: dict | None = None) -> pa.Table:
    """The aggregator: combine member prediction files into the full predictions table.

    Reads only the files; per split, applies the numpy aggregators to the stacked member
    probabilities `[n_members, n_rows, n_classes]`, fitted ones with `params` (`{name:
    params}` of `aggregators.json`).

    Raises:
        UsageError: a missing member file (named), or files whose rows do not line up.
    """
    for path in paths:
        if not Path(path).is_file():
            raise UsageError(f"Member predictions missing: {path}; run that member's client "
                             "(`ensemble client --run RUN --member I`) first.")
    member_tables = [artifacts.read_parquet(p) for p in paths]
    classes = tables.classes_from(member_tables[0])
    parts = []
    for split in dict.fromkeys(member_tables[0].column("split").to_pylist()):
        probs, first = {}, None
        for path, t in zip(paths, member_tables):
            t = t.filter(pc.equal(t.column("split"), split))
            if first is None:
                first = t
            elif t.column("source_row") != first.column("source_row"):
                raise UsageError(f"Rows of {path} do not match the other members' rows.")
            probs[t.column("member")[0].as_py()] = tables.probabilities(t, classes)
        y = first.column("y_true")
        y = None if y.null_count else encode(y.to_numpy(zero_copy_only=False), classes)
        parts.append(tables.predictions_table(probs, split, first.column("source_row").to_numpy(),
                                              y, classes, aggregators, params=params))
    return pa.concat_tables(parts)
