"""Benchmark harness: the project's two modes against what users would pick instead.

    python -m benchmarks.benchmark [--precisions float32,mixed_bfloat16] [--workload digits|wide|wide-long|tabular|cnn|data-parallel|all]
                                  [--repeats 3]
                                  [--methods in-graph,between-graph,naive,sklearn] [--out DIR]

Each of the project's modes runs in every precision of `--precisions` (`training.precision`;
default float32 and mixed_bfloat16), as does the `jax` peer, the other peers in float32;
every row names its precision,
and `steady x f32` is a row's steady rate over the same method's float32 rate of the same
run. Every method runs in its own fresh process, as a user would run it, and is measured whole:
`wall` is spawn to exit (what a user waits); `train` is the training phase alone (the
process's own clock around its training loop); `steady` is the steady-state training rate,
in GFLOP/s and as a fraction of the machine's float32 GEMM rate measured by numpy in the same
run (2048x2048), over every traced call (in-graph) or epoch (naive) after the first, which
pays for tracing (between-graph: each client's members' calls after their first, over
the time when every client was inside such a call, so a client that had the cores to itself
while another started or validated does not count double; the sum of the clients' own rates,
an upper bound, is printed under the table); `first epoch s` is spawn to the end of the
first epoch (its progress line: what a user waits before training shows, in-graph only).
FLOPs: 3x the forward pass (forward plus twice for backward), dense layers and convolutions,
read from each member's traced graph (`ensemble.models.cost`).

Methods: `in-graph` and `between-graph` (`ensemble train`), `naive` (members built and trained
one after another with Keras `model.fit`, then averaged), `sklearn` (`VotingClassifier`
(voting="soft") of `MLPClassifier`s with the same layers and epochs, `n_jobs=2`), `jax`
(the members stacked with `jax.vmap`, optax's Adam, an epoch per jit-compiled `lax.scan`;
in each precision; run where JAX is installed, `pip install jax optax`), and
`predict-1m` (in-graph prediction of 1,000,000 rows by the trained ensemble, time of the
prediction alone), and `in-graph-r2` / `in-graph-r4` (in-graph with `--replicas 2` / `4`,
each member data-parallel over that many logical CPU devices: the `data-parallel` workload,
2 members; on one CPU no speed-up is expected, it measures the cost of splitting); `between-graph-ray`: between-graph under `--engine ray`
on the Ray cluster `RAY_ADDRESS` names (docs/guides/ray.md). Each workload runs `--repeats` times; the method order is reversed on every
other repeat, so drift of a shared machine does not favour one method. The summary gives the
median and [min-max] over the repeats; `x in-graph` is a method's median whole-process wall over
in-graph's, `x fastest peer` over the fastest of the peers run (`naive`, `sklearn`, `jax`, in any precision). Writes `runs.parquet` (every process), `results.parquet` and `results.md` (the
summary, whose footer names the CPU's bfloat16 instructions, `amx_bf16` or `avx512_bf16`, without
which TensorFlow emulates bfloat16, slower than float32).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.bench_peers import PRECISION_WORKERS, WORKERS, timed

if TYPE_CHECKING:
    from ensemble.core.manifest import Manifest

WIDE = "configs/wide.toml"
# the JAX peer runs where JAX is installed (a benchmark-only dependency)
JAX = ("jax",) if importlib.util.find_spec("jax") and importlib.util.find_spec("optax") else ()
# workload -> (config file or None for the built-in default, dotted overrides, default methods)
WORKLOADS = {
    "digits": (None, [], ("in-graph", "between-graph", "naive", "sklearn")),
    "wide": (WIDE, [], ("in-graph", "between-graph", "naive", "sklearn", *JAX)),
    "wide-long": (WIDE, ["--epochs", "10"],
                  ("in-graph", "between-graph", "naive", "sklearn", *JAX)),
    # small-batch tabular work (issue #39): the default 4 MLPs, batch 32, 105,000 training rows
    "tabular": (None, ["--data", "synthetic", "--epochs", "2", "--set",
                       "data.synthetic.rows=150000", "--set", "data.synthetic.classes=2",
                       "--set", "training.batch_size=32"], ("in-graph", "between-graph")),
    # convolutional members (issue #33): 4 small CNNs on digits as 8x8x1 images, 10 epochs
    "cnn": ("configs/digits-cnn.toml", [], ("in-graph", "between-graph")),
    # data-parallel members (issue #24): 2 members, 1 vs 2 vs 4 replicas on logical CPUs
    "data-parallel": (None, ["--members", "2", "--epochs", "10", "--devices", "cpu:2"],
                      ("in-graph", "in-graph-r2", "in-graph-r4")),
}
REPLICATED = {"in-graph-r2": 2, "in-graph-r4": 4}  # in-graph, --replicas N on cpu:2N
# between-graph under the Ray engine, on the cluster RAY_ADDRESS names (else a local one)
ENGINES = {"between-graph-ray": ["--engine", "ray"]}
METHODS = ("in-graph", "between-graph", "naive", "sklearn", "jax", "predict-1m", *REPLICATED,
           *ENGINES)
PEERS = ("naive", "sklearn", "jax")
MODES = ("in-graph", "between-graph", *REPLICATED, *ENGINES)  # the project's: run in every precision
PRECISIONS = ("float32", "mixed_bfloat16")
REFERENCE = "in-graph"  # the method every other's wall time is compared with (`x in-graph`)  # what a user would reach for instead (`x fastest peer`)


def gemm_rate(n: int = 2048, repeats: int = 5) -> float:
    """Best float32 GEMM rate of numpy on this machine, FLOP/s (`2 n^3` per product)."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = min(timed(lambda: a @ a) for _ in range(repeats))
    return 2 * n**3 / best




