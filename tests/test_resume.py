"""Nothing lost: real SIGKILLs mid-training, resume, damaged artifacts and checkpoints."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_cli, set_status, start_held

from ensemble.core import artifacts
from ensemble.core.manifest import Manifest
from ensemble.runs import run_status


def _probs(path):
    t = pq.read_table(path)
    return t, np.column_stack([t.column(f"p_{c}").to_numpy() for c in range(10)])


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_config):
    """An uninterrupted in-graph run of the tiny config (the reference for resumed runs)."""
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir) == 0
    return run_dir


def _start_and_kill(argv, tmp_path, hold_at, member=None, timeout=120):
    """Start `ensemble ARGV` in its own process, wait until the process holding at `hold_at`
    writes its pid, SIGKILL that process, and return the driver's exit status."""
    proc, marker = start_held(argv, tmp_path, hold_at, member)
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the process never reached the hold point"
            time.sleep(0.1)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_in_graph_killed_mid_epoch_resumes_to_the_same_predictions(clean, tiny_config,
                                                                   tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = _start_and_kill(["train", "--config", tiny_config, "--run-dir", run_dir], tmp_path,
                           hold_at="1:5")  # epoch 1, after step 5: mid-epoch
    assert code == -signal.SIGKILL
    manifest = Manifest.load(run_dir)
    assert manifest.status == "running" and run_status.effective_status(manifest) == "interrupted"
    assert not (run_dir / "predictions.parquet").exists()
    assert run_cli("evaluate", "--run", run_dir) == 2
    assert "interrupted" in capsys.readouterr().err
    assert run_cli("train", "--resume", "--run-dir", run_dir) == 0
    assert artifacts.read_manifest(run_dir)["status"] == "completed"
    got, p = _probs(run_dir / "predictions.parquet")
    want, q = _probs(clean / "predictions.parquet")
    assert np.abs(p - q).max() <= 1e-6
    assert got.column("y_pred").equals(want.column("y_pred"))
    hist = pq.read_table(run_dir / "history.parquet").to_pandas()
    assert sorted(hist.epoch.unique()) == [0, 1] and len(hist) == 8


def test_between_graph_client_killed_only_that_member_is_retrained(clean, tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    code = _start_and_kill(["train", "--config", tiny_config, "--run-dir", run_dir, "--mode",
                            "between-graph", "--jobs", "2"], tmp_path, hold_at="0:end",
                           member=2)
    assert code == 1  # the launcher reports the killed client after the others finished
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "failed"
    assert [m["status"] for m in manifest["members"]] == ["completed", "completed", "failed",
                                                          "completed"]
    kept = {p: p.read_bytes() for i in (0, 1, 3) for p in artifacts.member_files(run_dir, i)}
    assert (run_dir / "checkpoints" / "member-2" / "history.json").is_file()
    assert not artifacts.member_model_path(run_dir, 2).exists()
    assert run_cli("train", "--resume", "--run-dir", run_dir) == 0
    assert all(p.read_bytes() == b for p, b in kept.items())
    manifest = artifacts.read_manifest(run_dir)
    assert list(manifest["timings"]["clients"]) == ["2"]  # only member 2 ran again
    _, p = _probs(run_dir / "predictions.parquet")
    _, q = _probs(clean / "predictions.parquet")
    assert np.abs(p - q).max() <= 1e-5


def test_resume_refuses_a_changed_config(clean, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(clean, run_dir)
    set_status(run_dir, "failed")
    assert run_cli("train", "--resume", "--run-dir", run_dir, "--epochs", "5") == 2
    err = capsys.readouterr().err
    assert "training.epochs: 2 -> 5" in err


def test_resume_refuses_a_completed_run(clean, capsys):
    assert run_cli("train", "--resume", "--run-dir", clean) == 2
    assert "already completed" in capsys.readouterr().err


def test_damaged_newest_checkpoint_falls_back_to_the_previous(clean, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(clean, run_dir)
    ckpt = run_dir / "checkpoints" / "in-graph"
    newest = sorted(ckpt.glob("ckpt-1.data-*"))[0]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # truncated
    set_status(run_dir, "failed")
    assert run_cli("train", "--resume", "--run-dir", run_dir) == 0
    assert "ckpt-1" in capsys.readouterr().err  # the warning names the damaged checkpoint
    _, p = _probs(run_dir / "predictions.parquet")
    _, q = _probs(clean / "predictions.parquet")
    assert np.abs(p - q).max() <= 1e-6  # epoch 1 was trained again from ckpt-0


def test_every_checkpoint_damaged_is_an_error_naming_it(clean, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(clean, run_dir)
    for data in (run_dir / "checkpoints" / "in-graph").glob("ckpt-*.data-*"):
        data.write_bytes(b"\0" * 16)
    set_status(run_dir, "failed")
    assert run_cli("train", "--resume", "--run-dir", run_dir) == 2
    assert "ckpt-1" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("name", ["members/member-1.keras", "predictions.parquet",
                                  "preprocessing.json"])
def test_damaged_artifact_is_detected_and_named(clean, tmp_path, capsys, name):
    run_dir = tmp_path / "copy"
    shutil.copytree(clean, run_dir)
    path = run_dir / name
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    out = tmp_path / "out.parquet"
    cmd = (["evaluate", "--run", run_dir] if name == "predictions.parquet" else
           ["predict", "--run", run_dir, "--data", "digits", "--out", out])
    assert run_cli(*cmd) == 2
    err = capsys.readouterr().err
    assert f"Damaged artifact {path}" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_damaged_parquet_page_is_caught_by_checksums(tmp_path):
    path = tmp_path / "t.parquet"
    import pyarrow as pa

    artifacts.write_parquet(path, pa.table({"x": np.arange(10_000, dtype=np.float64)}))
    raw = bytearray(path.read_bytes())
    raw[200] ^= 0xFF  # inside the first data page
    path.write_bytes(bytes(raw))
    with pytest.raises(Exception, match=str(path)):
        artifacts.read_parquet(path)


def test_partial_ensemble_needs_min_members(clean, tmp_path, capsys, tiny_config):
    run_dir = tmp_path / "bg"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir, "--mode",
                   "between-graph", "--prepare-only") == 0
    subprocess.run([sys.executable, "-m", "pipelines.cli", "client", "--run", str(run_dir),
                    "--member", "0,3", "--threads", "2"], check=True, capture_output=True)
    assert run_cli("aggregate", "--run", run_dir) == 2
    assert "Members [1, 2]" in capsys.readouterr().err
    assert run_cli("aggregate", "--run", run_dir, "--min-members", "3") == 2
    assert run_cli("aggregate", "--run", run_dir, "--min-members", "2") == 0
    preds = pq.read_table(run_dir / "predictions.parquet")
    assert json.loads(preds.schema.metadata[b"members"]) == [0, 3]
    assert set(preds.column("member").drop_null().to_pylist()) == {0, 3}
    assert artifacts.read_manifest(run_dir)["aggregated_members"] == [0, 3]
    # a partial ensemble is completed, and --resume still trains the members it left out
    assert run_cli("train", "--resume", "--run-dir", run_dir, "--quiet") == 0
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "completed" and manifest["aggregated_members"] == [0, 1, 2, 3]
    assert np.allclose(_probs(run_dir / "predictions.parquet")[1],
                       _probs(clean / "predictions.parquet")[1], atol=1e-5)
