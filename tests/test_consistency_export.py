"""Export and `ensemble serve` answer as `ensemble predict` does (issue 30, point 1; #29).

Real files: tiny runs (2 members, 2 epochs) exported once per module. Checked:
- the SavedModel loaded by plain TensorFlow in a process without this package refuses a
  missing value, inf and a number beyond float32 of a run trained without imputation, naming
  the input and column; a run trained with `--impute median` fills NaN (the value predict
  gives) and still refuses inf;
- a classification export served by `ensemble serve` on loopback answers those with HTTP 400
  naming the input, and its entropy, expected entropy and mutual information equal
  `ensemble predict`'s within 1e-5; a regression export's std, aleatoric and epistemic std
  equal predict's.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from conftest import run_cli

TINY = ["--members", "2", "--epochs", "2", "--devices", "cpu:2", "--quiet"]


def _diabetes_csv(path, with_string: bool = False):
    """sklearn's diabetes table as a CSV (`sex` as text when `with_string`)."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes(scaled=False)
    cols = {n: d.data[:, i] for i, n in enumerate(d.feature_names)}
    if with_string:
        cols["sex"] = np.where(d.data[:, 1] > 1.5, "F", "M")
    cols["progression"] = d.target
    pcsv.write_csv(pa.table(cols), path)
    return path


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{kind: (run dir, export version dir)} for `regression` (numeric `features`, no
    imputation) and `imputed` (one input per column, `--impute median`)."""
    base = tmp_path_factory.mktemp("consistency")
    runs = {}
    for kind, data, extra in (
            ("regression", _diabetes_csv(base / "d.csv"), []),
            ("imputed", _diabetes_csv(base / "ds.csv", True), ["--impute", "median"])):
        run = base / kind
        assert run_cli("train", "--data", data, "--target", "progression", "--task",
                       "regression", "--run-dir", run, *TINY, *extra) == 0
        assert run_cli("export", "--run", run, "--out", base / "models" / kind) == 0
        runs[kind] = (run, base / "models" / kind / "1")
    return runs


LOADER = """
import json, sys
import numpy as np
import tensorflow as tf
assert "ensemble" not in sys.modules and "pipelines" not in sys.modules
answers = {}
for name, (version, cases) in json.load(open(sys.argv[1])).items():
    fn = tf.saved_model.load(version).signatures["serving_default"]
    answers[name] = []
    for case in cases:
        inputs = {k: tf.constant(v) if isinstance(v[0], str) else tf.constant(v, tf.float32)
                  for k, v in case.items()}
        try:
            out = fn(**inputs)
            answers[name].append({k: v.numpy().tolist() for k, v in out.items()})
        except tf.errors.InvalidArgumentError as exc:
            answers[name].append({"error": exc.message})
json.dump(answers, open(sys.argv[2], "w"))
"""


def _rows(run, n=3):
    """The first `n` test rows of the run's source CSV (a pandas DataFrame)."""
    from ensemble.core import artifacts

    preds = pq.read_table(run / "predictions.parquet").to_pandas()
    t = preds[(preds.model == "member-0") & (preds.split == "test")].sort_values("row")
    src = artifacts.read_manifest(run)["dataset"]["source"]
    return pcsv.read_csv(src).to_pandas().iloc[t.source_row.to_numpy()[:n]]


def _features(version):
    return (version / "assets" / "feature_names.txt").read_text().split()


def _columnar(rows, names, change=None):
    """One input per column (`export_inputs.input_names`), `change` = (column, value) on row 0."""
    from ensemble.data.export_inputs import input_names

    key = input_names(names)
    c = {key[n]: (rows[n].astype(str).tolist() if n == "sex" else
                  rows[n].astype(float).tolist()) for n in names}
    if change:
        c[key[change[0]]][0] = change[1]
    return c


@pytest.fixture(scope="module")
def plain(exports, tmp_path_factory, plain_tf):
    """The answers of `serving_default` of both exports in ONE plain TensorFlow process (no
    PYTHONPATH, cwd outside the checkout): `{"regression": [...], "imputed": [...]}`, each
    case's outputs or `{"error": message}`; cases as built here."""
    tmp = tmp_path_factory.mktemp("plain")
    run, version = exports["regression"]
    names = _features(version)
    x = _rows(run, 5)[names].to_numpy(np.float64)
    cases = [{"features": x.tolist()}]
    for value in (float("nan"), float("inf"), 1e39):
        bad = x.copy()
        bad[1, names.index("bmi")] = value
        cases.append({"features": bad.tolist()})
    unfit = x.copy()
    unfit[0, names.index("s5")] = 3e38  # fits float32, but not once standardised
    cases.append({"features": unfit.tolist()})
    irun, iversion = exports["imputed"]
    inames, irows = _features(iversion), _rows(irun, 2)
    icases = [_columnar(irows, inames), _columnar(irows, inames, ("bmi", float("nan"))),
              _columnar(irows, inames, ("sex", "")),
              _columnar(irows, inames, ("bp", float("inf")))]
    (tmp / "cases.json").write_text(json.dumps({"regression": [str(version), cases],
                                                "imputed": [str(iversion), icases]}))
    proc = plain_tf.run(LOADER, tmp / "cases.json", tmp / "out.json", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp / "out.json").read_text())