def _worker_main(argv: list[str]) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    name, run_dir, *precision = argv
    if name == "gemm":
        print(json.dumps({"flops_per_second": gemm_rate()}))
    else:
        print(json.dumps(WORKERS[name](Path(run_dir), *precision)))


def _measured(argv: list[str], module: str = "pipelines.cli") -> dict:
    from ensemble.replication.processes import checked, run_process

    return checked(run_process(argv, module=module), " ".join(argv))


def _train_flops_per_row(manifest: Manifest) -> float:
    """Training FLOPs of one row through every member: 3x the forward FLOPs."""
    return 3.0 * sum(m.flops_per_row for m in manifest.members)


def _clients_steady(manifest: Manifest, clients: list[dict]) -> dict:
    """Between-graph's steady state as in-graph's fields: the FLOPs per second of the clients'
    steady training calls while every client was inside one (`concurrent_flops_rate` of their
    `spans`), the same condition as in-graph's steady calls, where every member trains.
    When that time is under half of some client's steady seconds (or spans are missing, or
    there is one client), the sum of each client's own rate (its members' steady FLOPs over
    their steady seconds) instead: an upper bound, as a client's calls that ran while another
    client was starting, switching members or validating had the cores to itself. Returned
    as `steady_rows` (rows per member, over all members' FLOPs per row) in `steady_seconds` =
    1 s, plus `steady_sum_rows` (the upper bound) when `steady_rows` is the concurrent rate;
    {} when no client reported a steady state."""
    flops = {i: 3.0 * m.flops_per_row for i, m in enumerate(manifest.members)}
    total = sum(flops.values())
    summed, spans, own_seconds = 0.0, [], []
    for c in clients:
        steady = {int(i): v for i, v in (c.get("steady") or {}).items()}
        seconds = sum(s for _, s in steady.values())
        if seconds > 0:
            summed += sum(rows * flops[i] for i, (rows, _) in steady.items()) / seconds
        own_seconds.append(seconds)
        spans.append([(a, b, rows * flops[int(i)]) for i, member in (c.get("spans") or {}).items()
                      for a, b, rows in member])
    if not summed:
        return {}
    together = concurrent_flops_rate(spans) if len(spans) > 1 and all(spans) else None
    if together is None or together[1] < 0.5 * min(own_seconds):
        return {"steady_rows": summed / total, "steady_seconds": 1.0}
    return {"steady_rows": together[0] / total, "steady_seconds": 1.0,
            "steady_sum_rows": summed / total}


