"""The typed run record (`ensemble.core.manifest.Manifest`): round trip, unknown keys kept, old
manifests load, bad ones refused in one line, updates under the manifest lock."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from ensemble.core import artifacts
from ensemble.core.errors import UsageError
from ensemble.core.manifest import SCHEMA_VERSION, Manifest, MemberRecord, load, update

# a manifest as version 0.1.0 wrote it (before `schema_version`), trimmed
OLD = {
    "run_id": "r1", "mode": "between-graph", "status": "completed", "pid": 7, "host": "h",
    "created": "2026-01-01T00:00:00+00:00", "config": {"training": {"batch_size": 64}},
    "config_sha256": "ab", "task": "regression", "model": {"builders": {"mlp": None}},
    "dataset": {"name": "digits", "rows": {"train": 10, "validation": 2, "test": 3},
                "feature_names": ["a", "b"], "classes": [], "target_loc": 1.5,
                "target_scale": 2.0, "named_columns": False, "a_task_entry": 3},
    "devices": ["/device:CPU:0"], "cluster": None, "placement": {"strategy": "round-robin"},
    "members": [{"index": 0, "seed": 5, "device": "/device:CPU:0", "status": "completed",
                 "sha256": {"members/member-0.keras": "00"}, "flops_per_row": 12},
                {"index": 1, "seed": 6, "device": "/device:CPU:0", "status": "diverged",
                 "diverged_epoch": 2, "future_member_key": [1]}],
    "versions": {"tensorflow": "2.21"}, "tensorflow_build": None,
    "timings": {"train_seconds": 1.5, "clients": {"0": {"seconds": 1.0}}},
    "artifacts": {"metrics.parquet": "11"}, "a_future_key": {"x": 1},
}


def _write(run_dir, data) -> None:
    (run_dir / artifacts.MANIFEST).write_text(json.dumps(data))


def test_old_manifest_loads_typed_and_round_trips_unknown_keys(tmp_path):
    _write(tmp_path, OLD)
    m = load(tmp_path)
    assert m.schema_version == 0 and m.mode == "between-graph" and m.task == "regression"
    assert m.dataset.rows["train"] == 10 and m.dataset.target_loc == 1.5
    assert m.dataset.extra == {"a_task_entry": 3} and m.dataset.named_columns is False
    m.dataset.update({"target_loc": 0.5, "other": 1})
    assert m.dataset.target_loc == 0.5 and m.dataset.extra["other"] == 1
    m.dataset.update({"target_loc": 1.5})
    del m.dataset.extra["other"]
    assert m.member(1) == MemberRecord(index=1, seed=6, device="/device:CPU:0",
                                       status="diverged", diverged_epoch=2,
                                       extra={"future_member_key": [1]})
    assert m.diverged() == {1: 2}
    assert m.hashes() == {"metrics.parquet": "11", "members/member-0.keras": "00"}
    m.save(tmp_path)
    written = json.loads((tmp_path / artifacts.MANIFEST).read_text())
    assert written == {**OLD, "schema_version": SCHEMA_VERSION}  # nothing lost or changed
    assert load(tmp_path) == Manifest.from_dict(written)


def test_new_manifest_round_trips_and_keeps_the_contract_keys(tmp_path):
    m = Manifest(run_id="r2", mode="in-graph", status="running",
                 members=[MemberRecord(index=0, seed=1, device="/device:CPU:0")])
    m.save(tmp_path)
    written = json.loads((tmp_path / artifacts.MANIFEST).read_text())
    assert written["cluster"] is None and written["timings"] == {}  # as prepare writes them
    assert written["members"] == [{"index": 0, "seed": 1, "device": "/device:CPU:0",
                                   "status": "pending"}]
    assert load(tmp_path) == m


def test_artifacts_verify_takes_the_record(tmp_path):
    (tmp_path / "members").mkdir()
    path = tmp_path / "members" / "member-0.keras"
    path.write_bytes(b"weights")
    m = Manifest(members=[MemberRecord(index=0)])
    m.member(0).sha256 = {"members/member-0.keras": artifacts.sha256_file(path)}
    assert artifacts.verify(tmp_path, m, path) == path
    path.write_bytes(b"changed")
    with pytest.raises(UsageError, match="Damaged artifact"):
        artifacts.verify(tmp_path, m, path)


@pytest.mark.parametrize("data, words", [
    ({**OLD, "members": {"0": {}}}, "`members` should be a JSON array"),
    ({**OLD, "schema_version": "1"}, "`schema_version` should be an integer"),
    ({**OLD, "schema_version": SCHEMA_VERSION + 1}, "upgrade ensemble"),
])
def test_bad_manifest_is_one_clear_line(tmp_path, data, words):
    _write(tmp_path, data)
    with pytest.raises(UsageError, match=words) as info:
        load(tmp_path)
    assert "\n" not in str(info.value) and "manifest.json" in str(info.value)


def test_not_a_run_directory(tmp_path):
    with pytest.raises(UsageError, match="Not a run directory"):
        load(tmp_path)
    with pytest.raises(UsageError, match="Member 3|member index"):
        Manifest(members=[MemberRecord(index=0)]).member(3)


def test_a_sparse_manifest_stays_valid(tmp_path):
    """Fields an old or hand-made manifest lacks are not written as nulls the schema
    refuses."""
    _write(tmp_path, {"members": [{"index": 0}]})
    update(tmp_path, lambda m: m.timings.update(x=1))
    assert set(json.loads((tmp_path / artifacts.MANIFEST).read_text())) == {
        "schema_version", "run_id", "config", "dataset", "members", "cluster",
        "tensorflow_build", "timings", "artifacts"}
    assert load(tmp_path).timings == {"x": 1}


def test_update_under_the_lock_loses_no_change(tmp_path):
    """Threads each record one member's status and bump a counter: every change survives."""
    _write(tmp_path, {**OLD, "members": [{"index": i} for i in range(8)]})

    def work(i: int) -> None:
        def change(m: Manifest) -> None:
            m.member(i).status = "completed"
            m.timings["count"] = m.timings.get("count", 0) + 1
        update(tmp_path, change)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = load(tmp_path)
    assert [x.status for x in m.members] == ["completed"] * 8 and m.timings["count"] == 8
    assert m.schema_version == SCHEMA_VERSION and m.extra == {"a_future_key": {"x": 1}}


