"""`ensemble serve` over real HTTP: one tiny digits run exported once, one server process
(2 replicas, dynamic batching) shared by the module, started on a free loopback port and
stopped by SIGTERM in the last test.

Checked: status and metadata; row and columnar predictions of every signature equal the run's
test predictions; bad requests get 400/404 with an `error`; concurrent one-row clients all get
their own rows back; a version exported while serving is picked up with no failed request, a
broken one is reported and the old one stays; SIGTERM finishes an in-flight request, exits 0."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, run_cli

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
epochs = 2
batch_size = 64
seed = 5
[placement]
devices = "cpu:2"
[aggregation]
aggregators = ["mean", "vote"]
"""
START_TIMEOUT = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def serving(model_dir, err, *args: str, name: str = "digits", ready_status: int = 200):
    """`ensemble serve --model MODEL_DIR ARGS` on a free loopback port, stderr to `err`;
    yields (the process, its URL) once the model's status route answers `ready_status` (503:
    up, no version loaded yet); SIGTERM (then SIGKILL) on exit."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "serve", "--model", str(model_dir),
             "--host", "127.0.0.1", "--port", str(port), *map(str, args)],
            env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    url = f"http://127.0.0.1:{port}"

    def ready():
        assert proc.poll() is None, Path(err).read_text()[-2000:]
        try:
            return httpx.get(f"{url}/v1/models/{name}", timeout=2).status_code == ready_status
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, START_TIMEOUT, "the server to be ready")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base folder, server URL, process, stderr path, test rows x [n, 64], expected
    {model: probabilities [n, 10]})."""
    from sklearn.datasets import load_digits

    base = tmp_path_factory.mktemp("serve")
    (base / "run.toml").write_text(RUN)
    assert run_cli("train", "--config", base / "run.toml", "--run-dir", base / "run",
                   "--quiet") == 0
    assert run_cli("export", "--run", base / "run", "--out", base / "models" / "digits") == 0
    preds = pq.read_table(base / "run" / "predictions.parquet")
    preds = preds.filter(pc.equal(preds.column("split"), "test"))
    expected = {}
    for model in ("ensemble-mean", "ensemble-vote"):
        t = preds.filter(pc.equal(preds.column("model"), model))
        t = t.take(pc.sort_indices(t.column("row")))
        expected[model] = np.column_stack([t.column(f"p_{k}").to_numpy() for k in range(10)])
        rows = t.column("source_row").to_numpy()
    x = load_digits().data[rows].astype(np.float32)

    err = base / "serve.err"
    with serving(base / "models" / "digits", err, "--replicas", "2", "--batch-timeout-ms", "1",
                 "--verbose") as (proc, url):
        yield base, url, proc, err, x, expected


