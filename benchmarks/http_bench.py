"""HTTP serving benchmark: `ensemble serve` under 1..64 concurrent clients on loopback.

    python -m benchmarks.serve_bench --http [--model DIR] [--requests N] [--seconds S]
                                           [--clients 1,8,32,64] [--out DIR]

Without `--model`, trains the default digits ensemble (4 members, 256-128, 2 epochs) and
exports it. For each server setting (dynamic batching on or off, 1 replica or one per core),
starts `ensemble serve` on a free 127.0.0.1 port, then for each client count runs a bounded
closed-loop load (every client sends one-row `:predict` requests on its own keep-alive
connection, the next when the answer came; at most `--requests` requests and `--seconds`
seconds per point) and prints requests per second and p50/p99 latency in a Markdown table;
`results.json` in `--out`. The load driver is a small asyncio HTTP/1.1 client (lighter than
an HTTP library, so the driver, which shares the machine's cores, takes less of them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

SETTINGS = {  # name: (label, serve flags)
    "batching-1": ("batching, 1 replica", ["--replicas", "1", "--max-batch-size", "64"]),
    "batching-n": ("batching, N replicas", ["--replicas", "auto", "--max-batch-size", "64"]),
    "no-batching-1": ("no batching, 1 replica", ["--replicas", "1", "--max-batch-size", "1"]),
    "no-batching-n": ("no batching, N replicas", ["--replicas", "auto", "--max-batch-size", "1"]),
}


async def _client(port: int, request: bytes, budget: dict, latencies: list, errors: list):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while budget["left"] > 0 and time.perf_counter() < budget["until"]:
            budget["left"] -= 1
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            body = await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(body[:200])
    finally:
        writer.close()


def load(port: int, body: bytes, clients: int, requests: int, seconds: float) -> dict:
    """Closed-loop load of `clients` connections; requests/s, p50/p99 latency (ms), errors."""
    request = (f"POST /v1/models/digits:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    latencies, errors = [], []

    async def main():
        budget = {"left": requests, "until": time.perf_counter() + seconds}
        await asyncio.gather(*(_client(port, request, budget, latencies, errors)
                               for _ in range(clients)))

    start = time.perf_counter()
    asyncio.run(main())
    wall = time.perf_counter() - start
    ms = np.array(latencies) * 1e3
    return {"clients": clients, "requests": len(latencies), "errors": len(errors),
            "seconds": wall, "rps": len(latencies) / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*argv) -> None:
    subprocess.run([sys.executable, "-m", "pipelines.cli", *map(str, argv)], check=True,
                   stdout=subprocess.DEVNULL)


def start_server(model: Path, flags: list[str], timeout: float = 120):
    """`ensemble serve` on a free loopback port, once ready: (process, port)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "serve", "--model",
                             str(model), "--name", "digits", "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"ensemble serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/digits",
                                        timeout=2):
                return proc, port
        except OSError:
            time.sleep(0.3)
    stop_server(proc)
    raise RuntimeError("ensemble serve was not ready in time")


def stop_server(proc) -> float:
    """SIGTERM; the seconds until the process exited (status must be 0)."""
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError("ensemble serve did not stop within 30 s of SIGTERM") from None
    if code != 0:
        raise RuntimeError(f"ensemble serve exited {code} on SIGTERM")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_bench --http",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="an export folder (default: train and export digits)")
    p.add_argument("--requests", type=int, default=1500, help="per point, at most")
    p.add_argument("--seconds", type=float, default=5.0, help="per point, at most")
    p.add_argument("--clients", default="1,8,32,64")
    p.add_argument("--out", default="artifacts/serve_bench_http")
    p.add_argument("--settings", default=",".join(SETTINGS),
                   help="server settings to measure (default: all of " + ", ".join(SETTINGS) + ")")
    args = p.parse_args(argv)
    unknown = set(args.settings.split(",")) - set(SETTINGS)
    if unknown:
        p.error(f"unknown --settings {sorted(unknown)}; expected from {', '.join(SETTINGS)}")
    settings = [SETTINGS[name] for name in args.settings.split(",")]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(args.model) if args.model else out / "models" / "digits"
    if not args.model and not model.is_dir():
        _cli("train", "--data", "digits", "--epochs", "2", "--run-dir", out / "run",
             "--overwrite", "--quiet")
        _cli("export", "--run", out / "run", "--out", model)
    from sklearn.datasets import load_digits

    body = json.dumps({"instances": [load_digits().data[0].tolist()]}).encode()
    levels = [int(c) for c in args.clients.split(",")]
    results = []
    for label, flags in settings:
        proc, port = start_server(model, flags)
        try:
            load(port, body, 4, 200, 2.0)  # warm-up: traced calls, connections
            for clients in levels:
                r = {"setting": label, **load(port, body, clients, args.requests, args.seconds)}
                results.append(r)
                print(json.dumps(r), flush=True)
        finally:
            r_stop = stop_server(proc)
        print(f"{label}: SIGTERM to exit 0 in {r_stop:.2f} s", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("| setting | clients | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['setting']} | {r['clients']} | {r['rps']:.0f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['errors']} |")
    by = {(r["setting"], r["clients"]): r["rps"] for r in results}
    for label, _ in settings:
        if (label, 32) in by and (label, 1) in by:
            print(f"{label}: 32 clients = {by[(label, 32)] / by[(label, 1)]:.1f}x the "
                  "requests per second of 1 client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
