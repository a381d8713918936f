"""Where an in-graph training step's time goes, per op type, in each precision (TensorFlow's profiler).

    python -m benchmarks.step_profile [--config configs/wide.toml] [--precisions float32,mixed_bfloat16]
                                      [--steps 16] [--calls 3] [--batch N] [--set KEY=VALUE]

Builds the config's members as `ensemble train --mode in-graph` does (its threads, op
determinism, `--devices auto` placement round robin, the fused Adam) in every precision of
`--precisions`, one group each, runs their traced many-steps call (`steps.make_steps_fn`) on the
same random rows (`data.synthetic.features` columns, `data.synthetic.classes` classes,
`--batch` rows per step: the config's batch size by default), the precisions interleaved, and
records `--calls` calls of `--steps` steps each under `tf.profiler`. For every op of the graph it
keeps the shortest of its runs (over steps and calls: what the op costs without the preemption
of a shared machine) and their median, and prints, per op type, the sums of those in ms per
step of all members, the shortest's share and the number of ops; with the median wall ms per
step of the profiled calls.
`--batch 1` leaves mostly what does not scale with the batch: the optimiser, the casts of the
variables, and the dispatch of every op.
Both precisions run in one process under TensorFlow's pooled allocator; `ensemble train` in a
mixed precision takes oneDNN's tensors from the system allocator instead
(`precision.use_system_allocator`): run with `TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1` to profile
that (float32 then runs under it too, and under the profiler its wall per step was 19-26%
longer there, 4.65-4.97 -> 5.51-6.24 ms, though `ensemble train`'s float32 steady rate is the
same either way).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _op_runs(logdir: Path, runs: dict[str, list[float]]) -> None:
    """Add to `runs` `{op name: [ms of each run]}` the runs of every TensorFlow op the profile
    in `logdir` recorded (the executor's threads of the host plane; events named
    `name:type`)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # TensorFlow's own trace format

    for path in logdir.rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            for line in plane.lines:
                if not line.name.startswith("tf_Compute"):
                    continue
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if ":" in name and "::" not in name:  # an op, not the executor's own
                        runs.setdefault(name, []).append(event.duration_ps / 1e9)


def profile(cfg_path: str | None, precisions: list[str], steps: int, calls: int,
            batch: int | None, sets: dict) -> dict[str, dict]:
    """`{precision: {"wall_ms": median wall ms per step, "ops": {op type: (ms of the ops'
    shortest runs, ms of their median runs, count)}}}`, per step of all members."""
    from ensemble import tasks
    from ensemble.config import schema
    from ensemble.core.tfimport import import_tensorflow_quietly
    from ensemble.replication import devices

    base = schema.load(cfg_path, sets)
    devices.configure(base)
    import_tensorflow_quietly()
    import tensorflow as tf

    from ensemble.replication.in_graph import InGraphEnsemble

    n = base.members.count
    devs = devices.resolve("auto", n)
    task, syn = tasks.get(), base.data.synthetic
    rows = batch or base.training.batch_size
    if not isinstance(rows, int):  # "auto": a size the rows decide; profile a fixed one
        raise SystemExit(f"step_profile: the config's training.batch_size is {rows!r}; "
                         "give --batch N")
    rng = np.random.default_rng(0)
    xb = tf.constant(rng.standard_normal((n, steps, rows, syn.features)), tf.float32)
    yb = tf.constant(rng.integers(0, syn.classes, (n, steps, rows)), task.target_dtype)
    total, active = tf.zeros([n]), tf.ones([n], tf.bool)
    calls_of = {}
    for p in precisions:
        cfg = schema.load(cfg_path, {**sets, "training.precision": p})
        group = InGraphEnsemble.build(cfg, syn.features, syn.classes,
                                      [devs[k % len(devs)] for k in range(n)], task=task)
        fn = group.make_train_steps(np.zeros((1, syn.features), np.float32))
        fn(xb, yb, total, active).numpy()  # traced, then warm
        calls_of[p] = fn
    runs = {p: {} for p in precisions}
    walls = {p: [] for p in precisions}
    with tempfile.TemporaryDirectory() as tmp:
        tf.profiler.experimental.start(str(Path(tmp) / "warm-up"))  # the profiler's own start-up
        tf.profiler.experimental.stop()
        for c in range(calls):
            for p in (precisions if c % 2 == 0 else precisions[::-1]):
                logdir = Path(tmp) / f"{p}-{c}"
                tf.profiler.experimental.start(str(logdir))
                start = time.perf_counter()
                calls_of[p](xb, yb, total, active).numpy()
                walls[p].append((time.perf_counter() - start) / steps * 1e3)
                tf.profiler.experimental.stop()
                _op_runs(logdir, runs[p])
    out = {}
    for p in precisions:
        ops = collections.defaultdict(lambda: [0.0, 0.0, 0])
        for name, ms in runs[p].items():
            op = ops[name.rpartition(":")[2]]
            op[0] += min(ms)
            op[1] += statistics.median(ms)
            op[2] += 1
        out[p] = {"wall_ms": statistics.median(walls[p]),
                  "ops": {k: tuple(v) for k, v in sorted(ops.items(), key=lambda kv: -kv[1][0])}}
    return out


def report(result: dict[str, dict], top: int = 12) -> str:
    """The profile as one Markdown table per precision."""
    lines = []
    for p, r in result.items():
        total = sum(ms for ms, _, _ in r["ops"].values())
        median = sum(ms for _, ms, _ in r["ops"].values())
        lines += [f"\n{p}: wall {r['wall_ms']:.2f} ms per step (median of the profiled calls); "
                  f"sum of the ops' shortest runs {total:.2f} ms per step, of their median "
                  f"runs {median:.2f}\n",
                  "| op type | shortest ms per step | share | median ms per step | ops |",
                  "|---|---|---|---|---|"]
        shown = list(r["ops"].items())[:top]
        lines += [f"| {k} | {ms:.3f} | {ms / total:.1%} | {med:.3f} | {count} |"
                  for k, (ms, med, count) in shown]
        rest = list(r["ops"].values())[top:]
        if rest:
            ms, med = sum(x[0] for x in rest), sum(x[1] for x in rest)
            lines.append(f"| (the other {len(rest)} types) | {ms:.3f} | {ms / total:.1%} "
                         f"| {med:.3f} | {sum(x[2] for x in rest)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/wide.toml")
    p.add_argument("--precisions", default="float32,mixed_bfloat16")
    p.add_argument("--steps", type=int, default=16, help="steps per call (default 16)")
    p.add_argument("--calls", type=int, default=3, help="profiled calls (default 3)")
    p.add_argument("--batch", type=int, help="rows per step (default: the config's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override (repeatable), e.g. members.count=2")
    args = p.parse_args(argv)
    if min(args.steps, args.calls, args.batch or 1) < 1:
        p.error("--steps, --calls and --batch must be at least 1")
    from ensemble.core.errors import UsageError
    from ensemble.models.precision import PRECISIONS
    from pipelines.flags import parse_set

    try:
        sets = parse_set(args.set)  # as `ensemble train --set`
    except UsageError as exc:
        p.error(str(exc))
    precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
    if not precisions or set(precisions) - set(PRECISIONS):
        p.error(f"unknown precision(s) in --precisions {args.precisions!r}; expected from "
                f"{', '.join(PRECISIONS)}")
    print(report(profile(args.config, precisions, args.steps, args.calls, args.batch, sets)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
