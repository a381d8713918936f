"""Nothing lost, part five (1/2): odd standard streams and outputs, corrupted run directories,
untidy paths and environments, data edge cases, deep configs. Real processes, real files.

- Streams: a command whose stdout or stderr is closed, full (`/dev/full`) or a pipe whose
  reader left completes and writes its files; a FIFO or `/dev/stdout` given as `--out` is
  written through, never replaced; `export --out` naming a file is one line.
- Corrupted runs: a manifest of the wrong shape, and run files replaced by damaged or foreign
  content whose sha256 was updated too, are refused in one line naming the field or the file;
  no builder file without a recorded sha256 is imported.
- Paths: newlines, non-UTF-8 bytes, a deleted working directory: one line each.
- Data: passthrough columns never share a name with ours; a boolean target stays boolean.
- Config: nesting thousands deep in a file or `--set` is one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, cli_env, run_cli

CLI = [sys.executable, "-m", "pipelines.cli"]


def _one_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("error: "), err
    for n in needles:
        assert n in last, (n, err)
    return last


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)
    return dst


def _rehash(run: Path, rel: str) -> None:
    """Record `rel`'s new sha256 in the manifest, as a careful tamperer would."""
    m = json.loads((run / "manifest.json").read_text())
    m["artifacts"][rel] = hashlib.sha256((run / rel).read_bytes()).hexdigest()
    (run / "manifest.json").write_text(json.dumps(m))


# ---- standard streams and special outputs ---------------------------------------------------

@pytest.mark.parametrize("streams", ["closed", "full"])
def test_aggregate_completes_whatever_its_streams(iris_run, tmp_path, streams):
    run = _copy(iris_run[0], tmp_path / "run")
    (run / "aggregators.json").unlink()
    argv = [*CLI, "aggregate", "--run", str(run), "--aggregators", "mean,vote,temperature"]
    if streams == "closed":  # stdout and stderr closed: no file may take their numbers
        proc = subprocess.run(argv, env=cli_env(), cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: (os.close(1), os.close(2)), timeout=120)
    else:  # stdout on a full device (its writes fail with ENOSPC)
        with open("/dev/full", "w") as full:
            proc = subprocess.run(argv, env=cli_env(), cwd=ROOT, stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert "No space left on device" in proc.stderr  # said once, on stderr
    assert proc.returncode == 0
    assert (run / "aggregators.json").is_file()
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "completed"
    assert "temperature" in json.loads((run / "aggregators.json").read_text())["aggregators"]


def test_predict_to_dev_stdout_with_stderr_closed(iris_run, tmp_path):
    """The table is written through /dev/stdout (CSV: no suffix), progress goes elsewhere."""
    run, csv = iris_run
    out = tmp_path / "stdout.csv"
    with open(out, "wb") as f:
        proc = subprocess.run([*CLI, "predict", "--run", str(run), "--data", str(csv),
                               "--out", "/dev/stdout"], env=cli_env(), cwd=ROOT, stdout=f,
                              stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(2),
                              timeout=180)
    assert proc.returncode == 0
    table = pcsv.read_csv(out)
    assert table.num_rows == 150 and "y_pred" in table.column_names


@pytest.mark.parametrize("name", ["preds.parquet", "preds.csv"])
def test_predict_into_a_fifo_writes_through(iris_run, tmp_path, name):
    run, csv = iris_run
    fifo = tmp_path / name
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert run_cli("predict", "--run", run, "--data", csv, "--out", fifo, "--quiet") == 0
    reader.join(30)
    assert not reader.is_alive()
    assert fifo.is_fifo()  # not replaced by a regular file
    table = (pq.read_table(pa.BufferReader(got[0])) if name.endswith(".parquet")
             else pcsv.read_csv(pa.BufferReader(got[0])))
    assert table.num_rows == 150
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no manifest, no staging


def test_between_graph_predict_to_a_pipe_in_a_folder_not_ours(iris_run):
    """`--out /dev/stdout` (here `/dev/fd/N`, whose folder no one can write): the members'
    files of a between-graph prediction go to the system's temporary folder."""
    run, csv = iris_run
    read, write = os.pipe()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(os.fdopen(read, "rb").read()),
                              daemon=True)
    reader.start()
    try:
        assert run_cli("predict", "--run", run, "--data", csv, "--out", f"/dev/fd/{write}",
                       "--mode", "between-graph", "--quiet") == 0
    finally:
        os.close(write)
    reader.join(30)
    assert pcsv.read_csv(pa.BufferReader(got[0])).num_rows == 150


