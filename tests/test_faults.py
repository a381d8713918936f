"""Nothing lost, part three: resource faults on write paths (a file-size limit, RLIMIT_FSIZE,
makes writes fail with EFBIG as a full disk would), writes killed with SIGKILL, and their
staging leftovers. Real processes, real limits, real signals."""

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, run_cli, start_held

from ensemble.core import artifacts
from ensemble.core import faults
from ensemble.core import staging

BIG = """
[data]
source = "digits"
[members]
count = 2
hidden = [512]
[training]
epochs = 1
batch_size = 64
[placement]
devices = "cpu:2"
"""


def _limited(argv, limit: int, timeout: float = 180) -> subprocess.CompletedProcess:
    """`ensemble ARGV` in its own process whose files may not grow beyond `limit` bytes."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "pipelines.cli", *map(str, argv)],
                          preexec_fn=cap, env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


def _fault_line(proc) -> str:
    """The one error line of a faulted process (notices may precede it; no traceback)."""
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip().endswith(errors[0]), proc.stderr
    return errors[0]


def _leftovers(folder: Path) -> list[Path]:
    """Staging files or folders (ours, TensorFlow's checkpoint `_temp`) under `folder`."""
    return [p for p in folder.rglob("*") if staging.MARK in p.name or p.name.endswith("_temp")
            or ".tmp" in p.name]


def _intact(run_dir: Path) -> None:
    """Every file the manifest records is there with its recorded sha256."""
    manifest = artifacts.read_manifest(run_dir)
    for rel in artifacts.recorded_hashes(manifest):
        artifacts.verify(run_dir, manifest, run_dir / rel)


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_a_full_disk_at_a_checkpoint_fails_the_run_keeps_its_files_and_resumes(tmp_path, mode):
    config = tmp_path / "big.toml"
    config.write_text(BIG)
    run_dir = tmp_path / "run"
    # the splits (~340 kB) fit, a checkpoint of a 512-unit member with Adam (~460 kB) does not
    proc = _limited(["train", "--config", config, "--run-dir", run_dir, "--quiet", "--mode",
                     mode], 400_000)
    line = _fault_line(proc)
    where = "in-graph" if mode == "in-graph" else "member-0"
    assert f"cannot write {run_dir / 'checkpoints' / where}" in line, line
    assert "File too large" in line
    assert f"continue with: ensemble train --resume --run-dir {run_dir}" in line
    assert artifacts.read_manifest(run_dir)["status"] == "failed"
    _intact(run_dir)  # the splits and the preprocessing, as recorded
    assert not _leftovers(run_dir)
    if mode == "between-graph":
        return  # resuming between-graph runs is test_resume's
    assert run_cli("train", "--resume", "--run-dir", run_dir, "--quiet") == 0
    assert artifacts.read_manifest(run_dir)["status"] == "completed"
    _intact(run_dir)


@pytest.mark.parametrize("command", ["predict", "export"])
def test_a_full_disk_at_predict_or_export_leaves_nothing_partial(trained, tmp_path, command):
    out = tmp_path / ("p.parquet" if command == "predict" else "models")
    argv = ["--data", "digits", "--out", out] if command == "predict" else ["--out", out]
    line = _fault_line(_limited([command, "--run", trained, *argv], 30_000))
    assert "File too large" in line and str(tmp_path) in line, line
    if command == "predict":
        assert line == f"error: cannot write {out}: File too large"
        assert not out.exists() and not _leftovers(tmp_path)
    else:  # no version folder, no staging folder: TF Serving never sees half a model
        from ensemble.runs.export import EXPORT_LOCK  # (the base's lock file stays)

        assert not [p for p in out.iterdir() if p.name != EXPORT_LOCK], list(out.iterdir())
    _intact(trained)


def test_a_full_disk_at_aggregate_marks_the_run_failed_and_aggregate_redoes_it(trained,
                                                                              tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    argv = ["aggregate", "--run", run_dir, "--aggregators", "mean,vote,greedy"]
    line = _fault_line(_limited(argv, 30_000))
    assert line.startswith(f"error: cannot write {run_dir / 'predictions.parquet'}: File too")
    assert f"continue with: ensemble aggregate --run {run_dir}" in line
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "failed" and manifest["failed_by"] == "aggregate"
    _intact(run_dir)  # what was rewritten is whole and recorded; the rest untouched
    assert not _leftovers(run_dir)
    assert run_cli(*argv) == 0
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "completed" and "failed_by" not in manifest
    _intact(run_dir)


def test_ctrl_c_at_aggregate_after_it_replaced_a_file_marks_the_run_failed(trained, tmp_path,
                                                                          monkeypatch, capsys):
    from ensemble.core.interrupt import Interrupted

    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    argv = ["aggregate", "--run", run_dir, "--aggregators", "mean,vote,greedy"]

    def ctrl_c(*args, **kwargs):  # aggregators.json is replaced, the tables not yet
        raise Interrupted(signal.SIGINT)

    with monkeypatch.context() as patched:
        patched.setattr(artifacts, "write_parquet", ctrl_c)
        assert run_cli(*argv) == 130
    assert capsys.readouterr().err.strip() == (
        f"interrupted; run {run_dir} marked failed (its files were being replaced): continue "
        f"with: ensemble aggregate --run {run_dir}")
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "failed" and manifest["failed_by"] == "aggregate"
    _intact(run_dir)  # not "damaged": the replaced file's sha256 is recorded
    assert run_cli("evaluate", "--run", run_dir) == 2
    assert f"run `ensemble aggregate --run {run_dir}` again" in capsys.readouterr().err
    assert run_cli(*argv) == 0
    assert artifacts.read_manifest(run_dir)["status"] == "completed"
    _intact(run_dir)


def test_a_between_graph_run_whose_aggregator_was_killed_resumes(tiny_config, tmp_path):
    """SIGTERM to the launcher while its aggregator writes: the aggregator is SIGKILLed with
    aggregators.json written and not yet recorded, the run marked interrupted; `--resume`
    (which the interruption's line names) aggregates again."""
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir, "--members", "2",
                   "--epochs", "1", "--mode", "between-graph", "--jobs", "1", "--quiet") == 0
    manifest = artifacts.read_manifest(run_dir)
    for rel in ("ensemble_size.parquet", "history.parquet", "members.parquet",
                "metrics.parquet", "predictions.parquet", "aggregators.json"):
        del manifest["artifacts"][rel]
        if rel != "aggregators.json":  # the aggregator's first file, the others not yet
            (run_dir / rel).unlink()
    artifacts.write_manifest(run_dir, {**manifest, "status": "interrupted"})
    assert run_cli("train", "--resume", "--run-dir", run_dir, "--quiet") == 0
    assert artifacts.read_manifest(run_dir)["status"] == "completed"
    _intact(run_dir)


def test_describe_names_the_path_and_cause_of_every_resource_errno():
    import errno

    import tensorflow as tf

    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG):
        exc = OSError(code, os.strerror(code), "/data/run/x.parquet")
        assert faults.describe(exc) == f"cannot write /data/run/x.parquet: {os.strerror(code)}"
    assert faults.describe(PermissionError(errno.EACCES, "Permission denied", "/ro/f")) == \
        "cannot access /ro/f: Permission denied"
    tf_error = tf.errors.ResourceExhaustedError(
        None, None, "{{function_node x}} /r/ckpt-0_temp/part-0.data.tempstate123; No space left "
        "on device [Op:SaveV2]")
    try:
        try:
            raise tf_error
        except Exception:
            raise RuntimeError("wrapped")  # found anywhere in the chain
    except RuntimeError as exc:
        assert faults.describe(exc) == "cannot write /r/ckpt-0_temp/part-0.data: No space left " \
                                       "on device"
    assert faults.describe(ValueError("x")) is None
    assert faults.describe(OSError(errno.ENOENT, "No such file or directory", "/x")) is None


