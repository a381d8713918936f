import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from ensemble.data import kinds
from ensemble.data import sources
from ensemble.core.labels import encode
from ensemble.data.settings import DataConfig, SyntheticConfig
from ensemble.core.errors import UsageError
from ensemble.data.preprocessing import Preprocessing


@pytest.mark.parametrize("name, rows, features, classes", [
    ("digits", 1797, 64, 10), ("breast_cancer", 569, 30, 2), ("wine", 178, 13, 3),
    ("iris", 150, 4, 3),
])
def test_builtin_sources(name, rows, features, classes):
    ds = sources.load(DataConfig(source=name))
    assert ds.x.shape == (rows, features) and ds.x.dtype == np.float32
    assert len(np.unique(ds.y)) == classes


def test_synthetic_source_follows_config():
    ds = sources.load(DataConfig(source="synthetic",
                              synthetic=SyntheticConfig(rows=500, features=8, classes=3)))
    assert ds.x.shape == (500, 8) and set(np.unique(ds.y)) == {0, 1, 2}


def test_split_is_stratified_disjoint_and_seeded():
    cfg = DataConfig()
    ds = sources.load(cfg)
    rows, classes = sources.split(ds, cfg, seed=0)
    all_rows = np.concatenate(list(rows.values()))
    assert len(all_rows) == len(np.unique(all_rows)) == len(ds.y)
    assert len(rows["test"]) == 360 and len(rows["validation"]) == 180
    for part in rows.values():  # every class in every split, in proportion
        share = np.bincount(ds.y[part], minlength=10) / len(part)
        np.testing.assert_allclose(share, np.bincount(ds.y) / len(ds.y), atol=0.02)
    again, _ = sources.split(ds, cfg, seed=0)
    other, _ = sources.split(ds, cfg, seed=1)
    assert np.array_equal(again["test"], rows["test"])
    assert not np.array_equal(other["test"], rows["test"])


def test_scaler_fit_on_train_only_and_columns_matched_by_name(tmp_path):
    ds = sources.load(DataConfig(source="iris"))
    train = np.arange(0, 150, 2)
    pre = Preprocessing.fit(ds, train, np.unique(ds.y))
    np.testing.assert_allclose(pre.mean, ds.x[train].mean(axis=0), rtol=1e-6)
    shuffled = sources.Dataset("s", ds.x[:, ::-1], None, ds.feature_names[::-1])
    np.testing.assert_array_equal(pre.transform(shuffled), pre.transform(ds))
    path = tmp_path / "pre.json"
    path.write_text(pre.to_json())
    back = kinds.read_preprocessing(path)
    np.testing.assert_array_equal(back.transform(ds), pre.transform(ds))
    assert "pickle" not in path.read_text()


def _write(tmp_path, table, name="d.csv"):
    path = tmp_path / name
    if name.endswith(".csv"):
        pcsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    return str(path)


GOOD = {"a": [1.0, 2.0, 3.0, 4.0], "b": [0, 1, 0, 1], "label": ["x", "y", "x", "y"]}


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_file_source_with_string_labels(tmp_path, ext):
    ds = sources.load(DataConfig(source=_write(tmp_path, pa.table(GOOD), f"d.{ext}"),
                              target="label"))
    assert ds.feature_names == ("a", "b")
    assert ds.y.tolist() == ["x", "y", "x", "y"]
    np.testing.assert_array_equal(encode(ds.y, np.array(["x", "y"])), [0, 1, 0, 1])


@pytest.mark.parametrize("columns, target, match", [
    ({**GOOD, "a": [1.0, float("nan"), 3.0, 4.0]}, "label", "'a'.*missing values"),
    ({**GOOD, "a": [1.0, float("inf"), 3.0, 4.0]}, "label", "NaN or inf"),
    ({**GOOD, "a": ["p", "q", "r", "s"]}, "label", "'a'.*expected numbers"),
    (GOOD, "missing", "Target column 'missing' not found"),
    ({"label": ["x", "y"]}, "label", "no feature columns"),
])
def test_bad_data(tmp_path, columns, target, match):
    path = _write(tmp_path, pa.table(columns), "d.parquet")
    with pytest.raises(UsageError, match=match):  # strings are numbers' problem without encoding
        sources.load(DataConfig(source=path, target=target, categorical="none"))


