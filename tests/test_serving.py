"""Serving: the SavedModel export loads in a plain TensorFlow process (this package not
imported) and reproduces the run's test predictions; streaming predict; replicas over devices.

One tiny run with string labels and every aggregator is shared by the module."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import run_cli

AGGREGATORS = ["mean", "vote", "geometric", "weighted", "greedy", "stacking", "temperature"]


@pytest.fixture(scope="module")
def string_run(tmp_path_factory):
    """digits with labels `d0`..`d9` in a Parquet file; 3 members, 1 epoch, every aggregator."""
    from sklearn.datasets import load_digits

    base = tmp_path_factory.mktemp("serving")
    d = load_digits()
    cols = {f"px{i}": d.data[:, i] for i in range(64)}
    cols["digit"] = np.array([f"d{k}" for k in d.target])
    pq.write_table(pa.table(cols), base / "digits.parquet")
    (base / "run.toml").write_text(f"""
[data]
source = "{base / 'digits.parquet'}"
target = "digit"
[members]
count = 3
hidden = [16]
[training]
epochs = 1
batch_size = 64
seed = 3
[placement]
devices = "cpu:2"
[aggregation]
aggregators = {json.dumps(AGGREGATORS)}
stacking_folds = 2
""")
    assert run_cli("train", "--config", base / "run.toml", "--run-dir", base / "run",
                   "--quiet") == 0
    return base


def _test_rows(base: Path):
    """Raw test inputs `[n_rows, 64]` and the run's test predictions per model."""
    preds = pq.read_table(base / "run" / "predictions.parquet")
    preds = preds.filter(pc.equal(preds.column("split"), "test"))
    first = preds.filter(pc.equal(preds.column("model"), "member-0"))
    rows = first.column("source_row").to_numpy()
    raw = pq.read_table(base / "digits.parquet")
    x = np.column_stack([raw.column(f"px{i}").to_numpy()[rows] for i in range(64)])
    classes = [f"d{k}" for k in range(10)]
    by_model = {}
    for model in set(preds.column("model").to_pylist()):
        t = preds.filter(pc.equal(preds.column("model"), model))
        t = t.take(pc.sort_indices(t.column("row")))
        by_model[model] = (np.column_stack([t.column(f"p_{c}").to_numpy() for c in classes]),
                           t.column("y_pred").to_pylist())
    return x.astype(np.float32), by_model


LOADER = """
import json, sys
import numpy as np
import tensorflow as tf
assert "ensemble" not in sys.modules and "pipelines" not in sys.modules
m = tf.saved_model.load(sys.argv[1])
x = tf.constant(np.load(sys.argv[2]))
out = {"feature_names": m.feature_names.numpy().astype(str).tolist(),
       "classes": m.classes.numpy().astype(str).tolist()}
for name, fn in m.signatures.items():
    r = fn(features=x)
    out[name] = {k: (v.numpy().astype(str) if v.dtype == tf.string else v.numpy()).tolist()
                 for k, v in r.items()}
json.dump(out, open(sys.argv[3], "w"))
# then TensorFlow's own `saved_model_cli show --all`, in this process (one TensorFlow start)
import runpy
sys.argv = ["saved_model_cli", "show", "--dir", sys.argv[1], "--all"]
runpy.run_module("tensorflow.python.tools.saved_model_cli", run_name="__main__")
"""


