import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from ensemble import data
from ensemble.config import DataConfig, SyntheticConfig
from ensemble.errors import UsageError
from ensemble.preprocessing import Preprocessing


@pytest.mark.parametrize("name, rows, features, classes", [
    ("digits", 1797, 64, 10), ("breast_cancer", 569, 30, 2), ("wine", 178, 13, 3),
    ("iris", 150, 4, 3),
])
def test_builtin_sources(name, rows, features, classes):
    ds = data.load(DataConfig(source=name))
    assert ds.x.shape == (rows, features) and ds.x.dtype == np.float32
    assert len(np.unique(ds.y)) == classes


def test_synthetic_source_follows_config():
    ds = data.load(DataConfig(source="synthetic",
                              synthetic=SyntheticConfig(rows=500, features=8, classes=3)))
    assert ds.x.shape == (500, 8) and set(np.unique(ds.y)) == {0, 1, 2}


def test_split_is_stratified_disjoint_and_seeded():
    cfg = DataConfig()
    ds = data.load(cfg)
    rows, classes = data.split(ds, cfg, seed=0)
    all_rows = np.concatenate(list(rows.values()))
    assert len(all_rows) == len(np.unique(all_rows)) == len(ds.y)
    assert len(rows["test"]) == 360 and len(rows["validation"]) == 180
    for part in rows.values():  # every class in every split, in proportion
        share = np.bincount(ds.y[part], minlength=10) / len(part)
        np.testing.assert_allclose(share, np.bincount(ds.y) / len(ds.y), atol=0.02)
    again, _ = data.split(ds, cfg, seed=0)
    other, _ = data.split(ds, cfg, seed=1)
    assert np.array_equal(again["test"], rows["test"])
    assert not np.array_equal(other["test"], rows["test"])


def test_scaler_fit_on_train_only_and_columns_matched_by_name(tmp_path):
    ds = data.load(DataConfig(source="iris"))
    train = np.arange(0, 150, 2)
    pre = Preprocessing.fit(ds, train, np.unique(ds.y))
    np.testing.assert_allclose(pre.mean, ds.x[train].mean(axis=0), rtol=1e-6)
    shuffled = data.Dataset("s", ds.x[:, ::-1], None, ds.feature_names[::-1])
    np.testing.assert_array_equal(pre.transform(shuffled), pre.transform(ds))
    path = tmp_path / "pre.json"
    path.write_text(pre.to_json())
    back = Preprocessing.read(path)
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
    ds = data.load(DataConfig(source=_write(tmp_path, pa.table(GOOD), f"d.{ext}"),
                              target="label"))
    assert ds.feature_names == ("a", "b")
    assert ds.y.tolist() == ["x", "y", "x", "y"]
    np.testing.assert_array_equal(data.encode(ds.y, np.array(["x", "y"])), [0, 1, 0, 1])


@pytest.mark.parametrize("columns, target, match", [
    ({**GOOD, "a": [1.0, float("nan"), 3.0, 4.0]}, "label", "'a'.*NaN or inf"),
    ({**GOOD, "a": [1.0, float("inf"), 3.0, 4.0]}, "label", "NaN or inf"),
    ({**GOOD, "a": ["p", "q", "r", "s"]}, "label", "'a'.*expected numbers"),
    (GOOD, "missing", "Target column 'missing' not found"),
    ({**GOOD, "label": ["x"] * 4}, "label", "fewer than two classes"),
    ({"label": ["x", "y"]}, "label", "no feature columns"),
])
def test_bad_data(tmp_path, columns, target, match):
    path = _write(tmp_path, pa.table(columns), "d.parquet")
    with pytest.raises(UsageError, match=match):
        data.load(DataConfig(source=path, target=target))


def test_bad_files(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        data.load(DataConfig(source=str(tmp_path / "none.csv")))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(UsageError, match="empty"):
        data.load(DataConfig(source=str(empty)))
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet at all")
    with pytest.raises(UsageError, match="Cannot read .* as Parquet"):
        data.load(DataConfig(source=str(fake)))
    with pytest.raises(UsageError, match="Unknown data source 'mnist'"):
        data.load(DataConfig(source="mnist"))


def test_missing_feature_at_predict_time():
    ds = data.load(DataConfig(source="iris"))
    pre = Preprocessing.fit(ds, np.arange(150), np.unique(ds.y))
    fewer = data.Dataset("f", ds.x[:, 1:], None, ds.feature_names[1:])
    with pytest.raises(UsageError, match=re.escape(f"{ds.feature_names[0]!r} missing")):
        pre.transform(fewer)


def test_unknown_label():
    with pytest.raises(UsageError, match="'z' is not a class"):
        data.encode(np.array(["x", "z"]), np.array(["x", "y"]))
    with pytest.raises(UsageError, match="do not match"):
        data.encode(np.array([0, 1]), np.array(["x", "y"]))