def test_plain_tensorflow_refuses_what_predict_refuses(plain):
    ok, nan, inf, big, unfit = plain["regression"]
    assert np.all(np.isfinite(ok["mean"])) and np.all(np.asarray(ok["std"]) > 0)
    assert "input `features` column(s) bmi: a missing value" in nan["error"]
    assert "--impute" in nan["error"]
    for answer in (inf, big):
        assert "input `features` column(s) bmi: a value that is infinite or beyond float32" \
            in answer["error"]
    assert "column(s) s5: a value that does not fit float32" in unfit["error"]


def test_an_imputing_export_fills_nan_and_still_refuses_inf(exports, plain, tmp_path):
    run, version = exports["imputed"]
    ok, nan, empty, inf = plain["imputed"]
    assert "error" not in ok and "error" not in nan and "error" not in empty
    assert "input `bp`: a value that is infinite or beyond float32" in inf["error"]
    # predict on the same rows with the missing value gives the same answer as the graph
    table = _rows(run, 2)[_features(version)].copy()
    table.loc[table.index[0], "bmi"] = np.nan
    pcsv.write_csv(pa.Table.from_pandas(table, preserve_index=False), tmp_path / "in.csv")
    assert run_cli("predict", "--run", run, "--data", tmp_path / "in.csv",
                   "--out", tmp_path / "p.parquet") == 0
    got = pq.read_table(tmp_path / "p.parquet").to_pandas()
    assert np.allclose(got.y_pred, nan["mean"], rtol=1e-5, atol=1e-3)
    assert np.allclose(got["std"], nan["std"], rtol=1e-5, atol=1e-3)
    assert not np.allclose(nan["mean"][0], ok["mean"][0], rtol=1e-6)  # the fill mattered


def test_regression_export_gives_predicts_uncertainty_columns(exports, plain, tmp_path):
    run, _ = exports["regression"]
    out = plain["regression"][0]
    pcsv.write_csv(pa.Table.from_pandas(_rows(run, 5), preserve_index=False),
                   tmp_path / "in.csv")
    assert run_cli("predict", "--run", run, "--data", tmp_path / "in.csv",
                   "--out", tmp_path / "p.parquet") == 0
    got = pq.read_table(tmp_path / "p.parquet").to_pandas()
    for column in ("std", "aleatoric_std", "epistemic_std"):
        assert np.allclose(got[column], out[column], rtol=1e-5, atol=1e-4), column
    assert np.allclose(got.y_pred, out["mean"], rtol=1e-5, atol=1e-3)


# ---------------------------------------------------------------- `ensemble serve` over HTTP

@pytest.fixture(scope="module")
def served_digits(tmp_path_factory):
    """(run dir, server URL) of a 2-member digits export served on a free loopback port;
    the server is stopped with SIGTERM at the end of the module."""
    pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from test_serve_http import serving

    base = tmp_path_factory.mktemp("served")
    assert run_cli("train", "--data", "digits", "--run-dir", base / "run", *TINY) == 0
    assert run_cli("export", "--run", base / "run", "--out", base / "models" / "digits") == 0
    with serving(base / "models" / "digits", base / "serve.err", "--replicas", "1") as (_, url):
        yield base / "run", url


def _digits(n):
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data[:n].astype(np.float64), list(d.feature_names)


@pytest.mark.parametrize("body", ['{"instances": [[%s]]}', '{"inputs": [[%s]]}'])
@pytest.mark.parametrize("value, words", [
    ("null", "a missing value (NaN or null)"), ("NaN", "a missing value (NaN or null)"),
    ("1e39", ""), ("Infinity", "")])  # refused by the server itself (non-finite, the row)
