"""The `ensemble` command line: one small function per subcommand, `main(argv) -> int`.

Exit status: 0 success, 2 bad input or usage (one line on stderr naming the bad value and what
was expected, no traceback), 1 an internal failure, 130 / 143 interrupted by SIGINT / SIGTERM
(training stops after its current call, keeps its newest checkpoint and says how to resume). Heavy modules are imported inside the
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
from pipelines.guide import HelpFormatter as _HelpFormatter  # noqa: E402
from pipelines.guide import Parser as _Parser  # noqa: E402
from pipelines.guide import add as _add  # noqa: E402
from pipelines.guide import nonneg as _nonneg  # noqa: E402
from pipelines.guide import positive as _positive  # noqa: E402
from pipelines.guide import report, unknown_options  # noqa: E402

from ensemble.config import MODES  # noqa: E402
IMPUTE = ("error", "median", "most_frequent")


KERAS_EXTRAS = ("sklearn", "scipy", "pandas", "matplotlib")


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with stderr silenced: its C++ runtime prints start-up banners (oneDNN,
    CUDA probing) before any log level applies. Errors still surface as Python exceptions.

    Keras imports scikit-learn, SciPy, pandas and matplotlib (pyplot) when they are installed,
    for wrappers and plots this CLI never uses: about 2 s of every process's start-up. Those
    not loaded yet are hidden while TensorFlow loads (a `None` entry in `sys.modules` makes an
    import fail, which Keras handles by leaving the extra off) and importable again after, so a
    command that needs one (scikit-learn for data and metrics) still loads it, once, when used.
    """
    if "tensorflow" in sys.modules:
        return
    hidden = [name for name in KERAS_EXTRAS if name not in sys.modules]
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        sys.modules.update(dict.fromkeys(hidden))
        os.dup2(devnull, 2)
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def _load_config(args, base: dict | None = None):
    """The config file (or `base`) with the command's flags applied; `cpu:N` beyond the member
    count is capped to it with a notice (the extra logical devices would stay idle)."""
    import dataclasses

    from ensemble import config

    cfg = config.load(args.config, base=base, overrides={
        "data.source": args.data, "data.target": args.target, "members.count": args.members,
        "training.epochs": getattr(args, "epochs", None), "training.seed": getattr(args, "seed", None),
        "placement.devices": args.devices, "data.impute": getattr(args, "impute", None)})
    spec, n = cfg.placement.devices.strip(), cfg.members.count
    if spec.startswith("cpu:") and spec[4:].isdigit() and int(spec[4:]) > n:
        from ensemble.data import notice

        notice(f"--devices {spec} gives more logical devices than the {n} members; "
               f"using cpu:{n}")
        cfg = dataclasses.replace(cfg, placement=dataclasses.replace(cfg.placement,
                                                                     devices=f"cpu:{n}"))
    return cfg


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
    _refuse_inapplicable(args)
    if not args.resume:  # every data problem, in one message, before TensorFlow loads
        from ensemble import data

        data.load(cfg.data)
    if args.mode == "in-graph" or args.cluster or os.environ.get("TF_CONFIG"):  # not a
        _import_tensorflow_quietly()  # between-graph launcher: its clients load TensorFlow
    from pipelines import api

    ready = time.time()
    verbosity = 0 if args.quiet else 2 if args.verbose else 1
    trained = api.train(cfg, args.mode, args.run_dir, overwrite=args.overwrite,
                        resume=args.resume, jobs=args.jobs, cluster=_cluster(args),
                        prepare_only=args.prepare_only,
                        tensorboard=True if args.tensorboard else None,
                        log_device_placement=args.log_device_placement, verbosity=verbosity)
    run_dir = trained.path
    if args.prepare_only:
        print(f"prepared run directory: {run_dir}; now run, on any machine that sees it:")
        for m in trained.manifest["members"]:
            print(f"  ensemble client --run {run_dir} --member {m['index']}")
        print(f"then: ensemble aggregate --run {run_dir}")
        return 0
    from ensemble import runlock

    runlock.update_manifest(run_dir, lambda m: m["timings"].update(  # when it was ready to work
        process_ready_unix=ready, process_peak_rss_bytes=peak_rss_bytes()))
    print(f"run directory: {run_dir}")
    if trained.config.training.tensorboard:
        print(f"tensorboard: tensorboard --logdir {run_dir / 'tensorboard'}")
    print(trained.summary())
    return 0


