"""Run configuration: TOML files in `configs/`, validated up front, overridden by CLI flags.

The defaults of the dataclasses below ARE the default run (`configs/digits.toml` spells them
out; a test keeps the two equal), so an installed `ensemble train` needs no file.

A config has six tables: `[data]`, `[model]`, `[members]`, `[training]`, `[placement]`,
`[aggregation]` (plus the optional `[data.synthetic]` and `[model.params]`; a `[search]` table is `ensemble search`'s, read and
checked by `ensemble.config.search_space`, and left out of the run config here). Unknown keys and wrong
types are rejected with a `UsageError` that names the key and the expected type.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, ClassVar

from ensemble.config import bounds, values
from ensemble.config.checks import check_ranges
from ensemble.core.errors import UsageError
from ensemble.data.settings import DataConfig, names_a_path
from ensemble.models import builders, builtin
from ensemble.tasks.aggregation_config import AggregationConfig

MLP_KEYS = ("hidden", "activation", "dropout", "l2")  # [members] keys: the mlp builder's params


@dataclass(frozen=True)
class ModelConfig:
    """The members' network: `builder` is `"mlp"`, `"cnn"`, `"package.module:function"` or
    `"path/to/file.py:function"` (see `ensemble.models.builders`); `params` are its keyword
    arguments. For `mlp`, `[members] hidden/activation/dropout/l2` are its parameters too
    (`params` wins)."""

    builder: str = "mlp"
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MemberOverride:
    """One member's hyperparameters where they differ from `[model]`/`[members]`/`[training]`
    (`[[members.override]]`, a hyperparameter ensemble): its own `builder` (mixed
    architectures), builder `params`, the MLP keys and `learning_rate`. Unset keys are None."""

    run_wide: ClassVar[tuple[str, ...]] = ("batch_size", "epochs")  # never per member
    index: int = -1
    builder: str | None = None
    params: dict | None = None
    hidden: tuple[int, ...] | None = None
    activation: str | None = None
    dropout: float | None = None
    learning_rate: float | None = None
    l2: float | None = None


@dataclass(frozen=True)
class MembersConfig:
    """The ensemble members: `count` MLPs with `hidden` layer widths; `l2` is the L2 penalty
    `l2 * sum(kernel**2)` on every Dense kernel, added to the training loss; `override` gives
    per-member hyperparameters (`batch_size` and `epochs` stay shared by the run)."""

    count: int = 4
    hidden: tuple[int, ...] = (256, 128)
    activation: str = "relu"
    dropout: float = 0.1
    l2: float = 0.0
    override: tuple[MemberOverride, ...] = ()


@dataclass(frozen=True)
class TrainingConfig:
    """How every member trains; `seed` is the run seed.

    `optimizer`: `adam` (the fused kernel of `ensemble.models.optimizer`, the fast default) or any
    `keras.optimizers` name (`sgd`, `adamw`, `rmsprop`, ...) with `optimizer_params` (e.g.
    `{momentum = 0.9}`). `lr_schedule`: `constant` or `cosine` (cosine decay to 0 over the
    run's steps). `early_stopping`: patience in epochs on each member's validation loss
    (0: off); a member that stops keeps the weights of its best epoch. `min_delta`: the drop
    of validation loss (nats per row for the NLL losses; for `mse`, times the training
    target's variance: `Task.loss_delta`) an epoch must beat the best by to count as better. `epochs`, `batch_size` and
    `early_stopping` default to `"auto"`: chosen from the training rows when the run starts
    (`ensemble.config.auto`: at least 2,000 steps within [30, 200] epochs, ...), the chosen
    numbers recorded in the run's manifest.
    """

    epochs: int | str = "auto"
    batch_size: int | str = "auto"
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    optimizer_params: dict = field(default_factory=dict)
    lr_schedule: str = "constant"
    early_stopping: int | str = "auto"
    min_delta: float = 1e-3
    loss: str = "auto"  # regression: gaussian_nll (auto) or mse; classification: cross_entropy
    # classification: "balanced" weights each class n / (k n_c); a table {label = weight}
    class_weight: str | dict = "none"
    target_transform: str = "none"  # regression: "log1p" or "log", log-normal members
    # binary classification: y_pred = positive where p >= threshold; a number in (0, 1) or
    # "auto:<metric>" picked on validation (ensemble.tasks.classification.threshold)
    threshold: float | str = "none"
    seed: int = 0
    deterministic: bool = True
    # threads of one op (TensorFlow's intra-op pool) in every training and prediction process,
    # both modes: a convolution's float sums depend on it; 0: TensorFlow's default (parity off)
    intra_op_threads: int = 1
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch is always saved)
    steps_per_execution: int = 0  # steps per traced call; 0: automatic (calls of about 1 s)
    tensorboard: bool = False  # tf.summary scalars under RUN/tensorboard/ (members, ensemble)
    # fast gradient sign step in units of the scaled input's range (0: off; paper: 0.01)
    adversarial_epsilon: float = 0.0
    # the members' Keras dtype policy: float32, mixed_bfloat16 or mixed_float16 (variables
    # in float32, computation in the lower type; `ensemble.models.precision`)
    precision: str = "float32"


@dataclass(frozen=True)
class PlacementConfig:
    """Device spec: `auto`, `cpu:N` or a comma-separated list of device names; `strategy`:
    `round-robin` (by member index) or `balanced` (by each member's FLOPs per row).

    GPU memory: `memory_growth` allocates GPU memory as needed instead of all of it at
    start-up; `memory_limit_mb` caps every GPU at this many MiB (a logical device
    configuration; 0: no cap). Both apply before TensorFlow initialises; without GPUs they
    only print a notice.

    `replicas`: data parallelism in training: each member runs as this many replicas on
    distinct devices, each batch split across them (`ensemble.replication.steps`); `auto`:
    devices // members; 1: one device per member.

    `engine`: where clients run: `local` (processes on this machine) or `ray` (a Ray cluster,
    `ensemble.replication.ray_engine`); `address`: the Ray cluster's head (`host:port`, or
    `auto`; empty: `$RAY_ADDRESS`, else a local cluster started for the run).
    """

    devices: str = "auto"
    strategy: str = "round-robin"
    memory_growth: bool = True
    memory_limit_mb: int = 0
    replicas: int | str = 1
    engine: str = "local"
    address: str = ""


@dataclass(frozen=True)
class Config:
    """The resolved configuration of a run."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    members: MembersConfig = field(default_factory=MembersConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def sha256(self) -> str:
        """sha256 of the canonical JSON of `to_dict()` (sorted keys)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def member_hparams(cfg: Config, index: int) -> dict[str, Any]:
    """Member `index`'s resolved hyperparameters as JSON: `{"builder", "params",
    "learning_rate"}`.

    `params` of the `mlp` builder start from `[members]` (`hidden`, `activation`, `dropout`,
    `l2`); then `[model.params]` (when the member uses the run's builder), then the member's
    `[[members.override]]` keys (`hidden`, ..., then its `params`) apply.
    """
    over = next((o for o in cfg.members.override if o.index == index), None)
    builder = (over.builder if over is not None and over.builder else None) or cfg.model.builder
    params: dict[str, Any] = {}
    if builder == "mlp":
        m = cfg.members
        params = {"hidden": list(m.hidden), "activation": m.activation, "dropout": m.dropout,
                  "l2": m.l2}
    if builder == cfg.model.builder:
        params.update(cfg.model.params)
    lr = cfg.training.learning_rate
    if over is not None:
        for key in MLP_KEYS:
            value = getattr(over, key)
            if value is not None:
                params[key] = list(value) if isinstance(value, tuple) else value
        params.update(over.params or {})
        lr = lr if over.learning_rate is None else over.learning_rate
    return json.loads(json.dumps({"builder": builder, "params": params, "learning_rate": lr}))


def check_builders(cfg: Config) -> None:
    """Resolve every member's builder and check its parameters' names (and the built-in
    MLP's values) before anything else runs; no network is built here.

    Raises:
        UsageError: an unknown builder, a module, file or function that does not exist, or a
            parameter the builder does not take; the message names the key.
    """
    seen = set()
    for i in range(cfg.members.count):
        h = member_hparams(cfg, i)
        key = json.dumps([h["builder"], h["params"]], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        own = any(o.index == i and (o.builder or o.params) for o in cfg.members.override)
        where = f"members.override[index={i}].params" if own else "model.params"
        try:
            fn = builders.resolve(h["builder"])
        except UsageError as exc:
            key = where.rpartition(".")[0] + ".builder"
            raise UsageError(f"`{key}`: {exc}") from None
        builders.check_params(h["builder"], fn, h["params"], where)
        if h["builder"] == "mlp":
            builtin.check_mlp_params(h["params"], where)
        elif h["builder"] == "cnn":
            builtin.check_cnn_params(h["params"], where)


def from_dict(table: dict[str, Any]) -> Config:
    """Build and validate a `Config` from nested dicts (the TOML tables).

    Raises:
        UsageError: unknown key, wrong type or out-of-range value; the message names the key.
    """

    cfg = values.build(Config, table, "")  # keys named as in the TOML and --set: `training.epochs`
    check_ranges(cfg)
    check_builders(cfg)
    return cfg


def _resolve_source(table: dict[str, Any], path: Path) -> None:
    """A relative file `data.source` in a config file names a file beside that config."""
    data = table.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("source"), str):
        return
    source = Path(data["source"])
    if names_a_path(data["source"]) and not source.is_absolute():
        data["source"] = str((path.resolve().parent / source))


def _resolve_builders(table: dict[str, Any], base: Path | None) -> None:
    """Relative `file.py:function` builders (and a `file.py:Class` task) in a config file name
    files beside it (from the command line: the working directory); made absolute so client
    processes find them."""
    data = table.get("data")
    if isinstance(data, dict) and isinstance(data.get("task"), str):
        data["task"] = builders.absolute(data["task"], base)
    model = table.get("model")
    if isinstance(model, dict) and isinstance(model.get("builder"), str):
        model["builder"] = builders.absolute(model["builder"], base)
    members = table.get("members")
    for over in (members.get("override") if isinstance(members, dict) else None) or []:
        if isinstance(over, dict) and isinstance(over.get("builder"), str):
            over["builder"] = builders.absolute(over["builder"], base)


def _plain(value: Any, key: str) -> Any:
    """A copy of config `value` in TOML's types, as a notebook's tables hold them: a path
    (`pathlib`) as its string, numpy scalars as Python numbers, tuples and arrays as lists.

    Raises:
        UsageError: any other object (a DataFrame as `data.source`), naming its key.
    """
    import numpy as np

    if isinstance(value, dict):
        return {str(k): _plain(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.ndim == 0:  # np.array(3): its one number
        return _plain(value.item(), key)
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float)):
        return value
    hint = " (a DataFrame: write it to a file, frame.to_csv(path), and pass the path)" \
        if hasattr(value, "to_csv") else ""
    raise UsageError(f"Expected `{key}` to be a number, string, boolean, list or table. "
                     f"Received: {key} of type {type(value).__name__}{hint}")


def load(path: str | Path | None = None, overrides: dict[str, Any] | None = None,
         base: dict[str, Any] | None = None) -> Config:
    """Read a TOML config and apply dotted-key overrides.

    Args:
        path: TOML file; None for `base`, or for the built-in defaults (equal to
            `configs/digits.toml`) when `base` is None too.
        base: config tables to start from when `path` is None (e.g. a run's resolved config).
        overrides: e.g. `{"members.count": 4, "training.epochs": 2}`; None values are ignored.

    Raises:
        UsageError: missing or unparsable file, unknown key, wrong type or value.
    """
    table: dict[str, Any] = _plain(base, "") if base else {}
    try:
        if path is not None:
            path = Path(path)
            table = tomllib.loads(bounds.check_depth(path.read_text(),
                                                     f"config file {str(path)!r}"))
    except FileNotFoundError:
        raise UsageError(f"Config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"Config file {path} is not valid TOML: {exc}") from None
    if path is not None:
        table.pop("search", None)  # ensemble search's space (ensemble.config.search_space), not the run's
        _resolve_source(table, path)
        _resolve_builders(table, path.resolve().parent)
    before = (table.get("model") or {}).get("builder", "mlp") \
        if isinstance(table.get("model"), dict) else None
    builder = (overrides or {}).get("model.builder")
    if isinstance(builder, str) and builder and isinstance(table.get("model"), dict) and \
            builders.absolute(builder, None) != before:
        table["model"].pop("params", None)  # the config's params were for its own builder
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = table
        *parents, leaf = dotted.split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # `--set training.epochs.x=1`
                where = ".".join(parents[:i + 1])
                raise UsageError(f"Expected `{where}` to be a table to set `{dotted}` in. "
                                 f"Received: {where}={node!r}")
        node[leaf] = _plain(value, dotted)
    if isinstance((overrides or {}).get("model.builder"), str) and overrides["model.builder"]:
        # --model: relative to the working directory
        model = table["model"]
        model["builder"] = builders.absolute(model["builder"], None)
    return from_dict(table)