def _held(argv, tmp_path, point: str, timeout: float = 120):
    proc, marker = start_held(argv, tmp_path, point)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"never reached {point}: {proc.stderr.read()}")
        time.sleep(0.1)
    return proc, marker


def _killed_at(argv, tmp_path, point: str):
    """Run `argv` until it holds at `point`, SIGKILL it, and return the ended process."""
    proc, marker = _held(argv, tmp_path, point)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        marker.unlink(missing_ok=True)
    return proc


@pytest.mark.parametrize("command", ["predict", "export"])
def test_a_write_killed_midway_leaves_a_staging_entry_the_next_run_removes(trained, tmp_path,
                                                                           command):
    out = tmp_path / "out" / ("p.parquet" if command == "predict" else "models")
    argv = [command, "--run", trained, *(["--data", "digits"] if command == "predict" else []),
            "--out", out]
    proc = _killed_at(argv, tmp_path, command)
    folder = out.parent if command == "predict" else out
    left = [p for p in folder.iterdir() if staging.owner(p.name)]
    assert len(left) == 1 and staging.owner(left[0].name)[1] == proc.pid, left
    assert staging.is_stale(left[0].name)
    assert not out.exists() if command == "predict" else not (out / "1").exists()
    assert run_cli(*argv[:-2], "--out", out) == 0  # the next run into the same place
    assert not [p for p in folder.iterdir() if staging.owner(p.name)]
    assert out.is_file() if command == "predict" else (out / "1" / "saved_model.pb").is_file()


