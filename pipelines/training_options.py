"""The options of the `ensemble` commands that train: `train`, `compare` (sharing the options
that override the config), `search`, and `client` (members of a prepared between-graph run).

`pipelines.options` builds the parser from them.
"""

from __future__ import annotations

from ensemble.config import bounds as B
from ensemble.tasks import TASKS
from pipelines.guide import add as _add
from pipelines.guide import nonneg as _nonneg
from pipelines.guide import positive as _positive
from pipelines.option_values import (BATCH_ROWS, DEVICES, JOBS, MODE_METAVAR, bounded,
                                     member_list, mode, replicas_value)
from pipelines.flags import add_options as add_flags

IMPUTE = ("error", "median", "most_frequent")


def _common_run_options(parser, what: str) -> None:
    """The options `train` and `compare` share (they override the config)."""
    _add(parser, "--config", metavar="PATH",
         help="TOML config; relative paths in it are read beside it "
              "(default: the built-in digits config, equal to configs/digits.toml)")
    _add(parser, "--data", metavar="SOURCE",
         help="digits, breast_cancer, wine, iris, diabetes (regression), digits_images, "
              "synthetic, a .csv/.parquet/.npz file, or a folder of images (one sub-folder "
              "per class) "
              "(default: the config's [data] source, digits)")
    _add(parser, "--target", metavar="COL",
         help="label column of a .csv/.parquet file (default: the config's, 'target')")
    _add(parser, "--drop", metavar="COL[,COL]",
         help="columns of a .csv/.parquet file to leave out (an id, a date, free text; "
              "default: the config's [data] drop, none)")
    _add(parser, "--categorical", metavar="COL[,COL]",
         help="columns to one-hot encode (default: the config's [data] categorical, auto: "
              "string, boolean and dictionary columns)")
    _add(parser, "--task", choices=("auto", *TASKS),
         help="what the target is: auto (text or few whole numbers: classification; "
              "non-integer numbers: regression), classification, regression "
              "(default: the config's, auto)")
    _add(parser, "--target-transform", choices=("none", "log1p", "log"),
         help="regression: members fit Gaussians on log1p(y) or log(y), reported as "
              "log-normals on the target's scale (default: the config's [training] "
              "target_transform, none)")
    _add(parser, "--threshold", metavar="auto:METRIC|T",
         help="binary classification: y_pred is the positive class where its probability "
              ">= T, a number in (0, 1), or the T that maximises METRIC (f1, "
              "balanced_accuracy, mcc, accuracy) on the validation split, per aggregator "
              "(default: the config's [training] threshold, none: the most probable class)")
    _add(parser, "--impute", choices=IMPUTE,
         help="missing feature values: refuse them, or fill them from the training split "
              "(default: the config's, error)")
    _add(parser, "--model", metavar="BUILDER",
         help="the members' network: mlp, cnn, package.module:function or "
              "path/to/file.py:function returning a keras.Model of logits (default: the "
              "config's [model] builder, mlp)")
    _add(parser, "--members", type=_positive, metavar="N",
         help=f"number of members {what} (default: the config's, 4)")
    _add(parser, "--epochs", type=_positive, metavar="N",
         help="training epochs of every member (default: the config's, auto: from the training rows)")
    _add(parser, "--devices", metavar="SPEC", type=DEVICES,
         help="auto, cpu:N (the CPU split into N logical devices, N <= "
              f"{B.LOGICAL_CPU_MAX}), or device names such as /GPU:0,/GPU:1 (default: the "
              "config's, auto)")
    _add(parser, "--cluster", metavar="FILE",
         help="TensorFlow cluster spec FILE.json (default: TF_CONFIG, if set)")
    _add(parser, "--engine", choices=("local", "ray"),
         help="where clients run: local (processes on this machine) or ray (a Ray cluster: "
              "members as Ray tasks, in-graph's TensorFlow servers as Ray actors) "
              "(default: the config's [placement] engine, local)")
    _add(parser, "--address", metavar="HOST:PORT",
         help="with --engine ray: the Ray cluster's head, or auto (default: the config's "
              "[placement] address, else RAY_ADDRESS, else a local Ray cluster)")
    add_flags(parser)


