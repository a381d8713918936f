"""Nothing lost, part four: diverging members, misbehaving builders, tampered or damaged runs,
resource caps. Real runs through the CLI (in-process and in subprocesses), real files.

- Divergence: a member whose outputs hold NaN (one member only, by `[[members.override]]`)
  is stopped and marked `diverged` with its epoch in both modes, the others finish, and no
  table of the run, its predictions, export or re-aggregation holds a NaN from it; runs whose
  every member diverges (SGD at learning rate 10, weights of 1e38, NaN outputs everywhere) fail
  with one line; a regression target beyond float32's reach is refused at the data check.
- Tampering: a changed or missing builder file, a missing or changed member file, a manifest
  that lost a member, predictions that disagree with the manifest: `predict`, `export` and
  `aggregate` refuse each with one line (exit 2) and never import the changed builder;
  `--trust-builder` accepts a change and records its sha256.
- Caps: every option that sizes work or memory is refused beyond its bound in every command.
- Builders: int outputs, `sys.exit` and other `BaseException`s from user code are one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import cli_env, run_cli

from ensemble.core import artifacts

NAN_BUILDER = '''
import keras

def build(input_shape, n_outputs, *, seed, poison=False, scale=None):
    inp = keras.Input(input_shape)
    x = keras.layers.Flatten()(inp)
    init = "glorot_uniform" if scale is None else keras.initializers.Constant(scale)
    x = keras.layers.Dense(16, activation="relu", kernel_initializer=init)(x)
    x = keras.layers.Dense(n_outputs, kernel_initializer=init)(x)
    if poison:
        x = keras.layers.Rescaling(float("nan"))(x)
    return keras.Model(inp, x)
'''

CONFIG = """
[data]
source = "digits"
[model]
builder = "{builder}:build"
[members]
count = 3
{extra}
[training]
epochs = 2
batch_size = 64
seed = 11
{training}
[placement]
devices = "cpu:2"
[aggregation]
aggregators = ["mean", "greedy", "temperature"]
"""
POISON_ONE = "[[members.override]]\nindex = 1\nparams = {poison = true}"


def _config(tmp: Path, name: str, extra: str = "", training: str = "",
            builder: Path | None = None) -> Path:
    builder = builder or tmp / "nanb.py"
    if not builder.exists():
        builder.write_text(NAN_BUILDER)
    path = tmp / f"{name}.toml"
    path.write_text(CONFIG.format(builder=builder, extra=extra, training=training))
    return path


def _non_finite(table: pa.Table) -> list[str]:
    """Float columns of `table` holding NaN or an infinity (nulls are fine)."""
    bad = []
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_floating(col.type) and (
                pc.any(pc.is_nan(col)).as_py() or pc.any(pc.is_inf(col)).as_py()):
            bad.append(name)
    return bad


def _run_tables(run_dir: Path) -> dict[str, pa.Table]:
    return {str(p.relative_to(run_dir)): pq.read_table(p) for p in run_dir.rglob("*.parquet")
            if "data" not in p.relative_to(run_dir).parts}


@pytest.fixture(scope="module")
def diverged_runs(tmp_path_factory):
    """{mode: (run dir, stderr of train)} of a 3-member run whose member 1 outputs NaN."""
    tmp = tmp_path_factory.mktemp("diverged")
    cfg = _config(tmp, "one", POISON_ONE)
    out = {}
    for mode, jobs in (("in-graph", []), ("between-graph", ["--jobs", "1"])):
        run_dir, err = tmp / mode, io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = run_cli("train", "--config", cfg, "--mode", mode, *jobs,
                             "--run-dir", run_dir, "--quiet")
        assert status == 0, err.getvalue()[-3000:]
        out[mode] = (run_dir, err.getvalue())
    return out


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_a_diverging_member_is_left_out_and_the_others_finish(diverged_runs, mode):
    run_dir, err = diverged_runs[mode]
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "completed"
    states = [(m["status"], m.get("diverged_epoch")) for m in manifest["members"]]
    assert states == [("completed", None), ("diverged", 0), ("completed", None)]
    assert "member 1 (epoch 1) diverged" in err and "--overwrite" in err
    assert "Traceback" not in err
    assert not artifacts.member_model_path(run_dir, 1).exists()
    tables = _run_tables(run_dir)
    for name, table in tables.items():
        assert _non_finite(table) == [], name
    preds = tables["predictions.parquet"]
    assert sorted(set(preds.column("member").drop_null().to_pylist())) == [0, 2]
    assert not any(m.startswith("member-1") for m in preds.column("model").to_pylist())
    members = tables["members.parquet"].to_pylist()
    assert [(r["status"], r["diverged_epoch"]) for r in members] == states
    assert members[1]["val_nll"] is None and members[0]["val_nll"] > 0
    assert json.loads((run_dir / "aggregators.json").read_text())["members"] == [0, 2]
    history = tables["history.parquet"]
    assert 1 not in history.column("member").to_pylist()


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_predict_export_and_aggregate_of_a_run_with_a_diverged_member(diverged_runs, mode,
                                                                       tmp_path, capsys):
    run_dir, _ = diverged_runs[mode]
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", run_dir, "--data", "digits", "--out", out,
                   "--mode", mode, "--layout", "long") == 0
    preds = pq.read_table(out)
    assert _non_finite(preds) == []
    assert sorted(set(preds.column("member").drop_null().to_pylist())) == [0, 2]
    assert run_cli("aggregate", "--run", run_dir, "--aggregators",
                   "mean,greedy,stacking,temperature") == 0
    for name, table in _run_tables(run_dir).items():
        assert _non_finite(table) == [], name
    assert run_cli("export", "--run", run_dir, "--out", tmp_path / "export") == 0
    import tensorflow as tf
    from sklearn.datasets import load_digits

    model = tf.saved_model.load(str(tmp_path / "export" / "1"))
    outputs = model.signatures["serving_default"](
        features=tf.constant(load_digits().data[:20], tf.float32))
    assert tf.reduce_all(tf.math.is_finite(outputs["probabilities"]))
    assert outputs["member_probabilities"].shape[1] == 2  # members 0 and 2
    capsys.readouterr()


@pytest.mark.parametrize("case, extra, training, mode", [
    ("sgd-lr-10", "", 'optimizer = "sgd"\nlearning_rate = 10.0', "in-graph"),
    ("weights-1e38", "[model.params]\nscale = 1e38", "", "in-graph"),
    ("nan-outputs", "[model.params]\npoison = true", "", "between-graph"),
])
def test_a_run_whose_every_member_diverges_fails_with_one_line(tmp_path, capsys, case, extra,
                                                               training, mode):
    extra = extra.replace("[model.params]", "").strip()
    cfg = _config(tmp_path, case, training=training)
    if extra:  # the builder's params for every member
        cfg.write_text(cfg.read_text().replace('builder = "', f"params = {{{extra}}}\nbuilder = \""))
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", cfg, "--mode", mode, "--run-dir", run_dir,
                   "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "every member diverged" in err[0], err
    assert "member 0" in err[0] and "member 2" in err[0]
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "failed"
    if mode == "in-graph":
        assert not (run_dir / "predictions.parquet").exists()
    assert run_cli("predict", "--run", run_dir, "--data", "digits", "--out",
                   tmp_path / "p.parquet") == 2


def test_every_member_diverging_in_one_epoch_with_progress_lines_fails_with_one_line(
        tmp_path, capsys):
    """Without `--quiet`: the epoch in which the last members diverge has no records, and the
    progress line of its members' means raised IndexError instead of the one-line failure."""
    cfg = _config(tmp_path, "sgd", training='optimizer = "sgd"\nlearning_rate = 10.0')
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", cfg, "--run-dir", run_dir) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "every member diverged" in err[-1], err
    assert not any("Traceback" in line for line in err)


