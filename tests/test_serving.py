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
out = {}
for name, fn in m.signatures.items():
    r = fn(features=x)
    out[name] = {k: (v.numpy().astype(str) if v.dtype == tf.string else v.numpy()).tolist()
                 for k, v in r.items()}
json.dump(out, open(sys.argv[3], "w"))
"""


def test_export_serves_the_run_in_a_plain_tensorflow_process(string_run, tmp_path, capsys):
    from ensemble.export import DEFAULT_SIGNATURE

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
    cli = Path(sys.executable).with_name("saved_model_cli")
    show = ([str(cli)] if cli.is_file() else
            [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli"])
    procs = [subprocess.Popen([sys.executable, "-c", LOADER, str(version), str(tmp_path / "x.npy"),
                               str(tmp_path / "out.json")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
             subprocess.Popen([*show, "show", "--dir", str(version), "--all"], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
    served = json.loads((tmp_path / "out.json").read_text())
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
    listing = results[1][0]
    for name in [DEFAULT_SIGNATURE, *AGGREGATORS]:
        assert f"signature_def['{name}']" in listing
    assert "features" in listing and "labels" in listing


def test_export_hard_wires_no_device(string_run, tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    from ensemble.export import export_run

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


def test_export_refuses_categorical_columns():
    from ensemble.errors import UsageError
    from ensemble.export import check_exportable
    from ensemble.preprocessing import Preprocessing

    pre = Preprocessing(("a",), np.zeros(3), np.ones(3), np.array([0, 1]),
                        categories={"colour": ["blue", "red"]})
    with pytest.raises(UsageError, match="categorical columns \\(colour\\)"):
        check_exportable(pre)