def cmd_search(args) -> int:
    from pipelines import search

    if args.resume and not args.run_dir:
        raise UsageError("--resume needs --run-dir PATH of the search to continue")
    plan = search.plan(args.config, args.candidates, args.select, args.stratify, overrides={
        "training.epochs": args.epochs, "placement.devices": args.devices})
    if not args.resume:  # every space and data problem before TensorFlow loads
        from ensemble import data

        data.load(plan.config.data)
    if args.mode == "in-graph":  # a between-graph launcher leaves TensorFlow to its clients
        _import_tensorflow_quietly()
    from pipelines import evaluate, train

    run_dir = Path(args.run_dir) if args.run_dir else train.default_run_dir(plan.config)
    verbosity = 0 if args.quiet else 1
    search.run_search(plan, run_dir, args.mode, resume=args.resume, overwrite=args.overwrite,
                      jobs=args.jobs, verbosity=verbosity)
    print(f"run directory: {run_dir} (members.parquet: every candidate; predict applies the "
          "greedy selection)")
    print(evaluate.evaluate(run_dir)[1])
    return 0


def cmd_devices(args) -> int:
    from ensemble import config, devices

    cfg = config.load(args.config)
    spec = args.devices or cfg.placement.devices
    limit = cfg.placement.memory_limit_mb if args.memory_limit_mb is None else args.memory_limit_mb
    for text in devices.configure_gpus(cfg.placement.memory_growth, limit):
        print(f"notice: {text}", file=sys.stderr)
    kind, n = devices.parse(spec)
    if kind == "cpu":
        devices.split_cpu(n)
    print(devices.format_description(devices.describe()))
    return 0


def _check_input_early(args) -> None:
    """Every problem of the input's columns and first batch in one message before TensorFlow
    loads (the run's own problems, damaged or unfinished, are left to the full check that
    follows)."""
    from ensemble import artifacts
    from ensemble.preprocessing import Preprocessing
    from ensemble.stream import InputStream

    try:
        manifest = artifacts.read_manifest(Path(args.run))
        pre = Preprocessing.read(Path(args.run) / artifacts.PREPROCESSING)
    except (UsageError, OSError):
        return
    target = args.target or manifest.get("dataset", {}).get("target", "target")
    InputStream(pre, args.data, target, args.strict_columns, args.batch_size).check()


def cmd_predict(args) -> int:
    from pipelines.predict import check_out

    check_out(Path(args.out))
    _check_input_early(args)
    if args.mode == "in-graph":  # a between-graph launcher never loads TensorFlow
        _import_tensorflow_quietly()
    from pipelines import predict

    ready, measured = time.time(), {}
    verbosity = 0 if args.quiet else 1
    if args.mode == "in-graph":
        rec = predict.predict_in_graph(Path(args.run), args.data, Path(args.out), args.target,
                                       args.devices or "auto", args.batch_size,
                                       cluster=_cluster(args), strict_columns=args.strict_columns,
                                       replicas=args.replicas or "auto",
                                       verbosity=verbosity)
    else:
        from pipelines import between

        rec, measured = between.predict_between_graph(
            Path(args.run), args.data, Path(args.out), args.target, jobs=args.jobs,
            cluster_file=args.cluster, strict_columns=args.strict_columns,
            batch_size=args.batch_size, verbosity=verbosity)
    print(f"predictions: {args.out}")
    report({"out": args.out, "rows": rec["rows"], "ready_unix": ready,
            "seconds": rec["seconds"], "rows_per_second": rec["rows_per_second"],
            "members": rec["members"], "peak_rss_bytes": peak_rss_bytes(), **measured}, args)
    return 0


def cmd_export(args) -> int:
    _import_tensorflow_quietly()
    from ensemble.export import export_run

    path = export_run(Path(args.run), Path(args.out), args.version, args.aggregator)
    print(f"SavedModel: {path} (TensorFlow Serving: --model_base_path={path.parent.resolve()})")
    return 0


def cmd_compare(args) -> int:
    from pipelines import compare

    base = Path(args.run_dir) if args.run_dir else Path("artifacts") / "compare"
    table, _ = compare.compare(_load_config(args), base, repeats=args.repeats,
                               overwrite=args.overwrite, cluster_file=args.cluster)
    print(compare.verdict(table))
    print(f"comparison: {base / 'comparison.parquet'} (summary), {base / 'runs.parquet'} "
          f"(every run)")
    if (base / "comparison.png").is_file():
        print(f"chart: {base / 'comparison.png'}")
    return 0