def test_a_failed_change_writes_nothing(tmp_path):
    _write(tmp_path, OLD)
    before = (tmp_path / artifacts.MANIFEST).read_text()

    def change(m: Manifest) -> None:
        m.status = "failed"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        update(tmp_path, change)
    assert (tmp_path / artifacts.MANIFEST).read_text() == before


def test_the_run_layer_records_the_process_timings(tmp_path):
    """`ensemble train`'s process timings are written by the run layer (`api.train` calls
    `record_process`), not by `pipelines`."""
    _write(tmp_path, OLD)
    from ensemble.runs.api import record_process
    from ensemble.runs.context import config_of

    m = record_process(tmp_path, 123.5)
    assert m.timings["process_ready_unix"] == 123.5 and m.timings["process_peak_rss_bytes"] > 0
    assert load(tmp_path).timings == {**OLD["timings"], "process_ready_unix": 123.5,
                                      "process_peak_rss_bytes": m.timings[
                                          "process_peak_rss_bytes"]}
    assert config_of(Manifest()).members.count >= 1  # the defaults


RAW = re.compile(r"\bmanifest\[|\bmanifest\.get\(|read_manifest\(|update_manifest\(|"
                 r"artifacts\.write_manifest\(|manifest\.json\"\)\.read_text")
OWNERS = {"ensemble/core/manifest.py", "ensemble/core/artifacts.py", "ensemble/core/runlock.py"}


def test_no_raw_manifest_access_outside_the_record():
    """Every reader and writer of `manifest.json` goes through `Manifest`; `pipelines` never
    changes a run's manifest (the run layer records what it needs)."""
    root = Path(__file__).resolve().parent.parent
    raw, writes = [], []
    for path in sorted([*root.glob("ensemble/**/*.py"), *root.glob("pipelines/**/*.py")]):
        rel = str(path.relative_to(root))
        text = path.read_text()
        if rel not in OWNERS:
            raw += [f"{rel}:{n}" for n, line in enumerate(text.splitlines(), 1)
                    if RAW.search(line)]
        if rel.startswith("pipelines/") and re.search(r"Manifest\.update\(|record\.update\(|"
                                                      r"\.save\(run_dir|record_process\(", text):
            writes.append(rel)
    assert raw == [] and writes == []
