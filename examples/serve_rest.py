"""Export a run as a SavedModel, serve it with TF Serving's REST API, and call it.

Trains a small ensemble on iris, runs `ensemble export`, starts `ensemble serve` on
127.0.0.1 with a free port, waits until the model is AVAILABLE, sends a predict request and
stops the server (SIGTERM: it drains and exits 0). Needs the `serve` extra (Starlette,
uvicorn). Run: `python examples/serve_rest.py [--members 4] [--epochs 20] [--workdir DIR]`;
without `--workdir` the run and the model go to a temporary folder, removed at the end (also
when a step fails).
"""
import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def ensemble_cli(*args: str) -> list[str]:
    """The `ensemble` command (the installed script, else `python -m pipelines.cli`)."""
    exe = shutil.which("ensemble")
    return [exe, *args] if exe else [sys.executable, "-m", "pipelines.cli", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: dict | None = None, timeout: float = 10.0) -> dict:
    """GET `url` (or POST `body` as JSON); the JSON answer. Every request has a timeout."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.load(answer)


def wait_available(url: str, server: subprocess.Popen, seconds: float = 120.0) -> None:
    """Poll the status route until a version is AVAILABLE (the readiness probe)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"ensemble serve exited with status {server.returncode}")
        try:
            states = [v["state"] for v in call(url, timeout=2)["model_version_status"]]
            if "AVAILABLE" in states:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError):
            pass  # not listening yet, or 503 while loading
        time.sleep(0.5)
    raise TimeoutError(f"{url} not AVAILABLE after {seconds:.0f} s")


def main() -> None:
    """Parse the options; run the example in `--workdir`, else in a temporary folder."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--workdir", help="keep the run and the model in this folder")
    args = p.parse_args()
    if args.workdir:
        serve_and_call(Path(args.workdir), args)
        return
    with tempfile.TemporaryDirectory(prefix="ensemble-serve-rest-") as work:
        serve_and_call(Path(work), args)


def serve_and_call(work: Path, args: argparse.Namespace) -> None:
    """Train, export and serve in `work`, print the answers to three rows, stop the server."""
    import numpy as np
    from sklearn.datasets import load_iris

    import ensemble

    run = ensemble.train({"data": {"source": "iris"}, "members": {"count": args.members},
                          "training": {"epochs": args.epochs}}, run_dir=work / "runs" / "iris")
    subprocess.run(ensemble_cli("export", "--run", str(run.path), "--out",
                                str(work / "models" / "iris")), check=True)

    port = free_port()
    server = subprocess.Popen(ensemble_cli("serve", "--model", str(work / "models" / "iris"),
                                           "--host", "127.0.0.1", "--port", str(port),
                                           "--replicas", "1"))
    try:
        base = f"http://127.0.0.1:{port}/v1/models/iris"
        wait_available(base, server)
        rows = load_iris().data[[0, 60, 120]].tolist()           # raw, unscaled features
        answer = call(f"{base}:predict", {"signature_name": "serving_default",
                                          "instances": rows})
        for row in answer["predictions"]:
            print(row["labels"], np.round(row["probabilities"], 3),
                  f"entropy {row['entropy']:.3f}")
    finally:
        server.send_signal(signal.SIGTERM)                       # drain, then exit 0
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
