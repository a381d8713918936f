"""Inputs as they come: a folder of PNGs with a user's CNN (both modes, predict naming files,
export fed raw pixels), a Keras-layout `.npz` with its own test split, the built-in CNN on
`digits_images`, the estimator on 4-D arrays, a real table (free text, a date, missing
values) from CLI flags alone with an id carried through and a per-column export, and bad
array inputs refused in one line."""

import json

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, run_cli

USER_CNN = '''
import keras


def build(input_shape, n_outputs, *, seed, filters=6):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(filters, 3, activation="relu")(inputs)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(n_outputs)(x))
'''


def _digit_images(classes=(0, 1), size=25):
    """Digits of `classes` as `[n, size, size]` uint8 grey images, their labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    keep = np.isin(d.target, classes)
    imgs = [np.asarray(Image.fromarray(np.round(im * 255 / 16).astype(np.uint8), "L")
                       .resize((size, size), Image.BILINEAR)) for im in d.images[keep]]
    return np.stack(imgs), d.target[keep]


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    """`train/<digitK>/*.png` (two classes, 25x25 grey), `new/*.png`, a user CNN file, and
    the runs of both modes trained on the folder."""
    from PIL import Image

    base = tmp_path_factory.mktemp("images")
    x, y = _digit_images()
    for i, (img, label) in enumerate(zip(x, y)):
        folder = base / "new" if i % 6 == 0 else base / "train" / f"digit{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, "L").save(folder / f"img{i:03d}.png")
    (base / "mycnn.py").write_text(USER_CNN)
    common = ["--data", base / "train", "--model", f"{base}/mycnn.py:build", "--members", "2",
              "--epochs", "2", "--devices", "cpu:2", "--quiet"]
    assert run_cli("train", *common, "--run-dir", base / "ig") == 0
    # one client trains both members in turn (the client count is test_between_graph's and
    # test_parity_cnn's; each client process is a TensorFlow start)
    assert run_cli("train", *common, "--mode", "between-graph", "--jobs", "1",
                   "--run-dir", base / "bg") == 0
    return base


def _p(table):
    return np.column_stack([table.column(c).to_numpy() for c in table.column_names
                            if c.startswith("p_")])


def test_cnn_on_a_png_folder_gives_the_same_members_in_both_modes(pngs):
    a, b = (pq.read_table(pngs / r / "predictions.parquet") for r in ("ig", "bg"))
    assert a.column("model").to_pylist() == b.column("model").to_pylist()
    assert np.abs(_p(a) - _p(b)).max() <= 1e-5
    manifest = json.loads((pngs / "ig" / "manifest.json").read_text())
    assert manifest["dataset"]["input_shape"] == [25, 25, 1]
    assert manifest["dataset"]["classes"] == ["digit0", "digit1"]
    # the run stores the images as uint8, 4x less than float32
    x_train = np.load(pngs / "ig" / "data" / "train.x.npy", mmap_mode="r")
    assert x_train.dtype == np.uint8 and x_train.shape[1:] == (25, 25, 1)
    acc = [r for r in pq.read_table(pngs / "ig" / "metrics.parquet").to_pylist()
           if r["model"] == "ensemble-mean" and r["split"] == "test"][0]["accuracy"]
    assert acc > 0.9  # 0 against 1 is easy: the members learned from the pixels


def test_predict_names_every_file_and_the_export_takes_raw_pixels(pngs, tmp_path, plain_tf):
    out = tmp_path / "new.csv"
    for mode in ("in-graph", "between-graph"):
        assert run_cli("predict", "--run", pngs / "ig", "--data", pngs / "new", "--out", out,
                       "--mode", mode, "--quiet") == 0
        got = pcsv.read_csv(out)
        files = sorted(str(p) for p in (pngs / "new").glob("*.png"))
        assert got.column("input").to_pylist() == files  # one row per input, named
        probs = _p(got)
        if mode == "in-graph":
            first = probs
        assert np.abs(probs - first).max() <= 1e-5
    from PIL import Image

    x = np.stack([np.asarray(Image.open(f))[:, :, None] for f in files]).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert run_cli("export", "--run", pngs / "ig", "--out", tmp_path / "models") == 0
    served = _serve(plain_tf, tmp_path / "models" / "1", {"features": tmp_path / "x.npy"},
                    tmp_path)
    assert np.abs(served - first).max() <= 1e-4


def _serve(plain_tf, version, inputs: dict, tmp_path):
    """The default signature of a SavedModel in a plain TensorFlow process (this package not
    imported), fed `{input name: .npy file}`; returns its probabilities."""
    code = ("import sys, json, numpy as np, tensorflow as tf\n"
            "assert 'ensemble' not in sys.modules\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "feeds = {k: tf.constant(np.load(v, allow_pickle=False))\n"
            "         for k, v in json.loads(sys.argv[2]).items()}\n"
            "p = m.signatures['serving_default'](**feeds)['probabilities'].numpy()\n"
            "np.save(sys.argv[3], p)\n")
    proc = plain_tf.run(code, version, json.dumps({k: str(v) for k, v in inputs.items()}),
                        tmp_path / "served.npy", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return np.load(tmp_path / "served.npy")


def test_keras_layout_npz_trains_with_its_own_test_split(tmp_path):
    x, y = _digit_images(classes=(0, 1, 2), size=12)
    path = tmp_path / "digits.npz"
    np.savez(path, x_train=x[:400], y_train=y[:400], x_test=x[400:], y_test=y[400:])
    assert run_cli("train", "--data", path, "--model", "cnn", "--members", "2", "--epochs",
                   "1", "--devices", "cpu:2", "--run-dir", tmp_path / "run", "--quiet") == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["dataset"]["rows"]["test"] == len(x) - 400
    assert manifest["dataset"]["input_shape"] == [12, 12]  # [h, w]: the cnn adds a channel
    rows = np.load(tmp_path / "run" / "data" / "test.row.npy")
    assert sorted(rows.tolist()) == list(range(400, len(x)))


def test_digits_cnn_config_and_the_estimator_on_4d_arrays(tmp_path):
    assert run_cli("train", "--config", ROOT / "configs" / "digits-cnn.toml", "--members", "2",
                   "--epochs", "1", "--devices", "cpu:2", "--run-dir", tmp_path / "run",
                   "--quiet") == 0
    from sklearn.datasets import load_digits

    from ensemble.models.builtin import cnn
    from ensemble.sklearn import DeepEnsembleClassifier

    d = load_digits()
    x = (d.images / 16.0)[..., None]  # [n, 8, 8, 1]
    clf = DeepEnsembleClassifier(model=cnn, model__filters=[8], model__dense=32, n_members=2,
                                 epochs=3, batch_size=64, random_state=0)
    clf.fit(x[:1200], d.target[:1200])
    assert clf.predict_proba(x[1200:]).shape == (len(x) - 1200, 10)
    assert clf.score(x[1200:], d.target[1200:]) > 0.6


@pytest.fixture(scope="module")
def penguins(tmp_path_factory):
    """palmerpenguins as a user has it, plus an id, a free-text name and a date column."""
    from palmerpenguins import load_penguins

    base = tmp_path_factory.mktemp("penguins")
    df = load_penguins()
    df.insert(0, "id", np.arange(1000, 1000 + len(df)))
    rng = np.random.default_rng(0)
    df["name"] = [f"penguin {w}{i}" for i, w in enumerate(rng.choice(["ann", "bo", "cy"],
                                                                     len(df)))]
    df["seen"] = [f"2021-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(len(df))]
    df.iloc[:300].to_csv(base / "train.csv", index=False)
    df.iloc[300:].drop(columns=["species"]).to_csv(base / "new.csv", index=False)
    return base


def test_real_table_from_cli_flags_predict_csv_and_columnar_export(penguins, tmp_path, capsys,
                                                                  plain_tf):
    run_dir = tmp_path / "run"
    argv = ["train", "--data", penguins / "train.csv", "--target", "species", "--members", "2",
            "--epochs", "3", "--devices", "cpu:2", "--run-dir", run_dir, "--quiet"]
    assert run_cli(*argv) == 2  # the date column and the missing values, in one line
    err = capsys.readouterr().err
    assert "'seen' holds dates" in err and "--drop seen" in err and "impute" in err
    assert run_cli(*argv, "--drop", "id,seen", "--impute", "median") == 0
    err = capsys.readouterr().err  # a distinct name on every row: an identifier, carried
    assert "has 300 distinct values in the 300 rows with a value (an identifier" in err and \
        "--categorical island,sex,name" in err
    assert err.count("(an identifier") == 1, err  # checked, then prepared: said once
    out = tmp_path / "new.csv"
    assert run_cli("predict", "--run", run_dir, "--data", penguins / "new.csv", "--out", out,
                   "--quiet") == 0
    got = pcsv.read_csv(out)
    new = pcsv.read_csv(penguins / "new.csv")
    assert got.column("id").to_pylist() == new.column("id").to_pylist()  # one row per input
    assert got.column("seen").to_pylist() == new.column("seen").to_pylist()
    assert got.column("name").to_pylist() == new.column("name").to_pylist()
    assert run_cli("export", "--run", run_dir, "--out", tmp_path / "models") == 0
    feeds = {}
    pre = json.loads((run_dir / "preprocessing.json").read_text())
    from ensemble.data.export_inputs import input_names

    key = input_names(pre["feature_names"] + list(pre["categories"]))
    for c in pre["feature_names"]:
        np.save(tmp_path / f"{c}.npy", new.column(c).to_numpy(zero_copy_only=False)
                .astype(np.float32))
        feeds[key[c]] = tmp_path / f"{c}.npy"
    for c in pre["categories"]:
        values = ["" if v is None else v for v in new.column(c).to_pylist()]
        np.save(tmp_path / f"{c}.npy", np.asarray(values, dtype=str))
        feeds[key[c]] = tmp_path / f"{c}.npy"
    served = _serve(plain_tf, tmp_path / "models" / "1", feeds, tmp_path)
    assert np.abs(served - _p(got)).max() <= 1e-4


def _bad_folder(tmp_path, kind):
    from PIL import Image

    root = tmp_path / kind
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((5, 5), 40 * i, np.uint8), "L").save(root / c / f"{i}.png")
    if kind == "unreadable":
        (root / "a" / "9.png").write_bytes(b"not a png")
    elif kind == "sizes":
        Image.fromarray(np.zeros((6, 7), np.uint8), "L").save(root / "b" / "9.png")
    elif kind == "empty":
        (root / "c").mkdir()
    return root


def _bad_npz(tmp_path, kind):
    path = tmp_path / f"{kind}.npz"
    if kind == "keys":
        np.savez(path, features=np.zeros((4, 3)), labels=np.zeros(4))
    elif kind == "lengths":
        np.savez(path, x=np.zeros((4, 3)), y=np.arange(3))
    elif kind == "empty_rows":
        np.savez(path, x=np.zeros((12, 4, 0)), y=np.arange(12) % 2)
    elif kind == "bytes":
        np.savez(path, x=np.zeros((12, 3)), y=np.array([b"\xff", b"a", b"b"] * 4))
    elif kind in ("test_class", "test_kind"):  # Keras's layout, test labels unlike train's
        y_test = np.arange(12) % 4 if kind == "test_class" else np.array(list("abc") * 4)
        np.savez(path, x_train=np.zeros((24, 3)), y_train=np.arange(24) % 3,
                 x_test=np.zeros((12, 3)), y_test=y_test)
    else:
        np.savez(path, x=np.array([{"a": 1}] * 4, dtype=object), y=np.arange(4))
    return path


@pytest.mark.parametrize("make, kind, message", [
    (_bad_folder, "unreadable", "Cannot read image"),
    (_bad_folder, "sizes", "Images differ in size"),
    (_bad_folder, "empty", "holds no images"),
    (_bad_npz, "keys", "expected arrays x and y"),
    (_bad_npz, "lengths", "differ in length (4 and 3)"),
    (_bad_npz, "pickled", "pickled (object) arrays"),
    (_bad_npz, "test_class", "holds label 3, which its training part does not"),
    (_bad_npz, "test_kind", "in y_train and y_test of"),
    (_bad_npz, "empty_rows", "rows of shape [4, 0], which hold no value"),
    (_bad_npz, "bytes", "row 0's (b'\\xff') are not UTF-8 text"),
])
def test_bad_array_inputs_exit_2_with_one_line(tmp_path, capsys, make, kind, message):
    source = make(tmp_path, kind)
    assert run_cli("train", "--data", source, "--run-dir", tmp_path / "run", "--quiet") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("shape", [(6,), (4, 5), (4, 5, 2), (2, 3, 2, 2)])
def test_float_arrays_of_any_rank_are_standardised_per_element(shape):
    """A float `.npz` of rows `[h, w]` (no channel axis) or deeper used to fail at training
    with a Keras Normalization rank error; the member's first layer standardises each element
    with the training rows' mean and std, also after the preprocessing's JSON round trip."""
    from ensemble.data.arrays import ArrayPreprocessing
    from ensemble.data.containers import ArrayData

    rng = np.random.default_rng(0)
    x = (rng.normal(3.0, 2.0, (40, *shape)) * rng.uniform(0.5, 4.0, shape)).astype(np.float32)
    ds = ArrayData("x.npz", x, np.arange(40) % 2, np.arange(40).astype(object))
    train = np.arange(30)
    pre = ArrayPreprocessing.fit(ds, train, np.array([0, 1]))
    pre = ArrayPreprocessing.from_dict(json.loads(pre.to_json()))
    got = np.asarray(pre.scaling_layer()(x))
    want = (x - x[train].mean(axis=0)) / x[train].std(axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_image_folder_for_a_run_of_float_arrays(tmp_path):
    """A run trained on a float `.npz` reads an image folder as rows of its own shape: grey
    `[h, w]` rows (no channel axis) or `[h, w, 1]`, RGB `[h, w, 3]`, each image resized as
    `keras.utils.load_img` does; rows no image can be (`[4, 4, 2]`) are one line."""
    import keras
    from PIL import Image

    from ensemble.core.errors import UsageError
    from ensemble.data.arrays import ArrayPreprocessing, ArrayStream

    rng = np.random.default_rng(1)
    (tmp_path / "a").mkdir()
    files = []
    for i, mode in enumerate(["L", "RGB", "L"]):
        f = tmp_path / "a" / f"{i}.png"
        shape = (12, 10) if mode == "L" else (12, 10, 3)
        Image.fromarray(rng.integers(0, 256, shape).astype(np.uint8), mode).save(f)
        files.append(f)

    def rows(shape):
        pre = ArrayPreprocessing(shape, np.array([0, 1]), "float32", np.zeros(shape, np.float32),
                                 np.ones(shape, np.float32), color_mode="auto")
        stream = ArrayStream(pre, str(tmp_path), batch_rows=2)
        stream.check()
        return np.concatenate([b.x for b in stream])

    for shape, colour in (((8, 6), "grayscale"), ((8, 6, 1), "grayscale"), ((8, 6, 3), "rgb")):
        want = np.stack([np.asarray(keras.utils.load_img(f, color_mode=colour, target_size=(8, 6),
                                                         interpolation="bilinear"))
                         for f in files]).reshape(3, *shape).astype(np.float32)
        np.testing.assert_array_equal(rows(shape), want)
    with pytest.raises(UsageError, match=r"rows of shape \[4, 4, 2\], which no image is"):
        rows((4, 4, 2))


def test_a_class_folders_nested_images_count_as_keras_reads_them(tmp_path):
    from PIL import Image

    from ensemble.data.images import load_image_folder

    for rel in ["c0/a.png", "c0/sub/deeper/b.png", "c0/.hidden/no.png", "c0/sub/.no.png",
                "c1/c.png", "c1/notes.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".png"):
            Image.fromarray(np.full((4, 4), 7, np.uint8), "L").save(tmp_path / rel)
        else:
            (tmp_path / rel).write_text("not an image")
    data = load_image_folder(str(tmp_path))
    assert sorted(data.y.tolist()) == ["c0", "c0", "c1"]
    assert sorted(str(f.relative_to(tmp_path)) for f in data.x.files) == [
        "c0/a.png", "c0/sub/deeper/b.png", "c1/c.png"]


def test_predict_labels_a_class_folders_nested_images_by_their_class(tmp_path):
    """`y_true` of an image folder at `predict` is each file's class folder, at any depth
    (was its parent's name: `c0/sub/b.png` labelled `sub`, and a batch holding one lost
    every label)."""
    from PIL import Image

    from ensemble.data.arrays import ArrayPreprocessing, ArrayStream

    for rel in ["c0/a.png", "c0/sub/b.png", "c1/c.png", "c1/c0/d.png"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4), 7, np.uint8), "L").save(tmp_path / rel)
    pre = ArrayPreprocessing((4, 4, 1), np.array(["c0", "c1"]), "uint8", None, None,
                             color_mode="grayscale")
    batches = list(ArrayStream(pre, str(tmp_path), batch_rows=8))
    assert [str(p) for p in batches[0].ids] == [
        str(tmp_path / r) for r in ("c0/a.png", "c0/sub/b.png", "c1/c.png", "c1/c0/d.png")]
    assert batches[0].y.tolist() == [0, 0, 1, 1]


def test_array_labels_the_run_never_saw_leave_only_their_rows_unlabelled(tmp_path, capsys):
    """As a table's target column: a label the run never saw (an `.npz`'s `y`, a class
    folder) leaves `y_true` null on its rows alone, with one notice naming it (was: silently
    no `y_true` for the whole batch); an image at the top of the folder has no label."""
    from PIL import Image

    from ensemble.data.arrays import ArrayPreprocessing, ArrayStream

    pre = ArrayPreprocessing((4, 4, 1), np.array([0, 1]), "uint8", None, None,
                             color_mode="grayscale")
    np.savez(tmp_path / "new.npz", x=np.zeros((6, 4, 4, 1), np.uint8), y=[0, 1, 5, 1, 7, 5])
    capsys.readouterr()
    batches = list(ArrayStream(pre, str(tmp_path / "new.npz"), batch_rows=4))
    assert [b.y.tolist() for b in batches] == [[0, 1, -1, 1], [-1, -1]]
    assert (f"notice: 3 rows of the y array of {tmp_path / 'new.npz'} hold labels the run "
            "never saw (5, 7): predicted, with y_true null on them (the run's classes: 0, 1)"
            ) in capsys.readouterr().err
    for rel in ["0/a.png", "1/b.png", "9/c.png", "top.png"]:
        (tmp_path / "imgs" / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4), 7, np.uint8), "L").save(tmp_path / "imgs" / rel)
    (batch,) = ArrayStream(pre, str(tmp_path / "imgs"), batch_rows=8)
    assert batch.y.tolist() == [0, 1, -1, -1]  # 9/c.png: never seen; top.png: no class
    err = capsys.readouterr().err
    assert "1 row of the class folders of" in err and "holds a label the run never saw (9)" in err


def test_npz_labels_that_are_nan_leave_only_their_rows_unlabelled(tmp_path, capsys):
    """An `.npz` `y` of floats with NaN (a missing label, as numpy stores one): those rows'
    `y_true` are null, the others keep their class (was: no label on any row)."""
    from ensemble.data.arrays import ArrayPreprocessing, ArrayStream

    pre = ArrayPreprocessing((4, 4, 1), np.array([0, 1]), "uint8", None, None,
                             color_mode="grayscale")
    path = tmp_path / "new.npz"
    np.savez(path, x=np.zeros((6, 4, 4, 1), np.uint8), y=[0, np.nan, 1, 1, np.nan, np.nan])
    capsys.readouterr()
    batches = list(ArrayStream(pre, str(path), batch_rows=4))
    assert [None if b.y is None else b.y.tolist() for b in batches] == [[0, -1, 1, 1], None]
    err = capsys.readouterr().err
    assert f"the y array of {path} has 3 missing labels in 6 rows" in err
    assert "never saw" not in err


def test_predict_refuses_target_for_an_image_folder_run(pngs, tmp_path, capsys):
    """An image folder's labels are its class folders: `--target` was silently ignored."""
    capsys.readouterr()
    assert run_cli("predict", "--run", pngs / "ig", "--data", pngs / "new", "--out",
                   tmp_path / "p.parquet", "--target", "label") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: Cannot use --target 'label': the run reads arrays, whose labels "
                   f"are the class folders of {pngs / 'new'}, not a column; expected no "
                   "--target"]
    assert not (tmp_path / "p.parquet").exists()


