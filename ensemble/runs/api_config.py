"""The Python API's config: a `Config` from what a notebook passes to `ensemble.train` (a
`Config`, nested tables, a TOML path, dotted-key overrides, a builder function or name).

`ensemble.runs.api.train` resolves its `config`, `overrides`, `resume`, `tensorboard` and
`model` arguments here; `Run.config` reads a run's config back with `as_config`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ensemble.config.schema import Config
from ensemble.core.errors import UsageError
from ensemble.replication import modes
from ensemble.core.manifest import Manifest


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
        base = Manifest.load(run_dir).config
        cfg = as_config(config if config is not None else base, overrides)
    else:
        cfg = as_config(config, overrides)
    if tensorboard is not None:
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
