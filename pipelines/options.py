"""The `ensemble` command line's options: the parser of every command (help with defaults,
examples), and the refusals of options that do not apply to the chosen mode.

`pipelines.training_options` holds the options of the commands that train; `pipelines.cli` the
commands themselves; `pipelines.guide` the parser's behaviour (no abbreviations, did-you-mean,
help formatting).
"""

from __future__ import annotations

import argparse
from typing import Callable

from ensemble.config import bounds as B
from ensemble.core.errors import UsageError
from pipelines.guide import HelpFormatter as _HelpFormatter
from pipelines.guide import Parser as _Parser
from pipelines.guide import add as _add
from pipelines.guide import nonneg as _nonneg
from pipelines.guide import positive as _positive
from pipelines.guide import unknown_options
from pipelines import training_options
from pipelines.option_values import (BATCH_ROWS, DEVICES, JOBS, MODE_METAVAR, bounded, mode,
                                     replicas)


def _trust_builder(parser) -> None:
    _add(parser, "--trust-builder", action="store_true",
         help="accept a builder file whose sha256 changed since training and record the new "
              "one in the manifest (by default such a run is refused and the file not "
              "imported)")


DESCRIPTION = """\
ensemble: train a deep ensemble of neural networks with in-graph or between-graph replication,
evaluate it against its members, and measure which replication mode is faster on this machine."""

EXAMPLES = """\
examples:
  ensemble train --data penguins.csv --target species --impute median
  ensemble train --learning-rate 0.01 --set model.params.hidden=[64,32] --set members.count=2
  ensemble compare --data digits --members 4 --epochs 5 --repeats 3

'ensemble COMMAND --help' shows a command's options."""


def _predict(p) -> None:
    """`ensemble predict`'s options."""
    _add(p, "--run", required=True, metavar="PATH", help="the run directory to predict with")
    _add(p, "--data", required=True, metavar="SOURCE",
         help="built-in data set name, a .csv/.parquet file or folder of them (columns "
              "matched by name), a .npz file, or a folder of images")
    _add(p, "--target", metavar="COL",
         help="label column for y_true, which the input must then hold (default: the "
              "run's, used when present)")
    _add(p, "--out", required=True, metavar="FILE.parquet|FILE.csv",
         help="where the predictions go (Parquet, or CSV by the name's ending)")
    _add(p, "--layout", choices=("wide", "long"), default="wide",
         help="wide: one row per input (its non-feature columns such as an id, then the "
              "--aggregator's prediction and probabilities); long: one row per model "
              "and input (every member and aggregator)")
    _add(p, "--aggregator", metavar="NAME",
         help="aggregator of the wide layout (default: the run's best on validation NLL)")
    _add(p, "--mode", type=mode, metavar=MODE_METAVAR, default="in-graph",
         help="in-graph: one process; between-graph: one client per member")
    _add(p, "--devices", metavar="SPEC", type=DEVICES,
         help="in-graph only: devices to predict on (default: auto)")
    _add(p, "--jobs", type=JOBS, metavar="N",
         help="between-graph only: concurrent client processes (default: as many as allowed)")
    _add(p, "--cluster", metavar="FILE", help="cluster spec FILE.json to predict on "
                                              "(default: none)")
    _add(p, "--batch-size", type=BATCH_ROWS, metavar="ROWS", default=None,
         help="rows read, predicted and written at a time, so memory stays flat (default: "
              "65536, fewer for wide rows: at most 64 MB of input values a batch)")
    _add(p, "--replicas", metavar="auto|N", type=replicas("--replicas"),
         help="in-graph only: replicas of each member over the devices, each batch's rows "
              "split across them; auto: devices // members (default: auto)")
    _add(p, "--quiet", action="store_true", help="no progress and no output path on stdout "
         "(notices still go to stderr)")
    _add(p, "--strict-columns", action="store_true",
         help="refuse columns the run was not trained on (by default they are ignored, "
              "named in a notice)")
    _trust_builder(p)
    _add(p, "--json", action="store_true",
         help="print a machine-readable report (rows, timings, peak memory) as the last line")


