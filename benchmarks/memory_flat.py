"""Flat memory: peak memory of `ensemble train` on an N x 64 float32 10-class Parquet table, per
mode, against the run's memory estimate, at 1x, 4x and 16x rows.

    python benchmarks/memory_flat.py [--rows 500000] [--factors 1,4,16] [--classes 10]
        [--modes in-graph,between-graph] [--limit-gib 0] [--out DIR] [--keep]

Each run is one `ensemble train --members 2 --epochs 1 --batch-size 512` in its own cgroup-v1
memory cgroup (root, `/sys/fs/cgroup/memory/`), with `--limit-gib` as its limit when > 0
(between-graph runs `--jobs 2`). Printed per run: exit status, wall seconds, the cgroup's peak
(`memory.max_usage_in_bytes`: anonymous memory and page cache), the peak of its anonymous
memory (`total_rss` of `memory.stat`, sampled every 0.2 s), the anonymous estimate of
`ensemble.runs.budget.estimate` and its ratio to that peak, the estimate with file pages
(what a run is refused by), prepare seconds per million rows, and whether
every table of the run directory was written; then per phase the anonymous peak against the
phase's anonymous estimate (prepare: until the run's `manifest.json` is written; training:
until its `history.parquet` is; evaluation: the rest). Without cgroups (not root) the peak is
`/usr/bin/time -v`'s maximum resident set size. Never run by the tests (a smoke test runs the
table writer and the measuring wrapper at a tiny size).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's `ensemble`, as the runs it starts use
MEMCG = Path("/sys/fs/cgroup/memory")
TABLES = ("predictions.parquet", "metrics.parquet", "history.parquet", "aggregators.json",
          "ensemble_size.parquet", "members.parquet")


def make_table(path: Path, rows: int, features: int = 64, classes: int = 10,
               seed: int = 0) -> None:
    """A Parquet table of `rows` float32 rows and a `target` of `classes` classes (the argmax
    of a linear map plus noise), written 2**18 rows at a time (flat memory)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    w = rng.normal(size=(features, classes)).astype(np.float32)
    names = [f"x{i}" for i in range(features)]
    schema = pa.schema([*[(n, pa.float32()) for n in names], ("target", pa.int64())])
    with pq.ParquetWriter(path, schema) as out:
        for lo in range(0, rows, 1 << 18):
            x = rng.normal(size=(min(1 << 18, rows - lo), features)).astype(np.float32)
            y = np.argmax(x @ w + rng.normal(size=(len(x), classes)), axis=1).astype(np.int64)
            out.write_table(pa.table({**{n: x[:, j] for j, n in enumerate(names)},
                                      "target": y}, schema=schema))


PHASES = ("prepare", "training", "evaluation")


def phase(run_dir: Path | None, since: float) -> str:
    """The phase a run writing `run_dir` is in, from the files it wrote after `since`
    (`time.time()`): no `manifest.json` yet, `prepare`; no `history.parquet`, `training`;
    else `evaluation`."""
    def written(name: str) -> bool:
        try:
            return (run_dir / name).stat().st_mtime >= since
        except OSError:
            return False

    if run_dir is None or not written("manifest.json"):
        return "prepare"
    return "training" if not written("history.parquet") else "evaluation"


