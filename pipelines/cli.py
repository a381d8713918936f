"""The `ensemble` command line: one small function per subcommand, `main(argv) -> int`.

Exit status: 0 success, 2 bad input or usage (one line on stderr naming the bad value and what
was expected, no traceback), 1 an internal failure, 130 / 143 interrupted by SIGINT / SIGTERM
(training stops after its current call, keeps its newest checkpoint and says how to resume).
Heavy modules are imported inside the subcommands so that a between-graph client starts lean.
The options of every command are in `pipelines.options`.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from ensemble.core import resources  # noqa: E402

resources.bound_threads()  # before NumPy loads: OpenBLAS starts its threads when it loads

from ensemble.replication.devices import peak_rss_bytes  # noqa: E402
from ensemble.core.errors import ClientFailed, UsageError  # noqa: E402
from ensemble.core.notices import one_line  # noqa: E402
from ensemble.core.tfimport import import_tensorflow_quietly  # noqa: E402
from ensemble.replication.modes import PredictRequest  # noqa: E402
from ensemble.runs import builtin_modes  # noqa: E402
from pipelines.guide import (environment_line, failed_line, fault_line,  # noqa: E402
                            interrupted_line, refuse_inapplicable, report, search_resume,
                            uses_tensorflow)
from pipelines.options import parse  # noqa: E402
from pipelines.flags import load_config  # noqa: E402


def _cluster(args):
    from ensemble.replication.cluster import load_spec

    return load_spec(getattr(args, "cluster", None))


def cmd_train(args) -> int:
    from ensemble.core.notices import said_once

    with said_once():  # the early data check and the preparation resolve the same task
        return _train(args)


def _train(args) -> int:
    if args.resume:
        from ensemble.core.manifest import Manifest

        if not args.run_dir:
            raise UsageError("Expected --run-dir PATH of the run to continue with --resume.")
        manifest = Manifest.load(args.run_dir)
        args.mode = args.mode or manifest.mode
        cfg = load_config(args, base=manifest.config)
    else:
        cfg = load_config(args)
    args.mode = args.mode or "in-graph"
    refuse_inapplicable(args)
    if not args.resume:  # every data problem, in one message, before TensorFlow loads
        from ensemble.runs.prepare import check_data

        check_data(cfg)
    if builtin_modes.get(args.mode).launcher_loads_tensorflow or args.cluster or \
            os.environ.get("TF_CONFIG"):  # a launcher of clients leaves TensorFlow to them
        import_tensorflow_quietly()
    from ensemble.runs import api
    from ensemble.runs.train import default_run_dir

    verbosity = 0 if args.quiet else 2 if args.verbose else 1
    args.run_dir = args.run_dir or str(default_run_dir(cfg))  # a failure's hint names it
    trained = api.train(cfg, args.mode, args.run_dir, overwrite=args.overwrite,
                        resume=args.resume, jobs=args.jobs, cluster=_cluster(args),
                        prepare_only=args.prepare_only,
                        tensorboard=True if args.tensorboard else None,
                        log_device_placement=args.log_device_placement, verbosity=verbosity)
    run_dir = trained.path
    if args.prepare_only:
        print(f"prepared run directory: {run_dir}; now run, on any machine that sees it:")
        for m in trained.record.members:
            print(f"  ensemble client --run {run_dir} --member {m.index}")
        print(f"then: ensemble aggregate --run {run_dir}")
        return 0
    print(f"run directory: {run_dir}")
    if trained.config.training.tensorboard:
        print(f"tensorboard: tensorboard --logdir {run_dir / 'tensorboard'}")
    print(trained.summary())
    return 0


def cmd_search(args) -> int:
    from pipelines import flags, search

    if args.resume and not args.run_dir:
        raise UsageError("Expected --run-dir PATH of the search to continue with --resume.")
    plan = search.plan(args.config, args.candidates, args.select, args.stratify, overrides={
        "training.epochs": args.epochs, "placement.devices": args.devices,
        **flags.overrides(args)})
    if not args.resume:  # every space and data problem before TensorFlow loads
        from ensemble.runs.prepare import check_data

        check_data(plan.config)
    if builtin_modes.get(args.mode).launcher_loads_tensorflow:  # a client launcher: they load it
        import_tensorflow_quietly()
    from ensemble.runs import evaluate
    from ensemble.runs import train

    run_dir = Path(args.run_dir) if args.run_dir else train.default_run_dir(plan.config)
    args.run_dir = str(run_dir)  # an interruption's hint names it
    verbosity = 0 if args.quiet else 1
    from ensemble.core.notices import reworded

    resume = re.escape(f"`ensemble train --resume --run-dir {run_dir}") + r"[^`]*`"
    with reworded([(resume, f"`{search_resume(args, run_dir)}`".replace("\\", "\\\\"))]):
        search.run_search(plan, run_dir, search.SearchOptions(
            args.mode, resume=args.resume, overwrite=args.overwrite, jobs=args.jobs,
            verbosity=verbosity))
    print(f"run directory: {run_dir} (members.parquet: every candidate; predict applies the "
          "greedy selection)")
    print(evaluate.evaluate(run_dir)[1])
    return 0


def cmd_devices(args) -> int:
    from ensemble.config import schema
    from ensemble.replication import device_report, devices

    cfg = schema.load(args.config)
    spec = args.devices or cfg.placement.devices
    limit = cfg.placement.memory_limit_mb if args.memory_limit_mb is None else args.memory_limit_mb
    for text in devices.configure_gpus(cfg.placement.memory_growth, limit):
        print(f"notice: {text}", file=sys.stderr)
    kind, n = devices.parse(spec)
    if kind == "cpu":
        devices.split_cpu(n)
    used = devices.resolve(spec, cfg.members.count) if kind == "auto" else None  # as train's
    print(device_report.format_description(device_report.describe()))
    if used:
        print(f"--devices auto (for the config's {cfg.members.count} members) uses: "
              f"{', '.join(used)}")
    return 0


def _check_input_early(args) -> None:
    """Every problem of the input's columns and first batch in one message before TensorFlow
    loads (the run's own problems, damaged or unfinished, are left to the full check that
    follows)."""
    from ensemble.core import artifacts
    from ensemble.core.outputs import table_format
    from ensemble.data import kinds
    from ensemble.runs.predict import input_stream
    from ensemble.core.manifest import Manifest

    try:
        manifest = Manifest.load(Path(args.run))
        pre = kinds.read_preprocessing(Path(args.run) / artifacts.PREPROCESSING)
    except (UsageError, OSError):
        return
    stream = input_stream(manifest, pre, args.data, args.target, args.strict_columns,
                          args.batch_size)
    stream.check()
    if args.layout == "wide" and table_format(Path(args.out)) == "csv" and hasattr(
            stream, "check_csv_out"):  # a table's (images and arrays have no such columns)
        stream.check_csv_out(args.out)


def cmd_predict(args) -> int:
    from ensemble.core import runlock
    from ensemble.core.notices import said_once
    from pipelines.pipe import people_stream

    # the run is read as a whole under its shared lock (no aggregate rewrites it meanwhile);
    # said_once: the early check and the prediction read the same input
    with said_once(), people_stream(args.out), runlock.reading(Path(args.run)):
        return _predict(args)


def _predict(args) -> int:
    from ensemble.runs.predict import check_out

    check_out(Path(args.out))
    _check_input_early(args)
    mode = builtin_modes.get(args.mode)
    if mode.launcher_loads_tensorflow:  # a launcher of clients never loads TensorFlow
        import_tensorflow_quietly()

    ready = time.time()
    rec, measured = mode.predict(PredictRequest(
        Path(args.run), args.data, Path(args.out), args.target, args.devices or "auto",
        args.batch_size, args.cluster, _cluster(args), strict_columns=args.strict_columns,
        replicas=args.replicas or "auto", jobs=args.jobs, verbosity=0 if args.quiet else 1,
        layout=args.layout, trust_builder=args.trust_builder, aggregator=args.aggregator))
    if not args.quiet:  # the file is the answer: --quiet leaves stdout empty (or to --json)
        print(f"predictions: {args.out}")
    report({"out": args.out, "rows": rec["rows"], "ready_unix": ready,
            "seconds": rec["seconds"], "rows_per_second": rec["rows_per_second"],
            "members": rec["members"], "peak_rss_bytes": peak_rss_bytes(), **measured}, args)
    return 0


def cmd_export(args) -> int:
    from ensemble.runs.export import check_out_dir

    check_out_dir(Path(args.out))  # before TensorFlow loads
    import_tensorflow_quietly()
    from ensemble.runs.export import export_run

    path = export_run(Path(args.run), Path(args.out), args.version, args.aggregator,
                      trust_builder=args.trust_builder)
    print(f"SavedModel: {path} (TensorFlow Serving: --model_base_path={path.parent.resolve()})")
    return 0


def cmd_serve(args) -> int:
    from pipelines import serve

    serve.require_extra()  # one line naming the pip command, before TensorFlow loads
    import_tensorflow_quietly()
    return serve.run(args)


def cmd_compare(args) -> int:
    from pipelines import compare

    base = Path(args.run_dir) if args.run_dir else Path("artifacts") / "compare"
    table, _ = compare.compare(load_config(args), base, repeats=args.repeats,
                               overwrite=args.overwrite, cluster_file=args.cluster)
    print(compare.verdict(table))
    print(f"comparison: {base / 'comparison.parquet'} (summary), {base / 'runs.parquet'} "
          f"(every run)")
    if (base / "comparison.png").is_file():
        print(f"chart: {base / 'comparison.png'}")
    return 0


def cmd_evaluate(args) -> int:
    from ensemble.runs import evaluate

    preds = Path(args.predictions) if args.predictions else None
    if args.ood or args.shift:
        if not args.run or preds is not None:
            raise UsageError("Expected --ood/--shift with --run PATH (and no --predictions). "
                             f"Received: --run {args.run}, --predictions {args.predictions}")
        import_tensorflow_quietly()
        from ensemble.runs import evaluate_ood

        if args.ood:
            print(evaluate_ood.evaluate_ood(Path(args.run), args.ood, args.plots)[1])
        if args.shift:
            print(evaluate_ood.evaluate_shift(Path(args.run), args.plots)[1])
        return 0
    if getattr(args, "data", None):
        return _evaluate_data(args)
    print(evaluate.evaluate(Path(args.run) if args.run else None, preds, args.plots)[1])
    return 0


def _evaluate_data(args) -> int:
    """`ensemble evaluate --run RUN --data SOURCE`: predict the labelled `SOURCE` (long
    layout, in a temporary folder) and print its table; nothing is written in the run."""
    import tempfile

    from ensemble.runs import evaluate

    if not args.run or args.predictions or args.plots:
        raise UsageError("Expected --data with --run PATH (and neither --predictions nor "
                         f"--plots). Received: --run {args.run}, --predictions "
                         f"{args.predictions}, --plots {args.plots}")
    with tempfile.TemporaryDirectory(prefix="ensemble-evaluate-") as tmp:
        out = Path(tmp) / "predictions.parquet"
        argv = ["predict", "--run", args.run, "--data", args.data, "--layout", "long",
                "--out", str(out), "--quiet", *(["--target", args.target] if args.target
                                                else [])]
        status = main(argv)
        if status != 0:
            return status
        try:
            print(evaluate.evaluate(Path(args.run), out)[1])  # the run's best member
        except UsageError as exc:  # name the user's data, not the temporary predictions
            raise UsageError(str(exc).replace(str(out), args.data) + " Expected labelled rows: "
                             "the run's target column in the data, or --target COL.") from None
    return 0


def cmd_aggregate(args) -> int:
    from ensemble.runs import aggregate
    from ensemble.runs import evaluate
    from ensemble.core.manifest import Manifest

    names = aggregate.parse_aggregators(args.aggregators)
    mode = builtin_modes.get(Manifest.load(Path(args.run)).mode)
    aggregate.aggregate_run(Path(args.run), names, args.min_members,
                            trust_builder=args.trust_builder, member_files=mode.member_files)
    print(f"aggregated: {args.run}")
    if args.aggregators:
        print(evaluate.evaluate(Path(args.run))[1])
    report({"peak_rss_bytes": peak_rss_bytes()})
    return 0


def cmd_client(args) -> int:
    """`ensemble client`: the client process started by hand (`ensemble.replication.client`)."""
    from ensemble.replication import client
    from ensemble.replication.protocol import ClientRequest

    report(client.serve(ClientRequest(
        args.run, args.member, args.threads, args.progress, args.predict, args.out,
        args.device.split(",") if args.device else None, args.cluster, args.batch_size,
        args.target)))
    return 0


def cmd_server(args) -> int:
    from ensemble.replication import cluster

    spec = cluster.load_spec(args.cluster)
    if spec is None:
        raise UsageError("Expected --cluster FILE.json or TF_CONFIG. Received: neither.")
    return cluster.serve(spec, args.task)  # checks the address, then loads TensorFlow


COMMANDS = {  # command name -> its function (the parser is in pipelines.options)
    "train": cmd_train,
    "predict": cmd_predict,
    "export": cmd_export,
    "serve": cmd_serve,
    "evaluate": cmd_evaluate,
    "aggregate": cmd_aggregate,
    "compare": cmd_compare,
    "search": cmd_search,
    "client": cmd_client,
    "devices": cmd_devices,
    "server": cmd_server,
}


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting."""
    from ensemble.core import interrupt
    from ensemble.replication.processes import die_with_parent

    from ensemble.runs import api

    die_with_parent()
    args = None
    wording, api.CLI_WORDING = api.CLI_WORDING, True  # hints name flags, not train's arguments
    try:
        with interrupt.handling_signals():
            parser, args = parse(argv, COMMANDS)
            if args is None:  # `ensemble` alone: the commands, one line each, and examples
                parser.print_help()
                return 0
            args.argv = list(sys.argv[1:] if argv is None else map(str, argv))  # for hints
            if args.command != "train":  # train: once its mode is known (--resume: the run's)
                refuse_inapplicable(args)
            resources.check(args.command, uses_tensorflow(args))
            if args.command == "devices":  # server: once its address is checked; client: its own
                import_tensorflow_quietly()
            return args.func(args)
    except interrupt.Interrupted as exc:
        print(one_line(interrupted_line(exc, args)), file=sys.stderr, flush=True)
        return exc.exit_status
    except UsageError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        from ensemble.replication.cluster import ClusterError

        if isinstance(exc, (ClusterError, ClientFailed)):
            print(f"error: {one_line(failed_line(exc, args))}", file=sys.stderr, flush=True)
            return 1
        line = fault_line(exc, args)
        status = 1
        if line is None:
            line, status = environment_line(exc), 2
        if line is None:
            raise
        print(f"error: {one_line(line)}", file=sys.stderr, flush=True)
        return status
    finally:
        api.CLI_WORDING = wording  # `main` called in-process (tests, notebooks): undone


if __name__ == "__main__":
    from pipelines.process import run

    run(lambda: main)  # the exit status; a Ctrl-C before `main` handles signals: one line
