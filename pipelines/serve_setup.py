"""What `ensemble serve` checks and decides before it listens: the optional extra installed, an
export folder (not a training run) as `--model`, the replicas and their devices."""

from __future__ import annotations

import shlex
from pathlib import Path

from ensemble.core.errors import UsageError

# from a checkout (as the README installs it), or from a package index
EXTRA = ('pip install ".[serve]" in a checkout of the project, or pip install '
         '"ensemble-replication[serve]" from a package index (or pip install starlette uvicorn)')


def require_extra() -> None:
    """Raises UsageError naming the pip command when Starlette or uvicorn is missing."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"Expected the optional extra 'serve' for ensemble serve ({exc.name} "
                         f"is not installed). Install it: {EXTRA}") from None


def check_replicas(replicas: str) -> None:
    """Raises UsageError unless `replicas` is auto or a positive integer."""
    if replicas != "auto" and not (replicas.isdigit() and int(replicas) >= 1):
        raise UsageError(f"Expected --replicas to be auto or a positive integer. "
                         f"Received: {replicas!r}")


def serving_devices(spec: str | None, replicas: str) -> list[str]:
    """One device per replica. `replicas` auto: every device of `spec` (auto: every GPU,
    else the CPU split into logical devices, at most the cores); N: N replicas round robin
    over them. Call before TensorFlow runs an op (a CPU split needs that). Raises UsageError."""
    from ensemble.replication import devices

    check_replicas(replicas)
    kind, value = devices.parse(spec or "auto")
    if kind == "auto":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            names = [f"/device:GPU:{i}" for i in range(len(gpus))]
        else:
            n = int(replicas) if replicas != "auto" else devices.cpu_count()
            names = devices.split_cpu(max(1, min(n, devices.cpu_count(), devices.AUTO_CPU_CAP)),
                                      allow_fewer=True)
    elif kind == "cpu":
        names = devices.split_cpu(value, allow_fewer=True)
    else:
        names = [devices.canonical(n) for n in value]
    n = len(names) if replicas == "auto" else int(replicas)
    return [names[i % len(names)] for i in range(n)]


def has_version(base: Path) -> bool:
    """Whether export folder `base` holds a version folder (`base/<digits>/`)."""
    return any(p.name.isdigit() and p.is_dir() for p in base.iterdir())


def check_model_folder(base: Path, given: str) -> None:
    """Raises UsageError unless `base` (`--model`, given as `given`) is a folder, and refuses a
    training run (its `manifest.json`) that holds no exported version: serving it would wait
    for a version forever. An empty folder or one without a manifest is a folder that waits
    for its first version (as TF Serving's model base path)."""
    from ensemble.core.artifacts import MANIFEST

    expected = ("Expected --model to be an export folder (DIR/<version>/ as `ensemble export` "
                "writes it)")
    if not base.is_dir():
        raise UsageError(f"{expected}. Received: {given!r}")
    try:
        run_only = (base / MANIFEST).is_file() and not has_version(base)
    except OSError as exc:
        raise UsageError(f"Cannot read --model {given!r}: {exc.strerror or exc}") from None
    if run_only:
        raise UsageError(f"{expected}; {given!r} is a training run ({MANIFEST}), not an "
                         f"exported model. Export it first: ensemble export --run "
                         f"{shlex.quote(given)} --out EXPORT_DIR, then serve EXPORT_DIR")