def test_an_image_folder_for_a_run_of_uint8_arrays_reads_grey_rows_as_grey(tmp_path):
    """A uint8 `.npz` (or `digits_images`) run records `color_mode` "rgb" whatever its rows:
    images for its `[h, w]` rows were read as RGB and cut to the red channel, and for its
    `[h, w, 1]` rows refused as `[h, w, 3]`; they are converted to grey, as `load_img`."""
    import keras
    from PIL import Image

    from ensemble.data.arrays import ArrayPreprocessing, ArrayStream

    (tmp_path / "a").mkdir()
    green = np.tile(np.array([0, 255, 0], np.uint8), (8, 6, 1))
    Image.fromarray(green, "RGB").save(tmp_path / "a" / "g.png")
    want = np.asarray(keras.utils.load_img(tmp_path / "a" / "g.png", color_mode="grayscale"))
    for shape in ((8, 6), (8, 6, 1)):
        pre = ArrayPreprocessing(shape, np.array([0, 1]), "uint8", color_mode="rgb")
        stream = ArrayStream(pre, str(tmp_path), batch_rows=2)
        stream.check()
        got = next(iter(stream)).x
        assert got.shape == (1, *shape)
        np.testing.assert_array_equal(got.reshape(8, 6), want)


def test_a_16_bit_grey_png_keeps_its_top_byte_as_tensorflow_decodes_it(tmp_path):
    """A 16-bit grey PNG (Pillow mode `I;16`) reads as `tf.io.decode_image` (what
    `image_dataset_from_directory` uses) decodes it, `v >> 8`; Pillow's `convert("L")` clipped
    every value above 255 to 255, so such an image was almost all white."""
    import tensorflow as tf
    from PIL import Image

    from ensemble.data.images import load_image_folder

    (tmp_path / "c0").mkdir()
    (tmp_path / "c1").mkdir()
    ramp = (np.arange(64).reshape(8, 8) * 1024).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "c0" / "a.png")
    Image.fromarray(np.full((8, 8), 7, np.uint8), "L").save(tmp_path / "c1" / "b.png")
    data = load_image_folder(str(tmp_path))
    want = tf.io.decode_image(tf.io.read_file(str(tmp_path / "c0" / "a.png")), channels=1,
                              expand_animations=False).numpy()
    np.testing.assert_array_equal(data.x[0:1][0], want)
    assert data.x[0:1].max() == 252  # 63 * 1024 >> 8, not 255


