"""Between-graph replication: one graph and one client process per member.

A client reads a prepared run directory (config, scaled splits, placement), builds ITS member's
graph on its device, trains it with the same per-member step as the in-graph builder (a client
is the in-graph builder restricted to one member), and writes that member's model, history and
predictions. The aggregator combines the members' prediction files, never their models.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble import artifacts, tables
from ensemble.cluster import naming_unreachable_tasks
from ensemble.data import encode
from ensemble.errors import UsageError

def local_device(device: str) -> tuple[dict[str, str], str]:
    """Map a run's device name to what a client process sees of it.

    A client sees only its own device: for `/device:GPU:k` it sets `CUDA_VISIBLE_DEVICES=k`
    and uses `/device:GPU:0`; a (logical) CPU device is the client's whole `/device:CPU:0`.

    Returns:
        (environment variables to set before TensorFlow starts, device name in the client).
    """
    if "/job:" in device and "/job:localhost" not in device:
        return {}, device
    kind, _, index = device.rpartition("device:")[2].partition(":")
    if kind == "GPU":
        return {"CUDA_VISIBLE_DEVICES": index}, "/device:GPU:0"
    return {}, "/device:CPU:0"


def _member_entry(manifest: dict, index: int) -> dict:
    members = manifest["members"]
    if not 0 <= index < len(members):
        raise UsageError(
            f"Expected `--member` in 0..{len(members) - 1}. Received: member={index}")
    return members[index]


def _start_client(manifest: dict, index: int, threads: int | None, device: str | None = None,
                  cluster: dict | None = None):
    """Configure this process's TensorFlow for one member; return (cfg, device, cluster).

    The member's device is `device` or the manifest's; on a cluster (`cluster` or the
    manifest's) the client connects to it and uses the remote device as it is.
    """
    from ensemble import config, devices
    from ensemble.cluster import connect, task_of

    cfg = config.from_dict(manifest["config"])
    cluster = cluster or manifest.get("cluster")
    env, device = local_device(device or _member_entry(manifest, index)["device"])
    os.environ.update(env)
    devices.set_threads(threads, threads)
    import tensorflow as tf

    if cfg.training.deterministic:
        tf.config.experimental.enable_op_determinism()
    if cluster is not None:
        cluster = task_of(cluster, device)
        connect(cluster)
    return cfg, device, cluster


def run_client(run_dir: Path, index: int, threads: int | None = None) -> Path:
    """Train member `index` of a prepared run and write its files atomically.

    Writes `members/member-<index>.keras`, `.history.parquet` and `.predictions.parquet`
    (validation and test rows, the columns of DESIGN.md). Saves a checkpoint after every
    epoch under `checkpoints/member-<index>/` and resumes from it when one exists.

    Args:
        threads: TensorFlow intra/inter-op threads for this client (None: TF's default).

    Returns:
        The member's predictions path.

    Raises:
        UsageError: not a prepared run, or `index` out of range.
        cluster.ClusterError: on a cluster, the member's task is unreachable.
    """
    manifest = artifacts.read_manifest(run_dir)
    cfg, device, cluster = _start_client(manifest, index, threads)
    with naming_unreachable_tasks(cluster):
        return _train_member(run_dir, manifest, cfg, index, device)


def _train_member(run_dir: Path, manifest: dict, cfg, index: int, device: str) -> Path:
    from ensemble.in_graph import InGraphEnsemble
    from ensemble.members import save_member

    split = {s: artifacts.read_split(run_dir, s) for s in artifacts.SPLITS}
    classes = np.asarray(manifest["dataset"]["classes"])
    (x_tr, y_tr, _), (x_val, y_val, _) = split["train"], split["validation"]
    start = time.perf_counter()
    member = InGraphEnsemble.build(cfg, x_tr.shape[1], len(classes), [device], [index],
                                   aggregators=())  # a client aggregates nothing
    history = member.fit(x_tr, y_tr, x_val, y_val, cfg.training.seed, cfg.training.epochs,
                         cfg.training.batch_size, run_dir / "checkpoints" / f"member-{index}")
    parts = [tables.predictions_table({index: member.predict(split[s][0])[0][0]}, s,
                                      split[s][2], split[s][1], classes, ())
             for s in artifacts.EVAL_SPLITS]
    save_member(member.models[0], artifacts.member_model_path(run_dir, index))
    artifacts.write_parquet(artifacts.member_history_path(run_dir, index),
                            tables.history_table(history))
    out = artifacts.member_predictions_path(run_dir, index)
    artifacts.write_parquet(out, pa.concat_tables(parts))
    print(f"member {index}: trained on {device} in {time.perf_counter() - start:.2f} s")
    return out


def predict_client(run_dir: Path, index: int, x_path: Path, out: Path,
                   threads: int | None = None, device: str | None = None,
                   cluster: dict | None = None) -> Path:
    """Predict the rows of `x_path` (`.npz` with `x` `[n_rows, n_features]` float32, optional
    `y` class indices) with member `index` only, on `device` (default: the member's device
    in the run); write its prediction rows to `out`."""
    manifest = artifacts.read_manifest(run_dir)
    _, device, cluster = _start_client(manifest, index, threads, device, cluster)
    from ensemble.in_graph import InGraphEnsemble
    from ensemble.members import load_member

    with np.load(x_path, allow_pickle=False) as z:
        x, y = z["x"], (z["y"] if "y" in z.files else None)
    path = artifacts.verify(run_dir, manifest, artifacts.member_model_path(run_dir, index))
    model = load_member(path, device)
    probs = InGraphEnsemble([model], [device], ()).predict(x)[0][0]
    table = tables.predictions_table({index: probs}, "predict", np.arange(len(x)), y,
                                     np.asarray(manifest["dataset"]["classes"]), ())
    artifacts.write_parquet(out, table)
    return out


def aggregate_files(paths: Sequence[Path], aggregators: Sequence[str]) -> pa.Table:
    """The aggregator: combine member prediction files into the full predictions table.

    Reads only the files; per split, applies the numpy aggregators to the stacked member
    probabilities `[n_members, n_rows, n_classes]`.

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
                                              y, classes, aggregators))
    return pa.concat_tables(parts)
