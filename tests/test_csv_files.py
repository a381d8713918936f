"""CSV files as users bring them: other separators (a semicolon with a decimal comma, a tab),
compressed files (`.csv.gz`, `.csv.bz2`). Each reads as the plain comma file with the same
values: the same predictions from one trained run, and a run trained on the compressed file
equal to one trained on the plain file."""

import bz2
import gzip
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from conftest import run_cli
from ensemble.core.errors import UsageError


def _digits_csv(path, n=100):
    from sklearn.datasets import load_digits

    d = load_digits()
    cols = {name: d.data[:n, i] for i, name in enumerate(d.feature_names)}
    pcsv.write_csv(pa.table({**cols, "target": d.target[:n]}), path)
    return path


def _write(path, text: str):
    path.write_text(text)
    return path


def test_semicolon_and_tab_files_read_as_the_comma_file(trained, tmp_path):
    from ensemble.data.csv_format import dialect

    lines = _digits_csv(tmp_path / "in.csv", n=40).read_text().splitlines()
    assert dialect(tmp_path / "in.csv") == (",", ".")
    euro = [lines[0].replace(",", ";")] + [";".join(v.replace(".", ",") for v in line.split(","))
                                            for line in lines[1:]]
    fields = euro[1].split(";")
    fields[1] = "0,5"  # one value with a fraction: a decimal comma
    euro[1] = ";".join(fields)
    comma = lines[:1] + [",".join(v.replace(",", ".") for v in line.split(";"))
                         for line in euro[1:]]
    files = {"comma.csv": comma, "euro.csv": euro,
             "tab.csv": [line.replace(",", "\t") for line in comma]}
    got = {}
    for name, text in files.items():
        data = _write(tmp_path / name, "\n".join(text) + "\n")
        out = tmp_path / f"{name}.parquet"
        assert run_cli("predict", "--run", trained, "--data", data, "--out", out,
                       "--quiet") == 0
        import pyarrow.parquet as pq

        got[name] = pq.read_table(out).column("y_pred").to_pylist()
    assert dialect(tmp_path / "euro.csv") == (";", ",")
    assert dialect(tmp_path / "tab.csv") == ("\t", ".")
    assert got["euro.csv"] == got["comma.csv"] == got["tab.csv"]


def test_compressed_csv_files_train_and_predict_as_the_plain_file(trained, tmp_path):
    plain = _digits_csv(tmp_path / "d.csv", n=200)
    text = plain.read_bytes()
    (tmp_path / "d.csv.gz").write_bytes(gzip.compress(text))
    (tmp_path / "d.csv.bz2").write_bytes(bz2.compress(text))
    probs = {}
    for name in ("d.csv", "d.csv.gz", "d.csv.bz2"):
        out = tmp_path / f"{name}.parquet"
        assert run_cli("predict", "--run", trained, "--data", tmp_path / name, "--out", out,
                       "--quiet") == 0
        probs[name] = pq.read_table(out).replace_schema_metadata(None)
    assert probs["d.csv.gz"].equals(probs["d.csv"]) and probs["d.csv.bz2"].equals(probs["d.csv"])
    common = ["--members", "2", "--epochs", "1", "--quiet"]
    for name in ("d.csv", "d.csv.gz"):
        assert run_cli("train", "--data", tmp_path / name, *common,
                       "--run-dir", tmp_path / f"run-{name}") == 0
    a, b = (pq.read_table(tmp_path / f"run-{n}" / "predictions.parquet") for n in
            ("d.csv", "d.csv.gz"))
    assert a.column("p_0").to_pylist() == b.column("p_0").to_pylist()


def test_one_decimal_comma_in_text_beside_dot_numbers_keeps_the_dot(tmp_path):
    from ensemble.data.csv_format import dialect

    rows = "".join(f"{i * 0.126:.3f}\t{'12,5' if i == 3 else 'ok'}\t{i % 2}\n" for i in range(60))
    data = _write(tmp_path / "t.csv", "x\tnote\ty\n" + rows)
    assert dialect(data) == ("\t", ".")
    assert run_cli("train", "--data", data, "--target", "y", "--members", "2", "--epochs", "1",
                   "--run-dir", tmp_path / "run", "--quiet") == 0
    import json

    pre = json.loads((tmp_path / "run" / "preprocessing.json").read_text())
    assert "x" in pre["feature_names"]  # a number, not text taken for an identifier


