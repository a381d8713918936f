"""Builders: where a member's network comes from (`mlp`, `cnn`, or the user's function).

A builder is any callable

    build(input_shape, n_outputs, *, seed, **params) -> keras.Model

mapping `[batch, *input_shape]` to `[batch, n_outputs]` **logits** (no softmax: the task owns
the head, `ensemble.tasks.base`). It is named in the config as `"mlp"` or `"cnn"` (built in:
`ensemble.models.builtin`), `"package.module:function"` (resolved with `pkgutil.resolve_name`)
or `"path/to/file.py:function"` (a relative path is resolved against the config file's folder).
Between-graph clients import it by that name, so it must be a module-level function there.

This module resolves and checks builders without TensorFlow; `ensemble.models.members` builds and
validates the networks they return.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import pkgutil
import sys
from pathlib import Path
from typing import Any, Callable

from ensemble.core import specs
from ensemble.core.errors import UsageError
from ensemble.models import builtin

LOCAL_PREFIX = "<local>:"  # a callable of this process that no other process can import

_local: dict[str, Callable] = {}


BUILTINS: dict[str, Callable] = {"mlp": builtin.mlp, "cnn": builtin.cnn}


def _load_file(path: Path, name: str) -> Callable:
    module = specs.import_file(path, "Builder file", "ensemble_builder_")
    fn = getattr(module, name, None)
    if fn is None:
        raise UsageError(f"Builder file {path} has no function `{name}`.")
    return fn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _resolve_here(spec: str):
    """`pkgutil.resolve_name(spec)`; a module in the working directory is found too (as
    `python -c` would), which the `ensemble` command's own path leaves out."""
    try:
        return pkgutil.resolve_name(spec)
    except ModuleNotFoundError:
        here = str(Path.cwd())
        if here in sys.path:
            raise
        sys.path.append(here)
        return pkgutil.resolve_name(spec)


def is_file_spec(spec: str) -> bool:
    """`path/to/file.py:function` (or `file.py`) rather than a module path."""
    return spec.partition(":")[0].endswith(".py")


def absolute(spec: str, base: Path | None) -> str:
    """`spec` with a relative `file.py` part made absolute against `base` (a config file's
    folder; the working directory when None). Other specs are returned as they are."""
    if not is_file_spec(spec):
        return spec
    path, _, name = spec.partition(":")
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = (base or Path.cwd()) / p
    return f"{p.resolve()}:{name}" if name else str(p.resolve())


def resolve(spec: str) -> Callable:
    """The builder function named by `spec`.

    Raises:
        UsageError: an unknown built-in, a module, file or function that does not exist, or
            something that is not callable; the message names `spec`.
    """
    if not isinstance(spec, str) or not spec:
        raise UsageError(f"Expected `model.builder` to be \"mlp\", \"cnn\", "
                         f"\"package.module:function\" or \"path/file.py:function\". "
                         f"Received: {spec!r}")
    if spec in BUILTINS:
        return BUILTINS[spec]
    if spec.startswith(LOCAL_PREFIX):
        if spec not in _local:
            raise UsageError(f"Builder {spec} was a function of another Python process; "
                             "name it by module (`package.module:function`) or file instead.")
        return _local[spec]
    from ensemble.core.tfimport import import_tensorflow_quietly

    import_tensorflow_quietly()  # the user's module imports Keras: no start-up banners
    if is_file_spec(spec):
        path, _, name = spec.partition(":")
        if not name:
            raise UsageError(f"Expected `{spec}` to name a function: `{path}:function`.")
        if not Path(path).is_file():
            raise UsageError(f"Builder file not found: {path} (from model.builder={spec!r}).")
        fn = _load_file(Path(path), name)
    else:
        if ":" not in spec and "." not in spec:
            raise UsageError(f"Unknown builder {spec!r}; expected \"mlp\", \"cnn\", "
                             "\"package.module:function\" or \"path/file.py:function\".")
        try:
            fn = _resolve_here(spec)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UsageError(f"Cannot import builder {spec!r}: {type(exc).__name__}: "
                             f"{_first_line(exc)}") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the user's module raised (or sys.exit) while importing
            raise UsageError(f"Builder module of {spec!r} failed to import: "
                             f"{type(exc).__name__}: {_first_line(exc)}") from None
    if not callable(fn):
        raise UsageError(f"Builder {spec!r} is {type(fn).__name__} {fn!r:.40}, not a function.")
    return fn


