"""Serving benchmark: streaming `ensemble predict` of a large Parquet file by a trained ensemble.

    python -m benchmarks.serve_bench [--run RUN] [--rows 1000000] [--big-rows 10000000]
                                    [--batch-size ROWS] [--out DIR]
    python -m benchmarks.serve_bench --http ...   # `ensemble serve` under load: http_bench

Without `--run`, trains the 8-member `wide` ensemble (configs/wide.toml, in-graph) first.
Writes `rows` (and `big-rows`) random float32 rows with the run's feature names to Parquet,
then measures, each in its own `ensemble predict` process: in-graph prediction of `rows` rows
(GFLOP/s over the whole process wall time and over the prediction loop, against numpy's float32
GEMM rate measured in the same run), its peak resident memory against the in-graph prediction of
`big-rows` rows (streaming should keep it flat), and between-graph prediction of the same file
(its wall time against in-graph). Prints a Markdown table and writes `results.json` in `--out`.
FLOPs: the members' `flops_per_row` (dense layers, `2 * w_in * w_out`) x rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

WIDE = "configs/wide.toml"


def write_input(path: Path, names: list[str], rows: int, chunk: int = 131072) -> Path:
    """`rows` standard-normal float32 rows with columns `names`, written chunk by chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_file() and pq.ParquetFile(path).metadata.num_rows == rows:
        return path
    rng = np.random.default_rng(0)
    schema = pa.schema([(n, pa.float32()) for n in names])
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, schema) as writer:
        for lo in range(0, rows, chunk):
            x = rng.standard_normal((min(chunk, rows - lo), len(names)), dtype=np.float32)
            writer.write_table(pa.Table.from_arrays(list(x.T), schema=schema))
    tmp.replace(path)
    return path


def _predict(run_dir: Path, source: Path, out: Path, mode: str, batch_size: int) -> dict:
    from pipelines.compare import client_processes, concurrent_peak
    from ensemble.replication.processes import checked, last_report, run_process

    res = checked(run_process(["predict", "--run", str(run_dir), "--data", str(source),
                               "--out", str(out), "--mode", mode, "--batch-size",
                               str(batch_size), "--quiet"], module="pipelines.cli"),
                  f"predict {mode}")
    report = last_report(res)
    clients = client_processes(report.get("clients") or {})  # one entry per process
    peak = concurrent_peak(report["peak_rss_bytes"], clients, report.get("jobs") or 1)
    out.unlink(missing_ok=True)  # the outputs are large; only the figures are kept
    return {"mode": mode, "rows": report["rows"], "wall_seconds": res["seconds"],
            "predict_seconds": report["seconds"], "peak_rss_bytes": peak,
            "jobs": report.get("jobs")}


def _print_summary(results: list[dict], summary: dict) -> None:
    """The runs as a Markdown table, then the summary's ratios in one line."""
    print("| mode | rows | wall s | loop s | GFLOP/s (process) | GFLOP/s (loop) | "
          "peak MiB |\n|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['rows']:,} | {r['wall_seconds']:.1f} | "
              f"{r['predict_seconds']:.1f} | {r['gflops_process']:.1f} | "
              f"{r['gflops_loop']:.1f} | {r['peak_rss_bytes'] / 2**20:.0f} |")
    print(f"numpy float32 GEMM: {summary['gemm_gflops']:.1f} GFLOP/s; in-graph = "
          f"{summary['in_graph_of_gemm_process']:.0%} of it over the whole process, "
          f"{summary['in_graph_of_gemm_loop']:.0%} over the prediction loop; peak memory at "
          f"{summary['big_rows']:,} rows = {summary['peak_ratio_big_vs_rows']:.2f}x the peak "
          f"at {summary['rows']:,}; between-graph wall = "
          f"{summary['between_vs_in_graph_wall']:.2f}x in-graph")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--http" in argv:  # `ensemble serve` over HTTP: benchmarks.http_bench
        from benchmarks import http_bench

        return http_bench.main([a for a in argv if a != "--http"])
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="a trained run (default: train configs/wide.toml)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--big-rows", type=int, default=10_000_000)
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--out", default="artifacts/serve_bench")
    args = p.parse_args(argv)
    from ensemble.core import artifacts
    from ensemble.core.manifest import Manifest
    from benchmarks.benchmark import gemm_rate
    from ensemble.replication.processes import checked, run_process

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(args.run) if args.run else out / "wide-run"
    if not args.run and not (run_dir / artifacts.MANIFEST).is_file():
        checked(run_process(["train", "--config", WIDE, "--run-dir", str(run_dir),
                             "--overwrite", "--quiet"], module="pipelines.cli"), "train wide")
    manifest = Manifest.load(run_dir)
    names = list(manifest.dataset.feature_names)
    flops_per_row = float(sum(m.flops_per_row for m in manifest.members))
    gemm = gemm_rate()
    results = []
    for rows, modes in ((args.rows, ("in-graph", "between-graph")),
                        (args.big_rows, ("in-graph",))):
        source = write_input(out / f"input-{rows}.parquet", names, rows)
        for mode in modes:
            r = _predict(run_dir, source, out / f"pred-{mode}-{rows}.parquet", mode,
                         args.batch_size)
            r["gflops_process"] = flops_per_row * rows / r["wall_seconds"] / 1e9
            r["gflops_loop"] = flops_per_row * rows / r["predict_seconds"] / 1e9
            results.append(r)
            print(json.dumps(r), flush=True)
    ig = results[0]
    summary = {
        "gemm_gflops": gemm / 1e9, "members": len(manifest.members),
        "flops_per_row": flops_per_row, "rows": args.rows, "big_rows": args.big_rows,
        "in_graph_of_gemm_process": ig["gflops_process"] * 1e9 / gemm,
        "in_graph_of_gemm_loop": ig["gflops_loop"] * 1e9 / gemm,
        "peak_ratio_big_vs_rows": results[2]["peak_rss_bytes"] / ig["peak_rss_bytes"],
        "between_vs_in_graph_wall": results[1]["wall_seconds"] / ig["wall_seconds"],
        "runs": results}
    artifacts.write_text(out / "results.json", json.dumps(summary, indent=1))
    _print_summary(results, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
