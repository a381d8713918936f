"""Benchmark harness: the project's two modes against what users would pick instead.

    python -m pipelines.benchmark [--workload digits|wide|all] [--out DIR]

For each workload, in the same run, each method runs in its own process: the project's in-graph
and between-graph training and prediction, the naive way (members built and trained one after
another with `model.fit`), scikit-learn's `VotingClassifier(voting="soft")` of `MLPClassifier`
with the same layers and epochs (`n_jobs=2`), in-graph prediction of 1,000,000 rows, and the
machine's float32 GEMM rate (numpy, 2048x2048). Writes `results.parquet` and `results.md`.
Never run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from pipelines.compare import concurrent_peak

WORKLOADS = {"digits": None, "wide": "configs/wide.toml"}
PREDICT_ROWS = 1_000_000


def forward_flops(cfg, n_features: int, n_classes: int) -> int:
    """Multiply-adds x 2 of one member's forward pass on one row (dense layers only)."""
    widths = [n_features, *cfg.members.hidden, n_classes]
    return 2 * sum(a * b for a, b in zip(widths, widths[1:]))


def gemm_rate(n: int = 2048, repeats: int = 5) -> float:
    """Best float32 GEMM rate of numpy on this machine, FLOP/s (`2 n^3` per product)."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(repeats))
    return 2 * n**3 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _peak_bytes(children: int = 0) -> int:
    """Own peak resident bytes plus `children` x the largest reaped child's peak (an upper
    bound for a pool of `children` workers)."""
    from ensemble.devices import peak_rss_bytes

    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return peak_rss_bytes() + children * kids


def _load(run_dir: Path):
    from ensemble import artifacts, config

    manifest = artifacts.read_manifest(run_dir)
    split = {s: artifacts.read_split(run_dir, s) for s in artifacts.SPLITS}
    return config.from_dict(manifest["config"]), manifest, split


def worker_naive(run_dir: Path) -> dict:
    """Members built and trained one after another with `model.fit`, then averaged."""
    import keras

    from ensemble.members import build_member, member_seed

    cfg, manifest, split = _load(run_dir)
    (x, y, _), (xt, yt, _) = split["train"], split["test"]
    n_classes = len(manifest["dataset"]["classes"])
    probs, seconds = [], 0.0
    for i in range(cfg.members.count):
        start = time.perf_counter()
        model = build_member(cfg.members, x.shape[1], n_classes,
                             member_seed(cfg.training.seed, i), f"member_{i}")
        model.compile(keras.optimizers.Adam(cfg.training.learning_rate),
                      "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=cfg.training.batch_size, epochs=cfg.training.epochs,
                  shuffle=True, verbose=0)
        seconds += time.perf_counter() - start
        probs.append(model.predict(xt, batch_size=16384, verbose=0))
    acc = float((np.mean(probs, axis=0).argmax(1) == yt).mean())
    return {"seconds": seconds, "test_accuracy": acc, "peak_rss_bytes": _peak_bytes()}


def worker_sklearn(run_dir: Path) -> dict:
    """`VotingClassifier(voting="soft")` of `MLPClassifier`s, same layers/epochs, n_jobs=2."""
    import warnings

    from joblib.externals.loky import get_reusable_executor
    from sklearn.ensemble import VotingClassifier
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from ensemble.members import member_seed

    cfg, _, split = _load(run_dir)
    (x, y, _), (xt, yt, _) = split["train"], split["test"]
    members = [(f"member_{i}", MLPClassifier(
        hidden_layer_sizes=cfg.members.hidden, activation=cfg.members.activation, solver="adam",
        alpha=0.0, batch_size=cfg.training.batch_size,
        learning_rate_init=cfg.training.learning_rate, max_iter=cfg.training.epochs,
        shuffle=True, random_state=member_seed(cfg.training.seed, i)))
        for i in range(cfg.members.count)]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = VotingClassifier(members, voting="soft", n_jobs=2).fit(x, y)
    seconds = time.perf_counter() - start
    acc = float((clf.predict(xt) == yt).mean())
    get_reusable_executor().shutdown(wait=True)  # reap the workers so their memory is counted
    return {"seconds": seconds, "test_accuracy": acc, "peak_rss_bytes": _peak_bytes(children=2)}


def worker_predict_1m(run_dir: Path) -> dict:
    """In-graph prediction of 1,000,000 rows by the trained ensemble of `run_dir`."""
    from ensemble import artifacts, devices
    from ensemble.in_graph import InGraphEnsemble
    from ensemble.members import load_member
    from ensemble.placement import place

    cfg, manifest, split = _load(run_dir)
    n = len(manifest["members"])
    devs = place(n, devices.resolve("auto", n))
    models = [load_member(artifacts.member_model_path(run_dir, i), d) for i, d in enumerate(devs)]
    ens = InGraphEnsemble(models, devs, cfg.aggregation.aggregators)
    x = np.random.default_rng(0).standard_normal((PREDICT_ROWS, split["train"][0].shape[1]),
                                                 dtype=np.float32)
    ens.predict(x[:16384])  # trace once
    seconds = _timed(lambda: ens.predict(x, batch_size=32768))
    return {"seconds": seconds, "rows": PREDICT_ROWS, "peak_rss_bytes": _peak_bytes()}


WORKERS = {"naive": worker_naive, "sklearn": worker_sklearn, "predict-1m": worker_predict_1m}


def _worker_main(argv: list[str]) -> None:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    name, run_dir = argv
    if name == "gemm":
        print(json.dumps({"flops_per_second": gemm_rate()}))
    else:
        print(json.dumps(WORKERS[name](Path(run_dir))))


def _run(argv: list[str], module: str = "pipelines.cli") -> dict:
    from pipelines.between import checked, run_process

    return checked(run_process(argv, module=module), " ".join(argv))


def _worker(name: str, run_dir: Path | str = "-") -> tuple[dict, dict]:
    from pipelines.between import last_report

    res = _run([name, str(run_dir)], module="pipelines.benchmark")
    return last_report(res), res


def _mode_rows(workload: str, cfg_path: str | None, base: Path) -> tuple[list[dict], Path]:
    from ensemble import artifacts
    from pipelines.between import last_report

    rows, ig_dir = [], base / "in-graph"
    for mode in ("in-graph", "between-graph"):
        run_dir = base / mode
        res = _run(["train", *(["--config", cfg_path] if cfg_path else []), "--mode", mode,
                    "--run-dir", str(run_dir), "--overwrite"])
        m = artifacts.read_manifest(run_dir)
        clients = list(m["timings"].get("clients", {}).values())
        metrics = artifacts.read_parquet(run_dir / artifacts.METRICS).to_pylist()
        acc = next(r["accuracy"] for r in metrics
                   if r["model"] == "ensemble-mean" and r["split"] == "test")
        rows.append({"workload": workload, "method": mode, "phase": "train",
                     "seconds": m["timings"]["train_seconds"], "wall_seconds": res["seconds"],
                     "peak_rss_bytes": concurrent_peak(m["timings"]["process_peak_rss_bytes"],
                                                       clients, m["timings"].get("jobs", 1)),
                     "test_accuracy": acc})
        out = base / f"{mode}.predict.parquet"
        res = _run(["predict", "--run", str(run_dir), "--data", m["config"]["data"]["source"],
                    "--mode", mode, "--out", str(out)])
        report = last_report(res)
        rows.append({"workload": workload, "method": mode, "phase": "predict",
                     "seconds": res["seconds"], "wall_seconds": res["seconds"],
                     "peak_rss_bytes": concurrent_peak(
                         report["peak_rss_bytes"], list((report.get("clients") or {}).values()),
                         report.get("jobs") or 1),
                     "rows": report["rows"]})
    return rows, ig_dir


def run_workload(workload: str, out: Path) -> list[dict]:
    """Every method on one workload, in the same run; returns result rows."""
    from ensemble import artifacts, config

    cfg_path = WORKLOADS[workload]
    gemm = _worker("gemm")[0]["flops_per_second"]
    rows, ig_dir = _mode_rows(workload, cfg_path, out / workload)
    for name, phase in (("naive", "train"), ("sklearn", "train"), ("predict-1m", "predict")):
        result, res = _worker(name, ig_dir)
        rows.append({"workload": workload, "method": name, "phase": phase,
                     "seconds": result["seconds"], "wall_seconds": res["seconds"],
                     "peak_rss_bytes": result["peak_rss_bytes"],
                     "test_accuracy": result.get("test_accuracy"), "rows": result.get("rows")})
    m = artifacts.read_manifest(ig_dir)
    cfg = config.from_dict(m["config"])
    fwd = forward_flops(cfg, len(m["dataset"]["feature_names"]), len(m["dataset"]["classes"]))
    train_flop = 3 * fwd * m["dataset"]["rows"]["train"] * cfg.training.epochs * cfg.members.count
    ig_train = next(r["seconds"] for r in rows if r["method"] == "in-graph" and
                    r["phase"] == "train")
    for r in rows:
        flop = train_flop if r["phase"] == "train" else fwd * cfg.members.count * (r["rows"] or 0)
        r["gflops"] = flop / r["seconds"] / 1e9
        r["gemm_fraction"] = flop / r["seconds"] / gemm
        r["gemm_gflops"] = gemm / 1e9
        r["seconds_vs_in_graph"] = r["seconds"] / ig_train if r["phase"] == "train" else None
    return rows


def markdown(rows: list[dict]) -> str:
    """The results as a Markdown table (the README's performance section)."""
    head = ("| workload | method | phase | seconds | x in-graph | GFLOP/s | of GEMM | peak MiB "
            "| test acc |\n|---|---|---|---|---|---|---|---|---|\n")
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    return head + "".join(
        f"| {r['workload']} | {r['method']} | {r['phase']} | {r['seconds']:.2f} | "
        f"{fmt(r['seconds_vs_in_graph'], '.2f')} | {r['gflops']:.1f} | "
        f"{r['gemm_fraction']:.0%} | {r['peak_rss_bytes'] / 2**20:.0f} | "
        f"{fmt(r.get('test_accuracy'), '.4f')} |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in (*WORKERS, "gemm"):
        _worker_main(argv)
        return 0
    p = argparse.ArgumentParser(prog="python -m pipelines.benchmark", description=__doc__)
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument("--out", default="artifacts/benchmark")
    args = p.parse_args(argv)
    import pyarrow as pa

    from ensemble import artifacts

    out = Path(args.out)
    rows = []
    for w in (WORKLOADS if args.workload == "all" else [args.workload]):
        rows += run_workload(w, out)
        print(markdown([r for r in rows if r["workload"] == w]), flush=True)
    artifacts.write_parquet(out / "results.parquet", pa.Table.from_pylist(rows))
    artifacts.write_text(out / "results.md", markdown(rows))
    print(f"results: {out / 'results.parquet'}, {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
