"""Convolutional members are the same whatever trains them: in-graph or between-graph, one
client or two (`--jobs`), two members or four. A CNN (Conv2D, pooling, batch normalisation,
dropout, Dense) on a folder of 12x12 grey PNGs, 4 epochs; every run is its own `ensemble` process,
as a user starts it (a process's thread pools are fixed when TensorFlow starts)."""

import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import cli_env

BUILDER = '''
import keras


def build(input_shape, n_outputs, *, seed):
    init = lambda k: keras.initializers.GlorotUniform(seed=seed + k)
    x = inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, padding="same", kernel_initializer=init(0))(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Conv2D(16, 3, activation="relu", kernel_initializer=init(1))(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.25, seed=seed + 2)(x)
    x = keras.layers.Dense(16, activation="relu", kernel_initializer=init(3))(x)
    return keras.Model(inputs, keras.layers.Dense(n_outputs, kernel_initializer=init(4))(x))
'''
# name -> (members, mode, jobs)
# (one client training two members in turn: jobs 1 and a smaller ensemble at once)
RUNS = {"ig4": (4, "in-graph", None), "bg4-jobs2": (4, "between-graph", 2),
        "bg2-jobs1": (2, "between-graph", 1)}


def _write_folder(base):
    """`base/digit<k>/*.png`: every other image of scikit-learn's digits 0, 1 and 2 (about
    270) as 12x12 grey PNGs."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for i, (im, label) in enumerate(zip(d.images, d.target)):
        if label > 2 or i % 2:
            continue
        folder = base / f"digit{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(im * 255 / 16).astype(np.uint8), "L").resize(
            (12, 12), Image.BILINEAR).save(folder / f"img{i:04d}.png")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The runs of `RUNS` on one image folder: `{name: run_dir}`."""
    base = tmp_path_factory.mktemp("parity_cnn")
    _write_folder(base / "images")
    (base / "cnn.py").write_text(BUILDER)
    (base / "cnn.toml").write_text(f"""
[data]
source = "{base / 'images'}"
[model]
builder = "{base / 'cnn.py'}:build"
[training]
epochs = 4
batch_size = 32
learning_rate = 0.005
seed = 5
""")
    out, started = {}, []
    try:
        for name, (members, mode, jobs) in RUNS.items():  # two processes at a time (2 cores)
            out[name] = base / name
            argv = ["train", "--config", base / "cnn.toml", "--members", members, "--mode",
                    mode, "--run-dir", out[name], "--quiet", *(["--jobs", jobs] if jobs else [])]
            if len(started) == 2:
                _finish(started.pop(0))
            started.append(subprocess.Popen([sys.executable, "-m", "pipelines.cli",
                                             *map(str, argv)], env=cli_env(), text=True,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        while started:
            _finish(started.pop(0))
    finally:  # a failed run: the other one started is ended too
        for proc in started:
            proc.kill()
            proc.wait()
    return out


def _finish(proc):
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]


def _member_probs(run_dir):
    """`{member: [n_test, n_classes]}` test probabilities of each member of a run."""
    t = pq.read_table(run_dir / "predictions.parquet").to_pandas()
    t = t[(t.split == "test") & t.member.notna()].sort_values(["member", "row"])
    cols = [c for c in t.columns if c.startswith("p_")]
    return {int(m): g[cols].to_numpy(np.float64) for m, g in t.groupby("member")}


def test_cnn_members_are_equal_across_modes_jobs_and_member_counts(runs):
    probs = {name: _member_probs(d) for name, d in runs.items()}
    ref = probs["ig4"]
    assert sorted(ref) == [0, 1, 2, 3]
    worst = {}
    for name, members in probs.items():
        for k, p in members.items():
            assert p.shape == ref[k].shape
            worst[f"{name} member {k}"] = float(np.abs(p - ref[k]).max())
    assert max(worst.values()) <= 1e-5, worst
    # the members learned (so equality is not that of untrained networks) and differ
    t = pq.read_table(runs["ig4"] / "metrics.parquet").to_pandas()
    test = t[(t.split == "test") & t.member.notna()]
    assert test.accuracy.min() > 0.5 and test.accuracy.mean() > 0.7  # chance is 1/3
    assert np.abs(ref[0] - ref[1]).max() > 1e-2
