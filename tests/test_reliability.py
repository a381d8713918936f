"""Nothing lost, part two: real signals to real processes (Ctrl-C, SIGTERM, a killed launcher),
one writer per run, durable writes with umask permissions, --overwrite, strict checksums, GPU
visibility under a scheduler."""

import os
import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import run_cli, start_held

from ensemble.core import artifacts
from ensemble.core.manifest import Manifest
from ensemble.runs import run_status
from ensemble.core import runlock
from ensemble.replication.visible import local_devices
from ensemble.core.errors import UsageError


def _start(argv, tmp_path, hold_at, member=None, timeout=90):
    """Start `ensemble ARGV` held at `hold_at` (see `tests/hold_site/sitecustomize.py`); returns (the
    process, the pid of the process that holds, the marker file that releases it)."""
    proc, marker = start_held(argv, tmp_path, hold_at, member)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"never reached the hold point: {proc.stderr.read()}")
        time.sleep(0.1)
    return proc, int(marker.read_text()), marker


def _end(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _client_pids(run_dir) -> list[int]:
    """Pids of the client processes (`python -m ensemble.replication.client --request JSON`)
    working on `run_dir`."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"ensemble.replication.client" in cmd and any(
                    str(run_dir).encode() in c for c in cmd):
                pids.append(int(p.name))
    return pids


def test_ctrl_c_in_graph_stops_cleanly_refuses_other_writers_and_resumes(tiny_config, tmp_path,
                                                                        capsys):
    run_dir = tmp_path / "run"
    proc, pid, marker = _start(["train", "--config", tiny_config, "--run-dir", run_dir],
                               tmp_path, hold_at="1:2")  # epoch 2 of 2, after step 2
    try:
        assert pid == proc.pid
        holder = f"in use by pid {pid} on {socket.gethostname()} (ensemble train"
        for argv in (["train", "--resume", "--run-dir", run_dir],
                     ["train", "--config", tiny_config, "--run-dir", run_dir, "--overwrite"],
                     ["aggregate", "--run", run_dir], ["evaluate", "--run", run_dir],
                     ["predict", "--run", run_dir, "--data", "digits", "--out",
                      tmp_path / "p.parquet"]):
            assert run_cli(*argv) == 2, argv
            assert holder in capsys.readouterr().err, argv
        assert artifacts.read_manifest(run_dir)["status"] == "running"
        os.kill(pid, signal.SIGINT)
        marker.unlink()
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        _end(proc)
    assert code == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"interrupted at epoch 2 of 2; continue with: ensemble train --resume --run-dir {run_dir}")
    assert artifacts.read_manifest(run_dir)["status"] == "interrupted"
    assert (run_dir / "checkpoints" / "in-graph" / "ckpt-0.index").is_file()  # epoch 1 kept
    assert not (run_dir / "checkpoints" / "in-graph" / "ckpt-1.index").exists()

    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir) == 2
    err = capsys.readouterr().err
    assert "interrupted" in err and err.index("--resume") < err.index("--overwrite")
    assert run_cli("train", "--resume", "--run-dir", run_dir) == 0
    assert "resuming at epoch 2 of 2 from the checkpoint of epoch 1" in capsys.readouterr().err
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "completed"
    history = artifacts.read_parquet(run_dir / artifacts.HISTORY).to_pylist()
    assert sorted((r["member"], r["epoch"]) for r in history) == [
        (i, e) for i in range(4) for e in (0, 1)]


def test_sigterm_to_the_launcher_reaches_its_clients(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    proc, pid, marker = _start(["train", "--config", tiny_config, "--run-dir", run_dir,
                                "--mode", "between-graph", "--members", "2", "--jobs", "2"],
                               tmp_path,
                               hold_at="1:2", member=0)
    try:
        clients = _client_pids(run_dir)
        assert pid in clients and pid != proc.pid
        os.kill(proc.pid, signal.SIGTERM)  # the launcher only; it forwards to its clients
        time.sleep(0.5)
        marker.unlink()
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        _end(proc)
    assert code == 143, err
    assert re.fullmatch(rf"interrupted at epoch [12] of 2; continue with: ensemble train "
                        rf"--resume --run-dir {re.escape(str(run_dir))}",
                        err.strip().splitlines()[-1]), err
    assert not any(_alive(p) for p in clients)
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "interrupted"
    assert manifest["members"][0]["status"] == "interrupted"
    for m in manifest["members"]:  # a completed member carries its client's own hashes
        if m["status"] == "completed":
            assert m["sha256"] == {os.path.relpath(p, run_dir): artifacts.sha256_file(p)
                                   for p in artifacts.member_files(run_dir, m["index"])}
    assert (run_dir / "checkpoints" / "member-0" / "ckpt-0.index").is_file()


def test_ctrl_c_leaves_the_members_a_client_had_not_started_pending(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    proc, _, marker = _start(["train", "--config", tiny_config, "--run-dir", run_dir,
                              "--mode", "between-graph", "--members", "3", "--jobs", "1"],
                             tmp_path, hold_at="1:2", member=0)
    try:
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: the launcher forwards it to its client
        time.sleep(0.5)
        marker.unlink()
        assert proc.wait(timeout=60) == 130, proc.stderr.read()
    finally:
        _end(proc)
    statuses = [m["status"] for m in artifacts.read_manifest(run_dir)["members"]]
    assert statuses == ["interrupted", "pending", "pending"]  # nothing failed


def test_a_killed_launcher_leaves_no_client_behind(tiny_config, tmp_path):
    run_dir = tmp_path / "run"
    proc, pid, marker = _start(["train", "--config", tiny_config, "--run-dir", run_dir,
                                "--mode", "between-graph", "--members", "2", "--jobs", "2"],
                               tmp_path,
                               hold_at="0:1", member=0)
    try:
        clients = _client_pids(run_dir)
        assert pid in clients
        proc.kill()  # SIGKILL: the launcher can neither forward nor reap
        proc.wait()
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in clients) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in clients if _alive(p)]
    finally:
        marker.unlink(missing_ok=True)
        _end(proc)
    manifest = Manifest.load(run_dir)
    assert run_status.effective_status(manifest, run_dir) == "interrupted"  # its lock died with it


def test_manifest_updates_lose_nothing_under_concurrency(tmp_path):
    artifacts.write_manifest(tmp_path, {"counter": 0})

    def bump() -> None:
        for _ in range(25):
            runlock.update_manifest(tmp_path, lambda m: m.update(counter=m["counter"] + 1))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert artifacts.read_manifest(tmp_path)["counter"] == 100


def test_member_lock_refuses_a_second_client_naming_the_first(tmp_path):
    artifacts.write_manifest(tmp_path, {"members": []})
    with runlock.Lock(tmp_path, 1, "ensemble client --member 1"):
        with pytest.raises(UsageError, match=rf"Member 1 .* in use by pid {os.getpid()}"):
            with runlock.Lock(tmp_path, 1, "second"):
                pass
        with runlock.Lock(tmp_path, 2, "another member"):  # other members are free
            pass
    with runlock.Lock(tmp_path, 1, "after release"):
        pass


def test_readers_probing_at_once_do_not_refuse_each_other(tmp_path, monkeypatch):
    """`require_free` takes the run lock for an instant to see whether a writer holds it: the
    clients of a between-graph predict (or two `ensemble predict`s) probe at once, and one's
    probe must not read as a writer to the other (it did: a predict failed "in use by another
    process" in CI). A real writer is still refused."""
    artifacts.write_manifest(tmp_path, {"members": []})
    refused = []

    def reader():
        for _ in range(200):
            try:
                runlock.require_free(tmp_path)
            except UsageError as exc:
                refused.append(str(exc))

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refused == []
    monkeypatch.setattr(runlock, "PROBE_SECONDS", 0.2)
    with runlock.Lock(tmp_path, None, "ensemble train"):
        token = os.environ.pop(runlock.ENV)  # this process as a reader, not the writer
        try:
            with pytest.raises(UsageError, match="in use by"):
                runlock.require_free(tmp_path)
        finally:
            os.environ[runlock.ENV] = token  # the lock's exit takes it away again


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_atomic_writes_get_the_umask_permissions_and_are_flushed(tmp_path, umask, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                 real(fd)))
    monkeypatch.setattr(artifacts, "_UMASK", [])
    old = os.umask(umask)
    try:
        artifacts.write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert any(Path(p).name.startswith(".a.json.") for p in synced)  # the file, before rename
    assert str(tmp_path) in synced  # then its folder


def test_history_is_written_before_its_checkpoint(tmp_path):
    import keras

    from ensemble.replication.checkpoints import EpochCheckpoints
    from ensemble.models.optimizer import Adam

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    ckpt = EpochCheckpoints(tmp_path, [model], [Adam(model.trainable_variables, 0.01)])
    ckpt.save(0, [{"member": 0, "epoch": 0}])
    history = (tmp_path / "history.json").stat().st_mtime_ns
    assert history <= (tmp_path / "ckpt-0.index").stat().st_mtime_ns
    assert history <= (tmp_path / "checkpoint").stat().st_mtime_ns


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_config):
    run_dir = tmp_path_factory.mktemp("rel") / "run"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir, "--members", "2") == 0
    return run_dir


