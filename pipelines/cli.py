"""The `ensemble` command line: one small function per subcommand, `main(argv) -> int`.

Exit status: 0 success, 2 bad input or usage (one line on stderr naming the bad value and what
was expected, no traceback), 1 an internal failure. Heavy modules are imported inside the
subcommands so that a between-graph client starts lean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from ensemble.devices import peak_rss_bytes  # noqa: E402
from ensemble.errors import UsageError  # noqa: E402

MODES = ("in-graph", "between-graph")


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with stderr silenced: its C++ runtime prints start-up banners (oneDNN,
    CUDA probing) before any log level applies. Errors still surface as Python exceptions."""
    if "tensorflow" in sys.modules:
        return
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def _positive(text: str) -> int:
    if not text.lstrip("-").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}")
    return int(text)


def _nonneg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, received {text!r}")
    return int(text)


def _load_config(args, base: dict | None = None):
    from ensemble import config

    return config.load(args.config, base=base, overrides={
        "data.source": args.data, "data.target": args.target, "members.count": args.members,
        "training.epochs": args.epochs, "training.seed": args.seed,
        "placement.devices": args.devices, "data.impute": getattr(args, "impute", None)})


def _cluster(args):
    from ensemble.cluster import load_spec

    return load_spec(getattr(args, "cluster", None))


def cmd_train(args) -> int:

    if args.resume:
        from ensemble import artifacts

        if not args.run_dir:
            raise UsageError("--resume needs --run-dir PATH of the run to continue")
        manifest = artifacts.read_manifest(args.run_dir)
        args.mode = args.mode or manifest["mode"]
        cfg = _load_config(args, base=manifest["config"])
    else:
        cfg = _load_config(args)
    args.mode = args.mode or "in-graph"
    if not args.resume:  # every data problem, in one message, before TensorFlow loads
        from ensemble import data

        data.load(cfg.data)
    _import_tensorflow_quietly()
    from pipelines import evaluate, train

    run_dir = Path(args.run_dir) if args.run_dir else train.default_run_dir(cfg)
    if args.prepare_only and args.mode != "between-graph":
        raise UsageError("--prepare-only is for --mode between-graph")
    ready = time.time()
    if args.mode == "in-graph":
        train.train_in_graph(cfg, run_dir, overwrite=args.overwrite, resume=args.resume,
                             cluster=_cluster(args))
    else:
        from pipelines import between

        manifest = between.train_between_graph(cfg, run_dir, jobs=args.jobs,
                                               overwrite=args.overwrite,
                                               prepare_only=args.prepare_only,
                                               resume=args.resume, cluster=_cluster(args))
        if args.prepare_only:
            print(f"prepared run directory: {run_dir}; now run, on any machine that sees it:")
            for m in manifest["members"]:
                print(f"  ensemble client --run {run_dir} --member {m['index']}")
            print(f"then: ensemble aggregate --run {run_dir}")
            return 0
    from ensemble import artifacts

    manifest = artifacts.read_manifest(run_dir)  # when this process was ready to work
    manifest["timings"].update(process_ready_unix=ready, process_peak_rss_bytes=peak_rss_bytes())
    artifacts.write_manifest(run_dir, manifest)
    print(f"run directory: {run_dir}")
    print(evaluate.evaluate(run_dir)[1])
    return 0


def cmd_predict(args) -> int:
    from pipelines import predict

    ready, report = time.time(), {}
    if args.mode == "in-graph":
        table = predict.predict_in_graph(Path(args.run), args.data, Path(args.out), args.target,
                                         args.devices, cluster=_cluster(args),
                                         strict_columns=args.strict_columns)
    else:
        from pipelines import between

        table, report = between.predict_between_graph(Path(args.run), args.data, Path(args.out),
                                                      args.target, jobs=args.jobs,
                                                      cluster_file=args.cluster,
                                                      strict_columns=args.strict_columns)
    n_rows = table.num_rows // len(set(table.column("model").to_pylist()))
    print(f"predictions: {args.out}")
    # last stdout line: a machine-readable report (read by `ensemble compare`)
    print(json.dumps({"out": args.out, "rows": n_rows, "ready_unix": ready,
                      "peak_rss_bytes": peak_rss_bytes(), **report}))
    return 0


def cmd_compare(args) -> int:
    from pipelines import compare

    base = Path(args.run_dir) if args.run_dir else Path("artifacts") / "compare"
    table = compare.compare(args.config, base, {"training.epochs": args.epochs,
                                                "members.count": args.members,
                                                "placement.devices": args.devices},
                            cluster_file=args.cluster)
    print(f"comparison: {base / 'comparison.parquet'}")
    print(compare.verdict(table))
    return 0


def cmd_evaluate(args) -> int:
    from pipelines import evaluate

    preds = Path(args.predictions) if args.predictions else None
    print(evaluate.evaluate(Path(args.run) if args.run else None, preds)[1])
    return 0


def cmd_aggregate(args) -> int:
    from pipelines import between

    between.aggregate_run(Path(args.run), args.min_members)
    print(f"aggregated: {args.run}")
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes()}))
    return 0


