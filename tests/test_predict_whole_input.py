"""`ensemble predict` on an input larger than one streamed batch decides once for the whole
input, not per batch: the notices (once, counts over the whole input: the missing labels,
whose rows alone have y_true null), the bad rows (counted over the whole input);
and a run's `source_row` is the row's position in the user's file even when training dropped
rows without a label. Small batches (`--batch-size 32`) stand in for a large file.
"""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from conftest import run_cli

UNLABELLED = [3, 40, 41, 77, 130]  # rows without a label, in several batches of 32


def _iris(missing_labels=(), missing_bmi=(), unknown=()):
    """iris as a table with string labels, a categorical column `kind` and an `id`."""
    from sklearn.datasets import load_iris

    d = load_iris()
    cols = {f"f{i}": d.data[:, i].astype(np.float64) for i in range(4)}
    for r in missing_bmi:
        cols["f1"][r] = np.nan
    kind = np.array(["a", "b", "c"], dtype=object)[np.arange(150) % 3]
    kind[list(unknown)] = "new"
    label = np.array([f"s{k}" for k in d.target], dtype=object)
    label[list(missing_labels)] = None
    return pa.table({"id": [f"r{i}" for i in range(150)], **cols,
                     "kind": pa.array(kind.tolist()), "species": pa.array(label.tolist())})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("whole")
    pcsv.write_csv(_iris(UNLABELLED), base / "train.csv")
    assert run_cli("train", "--data", base / "train.csv", "--target", "species",
                   "--members", "2", "--epochs", "1", "--devices", "cpu:2",
                   "--run-dir", base / "run", "--quiet") == 0
    return base


def test_source_row_is_the_position_in_the_users_file(run):
    """Training dropped the 5 unlabelled rows; `source_row` still points into the file, so a
    join back by it finds every row's own label."""
    preds = pq.read_table(run / "run" / "predictions.parquet").to_pylist()
    raw = pcsv.read_csv(run / "train.csv").column("species").to_pylist()
    rows = [r["source_row"] for r in preds]
    assert not set(rows) & set(UNLABELLED) and max(rows) <= 149
    assert all(raw[r["source_row"]] == r["y_true"] for r in preds)
    assert any(r["source_row"] > UNLABELLED[0] for r in preds)  # past a dropped row


@pytest.mark.parametrize("mode, fmt", [("in-graph", "csv"), ("in-graph", "parquet"),
                                       ("between-graph", "csv")])
def test_missing_labels_leave_only_their_rows_unlabelled(run, tmp_path, capsys, mode, fmt):
    """Missing labels in several batches: y_true null on those 5 rows alone, the other 145
    keep their labels (was: null on every row, so the output could not be evaluated); one
    notice counts them over the whole input, the unknown categories of every batch are
    counted in one notice, in both modes; `evaluate` of the long layout scores the 145
    labelled rows and says it left 5 out."""
    data = tmp_path / f"in.{fmt}"
    table = _iris(UNLABELLED, unknown=[5, 70, 140])
    pcsv.write_csv(table, data) if fmt == "csv" else pq.write_table(table, data)
    out = tmp_path / "out.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", out,
                   "--batch-size", "32", "--mode", mode) == 0
    err = capsys.readouterr().err
    assert err.count("missing label") == 1, err
    assert f"target column 'species' of {data} has 5 missing labels in 150 rows" in err
    assert err.count("unknown categories") == 1 and "3 rows in 'kind' ('new')" in err
    got = pq.read_table(out)
    assert got.column("y_true").to_pylist() == table.column("species").to_pylist()
    assert got.column("y_true").null_count == 5
    assert got.column("row").to_pylist() == list(range(150))  # one row column
    assert "source_row" not in got.column_names
    assert got.column("id").to_pylist() == [f"r{i}" for i in range(150)]
    long = tmp_path / "long.parquet"
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", long,
                   "--batch-size", "32", "--mode", mode, "--layout", "long", "--quiet") == 0
    capsys.readouterr()
    assert run_cli("evaluate", "--predictions", long) == 0
    cap = capsys.readouterr()
    assert "predict (145 rows)" in cap.out
    assert (f"left out 5 rows of split 'predict' of {long} without a y_true") in cap.err


def test_a_batch_without_any_label_and_an_input_without_any(run, tmp_path, capsys):
    """A whole batch of missing labels among labelled ones keeps the others' labels; an
    input whose target column is empty on every row (a CSV's null-typed column) predicts
    every row with y_true null, and evaluate refuses it in one line."""
    table = _iris(range(32, 64))
    data = tmp_path / "batch.csv"
    pcsv.write_csv(table, data)
    out = tmp_path / "out.parquet"
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", out,
                   "--batch-size", "32") == 0
    assert pq.read_table(out).column("y_true").to_pylist() == \
        table.column("species").to_pylist()
    data = tmp_path / "none.csv"
    pcsv.write_csv(_iris(range(150)), data)
    long = tmp_path / "long.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", long,
                   "--batch-size", "32", "--layout", "long") == 0
    assert "has no label in its 150 rows" in capsys.readouterr().err
    assert pq.read_table(long).column("y_true").null_count == pq.read_table(long).num_rows
    assert run_cli("evaluate", "--predictions", long) == 2
    assert "has no rows with a known y_true" in capsys.readouterr().err


