"""`ensemble serve` against hostile requests, over real HTTP on loopback: one tiny digits run
exported once, one server process with small limits shared by the module, stopped by SIGTERM
in the last test.

Checked, each over several requests of its class: bodies beyond `--max-request-bytes` are 413
(declared ones before the body is sent, chunked ones while reading); more rows than
`--max-request-rows` is 400; JSON nested too deep is 400 with no traceback in the log;
non-finite numbers (Infinity, -Infinity, beyond float32) are 400 naming the input, in
both request formats; a large request does not hold back small ones sent after it; a client
that disconnects before its body is read is no server error (no traceback, counted CANCELLED,
not INTERNAL) and a 413 is counted RESOURCE_EXHAUSTED; requests fully sent before SIGTERM are
all answered, then the process exits 0. At start: a training run given as `--model` is refused
(exit 2, one line naming `ensemble export`), an empty export folder waits for its first
version and serves it once exported."""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import cli_env, run_cli
from test_serve_http import free_port, serving, wait_until

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

RUN = """
[data]
source = "digits"
[members]
count = 2
hidden = [16]
[training]
epochs = 1
batch_size = 64
seed = 7
[placement]
devices = "cpu:2"
"""
MAX_BYTES, MAX_ROWS = 3_000_000, 6000


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The folder of a tiny digits run (`run/`) and its export (`models/digits/1/`)."""
    base = tmp_path_factory.mktemp("hostile")
    (base / "run.toml").write_text(RUN)
    assert run_cli("train", "--config", base / "run.toml", "--run-dir", base / "run",
                   "--quiet") == 0
    assert run_cli("export", "--run", base / "run", "--out", base / "models" / "digits") == 0
    return base


@pytest.fixture(scope="module")
def server(exported):
    """(URL, port, process, stderr path, digits rows x [n, 64] float32)."""
    from sklearn.datasets import load_digits

    base = exported
    err = base / "serve.err"
    with serving(base / "models" / "digits", err, "--replicas", "2", "--max-batch-size", "32",
                 "--max-request-bytes", str(MAX_BYTES),
                 "--max-request-rows", str(MAX_ROWS)) as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        yield url, port, proc, err, load_digits().data.astype(np.float32)


def _post(url, body: bytes, timeout=30):
    return httpx.post(f"{url}/v1/models/digits:predict", content=body,
                      headers={"Content-Type": "application/json"}, timeout=timeout)


def _count(url, status: str) -> int:
    """The server's `request_count` of `status` (0 when it has none)."""
    head = (':tensorflow:serving:request_count{entrypoint="REST",model_name="digits",'
            f'status="{status}"}} ')
    text = httpx.get(f"{url}/monitoring/prometheus/metrics", timeout=10).text
    return sum(int(line[len(head):]) for line in text.splitlines() if line.startswith(head))


@pytest.mark.parametrize("declared", [MAX_BYTES + 1, 10 * MAX_BYTES, 2 ** 40])
def test_declared_body_beyond_the_limit_is_413_before_it_is_sent(server, declared):
    _, port, *_ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", "/v1/models/digits:predict")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(declared))
        conn.endheaders()  # no body at all: the answer must not wait for it
        r = conn.getresponse()
        assert r.status == 413
        assert "--max-request-bytes" in json.loads(r.read())["error"]
    finally:
        conn.close()