def test_one_class_is_refused_with_the_task(tmp_path):
    from ensemble.config.schema import from_dict
    from ensemble.runs.prepare import check_data

    path = _write(tmp_path, pa.table({**GOOD, "label": ["x"] * 4}), "d.parquet")
    sources.load(DataConfig(source=path, target="label"))  # a readable table...
    with pytest.raises(UsageError, match="fewer than two classes"):  # ...but no task
        check_data(from_dict({"data": {"source": path, "target": "label"}}))


def test_bad_files(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        sources.load(DataConfig(source=str(tmp_path / "none.csv")))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(UsageError, match="empty"):
        sources.load(DataConfig(source=str(empty)))
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet at all")
    with pytest.raises(UsageError, match="Cannot read .* as Parquet"):
        sources.load(DataConfig(source=str(fake)))
    with pytest.raises(UsageError, match="Unknown data source 'mnist'"):
        sources.load(DataConfig(source="mnist"))


def test_missing_feature_at_predict_time():
    ds = sources.load(DataConfig(source="iris"))
    pre = Preprocessing.fit(ds, np.arange(150), np.unique(ds.y))
    fewer = sources.Dataset("f", ds.x[:, 1:], None, ds.feature_names[1:])
    with pytest.raises(UsageError, match=re.escape(f"{ds.feature_names[0]!r} missing")):
        pre.transform(fewer)


def test_unknown_label():
    with pytest.raises(UsageError, match="'z' is not a class"):
        encode(np.array(["x", "z"]), np.array(["x", "y"]))
    with pytest.raises(UsageError, match="do not match"):
        encode(np.array([0, 1]), np.array(["x", "y"]))


# A small table with the traits of the Palmer penguins CSV: string and boolean features,
# missing numbers, a missing category, a missing label.
TRAITS = ("island,bill,mass,sex,tagged,species\n"
          "Biscoe,39.1,3750,male,true,Adelie\n"
          "Dream,,3800,female,false,Adelie\n"
          "Biscoe,40.3,,female,true,Gentoo\n"
          "Torgersen,47.5,4200,,false,Gentoo\n"
          "Dream,46.1,4100,male,true,\n"
          "Biscoe,36.7,3450,female,false,Adelie\n"
          "Dream,48.7,4450,male,true,Gentoo\n")


def test_every_data_problem_in_one_message_without_tensorflow(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "traits.csv"
    path.write_text(TRAITS)
    with pytest.raises(UsageError) as err:
        sources.load(DataConfig(source=str(path), target="species", categorical="none"))
    msg = str(err.value)
    assert len(msg.splitlines()) == 1
    for col in ("'island'", "'sex'", "'bill'", "'mass'"):  # all at once (booleans are 0/1)
        assert col in msg, msg
    code = ("import sys; from pipelines.cli import main; rc = main(['train', '--data', "
            f"{str(path)!r}, '--target', 'species']); "
            "print(rc, 'tensorflow' in sys.modules, 'keras' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**__import__("os").environ,
                                             "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.stdout.split() == ["2", "False", "False"], proc.stdout + proc.stderr
    assert "'bill' (1 row), 'mass' (1 row), 'sex' (1 row)" in proc.stderr, proc.stderr


def test_categorical_and_imputation_fitted_on_train_rows_only(tmp_path, capsys):
    path = tmp_path / "traits.csv"
    path.write_text(TRAITS)
    ds = sources.load(DataConfig(source=str(path), target="species", impute="median"))
    assert "dropped 1 row of" in capsys.readouterr().err  # the row with no label
    assert ds.feature_names == ("bill", "mass") and set(ds.categorical) == {"island", "sex",
                                                                             "tagged"}
    assert len(ds.y) == 6
    train = np.array([0, 1, 2, 4])  # Biscoe, Dream, Biscoe, Biscoe (rows after the drop)
    pre = Preprocessing.fit(ds, train, np.unique(ds.y), impute="median")
    assert pre.categories["island"] == ["Biscoe", "Dream"]  # Torgersen is not in train
    np.testing.assert_allclose(pre.fill, [np.median([39.1, 40.3, 36.7]),
                                          np.median([3750, 3800, 3450])])
    assert pre.category_fill["sex"] == "female"
    x = pre.transform(ds)
    names = pre.output_names
    assert x.shape == (6, len(names)) and np.isfinite(x).all()
    # the Torgersen row (row 3) has an all-zero island block before scaling: unknown category
    island = [i for i, n in enumerate(names) if n.startswith("island=")]
    raw = x[:, island] * pre.scale[island] + pre.mean[island]
    np.testing.assert_allclose(raw[3], 0.0, atol=1e-6)
    assert "1 row in 'island'" in capsys.readouterr().err
    # the filled value is the training median, scaled
    bill = names.index("bill")
    assert x[1, bill] == pytest.approx((pre.fill[0] - pre.mean[bill]) / pre.scale[bill], rel=1e-5)
    back = tmp_path / "pre.json"
    back.write_text(pre.to_json())
    np.testing.assert_array_equal(kinds.read_preprocessing(back).transform(ds), x)
    assert "pickle" not in back.read_text()


def test_input_columns_matched_by_name_extra_ignored_or_refused(tmp_path, capsys):
    path = tmp_path / "traits.csv"
    path.write_text(TRAITS)
    ds = sources.load(DataConfig(source=str(path), target="species", impute="median"))
    pre = Preprocessing.fit(ds, np.arange(len(ds.y)), np.unique(ds.y), impute="median")
    lines = TRAITS.splitlines()
    with_id = tmp_path / "with_id.csv"  # an id column first, the columns in another order
    cols = lines[0].split(",")
    order = [5, 4, 3, 2, 1, 0]
    with_id.write_text("\n".join(
        ",".join([("row_id" if i == 0 else f"r{i}")] + [ln.split(",")[j] for j in order])
        for i, ln in enumerate(lines)) + "\n")
    capsys.readouterr()
    new = pre.read_input(str(with_id), "species")
    assert "ignoring column 'row_id'" in capsys.readouterr().err
    np.testing.assert_array_equal(pre.transform(new), pre.transform(
        pre.read_input(str(path), "species")))
    assert cols[0] == "island"
    with pytest.raises(UsageError, match="'row_id'.*--strict-columns"):
        pre.read_input(str(with_id), "species", strict=True)
    no_mass = tmp_path / "no_mass.csv"
    no_mass.write_text("\n".join(",".join(p for j, p in enumerate(ln.split(",")) if j != 2)
                                 for ln in lines) + "\n")
    with pytest.raises(UsageError, match="'mass' missing from"):
        pre.read_input(str(no_mass), "species")


def test_relative_source_resolves_against_the_config_folder(tmp_path, monkeypatch):
    from ensemble.config import schema

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.toml").write_text('[data]\nsource = "t.csv"\n')
    monkeypatch.chdir(tmp_path)
    cfg = schema.load("sub/c.toml")
    assert Path(cfg.data.source) == (tmp_path / "sub" / "t.csv").resolve()
    assert schema.load("sub/c.toml", {"data.source": "x.csv"}).data.source == "x.csv"


def test_a_column_that_cannot_be_numbers_is_described_in_words():
    """Not Arrow's type name alone ("is large_string"): what the column holds, its type after."""
    import pyarrow as pa

    from ensemble.data.columns import numeric_values

    col = pa.array(["a", "b"], pa.large_string())
    problems: list[str] = []
    assert numeric_values(pa.field("x", col.type), col, 0, None, problems) is None
    assert problems == ["column 'x' holds text (large_string); expected numbers (or list it in "
                        "[data] categorical to one-hot encode it)"]
    col = pa.array([None, None])  # a CSV column with every cell empty: missing numbers
    assert np.isnan(numeric_values(pa.field("x", col.type), col, 0, None, problems)).all()
    assert len(problems) == 1


def test_decimal_columns_are_numbers_as_features_and_targets():
    import decimal

    dec = pa.array([decimal.Decimal(v) for v in ("1.25", "-2.50", "3.75", "0.00")],
                   pa.decimal128(10, 2))
    table = pa.table({"price": dec, "amount": dec, "label": ["x", "y", "x", "y"]})
    ds = sources.table_to_dataset(table, "d", "label", True)  # was "'amount' is decimal128"
    assert ds.feature_names == ("price", "amount")
    np.testing.assert_array_equal(ds.x[:, 1], [1.25, -2.5, 3.75, 0.0])
    ds = sources.table_to_dataset(table.drop_columns(["label"]), "d", "price", True)
    assert ds.y.dtype == np.float64 and ds.y.tolist() == [1.25, -2.5, 3.75, 0.0]  # not text


@pytest.mark.parametrize("categorical", ["auto", ("nest", "tags")])
def test_nested_columns_are_refused_in_one_line_naming_drop(categorical):
    table = pa.table({"a": [1.0, 2.0], "tags": [[1.0], [2.0, 3.0]],
                      "nest": [{"x": 1}, {"x": 2}], "label": ["x", "y"]})
    with pytest.raises(UsageError) as err:  # as categories: was pyarrow's cast traceback
        sources.table_to_dataset(table, "d", "label", True, categorical)
    assert "column 'tags' is list<item: double>, values nested" in str(err.value)
    assert "leave it out with --drop nest" in str(err.value)


def test_a_folder_shard_whose_column_changes_type_is_named(tmp_path):
    from ensemble.data.table_scan import TableScan

    (tmp_path / "parts").mkdir()
    pq.write_table(pa.table({"a": [0.5, 1.5, 2.5, 3.5], "label": ["x", "y", "x", "y"]}),
                   tmp_path / "parts" / "part-0.parquet")
    pq.write_table(pa.table({"a": ["p", "q", "r", "s"], "label": ["x", "y", "x", "y"]}),
                   tmp_path / "parts" / "part-1.parquet")
    with pytest.raises(UsageError, match=r"Column 'a' of .*part-1.parquet is string; expected "
                                         r"double as in .*part-0.parquet"):  # was pyarrow's
        list(TableScan(DataConfig(source=str(tmp_path / "parts"), target="label")).chunks())


def test_a_partitioned_folder_is_read_alike_by_training_and_predict(tmp_path):
    """A Spark-style folder (`year=2020/part-0.parquet`, `_SUCCESS`, `_temporary/`): training
    and predict read the same files, in sub-folders, leaving out `_`/`.`-prefixed ones (train
    read `_temporary/`'s file and predict refused a folder without top-level files)."""
    from ensemble.data.csv_format import table_files
    from ensemble.data.table_scan import TableScan

    root = tmp_path / "ds"
    for year in (2020, 2021):
        (root / f"year={year}").mkdir(parents=True)
        pq.write_table(pa.table({"a": [0.5, 1.5, 2.5, 3.5], "label": ["x", "y", "x", "y"]}),
                       root / f"year={year}" / "part-0.parquet")
    (root / "_temporary").mkdir()
    pq.write_table(pa.table({"junk": [1]}), root / "_temporary" / "part-9.parquet")
    (root / "_SUCCESS").write_text("")
    files, kind = table_files(str(root))
    assert kind == "parquet" and [Path(f).relative_to(root).as_posix() for f in files] == [
        "year=2020/part-0.parquet", "year=2021/part-0.parquet"]
    scan = TableScan(DataConfig(source=str(root), target="label"))
    assert sum(len(chunk.x) for _, chunk in scan.chunks()) == 8


def test_pandas_index_of_a_parquet_file_is_not_a_feature(tmp_path, capsys):
    """`DataFrame.to_parquet` of a shuffled frame writes its index as `__index_level_0__`;
    it was trained on as a feature (on iris it follows the classes)."""
    import pandas as pd

    from ensemble.data.table_scan import TableScan

    frame = pd.DataFrame({"a": np.arange(40) % 7 * 0.5, "label": ["x", "y"] * 20})
    frame.sample(frac=1, random_state=0).to_parquet(tmp_path / "t.parquet")
    assert "__index_level_0__" in pq.read_schema(tmp_path / "t.parquet").names
    scan = TableScan(DataConfig(source=str(tmp_path / "t.parquet"), target="label"))
    assert list(scan.feature_names) == ["a"]
    assert "left out '__index_level_0__'" in capsys.readouterr().err


def _indexed(n: int = 60):
    """A shuffled frame indexed by `id` (whole numbers, one per row: an "(an id?)" feature
    before) as `df.set_index('id')` leaves it."""
    import pandas as pd

    rng = np.random.default_rng(0)
    return pd.DataFrame({"id": rng.permutation(n) * 7 + 1000, "a": np.arange(n) % 7 * 0.5,
                         "label": ["x", "y"] * (n // 2)}).set_index("id")


def test_named_pandas_index_of_a_parquet_file_is_an_identifier(tmp_path, capsys):
    """`df.set_index('id').to_parquet(...)` writes `id` as a column that the pandas metadata
    lists in `index_columns`: it was trained on as a feature. Now an identifier, left out with
    a notice, streamed or whole, file or folder; the same rows as a CSV (no pandas metadata)
    and an unnamed index behave as before."""
    from ensemble.data.table_scan import TableScan

    frame = _indexed()
    frame.to_parquet(tmp_path / "t.parquet")
    (tmp_path / "parts" / "k=1").mkdir(parents=True)
    (tmp_path / "parts" / "k=2").mkdir()
    frame.iloc[:30].to_parquet(tmp_path / "parts" / "k=1" / "p.parquet")
    frame.iloc[30:].to_parquet(tmp_path / "parts" / "k=2" / "p.parquet")
    for source in (tmp_path / "t.parquet", tmp_path / "parts"):
        scan = TableScan(DataConfig(source=str(source), target="label"), chunk_rows=16)
        assert list(scan.feature_names) == ["a"] and scan.identifiers == ("id",)
        assert sum(len(chunk.x) for _, chunk in scan.chunks()) == 60
        err = capsys.readouterr().err
        assert "left out 'id'" in err and "named index" in err and "an id?" not in err
    ds = sources.load(DataConfig(source=str(tmp_path / "t.parquet"), target="label"))
    assert ds.feature_names == ("a",) and ds.identifiers == ("id",)
    named = DataConfig(source=str(tmp_path / "t.parquet"), target="label",
                       categorical=("id",))  # asked for as a feature: one
    assert TableScan(named).identifiers == () and "id" in sources.load(named).categorical
    frame.to_csv(tmp_path / "t.csv")  # a CSV: `id` an ordinary column, a feature
    assert "id" in TableScan(DataConfig(source=str(tmp_path / "t.csv"),
                                        target="label")).feature_names
    frame.reset_index(drop=True).to_parquet(tmp_path / "r.parquet")  # a range index: no column
    frame.set_axis(frame.index.rename(None)).to_parquet(tmp_path / "u.parquet")  # unnamed
    for name in ("r.parquet", "u.parquet"):
        scan = TableScan(DataConfig(source=str(tmp_path / name), target="label"))
        assert list(scan.feature_names) == ["a"] and scan.identifiers == ()


def test_pandas_index_reads_only_pandas_metadata_naming_columns():
    from ensemble.data.identifiers import pandas_index

    schema = pa.schema([("id", pa.int64()), ("a", pa.float64()), ("label", pa.string())])
    meta = b'{"index_columns": ["label", "id", "gone", {"kind": "range", "name": "r"}]}'
    assert pandas_index(schema.with_metadata({b"pandas": meta})) == ("id", "label")
    assert pandas_index(schema.with_metadata({b"pandas": meta}), skip=("label",)) == ("id",)
    for bad in (b"not json", b"[1]", b'{"index_columns": "id"}'):
        assert pandas_index(schema.with_metadata({b"pandas": bad})) == ()
    assert pandas_index(schema) == () and pandas_index(None) == ()


def test_a_run_trained_on_a_named_index_carries_it_through_predict(tmp_path, capsys):
    """Train and predict agree: the index is recorded as an identifier, carried through to
    the predictions (a join back by it), and not needed at predict; a run that never saw it
    carries an input's index through too, without the "ignoring" notice, even under
    --strict-columns."""
    import json

    import pandas as pd

    from conftest import run_cli

    frame = _indexed(90)
    frame.to_parquet(tmp_path / "t.parquet")
    frame.reset_index(drop=True).to_csv(tmp_path / "plain.csv", index=False)
    small = ["--members", "2", "--epochs", "1", "--devices", "cpu:2", "--quiet"]
    for data, run in (("t.parquet", "run"), ("plain.csv", "plain")):
        assert run_cli("train", "--data", tmp_path / data, "--target", "label", *small,
                       "--run-dir", tmp_path / run) == 0
    pre = json.loads((tmp_path / "run" / "preprocessing.json").read_text())
    assert pre["identifiers"] == ["id"] and "id" not in pre["output_names"]
    capsys.readouterr()
    for run, data, strict in (("run", "t.parquet", []), ("run", "plain.csv", []),
                              ("plain", "t.parquet", ["--strict-columns"])):
        out = tmp_path / f"{run}-{data}.csv"
        assert run_cli("predict", "--run", tmp_path / run, "--data", tmp_path / data,
                       "--out", out, "--quiet", *strict) == 0
        assert "ignoring" not in capsys.readouterr().err
        got = pd.read_csv(out)
        if data == "t.parquet":
            assert got.columns[0] == "id" and list(got["id"]) == list(frame.index)
        else:
            assert "id" not in got.columns and len(got) == 90


def test_text_targets_of_a_regression_run_are_named_at_predict(capsys):
    """The refusal named numpy's dtype (`<U6`), not the value."""
    from ensemble.core.labels import encode_known

    with pytest.raises(UsageError, match=r"Expected numbers as the targets of this regression "
                                         r"run\. Received: '151\.0x' \(text\)"):
        encode_known(np.array(["151.0x", "2"]), np.array([]))
    with pytest.raises(UsageError, match=r"Received: 'a' \(text\)"):  # not the None before it
        encode_known(np.array([1.0, None, "a"], dtype=object), np.array([]))


def test_one_predicted_row_is_one_row(capsys):
    from ensemble.replication.progress import RowProgress

    progress = RowProgress(total=1, verbosity=1)
    progress.rows = 1
    progress.end()
    assert "predicted 1 row in" in capsys.readouterr().out


def test_the_missing_labels_notice_fits_how_many_rows_lack_one():
    """No row labelled: no "others" to keep and nothing for evaluate; some: evaluate needs the
    long layout to score the labelled ones."""
    from ensemble.data.messages import missing_labels

    assert missing_labels("target column 'y' of x.csv", 442, 442) == (
        "target column 'y' of x.csv has no label in its 442 rows: predicted, with y_true null "
        "on every row")
    some = missing_labels("target column 'y' of x.csv", 3, 150)
    assert some.startswith("target column 'y' of x.csv has 3 missing labels in 150 rows")
    assert "kept on the others" in some and "--layout long" in some


def test_a_misspelt_target_prints_no_identifier_notice(capsys):
    """With the target not found, the id-column notice would list the real target among the
    text columns to pass to --categorical: only the target's refusal is printed."""
    from ensemble.core.errors import UsageError
    from ensemble.data.sources import table_to_dataset

    table = pa.table({"x": [float(i) for i in range(60)],
                      "bottle_id": [f"b{i:03d}" for i in range(60)], "label": ["a", "b"] * 30})
    with pytest.raises(UsageError, match=r"Target column 'lable' not found \(did you mean "
                                         r"'label'\?\)"):
        table_to_dataset(table, "w.csv", "lable", require_target=True)
    assert "identifier" not in capsys.readouterr().err
    table_to_dataset(table, "w.csv", "label", require_target=True)  # found: the notice is kept
    assert "column 'bottle_id' of w.csv has 60 distinct values" in capsys.readouterr().err


def test_a_row_counter_is_an_identifier_carried_through(tmp_path, capsys):
    """R's `rownames` (1..n) and pandas' `to_csv()` index (0..n-1, here with a gap where a
    row has no label) are set aside as identifiers, recorded, and carried to predict's
    input; a column that does not count the rows stays a feature."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    from ensemble.config.schema import DataConfig
    from ensemble.data.identifiers import is_row_counter

    n = 120
    rng = np.random.default_rng(0)
    label = rng.integers(0, 2, n).astype(float)
    label[7] = np.nan  # dropped: a gap in the counter
    pcsv.write_csv(pa.table({"rownames": np.arange(1, n + 1), "idx": np.arange(n),
                             "x": rng.normal(size=n), "label": label}), tmp_path / "t.csv")
    ds = sources.load(DataConfig(source=str(tmp_path / "t.csv"), target="label"))
    assert ds.identifiers == ("rownames", "idx") and ds.feature_names == ("x",)
    assert "'rownames'" in capsys.readouterr().err
    col = pa.chunked_array
    assert not is_row_counter(col([np.arange(2, 200, 2)]))  # steps of 2: a feature
    assert not is_row_counter(col([np.arange(500, 600)]))  # starts far from 0 or 1
    assert not is_row_counter(col([np.arange(40)]))  # too few rows
    assert not is_row_counter(col([rng.permutation(100)]))  # not in file order
    assert is_row_counter(col([np.arange(100.0)]))  # whole floats count too