def test_class_folders_are_numbers_only_when_written_as_numbers(tmp_path):
    """Folders `01` and `1` were both class 1 (merged silently), `²` and `³` crashed with a
    traceback (`isdigit` but not `int`); they stay their names, and `-1`, `7` are numbers."""
    from PIL import Image

    from ensemble.data.images import folder_labels, load_image_folder

    for c in ["01", "1", "²"]:
        (tmp_path / c).mkdir()
        Image.fromarray(np.full((4, 4), 7, np.uint8), "L").save(tmp_path / c / "a.png")
    assert load_image_folder(str(tmp_path)).y.tolist() == ["01", "1", "²"]
    assert folder_labels(["-1", "7"]).tolist() == [-1, 7]
    assert folder_labels(["-1", "7"]).dtype == np.int64
    assert folder_labels(["³", "7"]).tolist() == ["³", "7"]


def test_byte_string_labels_of_an_npz_are_read_as_utf8_text(tmp_path):
    """Labels saved as bytes (numpy `S`, as h5py gives them) were decoded as ASCII: `é`
    crashed with a UnicodeDecodeError traceback (exit 1); they are UTF-8 text."""
    from ensemble.data.npz import load_npz

    np.savez(tmp_path / "b.npz", x=np.zeros((3, 2)), y=np.char.encode(["é", "a", "é"], "utf-8"))
    assert load_npz(str(tmp_path / "b.npz")).y.tolist() == ["é", "a", "é"]
