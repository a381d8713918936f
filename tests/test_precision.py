"""Mixed precision (`training.precision`): members compute in the lower type with float32
variables and outputs, are the same in both modes, across `--jobs` and member counts, and keep
their policy through resume, predict and export; loss scaling skips non-finite steps."""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import run_cli, set_status

CONFIG = """
[members]
hidden = [32]
[training]
epochs = 2
batch_size = 32
learning_rate = 0.005
seed = 3
precision = "mixed_bfloat16"
"""
# name -> (members, mode, jobs): one client training two members in turn, against in-graph
RUNS = {"ig3": (3, "in-graph", None), "bg2-jobs1": (2, "between-graph", 1)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The `RUNS` in `mixed_bfloat16` on digits: `{name: run_dir}`."""
    base = tmp_path_factory.mktemp("precision")
    (base / "bf16.toml").write_text(CONFIG)
    out = {}
    for name, (members, mode, jobs) in RUNS.items():
        out[name] = base / name
        assert run_cli("train", "--config", base / "bf16.toml", "--members", members, "--mode",
                       mode, "--run-dir", out[name], "--quiet",
                       *(["--jobs", jobs] if jobs else [])) == 0
    return out


def _member_probs(run_dir):
    """`{member: [n_test, n_classes]}` test probabilities of each member of a run."""
    t = pq.read_table(run_dir / "predictions.parquet").to_pandas()
    t = t[(t.split == "test") & t.member.notna()].sort_values(["member", "row"])
    cols = [c for c in t.columns if c.startswith("p_")]
    return {int(m): g[cols].to_numpy(np.float64) for m, g in t.groupby("member")}


def _policies(member_file) -> set[str]:
    """The dtype policy names in a saved member's `config.json`."""
    text = zipfile.ZipFile(member_file).read("config.json").decode()
    found = set()

    def walk(node):
        if isinstance(node, dict):
            if node.get("class_name") == "DTypePolicy":
                found.add(node["config"]["name"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(text))
    return found


def test_bfloat16_members_are_equal_across_modes_jobs_and_member_counts(runs):
    ig, bg = _member_probs(runs["ig3"]), _member_probs(runs["bg2-jobs1"])
    assert sorted(ig) == [0, 1, 2] and sorted(bg) == [0, 1]
    for k in bg:
        assert np.abs(ig[k] - bg[k]).max() <= 1e-6, k
    t = pq.read_table(runs["ig3"] / "metrics.parquet").to_pandas()
    test = t[(t.split == "test") & t.member.notna()]
    assert test.accuracy.min() > 0.8  # they learned (chance is 0.1)
    # the builder's layers computed in bfloat16, the head in float32
    assert _policies(runs["bg2-jobs1"] / "members" / "member-1.keras") == {"mixed_bfloat16",
                                                                            "float32"}


def test_predict_and_export_keep_the_policy(runs, tmp_path, plain_tf):
    run = runs["bg2-jobs1"]
    assert run_cli("predict", "--run", run, "--data", "digits", "--layout", "long",
                   "--out", tmp_path / "p.parquet") == 0
    pred = pq.read_table(tmp_path / "p.parquet")
    mine = pq.read_table(run / "predictions.parquet")
    mine = mine.filter(pc.and_(pc.equal(mine.column("split"), "test"),
                               pc.equal(mine.column("model"), "ensemble-mean")))
    rows = mine.column("source_row").to_numpy()
    want = np.column_stack([mine.column(f"p_{c}").to_numpy() for c in range(10)])
    theirs = pred.filter(pc.equal(pred.column("model"), "ensemble-mean"))
    got = np.column_stack([theirs.column(f"p_{c}").to_numpy() for c in range(10)])[rows]
    # as trained: members rebuilt in float32 would differ by bfloat16's rounding (~1e-3)
    assert np.abs(got - want).max() <= 1e-5

    assert run_cli("export", "--run", run, "--out", tmp_path / "models") == 0
    from sklearn.datasets import load_digits

    np.save(tmp_path / "x.npy", load_digits().data[rows].astype(np.float32))
    code = ("import sys, numpy as np, tensorflow as tf\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "p = m.signatures['serving_default'](features=tf.constant(np.load(sys.argv[2])))\n"
            "assert p['probabilities'].dtype == tf.float32\n"
            "np.save(sys.argv[3], p['probabilities'].numpy())\n")
    proc = plain_tf.run(code, tmp_path / "models" / "1", tmp_path / "x.npy",
                        tmp_path / "served.npy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert np.abs(np.load(tmp_path / "served.npy") - want).max() <= 1e-5


def test_resume_rebuilds_the_members_in_their_precision(runs, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(runs["ig3"], run_dir)
    ckpt = run_dir / "checkpoints" / "in-graph"
    newest = sorted(ckpt.glob("ckpt-1.data-*"))[0]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # damaged
    set_status(run_dir, "failed")
    assert run_cli("train", "--resume", "--run-dir", run_dir, "--quiet") == 0
    got, want = _member_probs(run_dir), _member_probs(runs["ig3"])
    for k in want:  # epoch 1 trained again from ckpt-0, in bfloat16
        assert np.abs(got[k] - want[k]).max() <= 1e-6, k


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_member_computes_in_the_lower_type_with_float32_variables_and_outputs(precision):
    import tensorflow as tf

    from ensemble import tasks
    from ensemble.models.members import build_member
    from ensemble.models.optimizer import build_optimizer
    from ensemble.replication.training import train_step

    task = tasks.get()
    model = build_member("mlp", {"hidden": [16]}, (8,), 3, 1, "m", task, precision=precision)
    opt = build_optimizer(model, 1e-2, precision=precision)
    assert {v.dtype for v in model.weights} == {"float32"}
    assert {v.dtype for v in opt.variables} <= {tf.float32, tf.int64}
    x = tf.random.stateless_normal([32, 8], [1, 2])
    y = tf.argmax(x[:, :3], axis=1, output_type=tf.int32)  # learnable
    step = tf.function(lambda: train_step(model, opt, x, y, task), autograph=False)
    graph = step.get_concrete_function().graph
    lower = tf.bfloat16 if precision == "mixed_bfloat16" else tf.float16
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    assert matmuls and all(op.get_attr("T") == lower for op in matmuls)
    assert model(x).dtype == "float32"
    before = [v.numpy() for v in model.trainable_weights]
    step()
    # Adam's first step moves each weight by about the learning rate; gradients lost to
    # float16 underflow, or unscaled by a scale they were never multiplied by, fall below
    # its epsilon (1e-7) and barely move them
    moved = np.concatenate([np.abs(v.numpy() - b).ravel()
                            for v, b in zip(model.trainable_weights, before)])
    assert np.median(moved) > 0.5e-2
    losses = [float(step()) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0]  # it trains (loss scaled and unscaled for float16)


def test_loss_scaling_skips_a_non_finite_step_and_grows_after_finite_ones():
    import keras
    import tensorflow as tf

    from ensemble.models.optimizer import Adam
    from ensemble.models.precision import LossScaled

    var, ref_var = keras.Variable([1.0, -2.0]), keras.Variable([1.0, -2.0])  # as a member's
    opt = LossScaled(Adam([var], 0.1), initial_scale=8.0, growth_steps=2)
    ref = Adam([ref_var], 0.1)
    assert float(opt.scale_loss(tf.constant(1.5))) == 12.0
    opt.apply([tf.constant([np.inf, 8.0])])  # skipped, scale halved
    assert var.numpy().tolist() == [1.0, -2.0] and float(opt.scale) == 4.0
    for g in ([0.5, -1.0], [2.0, 0.25]):  # gradients of the scaled loss: g x scale
        opt.apply([tf.constant(g) * opt.scale])
        ref.apply([tf.constant(g)])
    np.testing.assert_allclose(var.numpy(), ref_var.numpy(), rtol=0, atol=1e-7)
    assert float(opt.scale) == 8.0 and int(opt.good_steps) == 0  # doubled after 2 finite


def test_notice_when_the_cpu_lacks_the_lower_type(tmp_path):
    from ensemble.models.precision import check_hardware

    plain, bf16 = tmp_path / "plain", tmp_path / "bf16"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    bf16.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16\n")
    text = check_hardware("mixed_bfloat16", False, plain)
    assert "mixed_bfloat16" in text and "avx512_bf16" in text and "float32" in text
    assert check_hardware("mixed_bfloat16", False, bf16) is None
    assert check_hardware("mixed_bfloat16", True, plain) is None  # a GPU: its tensor cores
    assert "mixed_float16" in check_hardware("mixed_float16", False, bf16)
    assert check_hardware("float32", False, plain) is None
    assert check_hardware("mixed_bfloat16", False, tmp_path / "missing") is None


def test_a_mixed_precision_process_takes_onednn_tensors_from_the_system_allocator(monkeypatch):
    from ensemble.config import schema
    from ensemble.models.precision import SYSTEM_ALLOCATOR
    from ensemble.replication import devices

    monkeypatch.setenv(SYSTEM_ALLOCATOR, "0")  # so that monkeypatch restores the variable
    monkeypatch.delenv(SYSTEM_ALLOCATOR)  # unset, as in a fresh shell
    devices.configure(schema.load(None, {"training.precision": "float32"}))
    assert SYSTEM_ALLOCATOR not in os.environ  # float32 keeps TensorFlow's pool
    devices.configure(schema.load(None, {"training.precision": "mixed_bfloat16"}))
    assert os.environ[SYSTEM_ALLOCATOR] == "1"
    monkeypatch.setenv(SYSTEM_ALLOCATOR, "0")  # the user's own setting stays
    devices.configure(schema.load(None, {"training.precision": "mixed_float16"}))
    assert os.environ[SYSTEM_ALLOCATOR] == "0"


def test_bad_precision_is_refused_naming_it(capsys):
    from ensemble.config import schema
    from ensemble.core.errors import UsageError

    with pytest.raises(UsageError, match="training.precision.*mixed_float16.*'bfloat16'"):
        schema.load(None, overrides={"training.precision": "bfloat16"})
    assert run_cli("train", "--precision", "half") == 2
    err = capsys.readouterr().err
    assert "half" in err and "mixed_bfloat16" in err and "Traceback" not in err