def test_status_and_metadata(served):
    _, url, *_ = served
    status = httpx.get(f"{url}/v1/models/digits").json()
    assert status == {"model_version_status": [{
        "version": "1", "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""}}]}
    assert httpx.get(f"{url}/v1/models/digits/versions/1").json() == status
    meta = httpx.get(f"{url}/v1/models/digits/metadata").json()
    assert meta["model_spec"] == {"name": "digits", "signature_name": "", "version": "1"}
    sigs = meta["metadata"]["signature_def"]["signature_def"]
    # as TF Serving, the SignatureDefMap as saved (with TensorFlow's own init op)
    assert set(sigs) - {"__saved_model_init_op"} == {"serving_default", "mean", "vote"}
    features = sigs["mean"]["inputs"]["features"]
    assert features["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in features["tensor_shape"]["dim"]] == ["-1", "64"]
    assert set(sigs["vote"]["outputs"]) == {"probabilities", "labels", "class_index",
                                            "member_probabilities"}


@pytest.mark.parametrize("signature, model", [("mean", "ensemble-mean"),
                                              ("vote", "ensemble-vote"),
                                              (None, "ensemble-mean")])
def test_row_and_columnar_predictions_equal_the_run(served, signature, model):
    _, url, _, _, x, expected = served
    sig = {} if signature is None else {"signature_name": signature}
    rows = httpx.post(f"{url}/v1/models/digits:predict",
                      json={**sig, "instances": x.tolist()}, timeout=30)
    assert rows.status_code == 200, rows.text
    preds = rows.json()["predictions"]
    assert len(preds) == len(x)
    probs = np.array([p["probabilities"] for p in preds])
    assert np.abs(probs - expected[model]).max() <= 1e-5
    assert [p["labels"] for p in preds] == probs.argmax(1).tolist() or signature == "vote"
    cols = httpx.post(f"{url}/v1/models/digits/versions/1:predict",
                      json={**sig, "inputs": {"features": x[:17].tolist()}}, timeout=30)
    assert cols.status_code == 200, cols.text
    out = cols.json()["outputs"]
    assert np.abs(np.array(out["probabilities"]) - expected[model][:17]).max() <= 1e-5
    assert np.array(out["member_probabilities"]).shape == (17, 2, 10)


@pytest.mark.parametrize("path, body, status, words", [
    ("digits:predict", b'{"instances": [[1, 2', 400, "malformed JSON"),
    ("digits:predict", b'{"instances": [[1, 2, 3]]}', 400, "shape [-1, 64]"),
    ("digits:predict", json.dumps({"instances": [["a"] * 64]}).encode(), 400, "strings"),
    ("digits:predict", json.dumps({"instances": [[0] * 64], "inputs": [[0] * 64]}).encode(),
     400, "both"),
    ("digits:predict", json.dumps({"signature_name": "median", "instances": [[0] * 64]}
                                  ).encode(), 404, "'median'"),
    ("nope:predict", json.dumps({"instances": [[0] * 64]}).encode(), 404, "'nope'"),
    ("digits/versions/9:predict", json.dumps({"instances": [[0] * 64]}).encode(), 404,
     "version 9"),
])
def test_bad_requests_get_an_error(served, path, body, status, words):
    _, url, *_ = served
    r = httpx.post(f"{url}/v1/models/{path}", content=body)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert httpx.get(f"{url}/v1/models/nope").status_code == 404 if "nope" in path else True


def test_concurrent_one_row_clients_get_their_own_rows(served):
    _, url, _, _, x, expected = served

    def client(k: int) -> float:
        with httpx.Client(timeout=30) as c:
            worst = 0.0
            for i in range(k, len(x), 32):
                r = c.post(f"{url}/v1/models/digits:predict",
                           json={"signature_name": "mean", "instances": [x[i].tolist()]})
                assert r.status_code == 200, r.text
                p = np.array(r.json()["predictions"][0]["probabilities"])
                worst = max(worst, np.abs(p - expected["ensemble-mean"][i]).max())
            return worst

    with ThreadPoolExecutor(32) as pool:
        assert max(pool.map(client, range(32))) <= 1e-5
    text = httpx.get(f"{url}/monitoring/prometheus/metrics").text
    ok = [line for line in text.splitlines() if line.startswith(
        ':tensorflow:serving:request_count{entrypoint="REST",model_name="digits",status="OK"}')]
    assert len(ok) == 1 and int(ok[0].split()[-1]) >= len(x)
    count = [line for line in text.splitlines() if line.startswith(
        ':tensorflow:serving:request_latency_count{API="predict"')]
    assert int(count[0].split()[-1]) >= len(x)
    assert 'request_latency_bucket{API="predict",entrypoint="REST",model_name="digits",le="+Inf"}' \
        in text
    rows = int(next(line for line in text.splitlines()
                    if line.startswith(":tensorflow:serving:batching_session:"
                                       "processed_batch_size_sum")).split()[-1])
    assert rows >= len(x)  # every row went through a model call


def test_new_version_is_picked_up_and_a_broken_one_is_not(served):
    base, url, _, err, x, expected = served
    models = base / "models" / "digits"
    failures, stop = [], threading.Event()

    def hammer():  # requests across the swap: none may fail
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                r = c.post(f"{url}/v1/models/digits:predict", json={"instances": x[:4].tolist()})
                if r.status_code != 200:
                    failures.append(r.text)

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        start = time.monotonic()
        assert run_cli("export", "--run", base / "run", "--out", models) == 0
        wait_until(lambda: httpx.get(f"{url}/v1/models/digits/versions/2").status_code == 200
                   and httpx.get(f"{url}/v1/models/digits/versions/2").json()[
                       "model_version_status"][0]["state"] == "AVAILABLE", 30, "version 2")
        print(f"version 2 AVAILABLE {time.monotonic() - start:.1f} s after export started")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    r = httpx.post(f"{url}/v1/models/digits/versions/2:predict",
                   json={"signature_name": "mean", "instances": x[:5].tolist()})
    assert r.status_code == 200
    assert np.abs(np.array([p["probabilities"] for p in r.json()["predictions"]])
                  - expected["ensemble-mean"][:5]).max() <= 1e-5
    assert httpx.post(f"{url}/v1/models/digits/versions/1:predict",
                      json={"instances": x[:1].tolist()}).status_code == 404
    # a damaged version 3 (appears whole, fails to load) and a half-written version 4
    staging = models / ".3.tmp"
    shutil.copytree(models / "2", staging)
    (staging / "saved_model.pb").write_bytes(b"not a SavedModel")
    staging.rename(models / "3")
    (models / "4" / "variables").mkdir(parents=True)
    shutil.copy(models / "2" / "variables" / "variables.index", models / "4" / "variables")
    (models / "4" / "saved_model.pb").write_bytes((models / "2" / "saved_model.pb").read_bytes())
    v3 = wait_until(lambda: (r := httpx.get(f"{url}/v1/models/digits/versions/3")).status_code
                    == 200 and r.json()["model_version_status"][0]["state"] == "END"
                    and r.json()["model_version_status"][0], 30, "version 3 to fail")
    assert v3["status"]["error_code"] == "UNKNOWN" and "failed to load" in \
        v3["status"]["error_message"]
    assert "version 3 of digits failed to load" in err.read_text()
    assert httpx.get(f"{url}/v1/models/digits/versions/4").status_code == 404  # never read
    assert httpx.get(f"{url}/v1/models/digits/metadata").json()["model_spec"]["version"] == "2"
    assert httpx.post(f"{url}/v1/models/digits:predict",
                      json={"instances": x[:1].tolist()}).status_code == 200


def test_sigterm_finishes_the_request_in_flight_and_exits_0(served):
    _, url, proc, err, x, expected = served
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"signature_name": "mean", "instances": x[:3].tolist()}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    conn.putrequest("POST", "/v1/models/digits:predict")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body[:10])  # in flight: the body is not complete yet
    time.sleep(0.3)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(OSError):  # no longer accepting connections
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    conn.send(body[10:])
    r = conn.getresponse()
    assert r.status == 200
    probs = np.array([p["probabilities"] for p in json.loads(r.read())["predictions"]])
    assert np.abs(probs - expected["ensemble-mean"][:3]).max() <= 1e-5
    assert proc.wait(15) == 0
    print(f"exit 0 {time.monotonic() - start:.1f} s after SIGTERM")
    log = err.read_text()
    assert log.count('"GET /v1/models/nope" 404') == 1  # one access-log line per request
    assert "Traceback" not in log and "stopped digits" in log