def test_labels_of_a_complete_input_fill_every_row(run, tmp_path, capsys):
    data = tmp_path / "in.csv"
    pcsv.write_csv(_iris(), data)
    out = tmp_path / "out.parquet"
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", out,
                   "--batch-size", "32") == 0
    assert "missing label" not in capsys.readouterr().err
    got = pq.read_table(out)
    assert got.column("y_true").to_pylist() == _iris().column("species").to_pylist()


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_labels_the_run_never_saw_leave_only_their_rows_unlabelled(run, tmp_path, capsys,
                                                                   mode):
    """Labels that are not classes of the run, in three batches (was: the whole predict
    refused, naming neither row nor count): every row is predicted, `y_true` is null on
    those rows alone, and one notice names the labels and counts their rows."""
    table = _iris()
    label = table.column("species").to_pylist()
    for r, new in ((5, "s7"), (70, "s9"), (71, "s7"), (140, "s7")):
        label[r] = new
    data = tmp_path / "in.parquet"
    pq.write_table(table.set_column(6, "species", pa.array(label)), data)
    out = tmp_path / "out.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", out,
                   "--batch-size", "32", "--mode", mode, "--target", "species") == 0
    err = capsys.readouterr().err
    assert err.count("never saw") == 1, err
    assert (f"4 rows of target column 'species' of {data} hold labels the run never saw "
            "('s7', 's9'): predicted, with y_true null on them (the run's classes: 's0', "
            "'s1', 's2')") in err
    got = pq.read_table(out).column("y_true").to_pylist()
    assert got == [None if v in ("s7", "s9") else v for v in label]


def test_an_empty_label_is_missing_as_a_csvs_empty_cell_is(run, tmp_path, capsys):
    """`""` in a Parquet target column is a missing label, as the same CSV cell reads (was a
    class of its own, probability column `p_`): training drops its rows with the notice,
    `predict` counts it among the missing labels."""
    from ensemble.data.settings import DataConfig
    from ensemble.data.table_scan import TableScan

    table = _iris()
    label = table.column("species").to_pylist()
    for r in UNLABELLED:
        label[r] = ""
    data = tmp_path / "empty.parquet"
    pq.write_table(table.set_column(6, "species", pa.array(label)), data)
    capsys.readouterr()
    scan = TableScan(DataConfig(source=str(data), target="species", drop=("id",)))
    assert sorted(set(scan.y.tolist())) == ["s0", "s1", "s2"] and len(scan.y) == 145
    assert scan.file_rows(np.arange(5)).tolist() == [0, 1, 2, 4, 5]
    assert f"dropped 5 rows of {data} whose label 'species' is missing" in capsys.readouterr().err
    out = tmp_path / "out.parquet"
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", out,
                   "--batch-size", "32") == 0
    assert "5 missing labels in 150 rows" in capsys.readouterr().err
    assert pq.read_table(out).column("y_true").to_pylist() == [
        None if v == "" else v for v in label]


@pytest.mark.parametrize("mode, where", [("in-graph", [100, 10, 140]),  # first bad: row 10
                                         ("in-graph", [100, 140, 70]),  # mid-stream
                                         ("between-graph", [100, 140, 70])])
def test_bad_rows_are_counted_over_the_whole_input(run, tmp_path, capsys, mode, where):
    """Missing feature values (the run refuses them) in three batches: one error line counts
    the three rows and names the first, whichever batch fails first; between-graph refuses
    before starting its clients (one line, not one per client); nothing is written."""
    data = tmp_path / "in.csv"
    pcsv.write_csv(_iris(missing_bmi=where), data)
    out = tmp_path / "out.parquet"
    capsys.readouterr()
    assert run_cli("predict", "--run", run / "run", "--data", data, "--out", out,
                   "--batch-size", "32", "--mode", mode) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "client" not in err[0]
    assert (f"In the whole input (150 rows in the file): column 'f1' 3 rows missing (first at row "
            f"{min(where)})") in err[0]
    assert not out.exists()


@pytest.mark.parametrize("impute", ["error", "most_frequent"])
def test_unknown_categories_counted_as_encoding_counts_them(impute):
    """The whole-input check counts unknown categories without encoding; its counts equal
    `encode_scaled`'s on the same rows (missing values filled, or unknown, as the run says)."""
    from ensemble.data import sources, whole_input
    from ensemble.data.preprocessing import Preprocessing

    train = pa.table({"x": [1.0, 2.0, 3.0, 4.0], "kind": ["a", "b", "a", None],
                      "flag": [True, False, True, True], "y": [0, 1, 0, 1]})
    # missing values pass the table check here; the preprocessing decides what they encode to
    ds = sources.table_to_dataset(train, "t", "y", True, impute="most_frequent")
    pre = Preprocessing.fit(ds, np.arange(4), np.array([0, 1]), impute)
    new = pa.table({"x": [1.0, 1.0, 1.0, 1.0, 1.0],
                    "kind": ["a", "zzz", None, "b", "zzz"], "flag": [True] * 5})
    part = sources.table_to_dataset(new, "n", "y", False, categorical=("kind", "flag"),
                                    impute="most_frequent", expected=pre.columns)
    _, expected = pre.encode_scaled(part)
    assert whole_input.unknown_categories(new, pre) == expected
    # the values are named: a missing value is unknown unless the run fills it
    assert expected["kind"] == ({"zzz": 2} if impute != "error" else {"zzz": 2, None: 1})