def concurrent_flops_rate(spans: list[list[tuple[float, float, float]]]
                          ) -> tuple[float, float] | None:
    """FLOPs per second of several processes over the time when every one of them was inside a
    span.

    Args:
        spans: `[n_processes]` lists of `(start_unix, end_unix, flops)` (seconds; a process's
            spans do not overlap; one that ends before it starts, after a clock step, counts
            for nothing); each span's FLOPs are taken as spread evenly over it.

    Returns:
        `(FLOPs per second, seconds)` over those times, or None when there is no time at which
        all were inside a span.
    """
    edges = sorted({t for process in spans for a, b, _ in process for t in (a, b)})
    done = seconds = 0.0
    for lo, hi in zip(edges, edges[1:]):
        mid = (lo + hi) / 2
        rates = [next((f / (b - a) for a, b, f in process if a <= mid < b), None)
                 for process in spans]
        if all(r is not None for r in rates):
            done += sum(rates) * (hi - lo)
            seconds += hi - lo
    return (done / seconds, seconds) if seconds > 0 else None


def _run_mode(mode: str, base: Path, cfg_args: list[str], repeat: int,
              precision: str = "float32") -> dict:
    from ensemble.core import artifacts
    from ensemble.core.manifest import Manifest
    from pipelines.compare import client_processes, concurrent_peak

    run_dir = base / f"{mode}-{precision}-{repeat}"
    if mode in REPLICATED:  # data parallelism: each member over R logical CPU devices
        r = REPLICATED[mode]
        cfg_args = [*cfg_args, "--replicas", str(r), "--devices", f"cpu:{2 * r}"]
        mode = "in-graph"
    if mode in ENGINES:
        cfg_args, mode = [*cfg_args, *ENGINES[mode]], "between-graph"
    res = _measured(["train", *cfg_args, "--mode", mode, "--precision", precision,
                     "--run-dir", str(run_dir), "--overwrite", "--quiet"])
    m = Manifest.load(run_dir)
    t = m.timings
    metrics = artifacts.read_parquet(run_dir / artifacts.METRICS).to_pylist()
    acc = next(r["accuracy"] for r in metrics
               if r["model"] == "ensemble-mean" and r["split"] == "test")
    clients = client_processes(t.get("clients", {}))
    first = t.get("first_epoch_end_unix")
    if clients:  # between-graph: the clients' rate while all of them trained
        t = {**t, **_clients_steady(m, clients)}
    return {"wall_seconds": res["seconds"], "train_seconds": t["train_seconds"],
            "first_epoch_seconds": None if first is None else first - res["spawned_unix"],
            "steady_rows": t.get("steady_rows"), "steady_seconds": t.get("steady_seconds"),
            "steady_sum_rows": t.get("steady_sum_rows"),
            "flops_per_row": _train_flops_per_row(m), "test_accuracy": acc,
            "peak_rss_bytes": concurrent_peak(t["process_peak_rss_bytes"], clients,
                                              t.get("jobs", 1)), "run_dir": str(run_dir)}