def test_predict_into_a_pipe_whose_reader_left_is_one_line(iris_run, capsys):
    """`ensemble predict --out /dev/stdout | head -3`: the reader goes away, the command stops
    with one line naming the output, no BrokenPipeError traceback."""
    run, csv = iris_run
    read, write = os.pipe()
    os.close(read)  # the reader left
    try:
        status = run_cli("predict", "--run", run, "--data", csv, "--out", f"/dev/fd/{write}",
                         "--quiet")
    finally:
        os.close(write)
    assert status == 1
    _one_line(capsys, f"cannot write /dev/fd/{write}", "broken pipe")


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_export_out_naming_a_file_is_one_line(iris_run, tmp_path, capsys, where):
    target = tmp_path / "afile"
    target.write_text("keep")
    out = target if where == "file" else target / "models"
    assert run_cli("export", "--run", iris_run[0], "--out", out) == 2
    _one_line(capsys, "Expected --out to be a folder", "is a file")
    assert target.read_text() == "keep"


# ---- corrupted run directories --------------------------------------------------------------

MANIFEST_CASES = {
    "array": (lambda m: [1, 2], "should be a JSON object, not a JSON array"),
    "members-object": (lambda m: {**m, "members": {"0": m["members"][0]}}, "`members`"),
    "artifacts-null": (lambda m: {**m, "artifacts": None}, "`artifacts`"),
    "index-string": (lambda m: {**m, "members": [{**x, "index": str(x["index"])}
                                                 for x in m["members"]]}, "`members[0].index`"),
    "config-string": (lambda m: {**m, "config": "tiny.toml"}, "`config`"),
    "dataset-string": (lambda m: {**m, "dataset": "iris"}, "`dataset`"),
    "hash-number": (lambda m: {**m, "artifacts": {**m["artifacts"], "metrics.parquet": 7}},
                    "`artifacts['metrics.parquet']`"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
@pytest.mark.parametrize("command", ["predict", "export", "aggregate", "evaluate"])
def test_manifest_of_the_wrong_shape_is_one_line(iris_run, tmp_path, capsys, case, command):
    run = _copy(iris_run[0], tmp_path / "run")
    change, field = MANIFEST_CASES[case]
    m = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(change(m)))
    argv = {"predict": ["--data", iris_run[1], "--out", tmp_path / "p.parquet"],
            "export": ["--out", tmp_path / "exp"]}.get(command, [])
    assert run_cli(command, "--run", run, *argv) == 2
    _one_line(capsys, "Damaged manifest", field)
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "exp").exists()


def _garbage_predictions(run: Path) -> None:
    (run / "predictions.parquet").write_bytes(b"PAR1" + os.urandom(300) + b"PAR1")
    _rehash(run, "predictions.parquet")


def _unknown_aggregator(run: Path) -> None:
    fit = json.loads((run / "aggregators.json").read_text())
    fit["aggregators"] = ["mean", "no-such-aggregator"]
    (run / "aggregators.json").write_text(json.dumps(fit))
    _rehash(run, "aggregators.json")


def _few_features(run: Path) -> None:
    pre = json.loads((run / "preprocessing.json").read_text())
    for key in ("feature_names", "mean", "scale", "output_names"):
        pre[key] = pre[key][:2]
    (run / "preprocessing.json").write_text(json.dumps(pre))
    _rehash(run, "preprocessing.json")


