"""The Python API for notebooks and scripts: `train(config, mode=...) -> Run`, `load_run(path)`.

    import ensemble
    run = ensemble.train({"members": {"count": 4}, "training": {"epochs": 5}}, mode="in-graph")
    run.metrics                       # pandas DataFrame: one row per model and split
    run.predict(df)                   # pandas DataFrame: one row per input, as `ensemble predict`
    ensemble.load_run(run.path).evaluate()

`ensemble train` is a thin shell over `train` (it parses flags, checks the data before TensorFlow
loads and prints), so the notebook and the command line run the same code.

The module also turns what a notebook passes into the run's inputs: a `Config` from a `Config`,
nested tables, a TOML path, dotted-key overrides or a builder function (`as_config`), and
in-memory rows into a source the CLI's readers take (`as_source`). `ensemble.train`,
`ensemble.load_run` and `ensemble.Run` are lazy re-exports (module `__getattr__` in
`ensemble/__init__.py`), so `import ensemble` stays light (no TensorFlow) for clients and the
aggregator.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from ensemble.core import artifacts
from ensemble.config.schema import Config
from ensemble.core.errors import UsageError
from ensemble.core.notices import reworded
from ensemble.models.precision import check_hardware
from ensemble.replication import placement_log
from ensemble.replication import modes
from ensemble.replication.modes import Mode, PredictRequest, TrainRequest
from ensemble.runs import builtin_modes
from ensemble.core.manifest import Manifest


def to_pandas(table):
    """A pyarrow table as pandas with its Parquet dtypes: integer columns stay integers
    (nullable `Int32`/`Int64` when they hold nulls, e.g. `member` of ensemble rows), not
    float64 as `Table.to_pandas` makes them."""
    import pandas as pd
    import pyarrow as pa

    mapping = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(),
               pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype()}
    nullable = {f.name for f in table.schema if f.type in mapping
                and table.column(f.name).null_count}
    frame = table.to_pandas(types_mapper=mapping.get)
    for name in frame.columns:  # integer columns without nulls: plain numpy integers
        if name not in nullable and isinstance(frame[name].dtype, pd.core.arrays.integer.IntegerDtype):
            frame[name] = frame[name].astype(frame[name].dtype.numpy_dtype)
    return frame


def _notice(text: str) -> None:
    print(f"notice: {text}", file=sys.stderr, flush=True)


def train(config: Config | Mapping | str | Path | None = None, mode: Mode | str = "in-graph",
          run_dir: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None,
          overwrite: bool = False, resume: bool = False, jobs: int | None = None,
          cluster: dict | None = None, prepare_only: bool = False,
          tensorboard: bool | None = None, log_device_placement: bool = False,
          verbosity: int = 0, model=None) -> "Run":
    """Train an ensemble and write its run directory; the same path as `ensemble train`.

    Args:
        config: see `as_config`; `overrides` are dotted keys
            applied on top.
        mode: a mode object (`ensemble.replication.modes.Mode`), or the name of a built-in
            one: `in-graph` (one process, one graph) or `between-graph` (one client process
            per device, then the aggregator process), or a `module:Class` spec of a mode class
            (`ensemble.runs.builtin_modes.get`).
        run_dir: output folder (default `artifacts/<run_id>`).
        resume: continue the interrupted run in `run_dir` (its config is the base).
        jobs, prepare_only: between-graph only (see `ensemble train --help`).
        tensorboard: write `RUN/tensorboard/` scalars (None: the config's
            `training.tensorboard`).
        log_device_placement: print where every member's ops ran (`ensemble.replication.placement_log`).
        verbosity: 0 quiet (the default here), 1 progress lines, 2 more.
        model: the members' builder, overriding the config's `[model] builder`: a name
            (`"cnn"`, `"package.module:function"`, `"path/file.py:function"`) or the function
            itself (`build(input_shape, n_outputs, *, seed, **params) -> keras.Model` of
            logits); between-graph needs one that imports by name (module level).

    Returns:
        The `Run` (completed; or only prepared with `prepare_only`).

    Raises:
        UsageError: bad config, data, mode or run directory.
    """
    from ensemble.replication import devices
    from ensemble.runs.train import default_run_dir

    ready = time.time()  # the process is ready to work (`record_process`)
    strategy = builtin_modes.get(mode)
    run_dir = None if run_dir is None else Path(run_dir).expanduser()
    cfg = train_config(config, overrides, resume, run_dir, tensorboard)
    if model is not None:
        cfg = as_config(cfg, {"model.builder": builder_spec(model, strategy)})
    for text in devices.configure_gpus(cfg.placement.memory_growth, cfg.placement.memory_limit_mb):
        _notice(text)
    slow = check_hardware(cfg.training.precision, devices.gpu_possible())
    if slow:
        _notice(slow)
    run_dir = run_dir if run_dir is not None else default_run_dir(cfg)
    for option, given in (("prepare_only", prepare_only), ("jobs", jobs)):
        reason = strategy.refusal("train", [option] if given else [])
        if reason:
            raise UsageError(reason.replace("--prepare-only", "prepare_only")
                             .replace("--jobs", "jobs").replace("--mode ", "mode "))
    request = TrainRequest(cfg, run_dir, overwrite, resume, jobs, cluster, prepare_only,
                                 verbosity)
    with placement_log.logging(run_dir, strategy, log_device_placement and not prepare_only), \
            reworded([] if CLI_WORDING else API_WORDING):
        manifest = strategy.train(request)
    if prepare_only:
        return Run(run_dir)
    return Run(run_dir, record_process(run_dir, ready, manifest))


def record_process(run_dir: str | Path, ready_unix: float, known: Manifest | None = None
                   ) -> Manifest:
    """Record, under the manifest lock, the training process's `process_ready_unix` (when it
    was ready to work: `time.time()`, seconds) and `process_peak_rss_bytes` (its peak resident
    memory so far, bytes) in `timings`; `benchmarks.benchmark` and `compare` read them.
    `known`: the manifest the mode returned, used when this process wrote the file
    (`Manifest.update`). Returns the manifest as written."""
    from ensemble.replication.devices import peak_rss_bytes

    peak = peak_rss_bytes()
    return Manifest.update(run_dir, lambda m: m.timings.update(
        process_ready_unix=ready_unix, process_peak_rss_bytes=peak),
        known if isinstance(known, Manifest) else None)


CLI_WORDING = False  # the `ensemble` command sets it: its hints name its own flags
# the run directory's hints (`prepare.holds_run`) in `train`'s own argument names
API_WORDING = [(r"`ensemble train --resume --run-dir ([^`]+)`",
                r"`ensemble.train(resume=True, run_dir='\1')`"),
               (r"pass --overwrite", "pass overwrite=True"),
               (r"another --run-dir", "another run_dir")]


# the config of `train`: from what a notebook passes (a Config, nested tables, a TOML path,
# dotted-key overrides, a builder function or name)

def as_config(config: Config | Mapping | str | Path | None = None,
              overrides: Mapping[str, Any] | None = None) -> Config:
    """A `Config` from a `Config`, nested tables (`{"members": {"count": 4}}`, the TOML
    layout), a TOML path, or None (the defaults), with dotted-key `overrides` applied
    (`{"training.epochs": 2}`).

    Raises:
        UsageError: unknown key, wrong type or value (names the key).
    """
    from ensemble.config import schema

    if isinstance(config, Config):
        return schema.load(base=config.to_dict(), overrides=dict(overrides or {}))
    if isinstance(config, Mapping):
        return schema.load(base=_builder_names(dict(config)), overrides=dict(overrides or {}))
    if config is None or isinstance(config, (str, Path)):
        return schema.load(config, overrides=dict(overrides or {}))
    raise UsageError(f"Expected `config` to be a Config, a dict of tables or a TOML path. "
                     f"Received: config={config!r}")


def _builder_names(tables: dict) -> dict:
    """`{"model": fn}` or `{"model": {"builder": fn}}`: the function's name
    (`builders.spec_of`); a Keras model instance is refused (each member needs its own)."""
    from ensemble.models import builders

    model = tables.get("model")
    if callable(model) and not isinstance(model, Mapping) or isinstance(model, Mapping) \
            and callable(model.get("builder")):
        fn = model if not isinstance(model, Mapping) else model["builder"]
        if type(fn).__name__ in ("Sequential", "Functional", "Model") or hasattr(fn, "layers"):
            raise UsageError("Expected `model` to be a builder function "
                             "build(input_shape, n_outputs, *, seed, **params) that returns a "
                             f"new keras.Model; received a model instance ({fn.name!r}): every "
                             "member needs its own, freshly initialised network.")
        params = dict(model.get("params", {})) if isinstance(model, Mapping) else {}
        tables = {**tables, "model": {"builder": builders.spec_of(fn), "params": params}}
    return tables


def train_config(config, overrides, resume: bool, run_dir, tensorboard) -> Config:
    """`train`'s resolved config: `config` (on resume, by default the run's own) with
    `overrides` and `tensorboard` applied.

    Raises:
        UsageError: resume without `run_dir`, or a bad config.
    """
    if resume:
        if run_dir is None:
            raise UsageError("Expected run_dir, the run to continue, with resume=True. "
                             "Received: run_dir=None.")
        cfg = as_config(config if config is not None else Manifest.load(run_dir).config,
                        overrides)
    else:
        cfg = as_config(config, overrides)
    if tensorboard is not None and cfg.training.tensorboard != bool(tensorboard):
        cfg = as_config(cfg, {"training.tensorboard": bool(tensorboard)})
    return cfg


def builder_spec(model, strategy: modes.Mode) -> str:
    """The builder name of `model` (a name or a function), checked importable by name when
    the mode's members train in processes of their own.

    Raises:
        UsageError: a function those processes cannot import.
    """
    from ensemble.models import builders

    spec = model if isinstance(model, str) else \
        _builder_names({"model": model})["model"]["builder"]
    if strategy.member_processes and not builders.importable(spec):
        raise UsageError(f"Mode {strategy.name} trains in client processes, which import the "
                         f"builder by name; {model!r} is not importable: define it at "
                         "module level, or pass 'package.module:function'.")
    return spec


def load_run(path: str | Path) -> "Run":
    """Open a run directory written by `train`, `ensemble train` or
    `DeepEnsembleClassifier.save`.

    Raises:
        UsageError: no manifest there.
    """
    return Run(path)


class Run:
    """A run directory: its manifest, tables, and prediction with its members.

    Attributes:
        path: the run directory.
        record: the typed manifest (`ensemble.core.manifest.Manifest`; re-read by `refresh`).
    """

    def __init__(self, path: str | Path, record: Manifest | None = None):
        """`record`: the run's manifest when the caller holds the one it last wrote (else
        read from `path`)."""
        self.path = Path(path).expanduser()  # `~/runs/x`, as a notebook user writes it
        self.record = record if record is not None else Manifest.load(self.path)

    def __repr__(self) -> str:
        return (f"Run({str(self.path)!r}, mode={self.mode!r}, status={self.status!r}, "
                f"members={len(self.record.members)})")

    @property
    def manifest(self) -> dict[str, Any]:
        """`manifest.json` as a dict (a deep copy of `record`'s JSON)."""
        return copy.deepcopy(self.record.to_dict())

    def refresh(self) -> "Run":
        """Re-read the manifest (after another process changed the run)."""
        self.record = Manifest.load(self.path)
        return self

    @property
    def mode(self) -> str:
        return self.record.mode

    @property
    def status(self) -> str:
        """`completed`, `running`, `interrupted`, `failed`, ... (`run.effective_status`)."""
        from ensemble.runs.run_status import effective_status

        return effective_status(self.record)

    @property
    def config(self) -> Config:
        """The run's resolved `Config`."""
        return as_config(self.record.config)

    @property
    def classes(self) -> list:
        return list(self.record.dataset.classes)

    @property
    def feature_names(self) -> list[str]:
        """The input columns a data set must have (before one-hot encoding)."""
        return list(self.record.dataset.columns or self.record.dataset.feature_names)

    def _table(self, name: str):
        return to_pandas(artifacts.read_parquet(self.path / name))

    @property
    def metrics(self):
        """`metrics.parquet` as a pandas DataFrame (computed by `evaluate` when missing)."""
        if not (self.path / artifacts.METRICS).is_file():
            return self.evaluate()
        return self._table(artifacts.METRICS)

    @property
    def history(self):
        """`history.parquet` as a pandas DataFrame: member, epoch, loss, val_loss, ..."""
        return self._table(artifacts.HISTORY)

    @property
    def predictions(self):
        """`predictions.parquet` (validation and test splits) as a pandas DataFrame."""
        return self._table(artifacts.PREDICTIONS)

    def evaluate(self):
        """Recompute the metrics from the run's predictions (and rewrite `metrics.parquet`).

        Returns:
            pandas DataFrame, one row per model and split (accuracy, nll, brier, ece, ...).
        """
        from ensemble.runs.evaluate import evaluate

        return to_pandas(evaluate(self.path)[0])

    def summary(self) -> str:
        """The table `ensemble evaluate` prints (ensemble against its members, per split, and
        accuracy against confidence) of the run's stored `metrics.parquet` and predictions
        (each checked against its recorded hash): the table this process computed as it wrote
        them, while the metrics file is unchanged, else read from the files
        (`evaluate.stored_table`)."""
        from ensemble.runs.evaluate import stored_table

        return stored_table(self.path, self.record)

    def predict(self, data, target: str | None = None, devices: str = "auto",
                layout: str = "wide"):
        """Predict rows with the run's members (in-graph, on this machine's `devices`).

        Args:
            data: a table run: a pandas DataFrame with the training columns (matched by name;
                extra columns ignored with a notice), or an ndarray `[n_rows, n_columns]` in
                the order of `feature_names`. A run trained on arrays (`.npz`, image folder,
                an estimator's n-d `fit`): an ndarray `[n_rows, *row_shape]`, `row_shape`
                being `record.dataset.input_shape` (images `[height, width, channels]` of
                raw pixels). Any run: a path as `ensemble predict --data` takes it (a table
                file, an `.npz` file, an image folder). See `as_source`.
            target: label column of `data` for `y_true`, which `data` must then hold
                (default: the run's target, used when present).
            layout: `wide` (`ensemble predict`'s default: one row per input, the input's
                non-feature columns such as an id first, then the first aggregator's
                prediction and probabilities or mean/std) or `long` (one row per model and
                input: `model`, `member`, `aggregator`, `row`, `y_pred`, `p_<class>`, ...).

        Returns:
            pandas DataFrame in that layout, integer columns with their Parquet dtypes
            (pandas' nullable `Int32`/`Int64` where a column has nulls).

        Raises:
            UsageError: missing columns, wrong column count, an array whose rows are not of
                the run's row shape (naming both shapes), or a run that is not completed.
        """
        from ensemble.runs.predict import predict_in_graph

        if layout not in ("wide", "long"):
            raise UsageError(f"Expected `layout` to be 'wide' or 'long'. Received: "
                             f"layout={layout!r}")
        from ensemble.core.tfimport import import_tensorflow_quietly

        import_tensorflow_quietly()
        with as_source(self, data) as (src, label), \
                tempfile.TemporaryDirectory(prefix="ensemble-api-") as tmp:
            out = Path(tmp) / "predictions.parquet"
            predict_in_graph(PredictRequest(self.path, src, out, target, devices,
                                                  layout=layout))
            return without_temporary_ids(to_pandas(artifacts.read_parquet(out)), label)

    def evaluate_ood(self, data, plots: bool = False):
        """Out-of-distribution detection (`ensemble evaluate --ood`): AUROC and AUPR of
        telling the run's test split from `data` per member, aggregator and score; writes
        `ood.parquet` in the run (and `ood_entropy.png` with `plots`).

        Args:
            data: a source the run takes (a path to a table, `.npz`, image folder, a built-in
                name, or a long-layout predictions `.parquet`), or a pandas DataFrame / an
                ndarray (`[n_rows, n_columns]`, or `[n_rows, *row_shape]` for an array run)
                as `predict` takes. Labels are not needed.

        Returns:
            pandas DataFrame: `ood.parquet` (model, member, aggregator, score, auroc, aupr,
            n_in, n_out, in_split, ood_source, ood_sha256), with its Parquet dtypes as
            `metrics` (`member` nullable `Int32`).

        Raises:
            UsageError: a run that is not completed, or data it cannot read.
        """
        from ensemble.core.tfimport import import_tensorflow_quietly
        from ensemble.runs.evaluate_ood import evaluate_ood

        import_tensorflow_quietly()  # the members are loaded: no C++ banners in the notebook
        if isinstance(data, (str, Path)):
            return to_pandas(evaluate_ood(self.path, str(data), plots)[0])
        with as_source(self, data) as (src, label):
            named = f"{label.removeprefix('the ')} ({len(data)} rows)"
            return to_pandas(evaluate_ood(self.path, src, plots, label=named)[0])

    def evaluate_shift(self, plots: bool = False):
        """Dataset shift (`ensemble evaluate --shift`): the test split under every corruption
        at severities 1-5; writes `shift.parquet` in the run (and `shift.png` with `plots`).

        Returns:
            pandas DataFrame: `shift.parquet` (model, member, aggregator, corruption,
            severity, n, accuracy, nll, brier, ece, rmse, coverage_90), with its Parquet dtypes
            as `metrics`.
        """
        from ensemble.core.tfimport import import_tensorflow_quietly
        from ensemble.runs.evaluate_ood import evaluate_shift

        import_tensorflow_quietly()
        return to_pandas(evaluate_shift(self.path, plots)[0])


# the inputs of `Run.predict` and `Run.evaluate_ood` as a source the CLI's readers take: a path
# as it is; in-memory data written to a temporary file of the run's input kind (a table as
# Parquet, an array run's rows `[n_rows, *row_shape]` as `.npz`)

def _dims(shape) -> str:
    return ", ".join(str(d) for d in shape)


@contextlib.contextmanager
def as_source(run, data) -> Iterator[tuple[str, str]]:
    """`data` as a source for the CLI's readers, in a temporary folder removed afterwards.

    Yields:
        `(source, label)`: a path as `ensemble predict --data` takes it, and how messages
        name in-memory data (`the DataFrame`, `the array`; None for a path). Within the
        block, notices and `UsageError`s name `label` instead of the temporary file.

    Raises:
        UsageError: an array whose rows are not of the run's shape (or column count),
            naming the received shape and the expected one.
    """
    from ensemble.core.notices import named
    from ensemble.data import kinds

    if isinstance(data, (str, Path)):
        yield str(data), None
        return
    pre = kinds.run_preprocessing(run.path, run.record)
    shape = kinds.row_shape(pre)
    with tempfile.TemporaryDirectory(prefix="ensemble-api-") as tmp:
        if shape is None:
            src, label = Path(tmp) / "input.parquet", "the DataFrame"
            _write_table(run, data, src)
        else:
            src, label = kinds.write_rows(pre, _checked_rows(data, shape), tmp), "the array"
        with named(tmp, label), named(src, label):
            yield str(src), label


def _write_table(run, data, src: Path) -> None:
    """A DataFrame, or an ndarray `[n_rows, n_columns]` named by `run.feature_names`, as a
    Parquet file."""
    import pandas as pd
    import pyarrow as pa

    if isinstance(data, pd.DataFrame):
        frame = data
    else:
        x, names = np.asarray(data), run.feature_names
        if x.ndim != 2 or x.shape[1] != len(names):
            raise UsageError(f"Expected an array [n_rows, {len(names)}] (columns "
                             f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''}). "
                             f"Received: shape {x.shape}")
        frame = pd.DataFrame(x, columns=names)
    artifacts.write_parquet(src, pa.Table.from_pandas(frame, preserve_index=False))


def _checked_rows(data, shape: tuple[int, ...]) -> np.ndarray:
    """`data` as an array `[n_rows, *shape]`; raises UsageError naming both row shapes."""
    x = np.asarray(data)
    if x.ndim < 2 or tuple(x.shape[1:]) != shape:
        raise UsageError(f"Expected an array [n_rows, {_dims(shape)}]: the run was trained on "
                         f"rows of shape {list(shape)}. Received: shape {x.shape}, rows of "
                         f"shape {list(x.shape[1:])}")
    return x


def without_temporary_ids(frame, label: str | None):
    """Predictions of an in-memory array without their `input` column, which names rows of
    the temporary file (`rows.npz[i]`); `row` numbers them."""
    if label == "the array" and "input" in frame.columns:
        return frame.drop(columns="input")
    return frame