@pytest.mark.parametrize("values, refused", [
    (["75001"] * 30 + ["2A004"], None),  # codes beside numbers: categories
    ([str(i) for i in range(30)] + ["K"] * 5, None),  # a letter in more than a tenth of rows
    ([str(i) for i in range(30)] + ["?"], "holds numbers but for 1 row of '?'"),
])
def test_text_columns_of_numbers_are_told_from_categories(tmp_path, capsys, values, refused):
    data = _write(tmp_path / "c.csv", "code,y\n" + "".join(f"{v},{i % 2}\n"
                                                           for i, v in enumerate(values)))
    code = run_cli("train", "--data", data, "--target", "y", "--members", "2", "--epochs", "1",
                   "--run-dir", tmp_path / "run", "--quiet")
    err = capsys.readouterr().err
    if refused is None:
        assert code == 0, err
    else:
        assert code == 2 and refused in err, err


def test_numbers_read_as_text_are_named_not_encoded():
    from ensemble.data.columns import number_markers

    assert number_markers(pa.chunked_array([["0.126", "1.5", None, "2"]])) == ([], 0)
    assert number_markers(pa.chunked_array([["1", "2", "?"] * 10 + ["3"] * 5])) is None


def test_column_empty_in_the_first_block_then_numbers_reads_as_numbers(tmp_path):
    from ensemble.data.settings import DataConfig
    from ensemble.data.table_scan import TableScan

    # pyarrow types a streamed CSV's columns from its first block (1 MB, ~100k rows here):
    # 'late' was typed null there and its first number refused as "expected a number"
    rows = [f"{i % 7 * 0.125:.4f},{'' if i < 120_000 else i * 0.25},{i % 2}\n"
            for i in range(130_000)]
    data = _write(tmp_path / "late.csv", "x,late,y\n" + "".join(rows))
    assert data.stat().st_size > 1 << 20
    scan = TableScan(DataConfig(source=str(data), target="y", impute="median"))
    assert scan.feature_names == ("x", "late")
    late = np.concatenate([chunk.x[:, 1] for _, chunk in scan.chunks()])
    assert np.isnan(late[:120_000]).all() and late[-1] == 129_999 * 0.25


def test_a_nested_column_carried_to_a_csv_output_is_refused_before_predicting(trained,
                                                                              tmp_path, capsys):
    digits = pcsv.read_csv(_digits_csv(tmp_path / "d.csv", n=20))
    data = tmp_path / "tags.parquet"
    pq.write_table(digits.append_column("tags", pa.array([[i, i + 1] for i in range(20)])), data)
    out = tmp_path / "p.csv"
    assert run_cli("predict", "--run", trained, "--data", data, "--out", out, "--quiet") == 2
    err = capsys.readouterr().err  # was pyarrow's "Unsupported Type" traceback, after TensorFlow
    assert "Cannot write column 'tags'" in err and ".parquet" in err and "Traceback" not in err
    assert not out.exists()
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", trained, "--data", data, "--out", out, "--quiet") == 0
    assert pq.read_table(out).column("tags").to_pylist()[:2] == [[0, 1], [1, 2]]