def _foreign_member(run: Path) -> None:
    import keras

    inp = keras.Input((7,))
    keras.Model(inp, keras.layers.Dense(3)(inp)).save(run / "members" / "member-1.keras")
    _rehash(run, "members/member-1.keras")


FILE_CASES = {"garbage-predictions": (_garbage_predictions, "predictions.parquet"),
              "unknown-aggregator": (_unknown_aggregator, "aggregators.json"),
              "few-features": (_few_features, "preprocessing.json"),
              "foreign-member": (_foreign_member, "member-1.keras")}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
@pytest.mark.parametrize("command", ["predict", "export"])
def test_damaged_or_foreign_run_file_is_one_line_naming_it(iris_run, tmp_path, capsys, case,
                                                           command):
    run = _copy(iris_run[0], tmp_path / "run")
    damage, name = FILE_CASES[case]
    damage(run)
    argv = (["--data", iris_run[1], "--out", tmp_path / "p.parquet"] if command == "predict"
            else ["--out", tmp_path / "exp"])
    assert run_cli(command, "--run", run, *argv) == 2
    _one_line(capsys, name)


@pytest.mark.parametrize("form", ["file", "module"])
def test_builder_code_without_a_recorded_sha256_is_never_imported(iris_run, tmp_path, capsys,
                                                                  form, monkeypatch):
    run = _copy(iris_run[0], tmp_path / "run")
    marker = tmp_path / "ran"
    (run / "planted.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "def build(*a, **k):\n    raise SystemExit\n")
    spec = f"{run / 'planted.py'}:build" if form == "file" else "planted:build"
    monkeypatch.syspath_prepend(str(run))  # a module the run directory puts on the path
    m = json.loads((run / "manifest.json").read_text())
    for member in m["members"]:
        member["hparams"]["builder"] = spec
    (run / "manifest.json").write_text(json.dumps(m))
    for command, argv in (("predict", ["--data", iris_run[1], "--out", tmp_path / "p.parquet"]),
                          ("export", ["--out", tmp_path / "exp"])):
        assert run_cli(command, "--run", run, *argv) == 2, command
        _one_line(capsys, "planted.py", "not imported")
    assert not marker.exists()
    assert "planted" not in sys.modules


# ---- paths and environment ------------------------------------------------------------------

def test_path_with_a_newline_stays_one_line(iris_run, tmp_path, capsys):
    bad = tmp_path / "a\nrun"
    assert run_cli("aggregate", "--run", bad) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a\\nrun" in err


def test_path_with_a_newline_works(iris_run, tmp_path):
    run = _copy(iris_run[0], tmp_path / "new\nline run")
    out = tmp_path / "out\nput.parquet"
    assert run_cli("predict", "--run", run, "--data", iris_run[1], "--out", out, "--quiet") == 0
    assert pq.read_table(out).num_rows == 150


@pytest.mark.parametrize("which", ["data", "run", "out"])
def test_non_utf8_paths_are_one_line(iris_run, tmp_path, capsys, which):
    run, csv = iris_run
    odd = os.fsdecode(os.fsencode(tmp_path) + b"/odd\xff")
    out = tmp_path / "p.parquet"
    if which == "data":
        shutil.copy(csv, odd + ".csv")
        csv = odd + ".csv"
    elif which == "run":
        run = shutil.copytree(run, odd)
    else:
        out = odd + ".parquet"
    status = run_cli("predict", "--run", run, "--data", csv, "--out", out, "--quiet")
    if status == 0:  # correct results, or one line
        assert pq.read_table(open(out, "rb")).num_rows == 150
    else:
        assert status == 2
        last = _one_line(capsys, "odd", "not UTF-8")
        assert "\n" not in last


def test_deleted_working_directory_is_one_line(iris_run, tmp_path, capsys, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert run_cli("export", "--run", iris_run[0], "--out", "models") == 2
    _one_line(capsys, "working directory")
    assert run_cli("predict", "--run", iris_run[0], "--data", iris_run[1],
                   "--out", "p.parquet") == 2
    _one_line(capsys, "working directory")
    out = tmp_path / "abs.parquet"  # absolute paths still work
    assert run_cli("predict", "--run", iris_run[0], "--data", iris_run[1], "--out", out,
                   "--quiet") == 0
    assert pq.read_table(out).num_rows == 150


# ---- data edge cases ------------------------------------------------------------------------

def test_passthrough_columns_never_share_a_name(iris_run, tmp_path, capsys):
    run, csv = iris_run
    t = pcsv.read_csv(csv)
    n = t.num_rows
    for name in ("row", "input_row", "y_pred", "p_0", "input_input_row", "entropy", "input"):
        t = t.append_column(name, pa.array([f"{name}-{i}" for i in range(n)]))
    data = tmp_path / "collide.parquet"
    pq.write_table(t, data)
    for out in (tmp_path / "o.parquet", tmp_path / "o.csv"):
        assert run_cli("predict", "--run", run, "--data", data, "--out", out, "--quiet") == 0
        got = pq.read_table(out) if out.suffix == ".parquet" else pcsv.read_csv(out)
        assert len(set(got.column_names)) == len(got.column_names), got.column_names
        assert got.column("y_pred").type != pa.string()  # ours, not the input's
        for name in ("row", "input_row", "y_pred", "p_0", "input_input_row", "entropy",
                     "input"):  # every input column is kept, under one name or another
            assert any(got.column(c)[0].as_py() == f"{name}-0" for c in got.column_names
                       if got.column(c).type == pa.string()), name
    capsys.readouterr()
    assert run_cli("predict", "--run", run, "--data", data, "--out", tmp_path / "n.csv") == 0
    err = capsys.readouterr().err  # each renamed column named once, not once per batch
    assert err.count("the input's column 'y_pred' has the name of a predictions column: "
                     "written as 'input_y_pred'") == 1, err


def test_boolean_target_comes_back_boolean(tmp_path):
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame
    frame["target"] = frame["target"] == 1
    data = tmp_path / "bc.parquet"
    frame.to_parquet(data)
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'[data]\nsource = "{data}"\n[members]\ncount = 2\nhidden = [8]\n'
                   '[training]\nepochs = 2\nbatch_size = 64\nseed = 1\n'
                   '[placement]\ndevices = "cpu:1"\n')
    assert run_cli("train", "--config", cfg, "--run-dir", tmp_path / "run", "--quiet") == 0
    for out in (tmp_path / "p.parquet", tmp_path / "p.csv"):
        assert run_cli("predict", "--run", tmp_path / "run", "--data", data, "--out", out,
                       "--quiet") == 0
        got = pq.read_table(out) if out.suffix == ".parquet" else pcsv.read_csv(out)
        assert got.column("y_pred").type == pa.bool_()
        agree = pc.mean(pc.cast(pc.equal(got.column("y_pred"),
                                         pa.array(frame["target"])), pa.float64())).as_py()
        assert agree > 0.8
    long = pq.read_table(tmp_path / "run" / "predictions.parquet")
    assert long.column("y_true").type == pa.bool_()


# ---- config ---------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["file", "set"])
@pytest.mark.parametrize("brackets", ["[]", "{}"])
def test_deep_config_is_one_line(tmp_path, capsys, where, brackets):
    o, c = brackets
    deep = o * 3000 + ("1" if o == "[" else "a = 1") + c * 3000
    if o == "{":
        deep = "{x = " * 3000 + "1" + "}" * 3000
    cfg = tmp_path / "deep.toml"
    cfg.write_text(f"[members]\nhidden = {deep}\n" if where == "file" else "[members]\n")
    extra = ["--set", f"members.hidden={deep}"] if where == "set" else []
    assert run_cli("train", "--config", cfg, *extra, "--run-dir", tmp_path / "r") == 2
    _one_line(capsys, "at most 32 deep")
    assert not (tmp_path / "r").exists()