def test_serve_answers_400_naming_the_input(served_digits, body, value, words):
    import httpx

    _, url = served_digits
    x, names = _digits(1)
    row = [f"{v:g}" for v in x[0]]
    row[5] = value
    r = httpx.post(f"{url}/v1/models/digits:predict", content=body % ",".join(row), timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "features" in error or "non-finite" in error.lower() or "Infinity" in error, error
    assert words in error
    if words:
        assert f"column(s) {names[5]}" in error


def test_served_uncertainty_equals_predict(served_digits, tmp_path):
    import httpx

    run, url = served_digits
    x, names = _digits(40)
    pcsv.write_csv(pa.table({n: x[:, i] for i, n in enumerate(names)}), tmp_path / "in.csv")
    assert run_cli("predict", "--run", run, "--data", tmp_path / "in.csv",
                   "--out", tmp_path / "p.parquet") == 0
    want = pq.read_table(tmp_path / "p.parquet").to_pandas()
    r = httpx.post(f"{url}/v1/models/digits:predict", json={"instances": x.tolist()},
                   timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()["predictions"]
    for column in ("entropy", "expected_entropy", "mutual_information"):
        served = np.asarray([row[column] for row in got])
        assert np.abs(served - want[column].to_numpy()).max() <= 1e-5, column
    assert want["mutual_information"].max() > 1e-4  # the members do disagree somewhere
    probs = np.asarray([row["probabilities"] for row in got])
    assert np.abs(probs - want[[f"p_{k}" for k in range(10)]].to_numpy()).max() <= 1e-5


def test_the_serving_guides_sample_answer_names_what_serve_answers(served_digits):
    """The sample answer of docs/guides/serving.md left out the entropy fields a real answer
    has: its keys are those of one prediction of `ensemble serve`."""
    import re

    import httpx

    from conftest import ROOT

    _, url = served_digits
    x, _ = _digits(1)
    r = httpx.post(f"{url}/v1/models/digits:predict", json={"instances": x.tolist()},
                   timeout=60)
    assert r.status_code == 200, r.text
    text = (ROOT / "docs" / "guides" / "serving.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(text) if ln.startswith('# {"predictions": [{'))
    sample = " ".join(ln for ln in text[start:start + 5] if ln.startswith("#"))
    sample = sample[:sample.index("}]}") + 3]
    assert set(re.findall(r'"(\w+)":', sample)) - {"predictions"} == set(r.json()["predictions"][0])


def test_array_and_columnar_exports_refuse_in_the_graph(tmp_path):
    """An image array run (`features` `[batch, 8, 8, 1]`) refuses NaN and inf; a run with a string
    column and no imputation refuses NaN in a numeric input and `""` in the string one,
    each naming its input (loaded in this process: the graph alone decides)."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    d = load_digits()
    pixels = (d.images * 15).astype(np.uint8)[..., None]  # [n, 8, 8, 1] 0..240
    np.savez(tmp_path / "digits.npz", x=pixels[:300], y=d.target[:300])
    one = ["--members", "2", "--epochs", "1", "--devices", "cpu:2", "--quiet"]
    assert run_cli("train", "--data", tmp_path / "digits.npz", "--run-dir", tmp_path / "a",
                   *one) == 0
    assert run_cli("train", "--data", _diabetes_csv(tmp_path / "ds.csv", True), "--target",
                   "progression", "--task", "regression", "--run-dir", tmp_path / "c",
                   *one) == 0
    for run in ("a", "c"):
        assert run_cli("export", "--run", tmp_path / run, "--out", tmp_path / f"m{run}") == 0
    fn = tf.saved_model.load(str(tmp_path / "ma" / "1")).signatures["serving_default"]
    x = pixels[300:302].astype(np.float32)
    assert fn(features=tf.constant(x))["probabilities"].shape == (2, 10)
    for value, words in ((np.nan, "a missing value"), (np.inf, "a value that is infinite")):
        bad = x.copy()
        bad[1, 3, 4, 0] = value
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"input `features`: {words}"):
            fn(features=tf.constant(bad))
    fn = tf.saved_model.load(str(tmp_path / "mc" / "1")).signatures["serving_default"]
    names = _features(tmp_path / "mc" / "1")
    rows = pcsv.read_csv(tmp_path / "ds.csv").to_pandas().iloc[:2]

    def feed(change=None):
        return {k: tf.constant(v) if isinstance(v[0], str) else tf.constant(v, tf.float32)
                for k, v in _columnar(rows, names, change).items()}

    assert np.all(np.isfinite(fn(**feed())["mean"].numpy()))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input `bmi`: a missing value \(NaN or null\); this run was "
                             "trained without imputation"):
        fn(**feed(("bmi", np.nan)))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input `sex`: a missing value \(empty string\)"):
        fn(**feed(("sex", "")))


def test_input_names_are_names_tensorflow_keeps_and_never_collide():
    from tensorflow.core.function.polymorphism.function_type import sanitize_arg_name

    from ensemble.data.export_inputs import input_names

    columns = ["len /", "len %", "len__", "od280/od315", "1st", "_x", "färbung", "a.b", "a-b",
               "", "class"]
    key = input_names(columns)
    assert len(set(key.values())) == len(columns)
    for c, name in key.items():  # TensorFlow's own rule for a function argument's name
        assert sanitize_arg_name(name) == name, (c, name)
    assert key["len /"] == "len__" and key["len %"] == "len___1" and key["len__"] == "len___2"
    assert key["od280/od315"] == "od280_od315" and key["1st"] == "c1st"