def test_a_between_graph_predict_killed_midway_leaves_nothing_the_next_keeps(trained, tmp_path):
    """The members' files of a between-graph prediction are staged beside its output under
    owned names: a SIGKILLed predict's are swept by the next predict into the same place."""
    out = tmp_path / "out" / "p.parquet"
    argv = ["predict", "--run", trained, "--data", "digits", "--mode", "between-graph",
            "--out", out]
    _killed_at(argv, tmp_path, "predict")
    assert [p for p in out.parent.iterdir() if p.name.startswith(".")]  # the members' files
    assert run_cli(*argv) == 0  # the next predict into the same place
    assert sorted(p.name for p in out.parent.iterdir()) == ["p.parquet",
                                                             "p.parquet.manifest.json"]


def test_only_staging_entries_of_dead_writers_are_swept(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(done.stdout)
    host = staging._host()
    names = {
        "dead": f".a.parquet.{host}-{dead}.0a1b{staging.MARK}.parquet",
        "alive": f".a.parquet.{host}-{os.getppid()}.0a1b{staging.MARK}.parquet",
        "other host": f".a.parquet.elsewhere-{dead}.0a1b{staging.MARK}.parquet",
        "other file": f".b.parquet.{host}-{dead}.0a1b{staging.MARK}.parquet",
        "not staging": ".a.parquet.123.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_text("partial")
    assert staging.sweep(tmp_path, "a.parquet") == [tmp_path / names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for k, n in names.items() if k != "dead")
    with artifacts.atomic_path(tmp_path / "b.parquet") as tmp:  # a write sweeps its own name
        tmp.write_text("whole")
    assert not (tmp_path / names["other file"]).exists()
    assert (tmp_path / "b.parquet").read_text() == "whole"


def test_a_scratch_folder_left_by_a_killed_run_is_swept_by_the_next(tmp_path):
    """The memory-mapped outputs of a training or evaluation killed by SIGKILL stay in the run
    directory until the next `output_files` there removes them (their writer is dead); a
    live writer's folder is kept."""
    from ensemble.tasks import eval_writer

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    host = staging._host()
    dead = tmp_path / f".outputs.{host}-{int(done.stdout)}.0a1b{staging.MARK}"
    alive = tmp_path / f".outputs.{host}-{os.getppid()}.0a1b{staging.MARK}"
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "outputs-1.npy").write_bytes(b"\0" * 1024)
    with eval_writer.output_files(tmp_path) as files:
        files.new((2, 3)).fill(1.0)
        mine = files.folder
        assert mine.is_dir() and not dead.exists() and alive.exists()
    assert not mine.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name]


LAUNCHER = """import sys
from ensemble.replication.processes import run_process
run_process(["-n", "1", sys.argv[1]], module="timeit")
"""
# the client: ends with its launcher; a launcher killed before the client read its parent
# leaves it a child of init (parent 1 from the start): it ends then too, and after 120 s anyway
WAIT_FOR_PARENT = ("import os, time\nparent, end = os.getppid(), time.monotonic() + 120\n"
                   "while os.getppid() == parent != 1 and time.monotonic() < end:\n"
                   "    time.sleep(0.05)")


def test_a_killed_launchers_report_file_is_removed_by_the_next_launch(tmp_path, monkeypatch):
    import tempfile

    from ensemble.replication.processes import run_process

    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, WAIT_FOR_PARENT],
                                env=cli_env(TMPDIR=str(tmp_path)))
    try:  # its client runs (and ends once the launcher is gone) with a report file in TMPDIR
        deadline = time.monotonic() + 60
        while not any(tmp_path.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(tmp_path.iterdir())
    finally:
        launcher.kill()
        launcher.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run_process(["-n", "1", "pass"], module="timeit")["returncode"] == 0
    assert list(tmp_path.iterdir()) == []  # the killed launcher's file and its own: gone


def _read_only(run_dir, *argv):
    """`ensemble ARGV` with `run_dir` a read-only bind mount (its own mount namespace)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode:
        pytest.skip("needs `unshare -rm` for a read-only mount")
    mount = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", mount,
                           str(run_dir), sys.executable, "-m", "pipelines.cli", *map(str, argv)],
                          env=cli_env(), capture_output=True, text=True, timeout=300)


def test_evaluate_of_a_read_only_run_prints_the_table_and_says_it_wrote_nothing(trained):
    before = {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()}
    res = _read_only(trained, "evaluate", "--run", trained)
    assert res.returncode == 0, res.stderr
    assert "ensemble-mean" in res.stdout and "member-1" in res.stdout  # the table
    assert res.stderr.splitlines() == [f"notice: {trained} is read-only: the metrics are "
                                       f"printed, not written to {trained / 'metrics.parquet'}"]
    res = _read_only(trained, "evaluate", "--run", trained, "--plots")  # files asked for: refused
    assert res.returncode == 2 and res.stderr.splitlines() == [
        f"error: Expected a folder --plots can write in. Received: {trained} (read-only); "
        "evaluate without --plots (the table only), or copy the run or predictions to a "
        "writable folder first."]
    assert {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()} == before