def _bytes_read() -> int:
    """Bytes this process has read from files so far (Linux: `rchar` of /proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="Linux's /proc/self/io")
def test_a_csv_input_is_read_a_block_at_a_time_not_ahead_of_the_model(trained, tmp_path):
    from ensemble.data import kinds

    rows = _digits_csv(tmp_path / "d.csv", n=1000).read_text().splitlines(keepends=True)
    data = _write(tmp_path / "big.csv", rows[0] + "".join(rows[1:]) * 700)  # 700k rows, 103 MB
    pre = kinds.read_preprocessing(trained / "preprocessing.json")
    stream = kinds.input_stream(pre, str(data), "target", batch_rows=1024, quiet=True)
    stream.check()  # (a whole pass over the labels)
    before, batches = _bytes_read(), iter(stream)
    assert len(next(batches).x) == 1024
    time.sleep(1)  # a slow model: pyarrow's dataset scanner read on, to the file's end
    read = _bytes_read() - before
    assert read < data.stat().st_size / 2, (read, data.stat().st_size)  # 30 blocks ahead


def test_a_carried_column_empty_in_the_first_block_is_carried_through(trained, tmp_path):
    rows = _digits_csv(tmp_path / "d.csv", n=1000).read_text().splitlines()
    body = [f"{r},{'' if i < 9000 else 'late note'}" for i, r in enumerate(rows[1:] * 10)]
    data = _write(tmp_path / "n.csv", "\n".join([rows[0] + ",note", *body]) + "\n")
    assert data.stat().st_size > 1 << 20  # beyond pyarrow's first block, which typed it null
    out = tmp_path / "p.parquet"  # was "column 'note' row 9000 holds 'late note'; expected a
    # number (the column holds numbers)"
    assert run_cli("predict", "--run", trained, "--data", data, "--out", out, "--quiet") == 0
    note = pq.read_table(out).column("note").to_pylist()
    assert note[8999] is None and note[9000:] == ["late note"] * 1000


def test_a_column_named_in_categorical_is_read_as_text_past_the_first_block(tmp_path):
    from ensemble.data.settings import DataConfig
    from ensemble.data.table_scan import TableScan

    rows = [f"{i % 7 * 0.125:.4f},{75001 + i % 5 if i < 95_000 else '2A004'},{i % 2}\n"
            for i in range(100_000)]  # codes that look like numbers in pyarrow's first block
    data = _write(tmp_path / "codes.csv", "x,code,y\n" + "".join(rows))
    assert data.stat().st_size > 1 << 20
    with pytest.raises(UsageError, match="row 95000 holds '2A004'.*named in --categorical"):
        list(TableScan(DataConfig(source=str(data), target="y")).chunks())
    scan = TableScan(DataConfig(source=str(data), target="y", categorical=("code",)))
    codes = np.concatenate([chunk.categorical["code"] for _, chunk in scan.chunks()])
    assert codes[0] == "75001" and codes[-1] == "2A004"  # was refused as "expected a number"


def test_a_csv_column_with_every_cell_empty_is_a_missing_number_as_in_parquet(tmp_path, capsys):
    # pyarrow types such a column null; it was refused as "values of type null; expected
    # numbers (or list it in [data] categorical...)" even under --impute median, while the
    # same table as Parquet (a float column of NaN) trained
    rows = "".join(f"{i * 0.37 % 5:.3f},,{i % 2}\n" for i in range(60))
    data = _write(tmp_path / "empty.csv", "x,empty,y\n" + rows)
    code = run_cli("train", "--data", data, "--target", "y", "--members", "2", "--epochs", "1",
                   "--impute", "median", "--run-dir", tmp_path / "run", "--quiet")
    assert code == 0, capsys.readouterr().err
    code = run_cli("train", "--data", data, "--target", "y", "--members", "2", "--epochs", "1",
                   "--run-dir", tmp_path / "run2", "--quiet")
    err = capsys.readouterr().err
    assert code == 2 and "'empty' (60 rows)" in err and "type null" not in err, err


def test_labels_differing_only_in_spaces_around_them_are_named_at_train_time(tmp_path, capsys):
    # ' yes ' and 'yes' (a hand-written CSV, a spreadsheet) were silently four classes for two
    from ensemble.data.settings import DataConfig
    from ensemble.data.table_scan import TableScan

    labels = [" yes ", "no", " no", "yes"]
    rows = "".join(f"{i * 0.37 % 5:.3f};{labels[i % 4]}\n" for i in range(40))
    data = _write(tmp_path / "spaced.csv", "x;label\n" + rows)
    scan = TableScan(DataConfig(source=str(data), target="label"))
    assert sorted(set(scan.y.tolist())) == [" no", " yes ", "no", "yes"]
    err = capsys.readouterr().err
    assert "differ only in spaces around them (' no', 'no'; ' yes ', 'yes')" in err, err