def test_export_serves_the_run_in_a_plain_tensorflow_process(string_run, tmp_path, capsys):
    from ensemble.runs.export import DEFAULT_SIGNATURE

    out = tmp_path / "models"
    assert run_cli("export", "--run", string_run / "run", "--out", out,
                   "--aggregator", "stacking") == 0
    version = out / "1"
    assert (version / "saved_model.pb").is_file()
    assert (version / "assets" / "feature_names.txt").read_text().split() == \
        [f"px{i}" for i in range(64)]
    x, expected = _test_rows(string_run)
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run([sys.executable, "-c", LOADER, str(version), str(tmp_path / "x.npy"),
                           str(tmp_path / "out.json")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    served = json.loads((tmp_path / "out.json").read_text())
    assert served.pop("feature_names") == [f"px{i}" for i in range(64)]
    assert served.pop("classes") == [f"d{k}" for k in range(10)]
    assert set(served) == {DEFAULT_SIGNATURE, *AGGREGATORS}
    for name in AGGREGATORS:
        probs, labels = expected[f"ensemble-{name}"]
        got = served[name]
        assert np.abs(np.asarray(got["probabilities"]) - probs).max() <= 1e-6, name
        if name != "vote":  # vote shares tie; the table and the graph break ties alike
            assert got["labels"] == labels, name
        members = np.asarray(got["member_probabilities"])
        assert members.shape == (len(x), 3, 10)
        for k in range(3):
            assert np.abs(members[:, k] - expected[f"member-{k}"][0]).max() <= 1e-6
    assert served[DEFAULT_SIGNATURE]["probabilities"] == served["stacking"]["probabilities"]
    assert set(served["mean"]["labels"]) <= {f"d{k}" for k in range(10)}
    listing = proc.stdout
    for name in [DEFAULT_SIGNATURE, *AGGREGATORS]:
        assert f"signature_def['{name}']" in listing
    assert "features" in listing and "labels" in listing


def test_export_hard_wires_no_device(string_run, tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    from ensemble.runs.export import export_run

    version = export_run(string_run / "run", tmp_path, version=7, aggregator="mean")
    assert version == tmp_path / "7"
    sm = saved_model_pb2.SavedModel.FromString((version / "saved_model.pb").read_bytes())
    graph = sm.meta_graphs[0].graph_def
    # TensorFlow's own checkpoint save/restore functions run on the host CPU on any machine
    nodes = [n for f in graph.library.function if "_traced_save" not in f.signature.name
             and "_traced_restore" not in f.signature.name for n in f.node_def]
    assert sum(n.op == "MatMul" for n in nodes) >= 2 * 3 * len(AGGREGATORS)
    assert [n.device for n in nodes if n.device] == []


def test_export_refuses_bad_requests(string_run, tmp_path, capsys):
    out = tmp_path / "models"
    out.mkdir()
    (out / "1").mkdir()
    assert run_cli("export", "--run", string_run / "run", "--out", out, "--version", "1") == 2
    err = capsys.readouterr().err.strip()
    assert "already exists" in err and "next free: 2" in err and len(err.splitlines()) == 1
    assert run_cli("export", "--run", string_run / "run", "--out", out,
                   "--aggregator", "median") == 2
    assert "'median'" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["1"]  # nothing half-written left


def _expect_equal(out: Path, expected: dict, n_rows: int):
    got = pq.read_table(out)
    classes = [f"d{k}" for k in range(10)]
    assert set(got.column("split").to_pylist()) == {"predict"}
    for model, (probs, labels) in expected.items():
        t = got.filter(pc.equal(got.column("model"), model))
        assert t.column("row").to_pylist() == list(range(n_rows)), model  # in order
        p = np.column_stack([t.column(f"p_{c}").to_numpy() for c in classes])
        assert np.abs(p - probs).max() <= 1e-6, model
        assert t.column("y_pred").to_pylist() == labels, model
    return got


def _raw_test_table(base: Path) -> pa.Table:
    preds = pq.read_table(base / "run" / "predictions.parquet")
    first = preds.filter(pc.and_(pc.equal(preds.column("split"), "test"),
                                 pc.equal(preds.column("model"), "member-0")))
    first = first.take(pc.sort_indices(first.column("row")))
    return pq.read_table(base / "digits.parquet").take(first.column("source_row"))


def test_streamed_csv_folder_in_small_batches_equals_the_run(string_run, tmp_path, capsys):
    """A folder of two CSV files (and an extra `id` column), read in batches of 100 rows that
    straddle the files, gives the run's own test predictions, rows in order."""
    import pyarrow.csv as pcsv

    raw = _raw_test_table(string_run)
    raw = raw.append_column("id", pa.array(np.arange(raw.num_rows)))
    folder = tmp_path / "input"
    folder.mkdir()
    pcsv.write_csv(raw.slice(0, 150), folder / "part-0.csv")
    pcsv.write_csv(raw.slice(150), folder / "part-1.csv")
    _, expected = _test_rows(string_run)
    out = tmp_path / "pred.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", string_run / "run", "--data", folder, "--out", out,
                   "--batch-size", "100", "--layout", "long") == 0
    captured = capsys.readouterr()
    assert captured.err.count("ignoring column 'id'") == 1
    assert f"predicted {raw.num_rows:,} rows" in captured.out
    got = _expect_equal(out, expected, raw.num_rows)
    member0 = got.filter(pc.equal(got.column("model"), "member-0"))
    assert member0.column("y_true").to_pylist() == raw.column("digit").to_pylist()
    record = json.loads((tmp_path / "pred.parquet.manifest.json").read_text())
    assert record["rows"] == raw.num_rows and record["batch_size"] == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input", "pred.parquet",
                                                          "pred.parquet.manifest.json"]
    # the default layout: one row per input, its id carried through, the probabilities of
    # the aggregator of lowest validation NLL, in both modes (the batches straddle the files)
    fit = json.loads((string_run / "run" / "aggregators.json").read_text())
    nll = fit["out_of_fold_nll"]  # what the default is chosen on
    best = min((nll[a], i, a) for i, a in enumerate(fit["aggregators"]) if nll[a] is not None)[2]
    for mode in ("in-graph", "between-graph"):
        wide = tmp_path / f"wide-{mode}.csv"
        assert run_cli("predict", "--run", string_run / "run", "--data", folder, "--out", wide,
                       "--batch-size", "100", "--mode", mode, "--quiet") == 0
        w = pcsv.read_csv(wide)
        assert w.column("id").to_pylist() == list(range(raw.num_rows))
        p = np.column_stack([w.column(f"p_d{k}").to_numpy() for k in range(10)])
        assert np.abs(p - expected[f"ensemble-{best}"][0]).max() <= 1e-5
        assert "model" not in w.column_names


def test_predict_rows_per_second_is_over_the_whole_prediction_in_both_modes(
        string_run, tmp_path, capsys):
    """Issue 40: the printed `predicted N rows in S s (R rows/s)` and the prediction manifest
    time the whole prediction, member loading (in-graph) and client processes (between-graph)
    included, not only the last stage (a between-graph predict printed 0.5 s of a 10 s wall)."""
    import re
    import time

    pq.write_table(_raw_test_table(string_run), tmp_path / "in.parquet")
    for mode in ("in-graph", "between-graph"):
        out = tmp_path / f"pred-{mode}.parquet"
        capsys.readouterr()
        start = time.perf_counter()
        assert run_cli("predict", "--run", string_run / "run", "--data", tmp_path / "in.parquet",
                       "--out", out, "--mode", mode) == 0
        wall = time.perf_counter() - start
        line = re.search(r"predicted ([\d,]+) rows in ([\d.]+) s \(([\d,]+) rows/s\)",
                         capsys.readouterr().out)
        rows, seconds, rate = (float(g.replace(",", "")) for g in line.groups())
        record = json.loads(out.with_name(out.name + ".manifest.json").read_text())
        assert record["rows"] == rows and abs(record["seconds"] - seconds) < 0.06
        assert abs(rate - rows / record["seconds"]) <= 0.01 * rate + 1
        assert 0.5 * wall <= record["seconds"] <= wall, (mode, record["seconds"], wall)


def test_bad_value_mid_stream_leaves_nothing(string_run, tmp_path, capsys):
    raw = _raw_test_table(string_run)
    px = raw.column("px5").to_numpy().astype(float)
    px[250] = np.inf
    bad = tmp_path / "bad.parquet"
    pq.write_table(raw.set_column(raw.schema.get_field_index("px5"), "px5", pa.array(px)), bad)
    out = tmp_path / "out" / "pred.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", string_run / "run", "--data", bad, "--out", out,
                   "--batch-size", "100") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rows 200..299" in err and "'px5'" in err
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_replicas_run_on_their_own_devices_and_change_nothing(string_run, tmp_path):
    """3 members x 2 replicas over 4 logical CPUs: every replica's ops (read from the traced
    graph) on its own device, its weights there too, and the same probabilities as whole
    members (CLI too: the prediction's manifest records member -> devices)."""
    from ensemble.replication import devices
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.models.members import load_member
    from ensemble.replication.placement import replica_devices

    run_dir = string_run / "run"
    devs = devices.split_cpu(4)
    groups = replica_devices(3, devs, 2)
    copies = [[(load_member(run_dir / "members" / f"member-{i}.keras", d), d) for d in g]
              for i, g in enumerate(groups)]
    from ensemble import tasks

    whole = InGraphEnsemble([c[0][0] for c in copies], [g[0] for g in groups], ["mean"],
                            task=tasks.get())
    replicated = InGraphEnsemble([c[0][0] for c in copies], [g[0] for g in groups], ["mean"],
                                 task=tasks.get())
    replicated.set_replicas(dict(enumerate(copies)))
    graph = replicated.predict_fn.get_concrete_function().graph
    for k, group in enumerate(groups):
        assert len(set(group)) == 2
        for j, device in enumerate(group):
            ops = [op for op in graph.get_operations()
                   if op.name.startswith(f"replica_{k}_{j}/") and op.type == "MatMul"]
            assert len(ops) == 2 and {op.device for op in ops} == {device}
            assert all(v.value.device.endswith(device[len("/device"):])
                       for v in copies[k][j][0].trainable_variables)
    x, _ = _test_rows(string_run)
    x = ((x - np.asarray(json.loads((run_dir / "preprocessing.json").read_text())["mean"]))
         / np.asarray(json.loads((run_dir / "preprocessing.json").read_text())["scale"])
         ).astype(np.float32)
    for rows in (len(x), 7, 1):  # uneven splits, and a replica with no row
        (m1, e1), (m2, e2) = whole.predict(x[:rows]), replicated.predict(x[:rows])
        assert np.abs(m1 - m2).max() <= 1e-6 and np.abs(e1["mean"] - e2["mean"]).max() <= 1e-6

    out = tmp_path / "pred.parquet"
    pq.write_table(_raw_test_table(string_run), tmp_path / "in.parquet")
    assert run_cli("predict", "--run", run_dir, "--data", tmp_path / "in.parquet", "--out",
                   out, "--devices", "cpu:4", "--replicas", "2", "--quiet", "--layout",
                   "long") == 0
    record = json.loads((tmp_path / "pred.parquet.manifest.json").read_text())
    assert [m["devices"] for m in record["members"]] == groups
    _expect_equal(out, _test_rows(string_run)[1], len(x))