def cmd_evaluate(args) -> int:
    from pipelines import evaluate

    preds = Path(args.predictions) if args.predictions else None
    print(evaluate.evaluate(Path(args.run) if args.run else None, preds, args.plots)[1])
    return 0


def cmd_aggregate(args) -> int:
    from pipelines import aggregate, evaluate

    names = aggregate.parse_aggregators(args.aggregators)
    aggregate.aggregate_run(Path(args.run), names, args.min_members)
    print(f"aggregated: {args.run}")
    if args.aggregators:
        print(evaluate.evaluate(Path(args.run))[1])
    report({"peak_rss_bytes": peak_rss_bytes()})
    return 0


def _member_list(text: str) -> list[int]:
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected member indices I or I,J,... (integers >= 0), received {text!r}")
    return [int(p) for p in parts]


def cmd_client(args) -> int:
    from ensemble import between_graph, interrupt, progress

    ready = time.time()  # TensorFlow is imported (main) and the arguments are parsed
    start = time.perf_counter()
    if args.predict:
        if not args.out:
            raise UsageError("client: --predict needs --out FILE.parquet (or a folder)")
        devs = args.device.split(",") if args.device else None
        if devs is not None and len(devs) != len(args.member):
            raise UsageError(f"client: --device names {len(devs)} devices for "
                             f"{len(args.member)} members; expected one per member")
        between_graph.predict_client(Path(args.run), args.member, Path(args.predict),
                                     Path(args.out), threads=args.threads, devices_=devs,
                                     cluster=_cluster(args), batch_rows=args.batch_size,
                                     target=args.target)
    else:
        def callbacks(index: int):
            if args.progress == "report":
                return [progress.ReportProgress([index])]
            if args.progress == "log":
                return [progress.LogProgress(sys.stdout, prefix=f"member {index}: ")]
            return []

        def done(index: int, seconds: float) -> None:
            if args.progress == "report":  # the launcher records the member as completed
                print(progress.PREFIX + json.dumps({"kind": "member-done", "member": index,
                                                    "work_seconds": seconds}),
                      file=sys.stderr, flush=True)
            elif args.progress == "log":
                print(f"member {index}: trained in {seconds:.2f} s", flush=True)

        try:
            between_graph.run_client(Path(args.run), args.member, threads=args.threads,
                                     callbacks=callbacks, on_member_done=done)
        except interrupt.Interrupted as exc:
            if args.progress == "report" and getattr(exc, "member", None) is not None:
                print(progress.PREFIX + json.dumps({
                    "kind": "interrupted", "member": exc.member, "epoch": exc.epoch,
                    "epochs": exc.epochs}), file=sys.stderr, flush=True)
            exc.resume = (f"ensemble client --run {args.run} --member "
                          f"{','.join(map(str, args.member))}")
            raise
    # read by the launcher ($ENSEMBLE_REPORT): when the client was ready, its work time, memory
    from ensemble.devices import build_info

    report({"members": args.member, "ready_unix": ready,
            "work_seconds": time.perf_counter() - start, "peak_rss_bytes": peak_rss_bytes(),
            "tensorflow_build": build_info()})
    return 0


def cmd_server(args) -> int:
    from ensemble import cluster

    spec = cluster.load_spec(args.cluster)
    if spec is None:
        raise UsageError("server: expected --cluster FILE.json or TF_CONFIG")
    return cluster.serve(spec, args.task)


DESCRIPTION = """\
ensemble: train a deep ensemble of neural networks with in-graph or between-graph replication,
evaluate it against its members, and measure which replication mode is faster on this machine."""

EXAMPLES = """\
examples:
  ensemble train --data penguins.csv --target species --impute median
  ensemble compare --data digits --members 4 --epochs 5 --repeats 3

'ensemble COMMAND --help' shows a command's options."""


