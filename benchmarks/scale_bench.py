"""Data at scale: peak memory against data size for both modes, and prepare seconds per million rows.

    python -m benchmarks.scale_bench [--rows 250000] [--factors 1,4,16] [--features 64]
                                    [--limit-gib 0] [--images 0] [--out DIR]

Writes a Parquet table of `rows x factor` float32 rows (`features` columns, a binary label
from a linear rule plus noise) and runs `ensemble train` on it (2 members, 1 epoch, batch 256)
in a fresh process per mode: in-graph, and between-graph with `--jobs 2`. Each process runs in
its own cgroup-v1 memory cgroup when this runs as root (`/sys/fs/cgroup/memory/`), with
`--limit-gib` as its limit when > 0, and its peak is the cgroup's `memory.max_usage_in_bytes`
(anonymous memory and page cache together; the kernel reclaims the cache at the limit);
without cgroups, the peak RSS of `/usr/bin/time -v`. With `--images N`, a folder of N 64x64 RGB
PNGs trains the built-in `cnn` too. Prints one table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEMCG = Path("/sys/fs/cgroup/memory")


def make_table(path: Path, rows: int, features: int, seed: int = 0) -> None:
    """A Parquet table of `rows` float32 rows and a binary `label`, written in chunks."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    w = rng.normal(size=features).astype(np.float32)
    names = [f"x{i}" for i in range(features)]
    with pq.ParquetWriter(path, pa.schema([*[(n, pa.float32()) for n in names],
                                           ("label", pa.int64())])) as out:
        for lo in range(0, rows, 1 << 18):
            x = rng.normal(size=(min(1 << 18, rows - lo), features)).astype(np.float32)
            y = (x @ w + rng.normal(size=len(x)) > 0).astype(np.int64)
            out.write_table(pa.table({**{n: x[:, j] for j, n in enumerate(names)},
                                      "label": y}))


def make_images(folder: Path, n: int, seed: int = 0) -> None:
    """`n` 64x64 RGB PNGs in two class folders (noise plus a class-dependent tint)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in ("a", "b"):
        (folder / c).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        c = i % 2
        a = rng.integers(0, 200, (64, 64, 3), dtype=np.uint8)
        a[..., c] += 55
        Image.fromarray(a).save(folder / "ab"[c] / f"{i:06d}.png")


def run(argv: list[str], limit: int) -> tuple[int, float, int]:
    """Run `argv` in its own memory cgroup (root) or under `/usr/bin/time -v`; returns
    (exit status, wall seconds, peak bytes)."""
    start = time.perf_counter()
    if os.geteuid() == 0 and MEMCG.is_dir():
        cg = MEMCG / f"ensemble-bench-{os.getpid()}-{time.monotonic_ns()}"
        cg.mkdir()
        try:
            if limit:
                (cg / "memory.limit_in_bytes").write_text(str(limit))
            proc = subprocess.run(["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec \"$@\"",
                                   "sh", *argv], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
            peak = int((cg / "memory.max_usage_in_bytes").read_text())
        finally:
            for _ in range(50):
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        code = proc.returncode
        if code:
            print(proc.stderr[-2000:], file=sys.stderr)
        return code, time.perf_counter() - start, peak
    proc = subprocess.run(["/usr/bin/time", "-v", *argv], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    kb = [int(line.split()[-1]) for line in proc.stderr.splitlines()
          if "Maximum resident set size" in line]
    return proc.returncode, time.perf_counter() - start, (kb[0] * 1024 if kb else -1)


def train(data: str, run_dir: Path, mode: str, limit: int, extra=()) -> dict:
    argv = [sys.executable, "-m", "pipelines.cli", "train", "--data", data, "--members", "2",
            "--epochs", "1", "--mode", mode, "--run-dir", str(run_dir), "--overwrite",
            "--set", "training.batch_size=256", *extra]
    from ensemble.runs import builtin_modes

    if builtin_modes.get(mode).member_processes:  # clients of their own: two at once
        argv += ["--jobs", "2"]
    code, wall, peak = run(argv, limit)
    out = {"mode": mode, "code": code, "wall_s": wall, "peak_gib": peak / (1 << 30)}
    if code == 0:
        from ensemble.core.manifest import Manifest

        out["prepare_s"] = Manifest.load(run_dir).timings.get("prepare_seconds")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=250_000)
    p.add_argument("--factors", default="1,4,16")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--limit-gib", type=float, default=0.0)
    p.add_argument("--images", type=int, default=0)
    p.add_argument("--modes", default="in-graph,between-graph")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    work = Path(args.out or tempfile.mkdtemp(prefix="scale-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    limit = int(args.limit_gib * (1 << 30))
    print(f"{'input':<28}{'mode':<15}{'exit':>5}{'wall s':>9}{'peak GiB':>10}"
          f"{'prepare s/M rows':>18}")
    for factor in [int(f) for f in args.factors.split(",")]:
        rows = args.rows * factor
        table = work / f"table-{rows}.parquet"
        if not table.exists():
            make_table(table, rows, args.features)
        for mode in args.modes.split(","):
            r = train(str(table), work / f"run-{rows}-{mode}", mode, limit,
                      ["--target", "label"])
            per_m = (r.get("prepare_s") or float("nan")) / (rows / 1e6)
            print(f"{f'{rows:,} x {args.features} table':<28}{mode:<15}{r['code']:>5}"
                  f"{r['wall_s']:>9.1f}{r['peak_gib']:>10.2f}{per_m:>18.2f}", flush=True)
    if args.images:
        folder = work / f"images-{args.images}"
        if not folder.exists():
            make_images(folder, args.images)
        for mode in args.modes.split(","):
            r = train(str(folder), work / f"run-images-{mode}", mode, limit,
                      ["--model", "cnn", "--set", "training.batch_size=32"])
            print(f"{f'{args.images:,} PNGs 64x64x3':<28}{mode:<15}{r['code']:>5}"
                  f"{r['wall_s']:>9.1f}{r['peak_gib']:>10.2f}{'':>18}", flush=True)
    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