def train(p) -> None:
    """`ensemble train`'s options."""
    _common_run_options(p, "to train")
    _add(p, "--mode", type=mode, metavar=MODE_METAVAR,
         help="in-graph: one process, one graph holding every member; between-graph: one "
              "client process per device (default: in-graph; on --resume: the run's)")
    _add(p, "--seed", type=_nonneg, metavar="N", help="run seed (default: the config's, 0)")
    _add(p, "--jobs", type=JOBS, metavar="N",
         help="between-graph only: concurrent client processes "
              "(default: as many as members, GPUs or cores allow)")
    _add(p, "--replicas", type=replicas_value, metavar="auto|N",
         help="data parallelism: replicas of each member on distinct devices, each batch "
              "split across them and the gradients averaged; auto: devices // members "
              "(default: the config's [placement] replicas, 1)")
    _add(p, "--run-dir", metavar="PATH", help="output folder (default: artifacts/<run_id>)")
    _add(p, "--overwrite", action="store_true", help="replace a run already in --run-dir")
    _add(p, "--resume", action="store_true",
         help="continue the interrupted run in --run-dir from its checkpoints")
    _add(p, "--prepare-only", action="store_true",
         help="between-graph only: prepare the run for separately launched clients")
    _add(p, "--tensorboard", action="store_true",
         help="write tf.summary scalars under RUN/tensorboard/ (default: the config's "
              "[training] tensorboard, false)")
    _add(p, "--log-device-placement", action="store_true",
         help="print where every member's ops ran (TensorFlow's placement log, filtered to "
              "the members; kept under RUN/placement/)")
    loud = p.add_mutually_exclusive_group()
    _add(loud, "--quiet", action="store_true", help="no progress output")
    _add(loud, "--verbose", action="store_true",
         help="more progress: a line per member and epoch, lines within long epochs")


def compare(p) -> None:
    """`ensemble compare`'s options."""
    _common_run_options(p, "in each mode")
    _add(p, "--run-dir", metavar="PATH", help="output folder (default: artifacts/compare)")
    _add(p, "--repeats", type=bounded(B.check_int, "--repeats", 1, 1000), metavar="N",
         default=3,
         help="runs of each phase of each mode, order alternated")
    _add(p, "--overwrite", action="store_true", help="replace an existing comparison folder")


def search(p) -> None:
    """`ensemble search`'s options."""
    _add(p, "--config", required=True, metavar="PATH",
         help="TOML config with a [search] table (see configs/search.toml)")
    _add(p, "--candidates", required=True, type=_positive, metavar="N",
         help="candidate members sampled from the [search] space and trained")
    _add(p, "--select", required=True, type=_positive, metavar="K",
         help="greedy selection (on validation NLL, repeats allowed) of at most K candidates")
    _add(p, "--stratify", type=_nonneg, metavar="S", default=0,
         help="train every selected configuration again with S new seeds, then select again")
    _add(p, "--mode", type=mode, metavar=MODE_METAVAR, default="in-graph",
         help="in-graph: one graph holding every candidate; between-graph: client processes")
    _add(p, "--epochs", type=_positive, metavar="N",
         help="training epochs of every candidate (default: the config's)")
    _add(p, "--devices", metavar="SPEC", type=DEVICES,
         help="auto, cpu:N or device names (default: the config's)")
    _add(p, "--jobs", type=JOBS, metavar="N",
         help="between-graph only: concurrent client processes (default: as many as allowed)")
    _add(p, "--run-dir", metavar="PATH", help="output folder (default: artifacts/<run_id>)")
    _add(p, "--overwrite", action="store_true", help="replace a run already in --run-dir")
    _add(p, "--resume", action="store_true",
         help="continue an interrupted search in --run-dir: only unfinished candidates train")
    _add(p, "--quiet", action="store_true", help="no progress output")
    add_flags(p)


def client(p) -> None:
    """`ensemble client`'s options."""
    _add(p, "--run", required=True, metavar="PATH", help="the prepared run directory")
    _add(p, "--member", required=True, type=member_list, metavar="I[,J,...]",
         help="member index, or a queue of members trained one after another")
    _add(p, "--progress", choices=("log", "report", "none"), default="log",
         help="log: lines on stdout; report: machine-readable lines on stderr for a launcher")
    _add(p, "--threads", type=bounded(B.check_int, "--threads", 1, B.JOBS_MAX), metavar="N",
         help="TensorFlow inter-op threads, and intra-op ones when the run's "
         "training.intra_op_threads is 0 (default: TensorFlow's)")
    _add(p, "--predict", metavar="X.npz|SOURCE",
         help="predict this input instead of training: scaled X.npz, or a data source "
              "streamed in batches (default: train)")
    _add(p, "--batch-size", type=BATCH_ROWS, metavar="ROWS",
         help="with --predict SOURCE: rows per batch (default: 65536)")
    _add(p, "--target", metavar="COL", help="with --predict SOURCE: label column "
                                           "(default: the run's)")
    _add(p, "--out", metavar="FILE.parquet|DIR",
         help="with --predict: the members' predictions, a .parquet file (one member, a "
              "scaled .npz) or a folder of member-<i>.parquet files (default: none)")
    _add(p, "--device", metavar="NAME[,NAME...]",
         help="with --predict: run the members here, one device per member "
              "(default: their training devices)")
    _add(p, "--cluster", metavar="FILE", help="with --predict: cluster spec FILE.json "
                                             "(default: none)")
