"""Builders: a user's own Keras model as every member, in both modes, through predict and
export; bad builders refused in one line; the estimator's routed builder parameters.

One user file (a residual MLP with LayerNormalization) is written per session; the module
shares one in-graph run (builder named by file path) and one between-graph run (named by
module) of it, trained with SGD + momentum, a cosine schedule and early stopping."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, run_cli

USER_BUILDER = '''
"""A user's residual MLP: Dense -> [LayerNorm -> Dense(relu) -> Add] x blocks -> Dense."""
import keras


def build(input_shape, n_outputs, *, seed, width=32, blocks=2):
    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(width)(inputs)
    for _ in range(blocks):
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.Dense(width, activation="relu")(h)
        x = keras.layers.Add()([x, h])
    return keras.Model(inputs, keras.layers.Dense(n_outputs)(x))


def softmax_out(input_shape, n_outputs, *, seed):
    return keras.Sequential([keras.Input(input_shape),
                             keras.layers.Dense(n_outputs, activation="softmax")])


def wrong_shape(input_shape, n_outputs, *, seed):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(n_outputs + 1)])


def with_lambda(input_shape, n_outputs, *, seed):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(n_outputs),
                             keras.layers.Lambda(lambda t: t * 2.0)])


def raises(input_shape, n_outputs, *, seed):
    raise RuntimeError("my builder is broken on purpose")


def not_a_model(input_shape, n_outputs, *, seed):
    return [1, 2, 3]


def no_seed(input_shape, n_outputs):
    return None


NOT_CALLABLE = 42


def two_outputs(input_shape, n_outputs, *, seed):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, [keras.layers.Dense(n_outputs)(inputs),
                                keras.layers.Dense(n_outputs)(inputs)])


@keras.saving.register_keras_serializable(package="userbuilders")
class Jitter(keras.layers.Layer):
    """Noise from Keras's global seed generator (no `seed=`), in training only."""

    def call(self, x, training=False):
        return x + 0.3 * keras.random.normal(keras.ops.shape(x)) if training else x


def jittered(input_shape, n_outputs, *, seed):
    inputs = keras.Input(input_shape)
    x = Jitter()(keras.layers.Dense(16, activation="relu")(inputs))
    return keras.Model(inputs, keras.layers.Dense(n_outputs)(x))