def test_chunked_body_beyond_the_limit_is_413(server):
    url, *_ = server

    def chunks():
        piece = b" " * 65536
        for _ in range(MAX_BYTES // len(piece) + 2):
            yield piece

    r = httpx.post(f"{url}/v1/models/digits:predict", content=chunks(), timeout=30)
    assert r.status_code == 413, r.text


@pytest.mark.parametrize("fmt", ["instances", "inputs"])
def test_more_rows_than_the_limit_is_400(server, fmt):
    url, *_ = server
    body = json.dumps({fmt: [[0] * 64] * (MAX_ROWS + 1)}).encode()
    assert len(body) < MAX_BYTES
    r = _post(url, body)
    assert r.status_code == 400 and "--max-request-rows" in r.json()["error"], r.text


@pytest.mark.parametrize("depth", [40, 5000, 200_000])
def test_deep_json_is_400_without_a_traceback(server, depth):
    url, _, _, err, _ = server
    for body in ("[" * depth + "]" * depth, '{"instances": ' + "[" * depth + "]" * depth + "}",
                 '{"a":' * depth + "1" + "}" * depth):
        r = _post(url, body.encode())
        assert r.status_code == 400, (depth, r.text[:200])
        assert "nested deeper" in r.json()["error"] or "malformed" in r.json()["error"]
    log = err.read_text()
    assert "RecursionError" not in log and "Traceback" not in log


@pytest.mark.parametrize("token", ["Infinity", "-Infinity", "1e39", "-3.5e38", "1e400"])
@pytest.mark.parametrize("fmt", ["instances", "inputs"])
def test_non_finite_numbers_are_400_naming_the_input(server, token, fmt):
    """(`NaN` and `null` are a missing value, as in a table: the export fills or refuses it,
    tests/test_consistency_export.py.)"""
    url, _, _, _, x = server
    rows = [json.dumps(r) for r in x[:3].tolist()]
    rows[1] = "[" + ", ".join([token] + ["0"] * 63) + "]"
    body = '{"%s": [%s]}' % (fmt, ", ".join(rows))
    r = _post(url, body.encode())
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "`features`" in error and "non-finite" in error and "row 1" in error
    ok = _post(url, json.dumps({fmt: x[:3].tolist()}).encode())  # the same rows, finite
    assert ok.status_code == 200


def test_a_large_request_does_not_hold_back_small_ones(server):
    url, _, _, _, x = server
    big = json.dumps({"instances": np.resize(x, (MAX_ROWS, 64)).tolist()}).encode()
    done = {}

    def send_big():
        r = _post(url, big, timeout=120)
        done["big"] = (time.monotonic(), r.status_code, len(r.json()["predictions"]))

    t = threading.Thread(target=send_big)
    t.start()
    time.sleep(0.05)  # the large one is on its way first
    small = []
    for i in range(5):
        r = _post(url, json.dumps({"instances": x[i:i + 1].tolist()}).encode(), timeout=120)
        assert r.status_code == 200
        small.append(time.monotonic())
    t.join(180)
    assert done["big"][1:] == (200, MAX_ROWS)
    print(f"small requests answered {done['big'][0] - small[0]:.2f} s before the large one")
    assert small[0] < done["big"][0]  # answered while the large request was still running


BODY = b'{"instances": [[0, 0, 0, 0, 0, 0'  # 31 bytes of a longer body
CUT_OFF = {  # requests whose client closes the connection before the body is complete
    "mid-body": b"Content-Length: 100\r\n\r\n" + BODY,
    "before the body": b"Content-Length: 100\r\n\r\n",
    "mid-chunked-body": b"Transfer-Encoding: chunked\r\n\r\n1f\r\n" + BODY + b"\r\n",
}


def test_a_client_gone_mid_body_is_not_a_server_error(server):
    url, port, _, err, x = server
    logged, cancelled = len(err.read_text()), _count(url, "CANCELLED")
    for head in CUT_OFF.values():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\n" + head)
            time.sleep(0.2)  # the server is reading the body when the client leaves
    wait_until(lambda: _count(url, "CANCELLED") == cancelled + len(CUT_OFF), 30,
               "the disconnects to be counted CANCELLED")
    assert _count(url, "INTERNAL") == 0
    log = err.read_text()[logged:]
    for word in ("Traceback", "ClientDisconnect", "internal error", "Exception"):
        assert word not in log, log
    assert len(log.splitlines()) <= len(CUT_OFF)  # one line each at most (none unless verbose)
    r = _post(url, json.dumps({"instances": x[:2].tolist()}).encode())
    assert r.status_code == 200 and len(r.json()["predictions"]) == 2


def test_413_is_counted_resource_exhausted_not_internal(server):
    url, port, *_ = server
    before = _count(url, "RESOURCE_EXHAUSTED")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", "/v1/models/digits:predict")
        conn.putheader("Content-Length", str(MAX_BYTES + 1))
        conn.endheaders()
        assert conn.getresponse().status == 413
    finally:
        conn.close()
    assert _count(url, "RESOURCE_EXHAUSTED") == before + 1
    assert _count(url, "INTERNAL") == 0


def test_sigterm_answers_every_request_already_sent(server):
    _, port, proc, err, x = server

    def request(rows):
        body = json.dumps({"instances": np.resize(x, (rows, 64)).tolist()}).encode()
        return (b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)

    socks = []
    for rows in [MAX_ROWS, *[4] * 48, MAX_ROWS // 2, *[1] * 16]:  # fully sent, none read yet
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(request(rows))
        socks.append(s)
    proc.send_signal(signal.SIGTERM)
    statuses = []
    for s in socks:
        with s, s.makefile("rb") as f:
            line = f.readline()
            statuses.append(line.split()[1] if line else b"closed")
    assert statuses == [b"200"] * len(socks)
    assert proc.wait(20) == 0
    assert "Traceback" not in err.read_text()


def test_a_training_run_is_refused_at_start(exported):
    run = exported / "run"
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "serve", "--model", str(run), "--host",
         "127.0.0.1", "--port", str(free_port())], env=cli_env(TF_CPP_MIN_LOG_LEVEL="3"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{str(run)!r} is a training run" in lines[0]
    assert f"ensemble export --run {run} --out EXPORT_DIR" in lines[0]


def test_an_empty_export_folder_waits_for_its_first_version(exported, tmp_path):
    models = tmp_path / "digits"
    models.mkdir()
    err = tmp_path / "serve.err"
    rows = json.dumps({"instances": [[0.0] * 64]}).encode()
    with serving(models, err, "--replicas", "1", ready_status=503) as (_, url):
        assert "no version in" in err.read_text() and "waiting" in err.read_text()
        assert _post(url, rows).status_code == 503
        shutil.copytree(exported / "models" / "digits" / "1", models / ".1.tmp")
        (models / ".1.tmp").rename(models / "1")  # appears whole, as `ensemble export` does
        wait_until(lambda: httpx.get(f"{url}/v1/models/digits", timeout=5).status_code == 200,
                   60, "version 1 to be served")
        assert _post(url, rows).status_code == 200
