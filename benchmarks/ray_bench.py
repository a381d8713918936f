"""The Ray engine against the local launcher: between-graph `wide` under `--engine local` and
`--engine ray` on a local two-node Ray cluster (one CPU per node, in a network namespace of
its own: loopback only; needs root), at two epoch counts, the engines' order alternated on
every repeat.

    python -m benchmarks.ray_bench [--repeats 3] [--epochs 1,3] [--config configs/wide.toml]

Per engine: the marginal seconds per epoch (the training phase's seconds, `timings.
train_seconds`, at the larger epoch count less at the smaller, per added epoch; median over
repeats) and the fixed cost (the whole process's wall seconds at the smaller count less its
epochs times the marginal cost); the Ray engine's own fixed cost is its fixed cost less the
local launcher's (connecting, the object store, worker start-up, returning the members).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 6392


def _cluster(env: dict) -> tuple[subprocess.Popen, list[subprocess.Popen], Path]:
    """A head and a worker node (one CPU each) in a new network namespace."""
    tmp = Path(tempfile.mkdtemp(prefix="ens-rb-"))
    holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c",
                               "ip link set lo up && exec sleep 36000"])
    time.sleep(0.5)
    ray = str(Path(sys.executable).parent / "ray")
    nodes = []
    for extra in (["--head", "--port", str(PORT), "--temp-dir", str(tmp / "h"),
                   "--include-dashboard", "false"], ["--address", f"127.0.0.1:{PORT}"]):
        nodes.append(subprocess.Popen(
            ["nsenter", "-t", str(holder.pid), "--net", ray, "start", "--block", "--num-cpus",
             "1", "--disable-usage-stats", *extra], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        time.sleep(8)
    return holder, nodes, tmp


def _train(holder, env, cfg: str, engine: str, epochs: int, run_dir: Path) -> dict:
    cmd = ["nsenter", "-t", str(holder.pid), "--net", sys.executable, "-m", "pipelines.cli",
           "train", "--config", cfg, "--mode", "between-graph", "--epochs", str(epochs),
           "--run-dir", str(run_dir), "--overwrite", "--quiet", "--engine", engine,
           *(["--address", f"127.0.0.1:{PORT}"] if engine == "ray" else [])]
    start = time.perf_counter()
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode:
        raise SystemExit(f"{engine} failed: {res.stderr[-2000:]}")
    timings = json.loads((run_dir / "manifest.json").read_text())["timings"]
    return {"wall": wall, "train": timings["train_seconds"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ray_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", default="1,3", help="the two epoch counts, low,high")
    p.add_argument("--config", default="configs/wide.toml")
    p.add_argument("--out", default="artifacts/ray-bench")
    args = p.parse_args(argv)
    low, high = map(int, args.epochs.split(","))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PYTHONPATH": str(ROOT)}
    holder, nodes, tmp = _cluster(env)
    out = Path(args.out).resolve()
    rows = []
    try:
        for r in range(args.repeats):
            order = ("local", "ray") if r % 2 == 0 else ("ray", "local")
            for engine in order:
                for epochs in (low, high):
                    m = _train(holder, env, args.config, engine, epochs,
                               out / f"{engine}-{epochs}")
                    rows.append({"repeat": r, "engine": engine, "epochs": epochs, **m})
                    print(f"repeat {r} {engine} {epochs} epochs: wall {m['wall']:.1f} s, "
                          f"train {m['train']:.1f} s", flush=True)
    finally:
        for node in nodes:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        holder.kill()
        holder.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    for engine in ("local", "ray"):
        marginal, fixed = [], []
        for r in range(args.repeats):
            got = {x["epochs"]: x for x in rows if x["engine"] == engine and x["repeat"] == r}
            m = (got[high]["train"] - got[low]["train"]) / (high - low)
            marginal.append(m)
            fixed.append(got[low]["wall"] - low * m)
        summary[engine] = (statistics.median(marginal), min(marginal), max(marginal),
                           statistics.median(fixed))
        print(f"{engine}: marginal {summary[engine][0]:.2f} s/epoch [{summary[engine][1]:.2f}-"
              f"{summary[engine][2]:.2f}], fixed {summary[engine][3]:.1f} s")
    print(f"ray / local marginal s per epoch: {summary['ray'][0] / summary['local'][0]:.3f}; "
          f"the Ray engine's fixed cost: {summary['ray'][3] - summary['local'][3]:+.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