def _export(p) -> None:
    """`ensemble export`'s options."""
    _add(p, "--run", required=True, metavar="PATH", help="the run directory to export")
    _add(p, "--out", required=True, metavar="DIR", help="model base folder of TF Serving")
    _add(p, "--version", type=bounded(B.check_int, "--version", 1, B.VERSION_MAX),
         metavar="N",
         help="version folder DIR/N (default: 1 + the largest version in DIR)")
    _add(p, "--aggregator", metavar="NAME",
         help="aggregator of the serving_default signature (default: the run's best on "
              "validation NLL); "
              "every aggregator of the run gets its own signature too")
    _trust_builder(p)


def _serve(p) -> None:
    """`ensemble serve`'s options."""
    _add(p, "--model", required=True, metavar="DIR",
         help="export folder DIR/<version>/ as `ensemble export` writes it; the newest "
              "version is served and new ones are picked up while serving")
    _add(p, "--name", metavar="NAME", help="model name in the URLs (default: DIR's base name)")
    _add(p, "--host", default="127.0.0.1", metavar="ADDR",
         help="address to listen on (0.0.0.0: every interface)")
    _add(p, "--port", type=bounded(B.check_int, "--port", 0, B.PORT_MAX), default=8501,
         metavar="N",
         help="TCP port (0: any free port, printed on stderr)")
    _add(p, "--replicas", default="auto", metavar="auto|N", type=replicas("--replicas"),
         help="copies of the model, one per device; auto: every GPU, else the CPU split "
              "into logical devices (at most the cores)")
    _add(p, "--devices", metavar="SPEC", type=DEVICES,
         help="auto, cpu:N or device names such as /GPU:0,/GPU:1 (default: auto)")
    _add(p, "--max-batch-size", type=bounded(B.check_int, "--max-batch-size", 1,
                                               B.SERVE_BATCH_MAX), default=64, metavar="N",
         help="dynamic batching: requests merged into calls of at most N rows (1: off)")
    _add(p, "--batch-timeout-ms", type=bounded(B.check_float, "--batch-timeout-ms", 0.0,
                                                 B.BATCH_TIMEOUT_MS_MAX),
         default=0.0, metavar="MS",
         help="how long a batch waits for more requests when a replica is idle (0: only "
              "what is queued while every replica is busy)")
    _add(p, "--max-request-bytes", type=bounded(B.check_int, "--max-request-bytes", 1,
                                                  B.REQUEST_BYTES_MAX),
         default=B.REQUEST_BYTES_DEFAULT, metavar="BYTES",
         help="larger request bodies are answered 413 before they are read")
    _add(p, "--max-request-rows", type=bounded(B.check_int, "--max-request-rows", 1,
                                                 B.REQUEST_ROWS_MAX),
         default=B.REQUEST_ROWS_DEFAULT, metavar="N",
         help="requests of more rows are answered 400 before their arrays are built")
    _add(p, "--verbose", action="store_true", help="one access-log line per request (stderr)")


def _evaluate(p) -> None:
    """`ensemble evaluate`'s options."""
    _add(p, "--run", metavar="PATH", help="a run directory (default: none; or --predictions)")
    _add(p, "--predictions", metavar="FILE.parquet",
         help="a predictions Parquet file (default: the run's)")
    _add(p, "--data", metavar="SOURCE",
         help="labelled new data: predict it with --run's members and score the predictions "
              "in one command (the run's target column holds the labels; default: none)")
    _add(p, "--target", metavar="COL",
         help="with --data, the label column (default: the run's)")
    _add(p, "--plots", action="store_true",
         help="also write PNGs beside the metrics: reliability, ensemble size, members, "
              "confidence (regression: PIT, coverage, error against std, confidence); with "
              "--ood or --shift, their ood_entropy.png or shift.png instead (needs matplotlib)")
    _add(p, "--ood", metavar="SOURCE",
         help="out-of-distribution inputs (a table, .npz or image folder the run takes, or a "
              "long-layout predictions .parquet): AUROC/AUPR of telling the test split from "
              "them, written to ood.parquet in the run (default: none)")
    _add(p, "--shift", action="store_true",
         help="the test split under corruptions at severities 1-5, written to shift.parquet "
              "in the run")


def _aggregate(p) -> None:
    """`ensemble aggregate`'s options."""
    _add(p, "--run", required=True, metavar="PATH", help="a run directory of either mode")
    _add(p, "--aggregators", metavar="LIST",
         help="comma-separated names: mean, vote, geometric, weighted, greedy, stacking, "
              "temperature (classification); mean, weighted, greedy, std-scaling "
              "(regression); fitted ones fit on the validation split (default: the run's)")
    _add(p, "--min-members", type=_positive, metavar="K",
         help="aggregate a partial ensemble of at least K members (default: all members)")
    _trust_builder(p)


