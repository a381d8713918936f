"""The run config from the command line: the config file plus the flags, and any config key: `--set section.key=VALUE` (VALUE read as TOML), and the
flags that map onto config keys (`--learning-rate`, `--batch-size`).

The pairs become dotted-key overrides of `ensemble.config.load`, so they go through the same
validation and "did you mean" as a config file: `--set training.learnig_rate=0.1` is refused
naming `training.learning_rate`.
"""

from __future__ import annotations

import argparse
import tomllib
from typing import Any

from ensemble.core.errors import UsageError
from ensemble.models.precision import PRECISIONS
from pipelines.guide import add as _add
from pipelines.guide import positive as _positive

SET_HELP = ("any config key, VALUE read as TOML: --set training.learning_rate=0.01 "
            "--set model.params.hidden=[64,32] --set data.image_size=[64,64] (repeatable; default: "
            "none; applied after the config file and the other options)")


def positive_float(text: str) -> float:
    """A finite number > 0 (`--learning-rate`)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, received {text!r}")
    return value


def add_options(parser, batch_size: bool = True) -> None:
    """`--set`, `--learning-rate`, `--precision` and (unless the command has its own)
    `--batch-size`."""
    _add(parser, "--set", action="append", metavar="SECTION.KEY=VALUE", dest="set",
         help=SET_HELP)
    _add(parser, "--learning-rate", type=positive_float, metavar="LR",
         help="every member's learning rate (default: the config's [training] "
              "learning_rate, 0.001)")
    _add(parser, "--precision", choices=PRECISIONS,
         help="the members' Keras dtype policy: float32, or mixed_bfloat16 / mixed_float16 "
              "(variables in float32, computation in the lower type; faster on CPUs with AMX "
              "or AVX-512 BF16 and GPUs with tensor cores) (default: the config's [training] "
              "precision, float32)")
    if batch_size:
        _add(parser, "--batch-size", type=_positive, metavar="ROWS",
             help="rows per training step of each member (default: the config's [training] "
                  "batch_size: auto, from the training rows)")


def parse_value(text: str) -> Any:
    """VALUE of `--set`: a TOML value (`0.01`, `[64, 32]`, `true`, `"relu"`, `{momentum=0.9}`);
    text that is not TOML is taken as a string (`--set data.source=my.csv`)."""
    from ensemble.config import bounds

    bounds.check_depth(text, f"--set value {text[:40]!r}")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """`--set` items as `{dotted key: value}`, in order (a later one wins).

    Raises:
        UsageError: an item without `=` or with an empty or malformed key; names the item.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, text = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not eq or len(parts) < 2 or not all(p.strip() for p in parts):
            raise UsageError(f"Expected --set SECTION.KEY=VALUE (e.g. --set "
                             f"training.learning_rate=0.01). Received: --set {item!r}")
        out[".".join(p.strip() for p in parts)] = parse_value(text.strip())
    return out


def overrides(args) -> dict[str, Any]:
    """The config overrides of `--learning-rate`, `--precision`, `--batch-size` (train,
    compare, search)
    and then `--set` (which wins)."""
    out: dict[str, Any] = {}
    if getattr(args, "learning_rate", None) is not None:
        out["training.learning_rate"] = args.learning_rate
    if getattr(args, "precision", None) is not None:
        out["training.precision"] = args.precision
    if getattr(args, "command", None) != "predict" and \
            getattr(args, "batch_size", None) is not None:
        out["training.batch_size"] = args.batch_size
    out.update(parse_set(getattr(args, "set", None)))
    return out


def key_hint(option: str) -> str:
    """For an unknown option such as `--hidden` or `--early-stopping`, the config key of that
    name as a `--set` hint (` (a config key: --set members.hidden=VALUE)`), or ``."""
    import dataclasses

    from ensemble.config.schema import Config

    name = option.lstrip("-").split("=")[0].replace("-", "_")
    keys = [f"{section.name}.{f.name}" for section in dataclasses.fields(Config)
            for f in dataclasses.fields(section.default_factory())
            if f.name == name]
    if not keys:
        return ""
    return f" (a config key: --set {keys[0]}=VALUE)"


def columns(text: str | None) -> list[str] | None:
    """`--drop a,b` / `--categorical a,b` as a list of names (None when not given); `''`
    alone names the column whose header is empty (the index `pandas.DataFrame.to_csv` writes)."""
    if text is None:
        return None
    if text == "":
        return [""]
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise UsageError(f"Expected COL[,COL...] column names. Received: {text!r}")
    return names


def load_config(args, base: dict | None = None):
    """The config file (or `base`) with the command's flags applied; `cpu:N` beyond the member
    count is capped to it with a notice (the extra logical devices would stay idle)."""
    import dataclasses

    from ensemble.config import schema

    cfg = schema.load(args.config, base=base, overrides={
        "data.source": args.data, "data.target": args.target, "members.count": args.members,
        "model.builder": getattr(args, "model", None),
        "training.epochs": getattr(args, "epochs", None), "training.seed": getattr(args, "seed", None),
        "placement.devices": args.devices, "data.impute": getattr(args, "impute", None),
        "data.drop": columns(getattr(args, "drop", None)),
        "data.categorical": columns(getattr(args, "categorical", None)),
        "data.task": getattr(args, "task", None),
        "training.target_transform": getattr(args, "target_transform", None),
        "training.threshold": getattr(args, "threshold", None),
        "placement.replicas": getattr(args, "replicas", None) if args.command == "train"
        else None, "placement.engine": getattr(args, "engine", None),
        "placement.address": getattr(args, "address", None), **overrides(args)})
    spec, n = cfg.placement.devices.strip(), cfg.members.count
    if isinstance(cfg.placement.replicas, int):  # replicas use more devices (issue #24)
        n *= cfg.placement.replicas
    elif cfg.placement.replicas == "auto":
        n = float("inf")
    if spec.startswith("cpu:") and spec[4:].isdigit() and int(spec[4:]) > n:
        from ensemble.core.notices import notice

        what = "members" if n == cfg.members.count else "members' replicas"
        notice(f"--devices {spec} gives more logical devices than the {n} {what}; "
               f"using cpu:{n}")
        cfg = dataclasses.replace(cfg, placement=dataclasses.replace(cfg.placement,
                                                                     devices=f"cpu:{n}"))
    return cfg
