"""The run context (`ensemble.runs.context.RunContext`) and its rule: a process never reads back
a run file it wrote. A tiny run is trained and summarised in this process while every open
(Python's audit hook `open`, and pyarrow's Parquet readers, which open files in C++) and every
rename (`os.rename`/`os.replace`, how `artifacts.atomic_path` puts a file in place) is
recorded; a read of a file after this process wrote it fails the test. The memory-mapped
splits under `data/` (read by training by design) and TensorFlow's own checkpoint files
(written and read in C++, never seen here) are left out."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ensemble.core import artifacts
from ensemble.core.manifest import Manifest

EVENTS: list[tuple[str, str]] = []  # ("read" | "write", absolute path) while RECORDING
RECORDING: list[bool] = []


def _hook(event: str, args: tuple) -> None:
    if not RECORDING:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path, mode, flags = os.fsdecode(args[0]), args[1], args[2]
        writes = (mode is not None and any(c in mode for c in "wax+")) or (
            mode is None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        EVENTS.append(("write" if writes else "read", os.path.abspath(path)))
    elif event == "os.rename":
        EVENTS.append(("write", os.path.abspath(os.fsdecode(args[1]))))


sys.addaudithook(_hook)  # audit hooks stay for the process: inert unless RECORDING


def read_backs(run_dir: Path) -> list[str]:
    """The run files read after this process wrote them, in order (`EVENTS`), but the splits'
    memory maps (`data/`) and the atomic writer's staging names (hashed once as written)."""
    root, written, out = os.path.abspath(run_dir), set(), []
    for kind, path in EVENTS:
        rel = os.path.relpath(path, root)
        if rel.startswith(("..", "data" + os.sep, "checkpoints" + os.sep)) or \
                os.path.basename(path).startswith(".") or os.path.isdir(path):
            continue
        if kind == "write":
            written.add(rel)
        elif rel in written:
            out.append(rel)
    return out


@pytest.fixture
def recording(monkeypatch):
    """Record opens and renames; pyarrow's Parquet readers as reads of their path."""
    def reading(fn):
        def wrapper(source, *args, **kwargs):
            if isinstance(source, (str, os.PathLike)):
                EVENTS.append(("read", os.path.abspath(os.fspath(source))))
            return fn(source, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(pq, "read_table", reading(pq.read_table))
    monkeypatch.setattr(pq, "read_schema", reading(pq.read_schema))
    monkeypatch.setattr(pq, "read_metadata", reading(pq.read_metadata))
    EVENTS.clear()
    RECORDING.append(True)
    yield EVENTS
    RECORDING.clear()


def test_training_never_reads_back_the_run_files_it_wrote(tmp_path, recording):
    """`ensemble.train` then `Run.summary` (what `ensemble train` prints): no run file is read
    after this process wrote it, and the summary is the table `ensemble evaluate` computes
    from the files."""
    import ensemble
    from ensemble.runs.evaluate import evaluate

    run = ensemble.train({"data": {"source": "iris"}, "members": {"count": 2, "hidden": [8]},
                          "training": {"epochs": 2, "batch_size": 32},
                          "placement": {"devices": "cpu:2"}}, run_dir=tmp_path / "run")
    text = run.summary()
    assert any(rel == artifacts.PREDICTIONS for kind, p in recording if kind == "write"
               for rel in [os.path.relpath(p, tmp_path / "run")])  # the writes were seen
    assert read_backs(tmp_path / "run") == []
    RECORDING.clear()
    assert text == evaluate(run.path)[1]  # from the files, in a fresh evaluation
    EVENTS.clear()
    RECORDING.append(True)
    assert run.summary() == text  # the table evaluate kept as it rewrote metrics.parquet
    assert read_backs(tmp_path / "run") == [] and not any(
        p.endswith(artifacts.PREDICTIONS) for kind, p in EVENTS)
    assert Manifest.load(run.path).timings["process_peak_rss_bytes"] > 0  # record_process


def test_the_context_of_an_opened_run_is_the_one_training_built(tmp_path):
    """`RunContext.open` of a run gives the config (no `"auto"` left), task, input kind and
    preprocessing that `prepare` resolved when it created it."""
    import numpy as np

    from ensemble.config import schema
    from ensemble.replication.modes import TrainRequest
    from ensemble.runs import prepare
    from ensemble.runs.builtin_modes import InGraph
    from ensemble.runs.context import RunContext

    cfg = schema.load(overrides={"data.source": "iris", "members.count": 2,
                                 "training.batch_size": "auto"})
    made = prepare.prepare(TrainRequest(cfg, tmp_path / "run"), InGraph(), ["/device:CPU:0"])
    opened = RunContext.open(tmp_path / "run")
    assert made.config == opened.config and isinstance(opened.config.training.batch_size, int)
    assert made.task.spec == opened.task.spec == "classification"
    assert made.input_kind == opened.input_kind == "table"
    assert np.array_equal(made.preprocessing.mean, opened.preprocessing.mean)
    assert made.manifest.to_dict() == opened.manifest.to_dict()
    assert opened.classes == [0, 1, 2]