def _devices(p) -> None:
    """`ensemble devices`'s options."""
    _add(p, "--config", metavar="PATH",
         help="TOML config whose [placement] memory settings apply (default: built-in)")
    _add(p, "--devices", metavar="SPEC", type=DEVICES,
         help="split the CPU first with cpu:N (default: the config's, auto: the devices "
              "train --devices auto uses)")
    _add(p, "--memory-limit-mb", type=_nonneg, metavar="MB",
         help="cap each GPU at MB MiB (default: the config's [placement] memory_limit_mb, 0)")


def _server(p) -> None:
    """`ensemble server`'s options."""
    _add(p, "--cluster", metavar="FILE", help="cluster spec FILE.json (default: TF_CONFIG)")
    _add(p, "--task", required=True, metavar="JOB:I", help="the task to serve, e.g. worker:0")


COMMAND_OPTIONS = (  # (name, one-line help, the builder of its options), in the help's order
    ("train", "train an ensemble and write a run directory", training_options.train),
    ("predict", "predict a data set with a trained run", _predict),
    ("export", "write a run as a SavedModel for TensorFlow Serving (DIR/<version>/)", _export),
    ("serve", "serve an export folder with TF Serving's REST API (predict, "
     "status, metadata, Prometheus metrics)", _serve),
    ("evaluate", "print the ensemble against its members, validation and test", _evaluate),
    ("aggregate", "recompute a run's ensemble from its stored member predictions "
     "(no TensorFlow)", _aggregate),
    ("compare", "train and predict in both modes; measure which is faster here",
     training_options.compare),
    ("search", "hyperparameter ensemble: sample candidates from the config's "
     "[search] space, train them as one run, keep a greedy selection",
     training_options.search),
    ("client", "train (or predict) members of a prepared between-graph run",
     training_options.client),
    ("devices", "list the physical and logical devices TensorFlow sees, with "
     "their memory", _devices),
    ("server", "serve one task of a TensorFlow cluster", _server),
)


def _version() -> str:
    """The installed distribution's version (`pyproject.toml`), or `unknown` from a bare
    source tree."""
    from importlib import metadata

    try:
        return metadata.version("ensemble-replication")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser(commands: dict[str, Callable]) -> argparse.ArgumentParser:
    """The `ensemble` parser; `commands` maps each command name to its function (`cli.cmd_*`).

    Each command's options come from its own builder (`COMMAND_OPTIONS`); `parser.commands`
    maps a command's name to its sub-parser.
    """
    p = _Parser(prog="ensemble", description=DESCRIPTION, epilog=EXAMPLES,
                formatter_class=_HelpFormatter)
    p.add_argument("--version", action="version", version=f"ensemble {_version()}")
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND",
                           parser_class=_Parser)
    p.commands = sub.choices
    for name, text, add_options in COMMAND_OPTIONS:
        cp = sub.add_parser(name, help=text, description=f"ensemble {name}: {text}.",
                            formatter_class=_HelpFormatter)
        cp.set_defaults(func=commands[name])
        add_options(cp)
    return p


def parse(argv: list[str] | None, commands: dict[str, Callable]):
    """Parse `argv`; unknown options are refused with a suggestion from the command's own.

    Returns:
        (the parser, the parsed arguments; None when no command was given).
    """
    parser = build_parser(commands)
    args, extra = parser.parse_known_args(argv)
    if args.command is None and extra:  # `ensemble --bogus`: not the help, and not status 0
        raise UsageError(f"Unknown option {extra[0]!r}; expected a command first: ensemble "
                         "COMMAND [options] (`ensemble --help` lists the commands).")
    if args.command is None:
        return parser, None
    if extra:
        error = unknown_options(args.command, extra, parser.commands[args.command])
        first = next((x for x in extra if x.startswith("--")), None)
        if first and "--set" in parser.commands[args.command]._option_string_actions \
                and "did you mean" not in str(error):
            from pipelines.flags import key_hint

            error = UsageError(f"{error}{key_hint(first)}")
        raise error
    return parser, args