'''

CONFIG = """
[data]
source = "digits"
[model]
builder = "{builder}"
[model.params]
width = 16
[members]
count = 2
[training]
epochs = 4
batch_size = 64
seed = 5
learning_rate = 0.05
optimizer = "sgd"
optimizer_params = {{ momentum = 0.9 }}
lr_schedule = "cosine"
early_stopping = 1
[placement]
devices = "cpu:2"
"""


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """The user's folder (`userbuilders.py` and a config naming it by relative file path),
    an in-graph run by file path and a between-graph run by module name."""
    base = tmp_path_factory.mktemp("builders")
    (base / "userbuilders.py").write_text(USER_BUILDER)
    (base / "by_file.toml").write_text(CONFIG.format(builder="userbuilders.py:build"))
    (base / "by_module.toml").write_text(CONFIG.format(builder="userbuilders:build"))
    assert run_cli("train", "--config", base / "by_file.toml", "--run-dir", base / "ig",
                   "--quiet") == 0
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(base), str(ROOT), *filter(None, [old])])
    sys.path.insert(0, str(base))
    try:
        # one client trains the members in turn (the client count is test_between_graph's
        # and test_parity_cnn's; each client process is a TensorFlow start)
        assert run_cli("train", "--config", base / "by_module.toml", "--mode",
                       "between-graph", "--jobs", "1", "--run-dir", base / "bg",
                       "--quiet") == 0
    finally:
        sys.path.remove(str(base))
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    return base


def _probs(path, split="test"):
    t = pq.read_table(path)
    t = t.filter(pc.equal(t.column("split"), split))
    cols = [c for c in t.column_names if c.startswith("p_")]
    return t, np.column_stack([t.column(c).to_numpy() for c in cols])


def test_user_builder_gives_the_same_members_in_both_modes(user):
    a, pa_ = _probs(user / "ig" / "predictions.parquet")
    b, pb = _probs(user / "bg" / "predictions.parquet")
    assert a.column("model").to_pylist() == b.column("model").to_pylist()
    assert np.abs(pa_ - pb).max() <= 1e-5
    manifest = json.loads((user / "ig" / "manifest.json").read_text())
    builder = manifest["model"]["builder"]
    assert builder == str(user / "userbuilders.py") + ":build"  # made absolute for clients
    source = (user / "userbuilders.py").read_bytes()
    import hashlib

    assert manifest["model"]["builders"][builder] == hashlib.sha256(source).hexdigest()
    assert manifest["members"][0]["hparams"]["params"] == {"width": 16}
    # FLOPs from the built model: 64->16, two 16->16 blocks, 16->10, 2 per multiply-add
    assert manifest["members"][0]["flops_per_row"] == 2 * (64 * 16 + 2 * 16 * 16 + 16 * 10)


def test_early_stopping_restores_each_members_best_epoch(user):
    history = pq.read_table(user / "ig" / "history.parquet").to_pandas()
    bg = pq.read_table(user / "bg" / "history.parquet").to_pandas()
    assert history[["member", "epoch"]].values.tolist() == bg[["member", "epoch"]].values.tolist()
    t, probs = _probs(user / "ig" / "predictions.parquet", "validation")
    y = np.asarray(t.column("y_true").to_pylist())
    classes = [c[2:] for c in t.column_names if c.startswith("p_")]
    for k, rows in history.groupby("member"):
        losses = rows.sort_values("epoch").val_loss.to_numpy()
        best = int(np.argmin(losses))
        # patience 1: training stops one epoch without improvement after the best epoch
        assert len(losses) == min(best + 2, 4)
        mask = np.asarray(t.column("model").to_pylist()) == f"member-{k}"
        idx = np.searchsorted(np.asarray(classes, dtype=y.dtype), y[mask])
        nll = -np.mean(np.log(np.clip(probs[mask][np.arange(mask.sum()), idx], 1e-12, 1)))
        assert nll == pytest.approx(losses[best], rel=1e-4)  # the best epoch's weights


def test_predict_and_export_reproduce_the_user_builder_run(user, tmp_path, plain_tf):
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", user / "ig", "--data", "digits", "--out", out,
                   "--quiet", "--layout", "long") == 0
    run, run_p = _probs(user / "ig" / "predictions.parquet")
    pred = pq.read_table(out)
    for model in ("member-0", "ensemble-mean"):
        mine = run.filter(pc.equal(run.column("model"), model))
        theirs = pred.filter(pc.equal(pred.column("model"), model))
        rows = mine.column("source_row").to_numpy()
        got = np.column_stack([theirs.column(c).to_numpy() for c in theirs.column_names
                               if c.startswith("p_")])[rows]
        want = np.column_stack([mine.column(c).to_numpy() for c in mine.column_names
                                if c.startswith("p_")])
        assert np.abs(got - want).max() <= 1e-5, model
    models = tmp_path / "models"
    assert run_cli("export", "--run", user / "ig", "--out", models) == 0
    from sklearn.datasets import load_digits

    mine = run.filter(pc.equal(run.column("model"), "ensemble-mean"))
    x = load_digits().data[mine.column("source_row").to_numpy()].astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np, tensorflow as tf\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "p = m.signatures['serving_default'](features=tf.constant(np.load(sys.argv[2])))\n"
            "np.save(sys.argv[3], p['probabilities'].numpy())\n")
    proc = plain_tf.run(code, models / "1", tmp_path / "x.npy", tmp_path / "served.npy",
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = np.column_stack([mine.column(c).to_numpy() for c in mine.column_names
                            if c.startswith("p_")])
    assert np.abs(np.load(tmp_path / "served.npy") - want).max() <= 1e-5


@pytest.mark.parametrize("builder, message", [
    ("nosuchmodule_xyz:build", "Cannot import builder 'nosuchmodule_xyz:build'"),
    ("{base}/userbuilders.py:nothere", "has no function `nothere`"),
    ("{base}/missing.py:build", "Builder file not found"),
    ("{base}/userbuilders.py:raises", "raised RuntimeError: my builder is broken on purpose"),
    ("{base}/userbuilders.py:not_a_model", "returned list; expected a keras.Model"),
    ("{base}/userbuilders.py:wrong_shape",
     "output [batch, 11]; expected one output, [batch, 10] logits"),
    ("{base}/userbuilders.py:two_outputs", "with 2 outputs; expected one output, [batch, 10]"),
    ("{base}/userbuilders.py:NOT_CALLABLE", "is int 42, not a function"),
    ("{base}/userbuilders.py:softmax_out", "ends in a softmax; a builder returns logits"),
    ("{base}/userbuilders.py:with_lambda", "is a Lambda layer"),
    ("{base}/userbuilders.py:no_seed", "must be `build(input_shape, n_outputs, *, seed"),
])
def test_bad_builders_exit_2_with_one_line(user, tmp_path, capsys, builder, message):
    run_dir = tmp_path / "run"
    assert run_cli("train", "--model", builder.format(base=user), "--members", "2",
                   "--epochs", "1", "--run-dir", run_dir, "--quiet") == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not run_dir.exists()  # nothing half-made


def test_bad_builder_in_a_fresh_process_is_one_line(user, tmp_path):
    """The user's module imports Keras: TensorFlow's start-up banners stay hidden."""
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", "--model",
                           f"{user}/userbuilders.py:softmax_out", "--run-dir",
                           str(tmp_path / "run"), "--quiet"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: Builder '{user}/userbuilders.py:softmax_out' ends in a softmax; a builder "
        "returns logits (the task adds the head): drop the final softmax activation."]


@pytest.mark.parametrize("rows", [(6,), (3, 2, 2, 2), "wine"])
def test_cnn_on_rows_that_are_not_images_names_their_shape(tmp_path, capsys, rows):
    """`cnn` on flat rows (an `.npz` `[n, 6]`, a table) or rows of rank 4 used to raise
    IndexError from the builder; the one line names the rows' shape and what it needs."""
    data = rows
    if rows != "wine":
        data = tmp_path / "rows.npz"
        np.savez(data, x=np.random.default_rng(0).normal(size=(40, *rows)), y=np.arange(40) % 2)
    assert run_cli("train", "--data", data, "--model", "cnn", "--members", "2", "--epochs", "1",
                   "--devices", "cpu:2", "--run-dir", tmp_path / "run", "--quiet") == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    shape = [13] if rows == "wine" else list(rows)
    assert len(lines) == 1 and f"received rows of shape {shape}" in lines[0], lines
    assert "needs rows shaped [height, width] or [height, width, channels]" in lines[0]
    assert not (tmp_path / "run").exists()


def test_cnn_refusal_between_graph_in_a_fresh_process_is_one_line(tmp_path):
    """The between-graph launcher builds the members to count their FLOPs: TensorFlow loads
    there first, and quietly (its start-up banners were printed, twice)."""
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", "--data", "wine",
                           "--model", "cnn", "--mode", "between-graph", "--members", "2",
                           "--devices", "cpu:2", "--run-dir", str(tmp_path / "run"), "--quiet"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: Builder 'cnn' needs rows shaped [height, width] or [height, width, channels] "
        "(images); received rows of shape [13]. Use --model mlp, or reshape x to images."]


def test_unknown_builder_param_names_it():
    from ensemble.config import schema
    from ensemble.core.errors import UsageError

    with pytest.raises(UsageError, match=r"`members.override\[index=1\].params.depth`.*hidden"):
        schema.from_dict({"model": {"builder": "mlp"}, "members": {
            "count": 2, "override": [{"index": 1, "params": {"depth": 3}}]}})


@pytest.mark.parametrize("params, message", [
    ({"filters": 4}, r"`model.params.filters` to be a list of positive filter counts"),
    ({"filters": [8, 0]}, r"`model.params.filters`.*Received: \[8, 0\]"),
    ({"kernel_size": 0}, r"`model.params.kernel_size` to be a positive integer or"),
    ({"dense": -3}, r"`model.params.dense` to be a positive integer"),
    ({"dropout": 2.0}, r"`model.params.dropout` in \[0, 1\)"),
])
def test_bad_cnn_params_name_the_key_before_tensorflow(params, message):
    """The built-in CNN's parameters are checked with the config, as the MLP's: they were
    Keras's refusals at build time, naming no key ("'int' object is not iterable")."""
    from ensemble.config import schema
    from ensemble.core.errors import UsageError

    with pytest.raises(UsageError, match=message):
        schema.from_dict({"model": {"builder": "cnn", "params": params}})
    schema.from_dict({"model": {"builder": "cnn", "params": {
        "filters": [4, 8], "kernel_size": [3, 3], "dense": 16, "dropout": 0.0}}})


def test_mlp_hidden_of_one_width_is_refused_as_members_hidden_is():
    """`model.params.hidden = 64` passed the check, trained, then crashed writing
    members.parquet (a traceback, the run left unfinished); it is one line, as for
    `members.hidden = 64`."""
    from ensemble.config import schema
    from ensemble.core.errors import UsageError

    with pytest.raises(UsageError, match=r"`model.params.hidden` to be a list .*\[64\]"):
        schema.from_dict({"model": {"builder": "mlp", "params": {"hidden": 64}}})


def test_mixed_architectures_in_one_ensemble():
    from ensemble.config import schema

    cfg = schema.from_dict({"model": {"builder": "mlp", "params": {"hidden": [8]}},
                            "members": {"count": 2, "override": [
                                {"index": 1, "builder": "cnn", "params": {"filters": [4]}}]}})
    assert schema.member_hparams(cfg, 0) == {"builder": "mlp", "learning_rate": 0.001,
                                             "params": {"hidden": [8], "activation": "relu",
                                                        "dropout": 0.1, "l2": 0.0}}
    assert schema.member_hparams(cfg, 1) == {"builder": "cnn", "learning_rate": 0.001,
                                             "params": {"filters": [4]}}


def test_flops_of_the_built_mlp_equal_the_formula():
    from ensemble import tasks
    from ensemble.models.cost import count_flops
    from ensemble.models.members import build_member
    from ensemble.models.cost import member_flops, mlp_flops

    model = build_member("mlp", {"hidden": [32, 16]}, (64,), 10, 0, "m", tasks.get())
    assert count_flops(model, (64,)) == mlp_flops(64, [32, 16], 10)
    # the periodic embedding: 5 features x (2 x 4 sines/cosines) x 2 -> dense 10->8, 8->3
    periodic = {"hidden": [8], "embedding": "periodic", "n_frequencies": 4, "d_embedding": 2}
    model = build_member("mlp", periodic, (5,), 3, 0, "p", tasks.get())
    assert count_flops(model, (5,)) == 2 * (5 * 8 * 2 + 10 * 8 + 8 * 3)
    assert member_flops("mlp", periodic, (5,), 3, tasks.get()) == count_flops(model, (5,))
    cnn = build_member("cnn", {"filters": [4], "dense": 8}, (8, 8, 1), 10, 0, "c", tasks.get())
    # conv 3x3x1->4 on 8x8 (same padding), pool to 4x4, dense 64->8, 8->10
    assert count_flops(cnn, (8, 8, 1)) == 2 * (9 * 1 * 4 * 64 + 64 * 8 + 8 * 10)


def test_a_module_builder_in_the_working_directory_serves_its_run_afterwards(
        tmp_path, monkeypatch):
    (tmp_path / "cwd_builders_s13.py").write_text(
        "import keras\n\n\ndef small(input_shape, n_outputs, *, seed):\n"
        "    i = keras.Input(input_shape)\n"
        "    return keras.Model(i, keras.layers.Dense(n_outputs)(i))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the working directory added: undone
    assert run_cli("train", "--model", "cwd_builders_s13:small", "--members", "2", "--epochs",
                   "1", "--run-dir", "run", "--quiet") == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    for argv in (["predict", "--run", "run", "--data", "digits", "--out", "p.csv", "--quiet"],
                 ["aggregate", "--run", "run", "--aggregators", "mean"]):
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ensemble"),
                               *argv], cwd=tmp_path,  # the command: no working directory
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]  # found as training found it


def test_unseeded_random_layers_give_each_member_its_own_stream(user, tmp_path):
    """A layer drawing from Keras's global seed generator: each member draws from its own
    (`members.member_rng`), so a member is the same in either mode and alone (between-graph:
    one client trains member 0 in a fresh process, then member 1 after it)."""
    common = ["--model", f"{user}/userbuilders.py:jittered", "--epochs", "2", "--devices",
              "cpu:2", "--quiet"]
    for mode, n, jobs in (("in-graph", "2", []), ("between-graph", "2", ["--jobs", "1"]),
                          ("in-graph", "1", [])):
        assert run_cli("train", *common, "--members", n, "--mode", mode, *jobs,
                       "--run-dir", tmp_path / f"{mode}-{n}") == 0
    ig, p_ig = _probs(tmp_path / "in-graph-2" / "predictions.parquet")
    _, p_bg = _probs(tmp_path / "between-graph-2" / "predictions.parquet")
    alone, p_alone = _probs(tmp_path / "in-graph-1" / "predictions.parquet")
    assert np.abs(p_ig - p_bg).max() <= 1e-5
    first = np.asarray(ig.column("model").to_pylist()) == "member-0"
    mine = np.asarray(alone.column("model").to_pylist()) == "member-0"
    assert np.abs(p_ig[first] - p_alone[mine]).max() <= 1e-5
    assert np.abs(p_ig[first] - p_ig[np.asarray(ig.column("model").to_pylist())
                                      == "member-1"]).max() > 1e-3  # members still differ



COMPILED_BUILDER = '''
import keras