def _run_worker(name: str, prepared: Path, trained: Path | None,
                precision: str = "float32") -> dict:
    from ensemble.replication.processes import last_report

    from ensemble.core.manifest import Manifest

    res = _measured([name, str(trained if name == "predict-1m" else prepared),
                     *([precision] if name in PRECISION_WORKERS else [])],
                    module="benchmarks.benchmark")
    out = last_report(res)
    m = Manifest.load(prepared)
    row = {"wall_seconds": res["seconds"], "train_seconds": out.get("train_seconds"),
           "predict_seconds": out.get("predict_seconds"), "rows": out.get("rows"),
           "steady_rows": out.get("steady_rows"), "steady_seconds": out.get("steady_seconds"),
           "flops_per_row": _train_flops_per_row(m), "test_accuracy": out.get("test_accuracy"),
           "peak_rss_bytes": out["peak_rss_bytes"]}
    if name == "predict-1m":  # forward only: a third of the training FLOPs per row
        row["flops_per_row"] /= 3.0
        row["steady_rows"], row["steady_seconds"] = out["rows"], out["predict_seconds"]
    return row


def synthetic_as_table(cfg_args: list[str], path: Path) -> list[str]:
    """`cfg_args` training on a Parquet table of the workload's `synthetic` rows, written to
    `path` here, outside every timed process (other sources: `cfg_args` unchanged).

    A user brings a table, and the peers read splits prepared from it; with the `synthetic`
    source the modes' processes alone would also import scikit-learn and run
    `make_classification` (about 1.2 s of a 6 s `wide` run). Same rows, labels and split.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ensemble.data import sources
    from pipelines.cli import COMMANDS
    from pipelines.flags import load_config
    from pipelines.options import parse

    cfg = load_config(parse(["train", *cfg_args], COMMANDS)[1])
    if cfg.data.source != "synthetic":
        return cfg_args
    ds = sources.load(cfg.data)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({**{n: ds.x[:, i] for i, n in enumerate(ds.feature_names)},
                             "target": ds.y}), path)
    return [*cfg_args, "--data", str(path), "--target", "target"]


def run_workload(workload: str, out: Path, repeats: int, methods: list[str],
                 sets: list[str] = (), precisions: tuple[str, ...] = PRECISIONS) -> list[dict]:
    """Every method on one workload (the modes in each of `precisions`), `repeats` times,
    order reversed every other repeat; returns one row per process run. `sets`: `KEY=VALUE`
    config overrides of the workload."""
    cfg_path, extra, _ = WORKLOADS[workload]
    cfg_args = [*(["--config", cfg_path] if cfg_path else []), *extra,
                *(a for kv in sets for a in ("--set", kv))]
    base = out / workload
    cfg_args = synthetic_as_table(cfg_args, base / "table.parquet")
    prepared = base / "data"  # the splits every method reads (no TensorFlow needed)
    _measured(["train", *cfg_args, "--mode", "between-graph", "--prepare-only", "--run-dir",
               str(prepared), "--overwrite"])
    rows, trained = [], None
    runs = [(m, p) for m in methods
            for p in (precisions if m in (*MODES, *PRECISION_WORKERS) else ("float32",))]
    for r in range(repeats):
        gemm = json.loads(_measured(["gemm", "-"], module="benchmarks.benchmark")["stdout"]
                          .strip().splitlines()[-1])["flops_per_second"]
        order = runs if r % 2 == 0 else runs[::-1]
        if any(m == "predict-1m" for m, _ in order) and trained is None:  # needs in-graph's
            order = [mp for mp in order if mp[0] != "predict-1m"] + [("predict-1m", "float32")]
        for position, (method, precision) in enumerate(order):
            if method in MODES:
                row = _run_mode(method, base, cfg_args, r, precision)
                if method == REFERENCE and precision == "float32":  # predict-1m's run
                    trained = Path(row["run_dir"])
            else:
                row = _run_worker(method, prepared, trained, precision)
            row.update(workload=workload, method=method, precision=precision, repeat=r,
                       position=position, gemm_flops_per_second=gemm)
            rows.append(row)
            print(f"  {workload} repeat {r} {method} {precision}: {row['wall_seconds']:.2f} s",
                  flush=True)
    return rows


def summarise(runs: list[dict]) -> list[dict]:
    """Median and [min, max] per workload, method and precision over the repeats (see the
    module doc)."""
    out = []
    for w in dict.fromkeys(r["workload"] for r in runs):
        mine = [r for r in runs if r["workload"] == w]
        for r in mine:
            r.setdefault("precision", "float32")
        ref = [r["wall_seconds"] for r in mine
               if r["method"] == REFERENCE and r["precision"] == "float32"]
        ig_wall = statistics.median(ref) if ref else None
        peer = min((statistics.median(r["wall_seconds"] for r in mine
                                      if (r["method"], r["precision"]) == mp)
                    for mp in dict.fromkeys((r["method"], r["precision"]) for r in mine)
                    if mp[0] in PEERS), default=None)  # the fastest peer in either precision
        f32_rate = {}  # method -> its float32 median steady rate
        for method, precision in dict.fromkeys((r["method"], r["precision"]) for r in mine):
            rs = [r for r in mine if r["method"] == method and r["precision"] == precision]
            row = {"workload": w, "method": method, "precision": precision,
                   "repeats": len(rs)}
            for key in ("wall_seconds", "train_seconds", "first_epoch_seconds",
                        "peak_rss_bytes", "test_accuracy"):
                vals = [r[key] for r in rs if r.get(key) is not None]
                row[key + "_median"] = statistics.median(vals) if vals else None
                row[key + "_min"] = min(vals) if vals else None
                row[key + "_max"] = max(vals) if vals else None
            rates = [r["steady_rows"] * r["flops_per_row"] / r["steady_seconds"]
                     for r in rs if r.get("steady_seconds")]
            fracs = [r["steady_rows"] * r["flops_per_row"] / r["steady_seconds"]
                     / r["gemm_flops_per_second"] for r in rs if r.get("steady_seconds")]
            row["steady_gflops_median"] = statistics.median(rates) / 1e9 if rates else None
            if precision == "float32":
                f32_rate[method] = row["steady_gflops_median"]
            base_rate = f32_rate.get(method)
            row["steady_vs_float32"] = (row["steady_gflops_median"] / base_rate
                                        if base_rate and row["steady_gflops_median"] else None)
            sums = [r["steady_sum_rows"] * r["flops_per_row"] for r in rs
                    if r.get("steady_sum_rows")]
            row["steady_sum_gflops_median"] = statistics.median(sums) / 1e9 if sums else None
            row["steady_gemm_fraction_median"] = statistics.median(fracs) if fracs else None
            row["steady_gemm_fraction_min"] = min(fracs) if fracs else None
            row["steady_gemm_fraction_max"] = max(fracs) if fracs else None
            row["wall_vs_in_graph"] = (row["wall_seconds_median"] / ig_wall
                                       if ig_wall and method != "predict-1m" else None)
            row["wall_vs_fastest_peer"] = (row["wall_seconds_median"] / peer
                                           if peer and method != "predict-1m" else None)
            row["gemm_gflops_median"] = statistics.median(
                r["gemm_flops_per_second"] for r in rs) / 1e9
            out.append(row)
    return out


def markdown(summary: list[dict]) -> str:
    """The summary as a Markdown table (as docs/benchmarks.md shows them)."""
    def spread(r, key, fmt):
        if r[key + "_median"] is None:
            return ""
        return (f"{format(r[key + '_median'], fmt)} [{format(r[key + '_min'], fmt)}-"
                f"{format(r[key + '_max'], fmt)}]")

    head = ("| workload | method | precision | wall s | x in-graph | x fastest peer "
            "| first epoch s | train s | steady GFLOP/s | steady x f32 | of GEMM | peak MiB "
            "| test acc |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in summary:
        ratio = "" if r["wall_vs_in_graph"] is None else f"{r['wall_vs_in_graph']:.2f}"
        vs_peer = ("" if r.get("wall_vs_fastest_peer") is None
                   else f"{r['wall_vs_fastest_peer']:.2f}")
        gflops = "" if r["steady_gflops_median"] is None else f"{r['steady_gflops_median']:.1f}"
        vs_f32 = ("" if r.get("steady_vs_float32") is None
                  else f"{r['steady_vs_float32']:.2f}")
        peak = ("" if r["peak_rss_bytes_median"] is None
                else f"{r['peak_rss_bytes_median'] / 2**20:.0f}")
        lines.append(
            f"| {r['workload']} | {r['method']} | {r.get('precision', 'float32')} "
            f"| {spread(r, 'wall_seconds', '.2f')} | {ratio} "
            f"| {vs_peer} | {spread(r, 'first_epoch_seconds', '.2f')} "
            f"| {spread(r, 'train_seconds', '.2f')} | {gflops} | {vs_f32} "
            f"| {spread(r, 'steady_gemm_fraction', '.0%')} | {peak} "
            f"| {spread(r, 'test_accuracy', '.4f')} |")
    lines += [f"\n{r['workload']} {r['method']} {r.get('precision', 'float32')}: steady GFLOP/s while every client trained; "
              f"the sum of each client's own rate would say {r['steady_sum_gflops_median']:.1f}"
              for r in summary if r.get("steady_sum_gflops_median")]
    gemm = ", ".join(f"{w}: {g:.0f}" for w, g in dict.fromkeys(
        (r["workload"], round(r["gemm_gflops_median"])) for r in summary))
    from ensemble.models.precision import cpu_support

    bf16 = cpu_support("mixed_bfloat16")  # None: no /proc/cpuinfo to read
    hardware = ("" if bf16 is None else "; bfloat16 instructions: "
                + (", ".join(bf16) or "none (TensorFlow emulates bfloat16)"))
    return (head + "\n".join(lines) + f"\n\nnumpy float32 GEMM, GFLOP/s (median per workload): "
            f"{gemm}; {os.cpu_count()} cores{hardware}. Figures: median [min-max] over "
            f"{summary[0]['repeats']} repeats.\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in (*WORKERS, "gemm"):
        _worker_main(argv)
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument("--repeats", type=int, default=3, help="runs of every method (default 3)")
    p.add_argument("--methods", help="comma-separated subset of " + ", ".join(METHODS)
                   + " (default: the workload's own list)")
    p.add_argument("--out", default="artifacts/benchmark")
    p.add_argument("--precisions", default=",".join(PRECISIONS),
                   help="comma-separated training.precision values the modes run in "
                        "(default: float32,mixed_bfloat16; the jax peer too, the other peers "
                        "run in float32)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every workload's `ensemble train` (repeatable)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1; got {args.repeats}")
    chosen = args.methods.split(",") if args.methods else None
    if chosen and set(chosen) - set(METHODS):
        p.error(f"unknown method(s) {sorted(set(chosen) - set(METHODS))}; "
                f"expected from {', '.join(METHODS)}")
    precisions = tuple(x.strip() for x in args.precisions.split(",") if x.strip())
    from ensemble.models.precision import PRECISIONS as KNOWN

    if not precisions or set(precisions) - set(KNOWN):
        p.error(f"unknown precision(s) in --precisions {args.precisions!r}; expected from "
                f"{', '.join(KNOWN)}")
    import pyarrow as pa

    from ensemble.core import artifacts

    out = Path(args.out)
    runs = []
    for w in (WORKLOADS if args.workload == "all" else [args.workload]):
        runs += run_workload(w, out, args.repeats, chosen or list(WORKLOADS[w][2]), args.set,
                             precisions)
        print(markdown(summarise([r for r in runs if r["workload"] == w])), flush=True)
    summary = summarise(runs)
    artifacts.write_parquet(out / "runs.parquet", pa.Table.from_pylist(runs))
    artifacts.write_parquet(out / "results.parquet", pa.Table.from_pylist(summary))
    artifacts.write_text(out / "results.md", markdown(summary))
    print(f"results: {out / 'results.md'}, {out / 'results.parquet'} (summary), "
          f"{out / 'runs.parquet'} (every process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
