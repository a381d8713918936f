"""Nothing lost, part five (2/2): limits of the machine, commands at once on one run, hostile
HTTP peers, the gRPC server's address. Real processes, real limits (`resource.setrlimit` in the
child), a real server on 127.0.0.1 at a free port, bounded request loops.

- Limits: an address-space limit below what a command needs to start is one line naming
  `ulimit -v`, before TensorFlow loads; under a small one a NumPy command completes (BLAS
  threads bounded); a cgroup memory limit is read from its file.
- Concurrency: exports into one base get distinct versions; `predict` while `aggregate`
  rewrites the run never says "damaged".
- HTTP: both length headers, other transfer codings, a bad chunk: 400 and the connection
  closed, nothing smuggled behind answered; JSON booleans in numeric rows: 400; a version
  copied in slowly (old file times, as `cp -a` keeps them) is loaded once, complete.
- gRPC: ports outside 1-65535 or in use: one line; a loopback spec warns that TensorFlow
  listens on every interface.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli_env, run_cli

CLI = [sys.executable, "-m", "pipelines.cli"]


def _limit_as(nbytes: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- resource limits ------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["predict", "export", "aggregate"])
def test_address_space_below_the_need_is_one_line(iris_run, tmp_path, command):
    run, csv = iris_run
    argv = {"predict": ["--data", str(csv), "--out", str(tmp_path / "p.parquet")],
            "export": ["--out", str(tmp_path / "exp")], "aggregate": []}[command]
    limit = (1 << 30) if command != "aggregate" else (300 << 20)
    proc = subprocess.run([*CLI, command, "--run", str(run), *argv], env=cli_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_as(limit))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert "address-space limit (ulimit -v)" in proc.stderr and "GiB" in proc.stderr
    assert not (tmp_path / "p.parquet").exists() and not (tmp_path / "exp").exists()


def test_numpy_command_completes_under_a_small_address_space(iris_run, tmp_path):
    """OpenBLAS's threads are bounded before it loads: no abort, no endless spin."""
    run = shutil.copytree(iris_run[0], tmp_path / "run")
    env = {k: v for k, v in cli_env().items() if k not in ("OPENBLAS_NUM_THREADS",
                                                           "OMP_NUM_THREADS")}
    proc = subprocess.run([*CLI, "aggregate", "--run", str(run)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_as(896 << 20))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"aggregated: {run}" in proc.stdout


def test_cgroup_memory_limit_is_refused(monkeypatch):
    from ensemble.core import resources
    from ensemble.core.errors import UsageError

    monkeypatch.setattr(resources, "cgroup_limit", lambda: 300 << 20)
    with pytest.raises(UsageError, match="cgroup memory limit is 0.29 GiB"):
        resources.check("predict", tensorflow=True)
    resources.check("aggregate", tensorflow=False)  # above NumPy's floor: allowed


# ---- commands at once on one run ------------------------------------------------------------

def test_concurrent_exports_get_distinct_versions(iris_run, tmp_path):
    """Another export (a real process) holds the base's lock and takes version 1 meanwhile:
    this export waits for it and writes version 2; the same --version again is refused."""
    base = tmp_path / "models"
    base.mkdir()
    other = ("import sys, time, pathlib; from filelock import FileLock\n"
             "base = pathlib.Path(sys.argv[1])\n"
             "with FileLock(base / '.export.lock'):\n"
             "    print('holding', flush=True); time.sleep(2)\n"
             "    (base / '1').mkdir(); (base / '1' / 'saved_model.pb').write_bytes(b'x')\n")
    holder = subprocess.Popen([sys.executable, "-c", other, str(base)], env=cli_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        assert run_cli("export", "--run", iris_run[0], "--out", base) == 0
    finally:
        holder.wait(30)
    assert holder.returncode == 0
    assert sorted(p.name for p in base.iterdir() if not p.name.startswith(".")) == ["1", "2"]
    assert (base / "2" / "saved_model.pb").stat().st_size > 1
    assert run_cli("export", "--run", iris_run[0], "--out", base, "--version", "2") == 2


def test_predict_while_aggregate_rewrites_never_says_damaged(iris_run, tmp_path, capsys):
    run = shutil.copytree(iris_run[0], tmp_path / "run")
    loop = ("import sys; from pipelines.cli import main\n"
            "for i in range(4):\n"
            "    assert main(['aggregate', '--run', sys.argv[1], '--aggregators', "
            "['mean,vote', 'mean,vote,temperature'][i % 2]]) in (0, 2)\n")
    writer = subprocess.Popen([sys.executable, "-c", loop, str(run)], env=cli_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    outcomes = []
    try:
        deadline = time.monotonic() + 120
        while writer.poll() is None and time.monotonic() < deadline:
            status = run_cli("predict", "--run", run, "--data", iris_run[1],
                             "--out", tmp_path / "p.parquet", "--quiet")
            outcomes.append((status, capsys.readouterr().err.strip()))
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
    assert writer.returncode == 0, writer.stderr.read()[-2000:]
    status = run_cli("predict", "--run", run, "--data", iris_run[1],
                     "--out", tmp_path / "p.parquet", "--quiet")
    outcomes.append((status, capsys.readouterr().err.strip()))
    for status, err in outcomes:
        assert "Damaged" not in err and "sha256" not in err, err
        assert status == 0 or (status == 2 and "in use" in err), err
    assert outcomes[-1][0] == 0


# ---- the HTTP server ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(iris_run, tmp_path_factory):
    """`ensemble serve` of the iris run's export on 127.0.0.1: (base, port, stderr path)."""
    import httpx

    base = tmp_path_factory.mktemp("http") / "m"
    assert run_cli("export", "--run", iris_run[0], "--out", base) == 0
    port, err = _free_port(), base.parent / "serve.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([*CLI, "serve", "--model", str(base), "--host", "127.0.0.1",
                                 "--port", str(port), "--replicas", "1"],
                                env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=stderr)
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            assert proc.poll() is None, err.read_text()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models/m", timeout=2
                             ).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield base, port, err
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exchange(port: int, data: bytes, seconds: float = 5.0) -> tuple[bytes, bool]:
    """Send `data` on one connection; read until the server closes it or `seconds` pass.
    Returns (everything read, whether the server closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as s:
        s.sendall(data)
        got, end = b"", time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return got, False
            if not chunk:
                return got, True
            got += chunk
    return got, False


BODY = json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]]}).encode()
SMUGGLED = b"GET /v1/models/m HTTP/1.1\r\nHost: x\r\n\r\n"


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


@pytest.mark.parametrize("headers, body", [
    (b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(_chunked(BODY)),
     _chunked(BODY)),
    (b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n" % len(BODY), _chunked(BODY)),
    (b"Transfer-Encoding: gzip, chunked\r\n", _chunked(BODY)),
    (b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(BODY), len(BODY) + 1), BODY),
    (b"Transfer-Encoding: chunked\r\n", b"zz\r\nnot a chunk\r\n0\r\n\r\n"),
], ids=["cl-then-te", "te-then-cl", "gzip-chunked", "two-lengths", "bad-chunk"])
def test_ambiguous_framing_is_400_and_closed(server, headers, body):
    _, port, _ = server
    request = (b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
               + body + SMUGGLED)
    got, closed = _exchange(port, request)
    assert got.startswith(b"HTTP/1.1 400"), got[:200]
    assert got.count(b"HTTP/1.1 ") == 1, got  # the smuggled request is never answered
    assert closed


def test_well_framed_requests_still_answer(server):
    _, port, _ = server
    for framing, body in ((b"Content-Length: %d\r\n" % len(BODY), BODY),
                          (b"Transfer-Encoding: chunked\r\n", _chunked(BODY))):
        got, _ = _exchange(port, b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\n"
                           + framing + b"Connection: close\r\n\r\n" + body)
        assert got.startswith(b"HTTP/1.1 200"), got[:300]


@pytest.mark.parametrize("payload", [
    {"instances": [[5.1, True, 1.4, 0.2]]},
    {"instances": [[5.1, 3.5, 1.4, 0.2], [False, 3.5, 1.4, 0.2]]},
    {"inputs": [[True, True, True, True]]},
    {"instances": [{"features": [5.1, 3.5, 1.4, False]}]},
])
def test_json_booleans_in_numeric_rows_are_400(server, payload):
    import httpx

    _, port, _ = server
    r = httpx.post(f"http://127.0.0.1:{port}/v1/models/m:predict", json=payload, timeout=30)
    assert r.status_code == 400, r.text
    assert "boolean" in r.json()["error"]


def test_a_version_copied_in_slowly_loads_once_complete(server):
    """Files land one by one with their old times kept (`cp -a`): never a failed load."""
    import httpx

    base, port, err = server
    src, dst = base / "1", base / "7"
    files = sorted(p for p in src.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name != "saved_model.pb")  # the .pb first: looks complete early
    old = time.time() - 3600
    for p in files:
        target = dst / p.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, target)
        os.utime(target, (old, old))
        time.sleep(0.4)
    for d in [dst, *(p for p in dst.rglob("*") if p.is_dir())]:
        os.utime(d, (old, old))
    end = time.monotonic() + 60
    while time.monotonic() < end:
        status = httpx.get(f"http://127.0.0.1:{port}/v1/models/m", timeout=5).json()
        if any(v["version"] == "7" and v["state"] == "AVAILABLE"
               for v in status["model_version_status"]):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(err.read_text()[-2000:])
    log = err.read_text()
    assert "failed to load" not in log, log
    assert log.count("version 7") == 1, log


# ---- the gRPC server ------------------------------------------------------------------------

def _server(tmp_path, address: str, timeout: float = 20):
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"worker": [address]}))
    return subprocess.Popen([*CLI, "server", "--cluster", str(spec), "--task", "worker:0"],
                            env=cli_env(), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1:0", "[::1]:65536"])
def test_grpc_port_outside_the_range_is_one_line(tmp_path, address):
    proc = _server(tmp_path, address)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "1-65535" in err, err


def test_grpc_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _server(tmp_path, f"127.0.0.1:{port}")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and f"port {port} is in use" in err, err


def test_grpc_loopback_spec_warns_of_the_wider_bind(tmp_path):
    port = _free_port()
    proc = _server(tmp_path, f"127.0.0.1:{port}")
    try:
        end, lines = time.monotonic() + 90, []
        while time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("serving worker:0"):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "WARNING" in err and "every interface" in err and f"port {port}" in err, err
    assert "127.0.0.1" in err