@pytest.mark.parametrize("members, n_devices, replicas, expected", [
    (4, 8, "auto", [[0, 4], [1, 5], [2, 6], [3, 7]]),  # devices // members: every device works
    (3, 4, "auto", [[0], [1], [2]]),
    (3, 4, "2", [[0, 3], [1, 0], [2, 1]]),  # a member's replicas on distinct devices
    (2, 1, "auto", [[0], [0]]),
    (2, 4, "3", [[0, 2, 1], [1, 3, 2]]),  # (i + 2j) mod 4 repeats at j = 2: moved on by one
    (2, 4, "4", [[0, 2, 1, 3], [1, 3, 2, 0]]),
])
def test_replica_devices_table(members, n_devices, replicas, expected):
    from ensemble.replication.placement import replica_devices

    devs = [f"/device:GPU:{i}" for i in range(n_devices)]
    assert replica_devices(members, devs, replicas) == [[devs[i] for i in g] for g in expected]


@pytest.mark.parametrize("replicas", [0, 5, "two", True])
def test_replica_devices_refuses(replicas):
    from ensemble.core.errors import UsageError
    from ensemble.replication.placement import replica_devices

    with pytest.raises(UsageError, match=r"--replicas to be auto or an integer in 1\.\.4"):
        replica_devices(2, [f"/device:GPU:{i}" for i in range(4)], replicas)