def _common_run_options(parser, what: str) -> None:
    """The options `train` and `compare` share (they override the config)."""
    _add(parser, "--config", metavar="PATH",
         help="TOML config; relative paths in it are read beside it "
              "(default: the built-in digits config, equal to configs/digits.toml)")
    _add(parser, "--data", metavar="SOURCE",
         help="digits, breast_cancer, wine, iris, synthetic, or a .csv/.parquet file "
              "(default: the config's [data] source, digits)")
    _add(parser, "--target", metavar="COL",
         help="label column of a .csv/.parquet file (default: the config's, 'target')")
    _add(parser, "--impute", choices=IMPUTE,
         help="missing feature values: refuse them, or fill them from the training split "
              "(default: the config's, error)")
    _add(parser, "--members", type=_positive, metavar="N",
         help=f"number of members {what} (default: the config's, 4)")
    _add(parser, "--epochs", type=_positive, metavar="N",
         help="training epochs of every member (default: the config's, 30)")
    _add(parser, "--devices", metavar="SPEC",
         help="auto, cpu:N (the CPU split into N logical devices), or device names such as "
              "/GPU:0,/GPU:1 (default: the config's, auto)")
    _add(parser, "--cluster", metavar="FILE",
         help="TensorFlow cluster spec FILE.json (default: TF_CONFIG, if set)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ensemble", description=DESCRIPTION, epilog=EXAMPLES,
                formatter_class=_HelpFormatter)
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND",
                           parser_class=_Parser)
    p.commands = sub.choices

    def command(name: str, text: str, func):
        cp = sub.add_parser(name, help=text, description=f"ensemble {name}: {text}.",
                            formatter_class=_HelpFormatter)
        cp.set_defaults(func=func)
        return cp

    t = command("train", "train an ensemble and write a run directory", cmd_train)
    _common_run_options(t, "to train")
    _add(t, "--mode", choices=MODES,
         help="in-graph: one process, one graph holding every member; between-graph: one "
              "client process per device (default: in-graph; on --resume: the run's)")
    _add(t, "--seed", type=_nonneg, metavar="N", help="run seed (default: the config's, 0)")
    _add(t, "--jobs", type=_positive, metavar="N",
         help="between-graph only: concurrent client processes "
              "(default: as many as members, GPUs or cores allow)")
    _add(t, "--run-dir", metavar="PATH", help="output folder (default: artifacts/<run_id>)")
    _add(t, "--overwrite", action="store_true", help="replace a run already in --run-dir")
    _add(t, "--resume", action="store_true",
         help="continue the interrupted run in --run-dir from its checkpoints")
    _add(t, "--prepare-only", action="store_true",
         help="between-graph only: prepare the run for separately launched clients")
    _add(t, "--tensorboard", action="store_true",
         help="write tf.summary scalars under RUN/tensorboard/ (default: the config's "
              "[training] tensorboard, false)")
    _add(t, "--log-device-placement", action="store_true",
         help="print where every member's ops ran (TensorFlow's placement log, filtered to "
              "the members; kept under RUN/placement/)")
    loud = t.add_mutually_exclusive_group()
    _add(loud, "--quiet", action="store_true", help="no progress output")
    _add(loud, "--verbose", action="store_true",
         help="more progress: a line per member and epoch, lines within long epochs")

    pr = command("predict", "predict a data set with a trained run", cmd_predict)
    _add(pr, "--run", required=True, metavar="PATH", help="the run directory to predict with")
    _add(pr, "--data", required=True, metavar="SOURCE",
         help="built-in data set name or .csv/.parquet file; columns matched by name")
    _add(pr, "--target", metavar="COL",
         help="label column, used for y_true when present (default: the run's)")
    _add(pr, "--out", required=True, metavar="FILE.parquet", help="where the predictions go")
    _add(pr, "--mode", choices=MODES, default="in-graph",
         help="in-graph: one process; between-graph: one client per member")
    _add(pr, "--devices", metavar="SPEC",
         help="in-graph only: devices to predict on (default: auto)")
    _add(pr, "--jobs", type=_positive, metavar="N",
         help="between-graph only: concurrent client processes (default: as many as allowed)")
    _add(pr, "--cluster", metavar="FILE", help="cluster spec FILE.json to predict on "
                                                "(default: none)")
    _add(pr, "--batch-size", type=_positive, metavar="ROWS", default=65536,
         help="rows read, predicted and written at a time (memory stays flat)")
    _add(pr, "--replicas", metavar="auto|N",
         help="in-graph only: replicas of each member over the devices, each batch's rows "
              "split across them; auto: devices // members (default: auto)")
    _add(pr, "--quiet", action="store_true", help="no progress output")
    _add(pr, "--strict-columns", action="store_true",
         help="refuse columns the run was not trained on (by default they are ignored, "
              "named in a notice)")
    _add(pr, "--json", action="store_true",
         help="print a machine-readable report (rows, timings, peak memory) as the last line")

    x = command("export", "write a run as a SavedModel for TensorFlow Serving (DIR/<version>/)",
                cmd_export)
    _add(x, "--run", required=True, metavar="PATH", help="the run directory to export")
    _add(x, "--out", required=True, metavar="DIR", help="model base folder of TF Serving")
    _add(x, "--version", type=_positive, metavar="N",
         help="version folder DIR/N (default: 1 + the largest version in DIR)")
    _add(x, "--aggregator", metavar="NAME",
         help="aggregator of the serving_default signature (default: the run's first); "
              "every aggregator of the run gets its own signature too")

    e = command("evaluate", "print the ensemble against its members, validation and test",
                cmd_evaluate)
    _add(e, "--run", metavar="PATH", help="a run directory (default: none; or --predictions)")
    _add(e, "--predictions", metavar="FILE.parquet",
         help="a predictions Parquet file (default: the run's)")
    _add(e, "--plots", action="store_true",
         help="also write PNGs beside the metrics: reliability, ensemble size, members "
              "(needs matplotlib)")

    a = command("aggregate", "recompute a run's ensemble from its stored member predictions "
                "(no TensorFlow)", cmd_aggregate)
    _add(a, "--run", required=True, metavar="PATH", help="a run directory of either mode")
    _add(a, "--aggregators", metavar="LIST",
         help="comma-separated, from mean,vote,geometric,weighted,greedy,stacking,temperature; "
              "fitted ones fit on the validation split (default: the run's)")
    _add(a, "--min-members", type=_positive, metavar="K",
         help="aggregate a partial ensemble of at least K members (default: all members)")

    cmp = command("compare", "train and predict in both modes; measure which is faster here",
                  cmd_compare)
    _common_run_options(cmp, "in each mode")
    _add(cmp, "--run-dir", metavar="PATH", help="output folder (default: artifacts/compare)")
    _add(cmp, "--repeats", type=_positive, metavar="N", default=3,
         help="runs of each phase of each mode, order alternated")
    _add(cmp, "--overwrite", action="store_true", help="replace an existing comparison folder")

    se = command("search", "hyperparameter ensemble: sample candidates from the config's "
                 "[search] space, train them as one run, keep a greedy selection", cmd_search)
    _add(se, "--config", required=True, metavar="PATH",
         help="TOML config with a [search] table (see configs/search.toml)")
    _add(se, "--candidates", required=True, type=_positive, metavar="N",
         help="candidate members sampled from the [search] space and trained")
    _add(se, "--select", required=True, type=_positive, metavar="K",
         help="greedy selection (on validation NLL, repeats allowed) of at most K candidates")
    _add(se, "--stratify", type=_nonneg, metavar="S", default=0,
         help="train every selected configuration again with S new seeds, then select again")
    _add(se, "--mode", choices=MODES, default="in-graph",
         help="in-graph: one graph holding every candidate; between-graph: client processes")
    _add(se, "--epochs", type=_positive, metavar="N",
         help="training epochs of every candidate (default: the config's)")
    _add(se, "--devices", metavar="SPEC",
         help="auto, cpu:N or device names (default: the config's)")
    _add(se, "--jobs", type=_positive, metavar="N",
         help="between-graph only: concurrent client processes (default: as many as allowed)")
    _add(se, "--run-dir", metavar="PATH", help="output folder (default: artifacts/<run_id>)")
    _add(se, "--overwrite", action="store_true", help="replace a run already in --run-dir")
    _add(se, "--resume", action="store_true",
         help="continue an interrupted search in --run-dir: only unfinished candidates train")
    _add(se, "--quiet", action="store_true", help="no progress output")

    c = command("client", "train (or predict) members of a prepared between-graph run",
                cmd_client)
    _add(c, "--run", required=True, metavar="PATH", help="the prepared run directory")
    _add(c, "--member", required=True, type=_member_list, metavar="I[,J,...]",
         help="member index, or a queue of members trained one after another")
    _add(c, "--progress", choices=("log", "report", "none"), default="log",
         help="log: lines on stdout; report: machine-readable lines on stderr for a launcher")
    _add(c, "--threads", type=_positive, metavar="N",
         help="TensorFlow intra/inter-op threads (default: TensorFlow's)")
    _add(c, "--predict", metavar="X.npz|SOURCE",
         help="predict this input instead of training: scaled X.npz, or a data source "
              "streamed in batches (default: train)")
    _add(c, "--batch-size", type=_positive, metavar="ROWS",
         help="with --predict SOURCE: rows per batch (default: 65536)")
    _add(c, "--target", metavar="COL", help="with --predict SOURCE: label column "
                                            "(default: the run's)")
    _add(c, "--out", metavar="FILE.parquet",
         help="with --predict: the member's predictions (default: none)")
    _add(c, "--device", metavar="NAME[,NAME...]",
         help="with --predict: run the members here, one device per member "
              "(default: their training devices)")
    _add(c, "--cluster", metavar="FILE", help="with --predict: cluster spec FILE.json "
                                               "(default: none)")

    d = command("devices", "list the physical and logical devices TensorFlow sees, with "
                           "their memory", cmd_devices)
    _add(d, "--config", metavar="PATH",
         help="TOML config whose [placement] memory settings apply (default: built-in)")
    _add(d, "--devices", metavar="SPEC",
         help="split the CPU first with cpu:N (default: the config's, auto)")
    _add(d, "--memory-limit-mb", type=_nonneg, metavar="MB",
         help="cap each GPU at MB MiB (default: the config's [placement] memory_limit_mb, 0)")

    s = command("server", "serve one task of a TensorFlow cluster", cmd_server)
    _add(s, "--cluster", metavar="FILE", help="cluster spec FILE.json (default: TF_CONFIG)")
    _add(s, "--task", required=True, metavar="JOB:I", help="the task to serve, e.g. worker:0")
    return p