def cmd_client(args) -> int:
    from ensemble import between_graph

    start = time.perf_counter()
    if args.predict:
        if not args.out:
            raise UsageError("client: --predict needs --out FILE.parquet")
        between_graph.predict_client(Path(args.run), args.member, Path(args.predict),
                                     Path(args.out), threads=args.threads, device=args.device,
                                     cluster=_cluster(args))
    else:
        between_graph.run_client(Path(args.run), args.member, threads=args.threads)
    # last stdout line, read by the launcher: the client's work time without process start-up
    print(json.dumps({"member": args.member, "work_seconds": time.perf_counter() - start,
                      "peak_rss_bytes": peak_rss_bytes()}))
    return 0


def cmd_server(args) -> int:
    from ensemble import cluster

    spec = cluster.load_spec(args.cluster)
    if spec is None:
        raise UsageError("server: expected --cluster FILE.json or TF_CONFIG")
    return cluster.serve(spec, args.task)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ensemble", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train an ensemble and write a run directory")
    t.add_argument("--config", help="TOML config (default configs/digits.toml)")
    t.add_argument("--mode", choices=MODES, help="default in-graph (on --resume: the run's)")
    t.add_argument("--data", help="digits, breast_cancer, wine, iris, synthetic, or a file")
    t.add_argument("--target", help="target column of a .csv/.parquet source")
    t.add_argument("--impute", choices=("error", "median", "most_frequent"),
                   help="missing feature values: refuse, or fill from the training split")
    t.add_argument("--members", type=_positive)
    t.add_argument("--epochs", type=_positive)
    t.add_argument("--seed", type=_nonneg)
    t.add_argument("--devices", help="auto, cpu:N, or device names such as /GPU:0,/GPU:1")
    t.add_argument("--jobs", type=_positive, help="between-graph: concurrent clients")
    t.add_argument("--run-dir", help="output folder (default artifacts/<run_id>)")
    t.add_argument("--cluster", help="cluster spec FILE.json (default: TF_CONFIG, if set)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing run")
    t.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --run-dir from its checkpoints")
    t.add_argument("--prepare-only", action="store_true",
                   help="between-graph: prepare the run for separately launched clients")
    t.set_defaults(func=cmd_train)

    pr = sub.add_parser("predict", help="predict a data set with a trained run")
    pr.add_argument("--run", required=True)
    pr.add_argument("--data", required=True)
    pr.add_argument("--target")
    pr.add_argument("--mode", choices=MODES, default="in-graph")
    pr.add_argument("--devices", default="auto")
    pr.add_argument("--jobs", type=_positive)
    pr.add_argument("--out", required=True, help="FILE.parquet")
    pr.add_argument("--cluster", help="cluster spec FILE.json to predict on")
    pr.add_argument("--strict-columns", action="store_true",
                    help="refuse columns the run was not trained on (default: ignore them)")
    pr.set_defaults(func=cmd_predict)

    e = sub.add_parser("evaluate", help="the ensemble against its members")
    e.add_argument("--run")
    e.add_argument("--predictions", help="a predictions Parquet file (default: the run's)")
    e.set_defaults(func=cmd_evaluate)

    a = sub.add_parser("aggregate", help="the between-graph aggregator")
    a.add_argument("--run", required=True)
    a.add_argument("--min-members", type=_positive,
                   help="aggregate a partial ensemble of at least K members")
    a.set_defaults(func=cmd_aggregate)

    cmp = sub.add_parser("compare", help="train and predict in both modes; measure the cost")
    cmp.add_argument("--config", help="TOML config (default configs/digits.toml)")
    cmp.add_argument("--run-dir", help="output folder (default artifacts/compare)")
    cmp.add_argument("--members", type=_positive)
    cmp.add_argument("--epochs", type=_positive)
    cmp.add_argument("--devices")
    cmp.add_argument("--cluster", help="cluster spec FILE.json: compare both modes on it")
    cmp.set_defaults(func=cmd_compare)

    c = sub.add_parser("client", help="train one member of a prepared between-graph run")
    c.add_argument("--run", required=True)
    c.add_argument("--member", required=True, type=_nonneg)
    c.add_argument("--threads", type=_positive, help="TensorFlow intra/inter-op threads")
    c.add_argument("--predict", help="predict this .npz input instead of training")
    c.add_argument("--out", help="with --predict: the member's predictions FILE.parquet")
    c.add_argument("--device", help="with --predict: run the member here")
    c.add_argument("--cluster", help="with --predict: cluster spec FILE.json")
    c.set_defaults(func=cmd_client)

    s = sub.add_parser("server", help="serve one task of a TensorFlow cluster")
    s.add_argument("--cluster", help="cluster spec FILE.json (default: TF_CONFIG)")
    s.add_argument("--task", required=True, help="JOB:I, e.g. worker:0")
    s.set_defaults(func=cmd_server)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting."""
    try:
        args = _parser().parse_args(argv)
        if args.command in ("predict", "client", "server"):
            _import_tensorflow_quietly()
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from ensemble.cluster import ClusterError

        if isinstance(exc, ClusterError):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
