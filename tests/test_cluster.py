"""Both modes on a TensorFlow cluster of two `ensemble server` processes on 127.0.0.1.

Every server is started by the test that uses it and stopped (and checked gone) at its end.
Every command that joins the cluster runs in its own process, never in the test process.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import run_cli, start_held

from ensemble.core import artifacts
from ensemble.replication import cluster
from ensemble.core.errors import UsageError

WORKER = "/job:worker/replica:0/task:{}/device:CPU:0"


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Servers:
    """A spec of two worker tasks; the first `started` of them each an `ensemble server`
    process (a task not started is a down worker: nothing listens on its port)."""

    def __init__(self, tmp_path, started=2):
        self.spec = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
        self.file = tmp_path / "cluster.json"
        self.file.write_text(json.dumps(self.spec))
        self.logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
        self.procs = [self._start(i) for i in range(started)]
        for i in range(started):
            self.wait_serving(i)

    def _start(self, i):
        with open(self.logs[i], "w") as log:
            return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "server",
                                     "--cluster", str(self.file), "--task", f"worker:{i}"],
                                    stdout=log, stderr=subprocess.STDOUT)

    def wait_serving(self, i, timeout=60):
        deadline = time.monotonic() + timeout
        while "serving worker" not in self.logs[i].read_text():
            assert self.procs[i].poll() is None, self.logs[i].read_text()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)

    def restart(self, i):
        self.procs[i] = self._start(i)
        self.wait_serving(i)

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait(timeout=30)

    def stop(self):
        codes = []
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    codes.append(p.wait(timeout=30))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    codes.append("hung")
        assert all(p.poll() is not None for p in self.procs)
        return codes


@pytest.fixture
def servers(tmp_path):
    """A fresh pair for a test that kills one."""
    s = Servers(tmp_path)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def shared_servers(tmp_path_factory):
    """One pair for the tests that leave them running; stopped with SIGTERM: exit status 0."""
    s = Servers(tmp_path_factory.mktemp("cluster"))
    yield s
    assert s.stop() == [0, 0]
    assert "stopping worker:0" in s.logs[0].read_text()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_config):
    run_dir = tmp_path_factory.mktemp("local") / "run"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir) == 0
    return run_dir


def _probs(path):
    t = pq.read_table(path)
    return np.column_stack([t.column(f"p_{c}").to_numpy() for c in range(10)])


def _train(argv, timeout=240):
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "train", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_both_modes_on_the_cluster_match_the_local_run(shared_servers, local_run, tiny_config,
                                                       tmp_path, mode):
    servers = shared_servers
    run_dir = tmp_path / mode
    res = _train(["--config", tiny_config, "--mode", mode, "--cluster", servers.file,
                  "--devices", "auto", "--run-dir", run_dir])
    assert res.returncode == 0, res.stderr
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["cluster"] == servers.spec
    assert [m["device"] for m in manifest["members"]] == [WORKER.format(k % 2) for k in range(4)]
    assert np.abs(_probs(run_dir / "predictions.parquet")
                  - _probs(local_run / "predictions.parquet")).max() <= 1e-5
    m_local = pq.read_table(local_run / "metrics.parquet").drop_columns(["member"])
    m_cluster = pq.read_table(run_dir / "metrics.parquet").drop_columns(["member"])
    for name in ("accuracy", "nll", "brier", "ece"):
        np.testing.assert_allclose(m_cluster.column(name).to_numpy(),
                                   m_local.column(name).to_numpy(), atol=1e-5)
    out = tmp_path / "p.parquet"  # in its own process: the test process never joins a cluster
    res = subprocess.run([sys.executable, "-m", "pipelines.cli", "predict", "--run", str(run_dir),
                          "--data", "digits", "--mode", mode, "--cluster", str(servers.file),
                          "--out", str(out), "--layout", "long"], capture_output=True, text=True,
                         timeout=240)
    assert res.returncode == 0, res.stderr
    assert pq.read_table(out).num_rows == 1797 * 6


def test_a_down_worker_fails_fast_naming_the_task(tiny_config, tmp_path):
    servers = Servers(tmp_path, started=1)  # worker 1 is down from the start
    try:
        start = time.monotonic()
        res = _train(["--config", tiny_config, "--cluster", servers.file, "--devices", "auto",
                      "--run-dir", tmp_path / "r"], timeout=120)
        assert res.returncode == 1 and time.monotonic() - start < 60
        err = res.stderr.strip().splitlines()[-1]
        assert "worker:1" in err and servers.spec["worker"][1] in err
    finally:
        codes = servers.stop()
    assert codes == [0]  # the surviving server stops cleanly on SIGTERM


def _hold(argv, tmp_path, member=None):
    proc, marker = start_held(["train", *argv], tmp_path, "0:end", member)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return proc, marker


def test_worker_dying_mid_run_in_graph(servers, tiny_config, tmp_path):
    proc, marker = _hold(["--config", tiny_config, "--cluster", servers.file, "--devices",
                          "auto", "--run-dir", tmp_path / "r"], tmp_path)
    try:
        servers.kill(1)
        start = time.monotonic()
        marker.unlink()  # release the client: its next step needs worker 1
        code = proc.wait(timeout=90)
        assert code == 1 and time.monotonic() - start < 60
        assert "worker:1" in proc.stderr.read().strip().splitlines()[-1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_worker_dying_mid_run_between_graph_keeps_the_others(servers, local_run, tiny_config,
                                                             tmp_path):
    run_dir = tmp_path / "r"
    proc, marker = _hold(["--config", tiny_config, "--mode", "between-graph", "--jobs", "2",
                          "--cluster", servers.file, "--devices", "auto", "--run-dir", run_dir],
                         tmp_path, member=1)
    try:
        servers.kill(1)
        start = time.monotonic()
        marker.unlink()
        assert proc.wait(timeout=180) == 1
        assert time.monotonic() - start < 90
        assert "worker:1" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    manifest = artifacts.read_manifest(run_dir)
    status = {m["index"]: m["status"] for m in manifest["members"]}
    assert status == {0: "completed", 1: "failed", 2: "completed", 3: "failed"}
    kept = {p: p.read_bytes() for p in (run_dir / "members").glob("member-[02].*")}
    servers.restart(1)
    res = _train(["--resume", "--run-dir", run_dir])
    assert res.returncode == 0, res.stderr
    assert sorted(artifacts.read_manifest(run_dir)["timings"]["clients"]) == ["1", "3"]
    assert all(p.read_bytes() == b for p, b in kept.items())
    assert np.abs(_probs(run_dir / "predictions.parquet")
                  - _probs(local_run / "predictions.parquet")).max() <= 1e-5


def test_spec_validation_and_public_address_warning(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text('{"worker": "127.0.0.1:1"}')
    with pytest.raises(UsageError, match="cluster spec"):
        cluster.load_spec(bad)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["10.0.0.1:5"]},
                                                "task": {"type": "worker", "index": 0}}))
    assert cluster.load_spec(None) == {"worker": ["10.0.0.1:5"]}
    assert cluster.public_addresses({"w": ["127.0.0.1:1", "10.1.2.3:2", "192.168.0.1:3",
                                           "8.8.8.8:4"]}) == ["8.8.8.8:4"]


def test_a_stopped_worker_fails_the_run_naming_the_task(servers, tiny_config, tmp_path,
                                                        monkeypatch):
    """SIGSTOP: the task's process still accepts TCP connections but never answers; the
    client's watchdog (gRPC handshakes) names it instead of waiting for ever."""
    monkeypatch.setenv("ENSEMBLE_HUNG_SECONDS", "5")
    proc, marker = _hold(["--config", tiny_config, "--cluster", servers.file, "--devices",
                          "auto", "--run-dir", tmp_path / "r"], tmp_path)
    try:
        os.kill(servers.procs[1].pid, signal.SIGSTOP)
        start = time.monotonic()
        marker.unlink()  # release the client: its next step needs worker 1
        code = proc.wait(timeout=90)
        assert code == 1 and time.monotonic() - start < 60
        err = proc.stderr.read().strip().splitlines()[-1]
        assert f"cluster task worker:1 ({servers.spec['worker'][1]}) stopped answering" in err
    finally:
        os.kill(servers.procs[1].pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "r" / "checkpoints" / "in-graph" / "ckpt-0.index").is_file()
