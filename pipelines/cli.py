"""The `ensemble` command line: one small function per subcommand, `main(argv) -> int`.

Exit status: 0 success, 2 bad input or usage (one line on stderr naming the bad value and what
was expected, no traceback), 1 an internal failure, 130 / 143 interrupted by SIGINT / SIGTERM
(training stops after its current call, keeps its newest checkpoint and says how to resume).
Heavy modules are imported inside the subcommands so that a between-graph client starts lean.
The options of every command are in `pipelines.options`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from ensemble.devices import peak_rss_bytes  # noqa: E402
from ensemble.errors import UsageError  # noqa: E402
from ensemble.tfimport import import_tensorflow_quietly  # noqa: E402
from pipelines.guide import report  # noqa: E402
from pipelines.options import parse, refuse_inapplicable  # noqa: E402


def _columns(text: str | None) -> list[str] | None:
    """`--drop a,b` / `--categorical a,b` as a list of names (None when not given)."""
    if text is None:
        return None
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise UsageError(f"Expected COL[,COL...] column names. Received: {text!r}")
    return names


def _load_config(args, base: dict | None = None):
    """The config file (or `base`) with the command's flags applied; `cpu:N` beyond the member
    count is capped to it with a notice (the extra logical devices would stay idle)."""
    import dataclasses

    from ensemble import config

    cfg = config.load(args.config, base=base, overrides={
        "data.source": args.data, "data.target": args.target, "members.count": args.members,
        "model.builder": getattr(args, "model", None),
        "training.epochs": getattr(args, "epochs", None), "training.seed": getattr(args, "seed", None),
        "placement.devices": args.devices, "data.impute": getattr(args, "impute", None),
        "data.drop": _columns(getattr(args, "drop", None)),
        "data.categorical": _columns(getattr(args, "categorical", None)),
        "data.task": getattr(args, "task", None),
        "placement.replicas": getattr(args, "replicas", None) if args.command == "train"
        else None})
    spec, n = cfg.placement.devices.strip(), cfg.members.count
    if isinstance(cfg.placement.replicas, int):  # replicas use more devices (issue #24)
        n *= cfg.placement.replicas
    elif cfg.placement.replicas == "auto":
        n = float("inf")
    if spec.startswith("cpu:") and spec[4:].isdigit() and int(spec[4:]) > n:
        from ensemble.data import notice

        what = "members" if n == cfg.members.count else "members' replicas"
        notice(f"--devices {spec} gives more logical devices than the {n} {what}; "
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
    refuse_inapplicable(args)
    if not args.resume:  # every data problem, in one message, before TensorFlow loads
        from ensemble import data

        data.load(cfg.data)
    if args.mode == "in-graph" or args.cluster or os.environ.get("TF_CONFIG"):  # not a
        import_tensorflow_quietly()  # between-graph launcher: its clients load TensorFlow
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
        import_tensorflow_quietly()
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
    from ensemble.stream import input_stream

    try:
        manifest = artifacts.read_manifest(Path(args.run))
        pre = Preprocessing.read(Path(args.run) / artifacts.PREPROCESSING)
    except (UsageError, OSError):
        return
    target = args.target or manifest.get("dataset", {}).get("target", "target")
    input_stream(pre, args.data, target, args.strict_columns, args.batch_size).check()


def cmd_predict(args) -> int:
    from pipelines.predict import check_out

    check_out(Path(args.out))
    _check_input_early(args)
    if args.mode == "in-graph":  # a between-graph launcher never loads TensorFlow
        import_tensorflow_quietly()
    from pipelines import predict

    ready, measured = time.time(), {}
    verbosity = 0 if args.quiet else 1
    if args.mode == "in-graph":
        rec = predict.predict_in_graph(Path(args.run), args.data, Path(args.out), args.target,
                                       args.devices or "auto", args.batch_size,
                                       cluster=_cluster(args), strict_columns=args.strict_columns,
                                       replicas=args.replicas or "auto",
                                       verbosity=verbosity, layout=args.layout)
    else:
        from pipelines import between

        rec, measured = between.predict_between_graph(
            Path(args.run), args.data, Path(args.out), args.target, jobs=args.jobs,
            cluster_file=args.cluster, strict_columns=args.strict_columns,
            batch_size=args.batch_size, verbosity=verbosity, layout=args.layout)
    print(f"predictions: {args.out}")
    report({"out": args.out, "rows": rec["rows"], "ready_unix": ready,
            "seconds": rec["seconds"], "rows_per_second": rec["rows_per_second"],
            "members": rec["members"], "peak_rss_bytes": peak_rss_bytes(), **measured}, args)
    return 0


def cmd_export(args) -> int:
    import_tensorflow_quietly()
    from ensemble.export import export_run

    path = export_run(Path(args.run), Path(args.out), args.version, args.aggregator)
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


def cmd_client(args) -> int:
    from ensemble import between_graph, interrupt, progress

    ready = time.time()  # TensorFlow is imported (main) and the arguments are parsed
    start = time.perf_counter()
    steady: dict = {}  # training: member -> its steady-state rate (`training.SteadyState`)
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
        from ensemble import artifacts
        from ensemble.training import SteadyState

        m = artifacts.read_manifest(Path(args.run))

        def callbacks(index: int):
            steady[index] = SteadyState(m["config"]["training"]["batch_size"],
                                        m["dataset"]["rows"]["train"])
            if args.progress == "report":
                return [progress.ReportProgress([index]), steady[index]]
            if args.progress == "log":
                return [progress.LogProgress(sys.stdout, prefix=f"member {index}: "),
                        steady[index]]
            return [steady[index]]

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
            "steady": {str(i): [st.rows, st.seconds] for i, st in steady.items()},
            "work_seconds": time.perf_counter() - start, "peak_rss_bytes": peak_rss_bytes(),
            "tensorflow_build": build_info()})
    return 0


def cmd_server(args) -> int:
    from ensemble import cluster

    spec = cluster.load_spec(args.cluster)
    if spec is None:
        raise UsageError("server: expected --cluster FILE.json or TF_CONFIG")
    return cluster.serve(spec, args.task)


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


def _fault_line(exc: Exception, args) -> str | None:
    """The one line for a resource fault (full disk, quota, read-only, file-size limit), with
    the run's state when it was training; None for any other exception."""
    from ensemble import artifacts, faults

    line = faults.describe(exc)
    run_dir = getattr(args, "run_dir", None) or getattr(args, "run", None)
    if line is None or getattr(args, "command", None) not in ("train", "aggregate", "search") \
            or not run_dir:
        return line
    try:
        status = artifacts.read_manifest(run_dir).get("status")
    except Exception:  # noqa: BLE001 (no manifest: nothing was kept)
        return line
    if status == "failed":
        again = (f"ensemble aggregate --run {run_dir}" if args.command == "aggregate"
                 else f"ensemble train --resume --run-dir {run_dir}")
        line += (f"; run {run_dir} marked failed (completed files kept): free space, then "
                 f"continue with: {again}")
    return line


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting."""
    from ensemble import interrupt
    from pipelines.processes import die_with_parent

    die_with_parent()
    args = None
    try:
        with interrupt.handling_signals():
            parser, args = parse(argv, COMMANDS)
            if args is None:  # `ensemble` alone: the commands, one line each, and examples
                parser.print_help()
                return 0
            if args.command != "train":  # train: once its mode is known (--resume: the run's)
                refuse_inapplicable(args)
            if args.command in ("client", "server", "devices"):
                import_tensorflow_quietly()
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
        line = _fault_line(exc, args)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr, flush=True)
        return 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
