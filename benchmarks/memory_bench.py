"""Memory of the training data: peak RSS of one in-graph epoch of 8 CNN members on 8 logical
CPU devices over 10,000 random 32x32x3 images held as uint8 (as a run keeps images) against
float32 rows (batches are gathered on the host either way; `benchmarks.scale_bench` measures
runs whose splits are memory-mapped files).

    python -m benchmarks.memory_bench [--rows 10000] [--members 8]

Each variant runs in its own fresh process (peak RSS is per process, `VmHWM`); prints a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def worker(variant: str, rows: int, members: int) -> dict:
    """One epoch in this process; `variant` `after` (uint8, shared) or `before` (float32, a
    copy per device). Returns `{"variant", "peak_rss_bytes", "data_bytes"}`."""
    import numpy as np

    from ensemble.replication import devices

    devices.split_cpu(members)
    import tensorflow as tf

    from ensemble import tasks
    from ensemble.config import schema
    from ensemble.data.arrays import ArrayData, ArrayPreprocessing
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.replication.training import Schedule

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (rows, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, rows).astype(np.int32)
    pre = ArrayPreprocessing.fit(ArrayData("random", x, y, np.arange(rows)), np.arange(rows),
                                 np.arange(10))
    if variant == "before":  # the old way: float32 rows
        x = x.astype(np.float32)
    cfg = schema.from_dict({"model": {"builder": "cnn", "params": {"filters": [8],
                                                                    "dense": 16}},
                            "members": {"count": members},
                            "training": {"epochs": 1, "batch_size": 256,
                                         "early_stopping": 0}})
    devs = [d.name for d in tf.config.list_logical_devices("CPU")][:members]
    ens = InGraphEnsemble.build(cfg, x.shape[1:], 10, devs, aggregators=(), pre=pre,
                                task=tasks.get())
    ens.fit(x, y, (x[:256], y[:256]), Schedule.of(cfg.training))
    return {"variant": variant, "peak_rss_bytes": devices.peak_rss_bytes(),
            "data_bytes": int(x.nbytes)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10000)
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--worker", choices=("before", "after"))
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.rows, args.members)))
        return 0
    out = {}
    for variant in ("before", "after"):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.memory_bench", "--worker",
                               variant, "--rows", str(args.rows), "--members",
                               str(args.members)], capture_output=True, text=True, check=True)
        out[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"| {args.rows} images 32x32x3, {args.members} members on {args.members} logical CPUs "
          "| peak RSS MiB | rows as stored MiB |")
    print("|---|---|---|")
    for v in ("before", "after"):
        r = out[v]
        print(f"| {v} | {r['peak_rss_bytes'] / 2**20:.0f} | {r['data_bytes'] / 2**20:.0f} |")
    print(f"after / before: {out['after']['peak_rss_bytes'] / out['before']['peak_rss_bytes']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