def _refuse_inapplicable(args) -> None:
    """Options that do not apply to the chosen mode are refused, with the reason."""
    mode = getattr(args, "mode", None)
    if args.command in ("train", "predict", "search") and mode == "in-graph" and args.jobs:
        raise UsageError("--jobs applies to --mode between-graph only: in-graph replication "
                         "runs every member in one process")
    if args.command == "train" and mode == "in-graph" and args.prepare_only:
        raise UsageError("--prepare-only is for --mode between-graph: it writes the run "
                         "directory for clients started by hand or by a scheduler")
    if args.command == "predict" and mode == "between-graph" and args.devices:
        raise UsageError("--devices applies to --mode in-graph only: between-graph clients "
                         "predict on the members' own devices (or --cluster's)")
    if args.command == "predict" and mode == "between-graph" and args.replicas:
        raise UsageError("--replicas applies to --mode in-graph only: a between-graph client "
                         "runs one graph per member on its own device")
    if args.command == "predict" and args.replicas and args.replicas != "auto" and \
            not (args.replicas.isdigit() and int(args.replicas) >= 1):
        raise UsageError(f"Expected --replicas to be auto or a positive integer. "
                         f"Received: {args.replicas!r}")
    if args.command == "client" and not args.predict:
        for flag in ("out", "device", "cluster", "batch_size", "target"):
            if getattr(args, flag):
                raise UsageError(f"client: --{flag.replace('_', '-')} applies with --predict "
                                 "only")