def test_a_diverging_member_is_left_out_of_the_ensembles_tensorboard_scalars(tmp_path):
    """In-graph `--tensorboard`: the ensemble's per-epoch scalars came from every member's
    validation outputs, the diverged one's NaN too, and ECE's binning raised ValueError."""
    import glob

    import numpy as np
    import tensorflow as tf

    cfg = _config(tmp_path, "one", POISON_ONE)
    run_dir = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_cli("train", "--config", cfg, "--run-dir", run_dir, "--tensorboard",
                       "--quiet") == 0
    assert artifacts.read_manifest(run_dir)["members"][1]["status"] == "diverged"
    values = {}
    for f in glob.glob(str(run_dir / "tensorboard" / "ensemble" / "*")):
        for event in tf.compat.v1.train.summary_iterator(f):
            for v in event.summary.value:
                values[(v.tag, event.step)] = float(tf.make_ndarray(v.tensor))
    assert ("mean/val_nll", 1) in values
    assert all(np.isfinite(v) for v in values.values()), values


@pytest.mark.parametrize("scale", [1e30, 1e38, -3e20])
def test_a_regression_target_beyond_float32_is_refused_at_the_data_check(tmp_path, capsys,
                                                                       scale):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3))
    table = pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2],
                      "target": x[:, 0] * scale + scale / 10 * rng.normal(size=120)})
    pq.write_table(table, tmp_path / "t.parquet")
    run_dir = tmp_path / "run"
    assert run_cli("train", "--data", tmp_path / "t.parquet", "--task", "regression",
                   "--members", "2", "--epochs", "1", "--devices", "cpu:2",
                   "--run-dir", run_dir, "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "float32" in err[0] and "'target'" in err[0], err
    assert not run_dir.exists()


# --- tampered or damaged runs -----------------------------------------------------------

@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    """A completed 3-member in-graph run whose builder is a file of its own."""
    tmp = tmp_path_factory.mktemp("healthy")
    builder = tmp / "own_builder.py"
    builder.write_text(NAN_BUILDER)
    cfg = _config(tmp, "ok", builder=builder)
    assert run_cli("train", "--config", cfg, "--run-dir", tmp / "run", "--quiet") == 0
    return tmp / "run", builder


def _copy(healthy_run, tmp_path) -> tuple[Path, Path]:
    """A copy of the run whose manifest names its own copy of the builder file."""
    run_dir, builder = healthy_run
    run_copy, builder_copy = tmp_path / "run", tmp_path / "builder_copy.py"
    shutil.copytree(run_dir, run_copy)
    shutil.copy(builder, builder_copy)
    manifest = artifacts.read_manifest(run_copy)
    text = json.dumps(manifest).replace(str(builder), str(builder_copy))
    artifacts.write_manifest(run_copy, json.loads(text))
    return run_copy, builder_copy


COMMANDS = {
    "predict": lambda run, tmp: ["predict", "--run", run, "--data", "digits",
                                 "--out", tmp / "p.parquet"],
    "predict-between": lambda run, tmp: ["predict", "--run", run, "--data", "digits",
                                         "--out", tmp / "p.parquet", "--mode", "between-graph"],
    "export": lambda run, tmp: ["export", "--run", run, "--out", tmp / "export"],
    "aggregate": lambda run, tmp: ["aggregate", "--run", run],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_changed_builder_file_is_refused_and_never_imported(healthy_run, tmp_path, capsys,
                                                             command):
    run_dir, builder = _copy(healthy_run, tmp_path)
    marker = tmp_path / "imported"
    builder.write_text(builder.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n")
    assert run_cli(*COMMANDS[command](run_dir, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(builder) in err[0] and "--trust-builder" in err[0], err
    assert not marker.exists()
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "export").exists()
    # accepted explicitly: it runs, and the manifest records the new sha256
    assert run_cli(*COMMANDS[command](run_dir, tmp_path), "--trust-builder") == 0
    model = artifacts.read_manifest(run_dir)["model"]
    import hashlib

    assert model["builders"][f"{builder}:build"] == hashlib.sha256(
        builder.read_bytes()).hexdigest()
    assert model["builders_trusted"][f"{builder}:build"]
    capsys.readouterr()


def _drop_member_entry(run_dir: Path) -> None:
    manifest = artifacts.read_manifest(run_dir)
    manifest["members"].pop()
    artifacts.write_manifest(run_dir, manifest)
    artifacts.member_model_path(run_dir, 2).unlink()


def _predictions_without_member_0(run_dir: Path) -> None:
    path = run_dir / "predictions.parquet"
    table = pq.read_table(path)
    keep = pc.invert(pc.fill_null(pc.equal(table.column("member"), 0), False))
    pq.write_table(table.filter(keep), path)
    manifest = artifacts.read_manifest(run_dir)
    manifest["artifacts"]["predictions.parquet"] = artifacts.sha256_file(path)
    artifacts.write_manifest(run_dir, manifest)


DAMAGE = {
    "builder-deleted": (lambda run, b: b.unlink(), "missing"),
    "member-deleted": (lambda run, b: artifacts.member_model_path(run, 1).unlink(),
                       "member-1.keras"),
    "member-changed": (lambda run, b: artifacts.member_model_path(run, 0).open("ab").write(
        b"x"), "member-0.keras"),
    "member-entry-deleted": (lambda run, b: _drop_member_entry(run), "lists 2 members"),
    "predictions-disagree": (lambda run, b: _predictions_without_member_0(run),
                             "holds members [1, 2]"),
}


@pytest.mark.parametrize("command", ["predict", "export", "aggregate"])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_run_is_refused_with_one_line(healthy_run, tmp_path, capsys, command,
                                                damage):
    run_dir, builder = _copy(healthy_run, tmp_path)
    do, expected = DAMAGE[damage]
    do(run_dir, builder)
    before = artifacts.read_manifest(run_dir)
    assert run_cli(*COMMANDS[command](run_dir, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert artifacts.read_manifest(run_dir)["members"] == before["members"]
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "export").exists()


# --- resource caps, the same in every command ----------------------------------------------

CAPPED = [
    (["train"], "--devices", ["cpu:99999", "", "cpu:0", "cpu:257"]),
    (["predict", "--run", "R", "--data", "digits", "--out", "o.parquet"], "--devices",
     ["cpu:99999", "", "cpu:0"]),
    (["serve", "--model", "M"], "--devices", ["cpu:99999", "", "cpu:257"]),
    (["compare"], "--devices", ["cpu:99999", ""]),
    (["devices"], "--devices", ["cpu:99999", ""]),
    (["train"], "--replicas", ["100000", "257"]),
    (["predict", "--run", "R", "--data", "digits", "--out", "o.parquet"], "--replicas",
     ["100000", "0", "-1"]),
    (["serve", "--model", "M"], "--replicas", ["100000", "0", "x"]),
    (["serve", "--model", "M"], "--batch-timeout-ms", ["inf", "nan", "-1", "1e9"]),
    (["serve", "--model", "M"], "--max-batch-size", ["0", "100000000"]),
    (["serve", "--model", "M"], "--max-request-bytes", ["0", "99999999999"]),
    (["serve", "--model", "M"], "--port", ["65536", "-1"]),
    (["predict", "--run", "R", "--data", "digits", "--out", "o.parquet"], "--batch-size",
     ["0", "99999999999"]),
    (["export", "--run", "R", "--out", "E"], "--version",
     ["99999999999999999999", str(2 ** 63), "0"]),
    (["train"], "--jobs", ["100000"]),
]


@pytest.mark.parametrize("argv, flag, values", CAPPED,
                         ids=[f"{a[0]}{f}" for a, f, _ in CAPPED])
def test_options_beyond_their_bounds_are_refused_in_every_command(capsys, argv, flag, values):
    for value in values:
        assert run_cli(*argv, f"{flag}={value}") == 2, (argv, flag, value)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0] and "Received" in err[0], (value, err)


def test_a_config_beyond_the_device_bound_is_refused(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[placement]\ndevices = "cpu:99999"\n')
    assert run_cli("train", "--config", cfg, "--run-dir", tmp_path / "run") == 2
    assert "placement.devices" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# --- builders that misbehave -----------------------------------------------------------------

BAD_BUILDERS = {
    "int-outputs": ("import keras\n\nclass ToInt(keras.layers.Layer):\n"
                    "    def call(self, x):\n        return keras.ops.cast(x, 'int32')\n\n"
                    "def build(input_shape, n_outputs, *, seed):\n"
                    "    inp = keras.Input(input_shape)\n"
                    "    out = ToInt()(keras.layers.Dense(n_outputs)(inp))\n"
                    "    return keras.Model(inp, out)\n", "int32 outputs"),
    "sys-exit-0": ("import sys\n\ndef build(input_shape, n_outputs, *, seed):\n"
                   "    sys.exit(0)\n", "raised SystemExit"),
    "sys-exit-3": ("import sys\n\ndef build(input_shape, n_outputs, *, seed):\n"
                   "    sys.exit(3)\n", "raised SystemExit"),
    "exit-at-import": ("import sys\nsys.exit(0)\n", "SystemExit"),
    "base-exception": ("class Boom(BaseException):\n    pass\n\n"
                       "def build(input_shape, n_outputs, *, seed):\n"
                       "    raise Boom('no')\n", "raised Boom"),
    "generator-exit": ("def build(input_shape, n_outputs, *, seed):\n"
                       "    raise GeneratorExit()\n", "raised GeneratorExit"),
}


@pytest.mark.parametrize("case", list(BAD_BUILDERS))
def test_a_misbehaving_builder_is_one_line(tmp_path, capsys, case):
    source, expected = BAD_BUILDERS[case]
    (tmp_path / f"bad_{case.replace('-', '_')}.py").write_text(source)
    spec = f"{tmp_path / f'bad_{case.replace(chr(45), chr(95))}.py'}:build"
    assert run_cli("train", "--model", spec, "--members", "2", "--epochs", "1", "--devices",
                   "cpu:2", "--run-dir", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", ["sys-exit-0"])
def test_a_misbehaving_builder_is_one_line_between_graph(tmp_path, case):
    source, expected = BAD_BUILDERS[case]
    (tmp_path / "bad.py").write_text(source)
    res = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", "--model",
                          f"{tmp_path / 'bad.py'}:build", "--members", "2", "--epochs", "1",
                          "--devices", "cpu:2", "--mode", "between-graph", "--run-dir",
                          tmp_path / "run", "--quiet"], env=cli_env(TF_CPP_MIN_LOG_LEVEL="3"),
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and expected in lines[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()


# --- hostile image files ------------------------------------------------------------------

def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG that declares `width` x `height` pixels but holds no pixel data (Pillow checks
    the size when it opens the file, before decoding)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b""))


def _image_folder(root: Path, n: int = 6) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(
                root / c / f"{i}.png")
    return root


def _bomb(folder, outside):
    _png_header_only(folder / "a" / "zz.png", 30_000, 30_000)  # 9e8 pixels: Pillow's error
    return folder / "a" / "zz.png"


def _warning_bomb(folder, outside):
    _png_header_only(folder / "a" / "zz.png", 10_000, 10_000)  # 1e8: Pillow only warns
    return folder / "a" / "zz.png"


def _truncated(folder, outside):
    data = (folder / "a" / "0.png").read_bytes()
    (folder / "a" / "zz.png").write_bytes(data[:len(data) // 2])
    return folder / "a" / "zz.png"


def _not_an_image(folder, outside):
    (folder / "b" / "zz.png").write_text("not an image")
    return folder / "b" / "zz.png"


def _link_out(folder, outside):
    (folder / "b" / "zz.png").symlink_to(outside)
    return folder / "b" / "zz.png"


def _class_link_out(folder, outside):
    (folder / "c").symlink_to(outside.parent, target_is_directory=True)
    return folder / "c"


HOSTILE_IMAGES = {"bomb": (_bomb, "decompression bomb"),
                  "bomb-warning": (_warning_bomb, "decompression bomb"),
                  "truncated": (_truncated, "Cannot read image"),
                  "not-an-image": (_not_an_image, "Cannot read image"),
                  "link-out": (_link_out, "outside the image folder"),
                  "class-folder-link-out": (_class_link_out, "outside the image folder")}


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """A trained 2-member run on an 8x8 grey image folder, and a PNG outside any folder."""
    tmp = tmp_path_factory.mktemp("images")
    folder = _image_folder(tmp / "train")
    assert run_cli("train", "--data", folder, "--members", "2", "--epochs", "1",
                   "--devices", "cpu:2", "--run-dir", tmp / "run", "--quiet") == 0
    outside = tmp / "elsewhere" / "secret.png"
    outside.parent.mkdir()
    shutil.copy(folder / "a" / "0.png", outside)
    return tmp / "run", outside


@pytest.mark.parametrize("case", list(HOSTILE_IMAGES))
def test_hostile_image_files_are_one_line_at_train_and_predict(image_run, tmp_path, capsys,
                                                              case):
    run_dir, outside = image_run
    make, expected = HOSTILE_IMAGES[case]
    folder = _image_folder(tmp_path / "data")
    named = make(folder, outside)
    capsys.readouterr()
    assert run_cli("train", "--data", folder, "--members", "2", "--epochs", "1", "--devices",
                   "cpu:2", "--run-dir", tmp_path / "run", "--quiet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and str(named) in err[0], err
    assert not (tmp_path / "run").exists()
    assert run_cli("predict", "--run", run_dir, "--data", folder, "--out",
                   tmp_path / "p.parquet") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and str(named) in err[0], err
    assert not (tmp_path / "p.parquet").exists()


def test_links_inside_the_image_folder_are_read(image_run, tmp_path, capsys):
    run_dir, _ = image_run
    folder = _image_folder(tmp_path / "data")
    (folder / "b" / "zz.png").symlink_to(folder / "a" / "1.png")
    assert run_cli("predict", "--run", run_dir, "--data", folder, "--out",
                   tmp_path / "p.parquet") == 0
    assert pq.read_table(tmp_path / "p.parquet").num_rows == 13