def spec_of(builder: str | Callable) -> str:
    """The name a config records for `builder`: a string as it is; a callable as
    `module:qualname` when that name imports back to it, else a process-local name
    (`<local>:qualname`) that only this process resolves (in-graph training works;
    between-graph clients cannot import it)."""
    if isinstance(builder, str):
        return builder
    if not callable(builder):
        raise UsageError(f"Expected `model` to be a builder function or its name. "
                         f"Received: {builder!r}")
    for name, fn in BUILTINS.items():
        if builder is fn:
            return name
    module, qualname = getattr(builder, "__module__", None), getattr(builder, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        name = f"{module}:{qualname}"
        try:
            if pkgutil.resolve_name(name) is builder:
                return name
        except Exception:  # noqa: BLE001 - not importable by name: a local builder
            pass
    name = f"{LOCAL_PREFIX}{qualname or type(builder).__name__}#{id(builder):x}"
    _local[name] = builder
    return name


def register(spec: str, builder: Callable) -> None:
    """Make the process-local name `spec` (from `spec_of`, perhaps in another process that
    pickled it) resolve to `builder` here."""
    _local[spec] = builder


def importable(spec: str) -> bool:
    """Whether another process can resolve `spec` (not a `<local>` callable)."""
    return not spec.startswith(LOCAL_PREFIX)


def check_params(spec: str, fn: Callable, params: dict[str, Any], key: str) -> None:
    """Check that `fn` has the builder signature and accepts every name in `params`.

    Raises:
        UsageError: a parameter the builder does not take (names it and the accepted ones),
            or a function without the `(input_shape, n_outputs, *, seed, ...)` signature.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    ps = sig.parameters
    kw = any(p.kind is p.VAR_KEYWORD for p in ps.values())
    positional = [p for p in ps.values() if p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD)]
    if (len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in ps.values())) \
            or ("seed" not in ps and not kw):
        raise UsageError(f"Builder {spec!r} must be `build(input_shape, n_outputs, *, seed, "
                         f"**params)`. Received: {fn.__name__}{sig}")
    if kw:
        return
    known = [n for n in ps if n != "seed" and ps[n] not in positional[:2]]
    unknown = [n for n in params if n not in known]
    if unknown:
        raise UsageError(f"Unknown parameter `{key}.{unknown[0]}` of builder {spec!r}; it "
                         f"takes: {', '.join(known) or 'no parameters'}.")


def takes_embedded(spec: str) -> bool:
    """Whether builder `spec` names a keyword parameter `embedded` (then it receives a table's
    index columns and their description, and embeds them itself:
    `ensemble.models.members.build_member`)."""
    try:
        return "embedded" in inspect.signature(resolve(spec)).parameters
    except (TypeError, ValueError):
        return False


def builder_file(spec: str) -> Path | None:
    """The source file of user builder `spec`, found without importing it: the `file.py` of
    `path/file.py:function`; for `package.module:function` the module's origin
    (`importlib.util.find_spec`, which imports its parent packages but not the module).
    None for a built-in or a file that cannot be located."""
    if not isinstance(spec, str) or spec in BUILTINS or spec.startswith(
            LOCAL_PREFIX):
        return None
    if is_file_spec(spec):
        path = Path(spec.partition(":")[0])
        return path if path.is_file() else None
    module = spec.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
        if found is None and str(Path.cwd()) not in sys.path:  # as `_resolve_here` finds it
            sys.path.append(str(Path.cwd()))
            found = importlib.util.find_spec(module)
    except (ImportError, ValueError, AttributeError):
        return None
    origin = getattr(found, "origin", None)
    return Path(origin) if origin and Path(origin).is_file() else None


def source_sha256(spec: str) -> str | None:
    """sha256 of the file builder `spec` names (`path/file.py`, or the module of
    `package.module:function`: the file importing it runs, the one `runs.preflight` verifies
    before a run is used); else of the file that defines it; None for a built-in or when the
    source cannot be found. None for a process-local function (`<local>:`): no file is ever
    imported for it, so none is verified (`builder_files.check_builder` would refuse the run as
    missing its file)."""
    if spec in BUILTINS or not importable(spec):
        return None
    named = builder_file(spec)
    if named is not None:
        return hashlib.sha256(named.read_bytes()).hexdigest()
    try:
        path = inspect.getsourcefile(resolve(spec))
    except (TypeError, UsageError):
        return None
    if path is None or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