def build(input_shape, n_outputs, *, seed):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(n_outputs)])
    model.compile(optimizer="adam", loss="mse")
    return model


def plain(input_shape, n_outputs, *, seed):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(n_outputs)])
'''


def test_a_compiled_builder_model_gets_a_notice(tmp_path, capsys):
    """A builder that compiles its model is told, once, that its optimizer and loss are not
    the ones members train with; an uncompiled one gets no notice."""
    from ensemble import tasks
    from ensemble.core.notices import said_once
    from ensemble.models.cost import member_flops

    path = tmp_path / "compiled_builder.py"
    path.write_text(COMPILED_BUILDER)
    with said_once():
        for _ in range(2):
            flops = member_flops(f"{path}:build", {}, (5,), 3, tasks.get())
        plain = member_flops(f"{path}:plain", {}, (5,), 3, tasks.get())
    assert flops == plain > 0
    err = capsys.readouterr().err
    assert err.count("notice: builder") == 1
    assert "compiled its model; its optimizer, loss and metrics are not used" in err
    assert "plain" not in err


def test_a_compiled_builder_model_saves_and_loads_without_keras_warnings(tmp_path):
    """The builder's `compile` is undone: its never-built optimiser saved with the member
    made every load warn "Skipping variable loading for optimizer" (train, predict, evaluate)."""
    import warnings

    from ensemble import tasks
    from ensemble.models.members import build_member, load_member, save_member

    path = tmp_path / "compiled_builder.py"
    path.write_text(COMPILED_BUILDER)
    for name in ("build", "plain"):
        model = build_member(f"{path}:{name}", {}, (5,), 3, 0, "m", tasks.get())
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.fit(np.zeros((8, 5), "float32"), np.zeros(8, "int64"), verbose=0)
        save_member(model, tmp_path / f"{name}.keras")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = load_member(tmp_path / f"{name}.keras", None)
        assert not [w for w in caught if issubclass(w.category, UserWarning)], name
        np.testing.assert_allclose(loaded(np.ones((2, 5), "float32")),
                                   model(np.ones((2, 5), "float32")), rtol=1e-6)
