"""The typed run record (`Manifest`, re-exported from `ensemble.core.record`, where every layer
that reads a run can import it) and what the runs layer adds to it: the run's `Config`, and the
driver process's own timings."""

from __future__ import annotations

from pathlib import Path

from ensemble.config.schema import Config, from_dict
from ensemble.core.record import (  # noqa: F401 (the runs layer's name for the run record)
    SCHEMA_VERSION, DatasetRecord, Manifest, MemberRecord, ModelRecord, load, update)


def config_of(manifest: Manifest) -> Config:
    """The run's resolved `Config` (its manifest's `config`).

    Raises:
        UsageError: a config the manifest records that this version cannot read (names the key).
    """
    return from_dict(manifest.config)


def dropped_columns(manifest: Manifest) -> tuple[str, ...]:
    """The columns the run's training left out (`data.drop`), read from the recorded config
    as it is: resolving it (`config_of`) would import the run's builder before `predict`'s
    preflight checks the builder file's sha256."""
    return tuple((manifest.config.get("data") or {}).get("drop") or ())


def record_process(run_dir: str | Path, ready_unix: float) -> Manifest:
    """Record, under the manifest lock, the training process's `process_ready_unix` (when it
    was ready to work: `time.time()`, seconds) and `process_peak_rss_bytes` (its peak resident
    memory so far, bytes) in `timings`; `benchmarks.benchmark` and `compare` read them."""
    from ensemble.replication.devices import peak_rss_bytes

    peak = peak_rss_bytes()
    return update(run_dir, lambda m: m.timings.update(process_ready_unix=ready_unix,
                                                      process_peak_rss_bytes=peak))