def _parse(argv: list[str] | None):
    """Parse `argv`; unknown options are refused with a suggestion from the command's own."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        return parser, None
    if extra:
        raise unknown_options(args.command, extra, parser.commands[args.command])
    return parser, args


def _interrupted_line(exc, args) -> str:
    """The one line printed on SIGINT/SIGTERM: where training stopped and how to continue."""
    from pathlib import Path as _Path

    at = f" at epoch {exc.epoch} of {exc.epochs}" if exc.epoch else ""
    run_dir = getattr(exc, "run_dir", None) or getattr(args, "run_dir", None)
    if getattr(exc, "resume", None):
        return f"interrupted{at}; continue with: {exc.resume}"
    if args.command == "train" and run_dir and (_Path(run_dir) / "manifest.json").is_file():
        return f"interrupted{at}; continue with: ensemble train --resume --run-dir {run_dir}"
    return f"interrupted ({exc})"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting."""
    from ensemble import interrupt
    from pipelines.processes import die_with_parent

    die_with_parent()
    args = None
    try:
        with interrupt.handling_signals():
            parser, args = _parse(argv)
            if args is None:  # `ensemble` alone: the commands, one line each, and examples
                parser.print_help()
                return 0
            if args.command != "train":  # train: once its mode is known (--resume: the run's)
                _refuse_inapplicable(args)
            if args.command in ("client", "server", "devices"):
                _import_tensorflow_quietly()
            return args.func(args)
    except interrupt.Interrupted as exc:
        print(_interrupted_line(exc, args), file=sys.stderr, flush=True)
        return exc.exit_status
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