def test_overwrite_removes_every_file_of_the_old_run(trained, tiny_config, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    (run_dir / "tensorboard").mkdir()
    (run_dir / "tensorboard" / "events.old").write_text("stale")
    (run_dir / "old.metrics.parquet").write_text("stale")
    old = {p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file()}
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir, "--members", "1",
                   "--overwrite", "--epochs", "1") == 0
    new = {p.relative_to(run_dir) for p in run_dir.rglob("*") if p.is_file()}
    fresh = tmp_path / "fresh"
    assert run_cli("train", "--config", tiny_config, "--run-dir", fresh, "--members", "1",
                   "--epochs", "1") == 0
    assert new == {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
    stale = {Path("tensorboard/events.old"), Path("old.metrics.parquet"),
             Path("members/member-1.keras")}
    assert stale <= old and not stale & new


def test_a_file_without_a_recorded_hash_is_an_error_naming_it(trained, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    manifest = artifacts.read_manifest(run_dir)
    del manifest["artifacts"]["preprocessing.json"]
    artifacts.write_manifest(run_dir, manifest)
    assert run_cli("predict", "--run", run_dir, "--data", "digits", "--out",
                   tmp_path / "o.parquet") == 2
    err = capsys.readouterr().err.strip()
    assert f"No sha256 recorded for {run_dir / 'preprocessing.json'}" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "o.parquet").exists()


def test_evaluate_records_the_hash_of_what_it_rewrites(trained, tmp_path, capsys):
    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    metrics = run_dir / artifacts.METRICS
    metrics.unlink()  # evaluate writes it anew (new bytes: Parquet metadata differ)
    assert run_cli("evaluate", "--run", run_dir) == 0
    recorded = artifacts.read_manifest(run_dir)["artifacts"]["metrics.parquet"]
    assert recorded == artifacts.sha256_file(metrics)
    assert artifacts.verify(run_dir, artifacts.read_manifest(run_dir), metrics) == metrics


@pytest.mark.parametrize("parent, devices, visible, names", [
    (None, ["/device:GPU:1"], "1", ["/device:GPU:0"]),
    ("2,3", ["/device:GPU:0", "/device:GPU:1"], "2,3", ["/device:GPU:0", "/device:GPU:1"]),
    ("2,3", ["/device:GPU:1"], "3", ["/device:GPU:0"]),
    ("GPU-a1,GPU-b2", ["/device:GPU:1", "/device:GPU:1"], "GPU-b2",
     ["/device:GPU:0", "/device:GPU:0"]),
    ("5,6", ["/device:CPU:0"], None, ["/device:CPU:0"]),
])
def test_client_gpu_k_is_the_parents_kth_visible_gpu(monkeypatch, parent, devices, visible,
                                                     names):
    if parent is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", parent)
    env, got = local_devices(devices)
    assert env.get("CUDA_VISIBLE_DEVICES") == visible and got == names


def test_client_gpu_beyond_the_parents_visible_ones_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(UsageError, match=r"GPU:2 .*CUDA_VISIBLE_DEVICES='2,3' shows 2"):
        local_devices(["/device:GPU:2"])