def measure(argv: list[str], limit: int = 0, log: Path | None = None,
            run_dir: Path | None = None) -> dict:
    """Run `argv` in a memory cgroup of its own (root) or under `/usr/bin/time -v`.

    Returns:
        `{"code", "wall_s", "peak_bytes", "anon_bytes", "phases"}` (anon_bytes None and
        phases empty without cgroups; phases: `{phase: anonymous peak}`, the phase told by
        `phase(run_dir)`); stderr goes to `log` when given.
    """
    start = time.perf_counter()
    err = open(log, "w") if log else subprocess.DEVNULL
    try:
        if os.geteuid() == 0 and MEMCG.is_dir() and os.access(MEMCG, os.W_OK):
            return _in_cgroup(argv, limit, err, start, run_dir)
        proc = subprocess.run(["/usr/bin/time", "-v", *argv], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if log:
            err.write(proc.stderr)
        kb = [int(line.split()[-1]) for line in proc.stderr.splitlines()
              if "Maximum resident set size" in line]
        return {"code": proc.returncode, "wall_s": time.perf_counter() - start,
                "peak_bytes": kb[0] * 1024 if kb else None, "anon_bytes": None, "phases": {}}
    finally:
        if log:
            err.close()


def _in_cgroup(argv, limit, err, start, run_dir) -> dict:
    cg = MEMCG / f"memory-flat-{os.getpid()}-{time.monotonic_ns()}"
    cg.mkdir()
    anon, done, phases, since = [0], threading.Event(), {}, time.time()

    def sample():
        while not done.wait(0.2):
            try:
                for line in (cg / "memory.stat").read_text().splitlines():
                    if line.startswith("total_rss "):
                        rss = int(line.split()[1])
                        anon[0] = max(anon[0], rss)
                        now = phase(run_dir, since)
                        phases[now] = max(phases.get(now, 0), rss)
            except OSError:
                return

    try:
        if limit:
            (cg / "memory.limit_in_bytes").write_text(str(limit))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        proc = subprocess.run(["sh", "-c", f"echo $$ > {cg}/cgroup.procs && exec \"$@\"",
                               "sh", *argv], stdout=subprocess.DEVNULL, stderr=err)
        done.set()
        sampler.join()
        peak = int((cg / "memory.max_usage_in_bytes").read_text())
    finally:
        done.set()
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    return {"code": proc.returncode, "wall_s": time.perf_counter() - start,
            "peak_bytes": peak, "anon_bytes": anon[0], "phases": phases}


def estimate(rows: int, classes: int, mode: str) -> dict:
    """`budget.estimate` for this benchmark's run (its default split sizes): its `anonymous`
    figure (compared with the anonymous peak) and its `total` (with the file pages a cgroup
    charges: what the run is refused by)."""
    from ensemble.config.schema import Config
    from ensemble.runs import budget, builtin_modes

    cfg = Config()
    n_test = round(rows * cfg.data.test_size)
    n_val = round(rows * cfg.data.validation_size)
    split = {"train": rows - n_test - n_val, "validation": n_val, "test": n_test}
    m = builtin_modes.get(mode)
    return budget.estimate(split, classes, 2, len(cfg.aggregation.aggregators),
                           m.processes(2, ["/cpu:0"], 2), m.member_files)


def train(table: Path, run_dir: Path, mode: str, limit: int) -> dict:
    """One benchmark run: its `measure` figures, prepare seconds and the tables written."""
    argv = [sys.executable, "-m", "pipelines.cli", "train", "--data", str(table),
            "--target", "target", "--members", "2", "--epochs", "1", "--batch-size", "512",
            "--mode", mode, "--run-dir", str(run_dir), "--overwrite"]
    if mode == "between-graph":
        argv += ["--jobs", "2"]
    out = measure(argv, limit, run_dir.with_suffix(".log"), run_dir)
    out["tables"] = all((run_dir / t).is_file() for t in TABLES)
    out["prepare_s"] = None
    if out["code"] == 0:
        from ensemble.core.manifest import Manifest

        out["prepare_s"] = Manifest.load(run_dir).timings.get("prepare_seconds")
    return out


def gib(b) -> str:
    return "n/a" if b is None else f"{b / (1 << 30):.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--factors", default="1,4,16")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--modes", default="in-graph,between-graph")
    p.add_argument("--limit-gib", type=float, default=0.0)
    p.add_argument("--out", default=None)
    p.add_argument("--keep", action="store_true", help="keep the tables and runs")
    args = p.parse_args(argv)
    work = Path(args.out or tempfile.mkdtemp(prefix="memory-flat-")).resolve()
    os.chdir(ROOT)  # `python -m pipelines.cli` of this checkout
    work.mkdir(parents=True, exist_ok=True)
    limit = int(args.limit_gib * (1 << 30))
    print(f"{'rows':>12} {'mode':<14}{'exit':>5}{'wall s':>8}{'peak GiB':>9}{'anon GiB':>9}"
          f"{'est anon':>9}{'est/anon':>9}{'est total':>10}{'prep s/M':>9} tables", flush=True)
    for factor in [int(f) for f in args.factors.split(",")]:
        rows = args.rows * factor
        table = work / f"table-{rows}.parquet"
        if not table.exists():
            make_table(table, rows, classes=args.classes)
        for mode in args.modes.split(","):
            r = train(table, work / f"run-{rows}-{mode}", mode, limit)
            est = estimate(rows, args.classes, mode)
            ratio = est["anonymous"] / r["anon_bytes"] if r["anon_bytes"] else float("nan")
            prep = (r["prepare_s"] or float("nan")) / (rows / 1e6)
            print(f"{rows:>12,} {mode:<14}{r['code']:>5}{r['wall_s']:>8.0f}"
                  f"{gib(r['peak_bytes']):>9}{gib(r['anon_bytes']):>9}"
                  f"{gib(est['anonymous']):>9}{ratio:>9.2f}{gib(est['total']):>10}"
                  f"{prep:>9.2f} {'all' if r['tables'] else 'missing'}",
                  flush=True)
            print(" " * 13 + "anon GiB / estimate by phase: " + ", ".join(
                f"{p} {gib(r['phases'].get(p))}/{gib(est[p + '_anonymous'])}" for p in PHASES),
                flush=True)
    if not args.out and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
