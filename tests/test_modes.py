"""A third replication mode defined here alone: `sequential` trains the members one after
another in this one process (each in its own graph, as a user without this project would train
them by hand); passed in as an object, it trains, predicts and is timed by `ensemble compare`
like the built-in modes (its processes find it by its spec, this file's `Sequential`), with
members identical to in-graph's."""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from ensemble.replication import modes


class Sequential(modes.Mode):
    """Members one after another in this process, each in its own graph; each writes its own
    files (`member_files`), which the aggregator combines."""

    name = "sequential"
    member_files = True

    def train(self, request: modes.TrainRequest) -> dict:
        from ensemble.config import schema
        from ensemble.replication import client_work, devices
        from ensemble.runs import prepare as run
        from ensemble.runs import run_status
        from ensemble.runs.aggregate import aggregate_run
        from ensemble.runs.train import open_run

        r = request
        devices.configure(r.cfg)
        devs = self.devices(r.cfg)
        with run.writing(r.run_dir, "ensemble train --mode sequential"):
            manifest = open_run(r, self, devs, None).manifest
            work = client_work.MemberWork.open(r.run_dir, manifest,
                                               schema.from_dict(manifest.config))
            with run_status.recording_outcome(r.run_dir):
                for m in manifest.members:  # one after another, each in its own graph
                    outputs = client_work.train_member(work, m.index, m.device)
                    outputs.write(r.run_dir, m.index)  # the member's files, as a client's
                    client_work.record_member(r.run_dir, m.index, "completed")
        return aggregate_run(r.run_dir, member_files=self.member_files)

    def predict(self, request: modes.PredictRequest) -> tuple[dict, dict]:
        from ensemble.data.prediction_io import PredictionWriter, prefetch
        from ensemble.models.members import load_run_member
        from ensemble.replication import devices
        from ensemble.replication.group import MemberGroup
        from ensemble.replication.placement import place
        from ensemble.runs.predict import open_prediction

        job = open_prediction(request)
        job.stream.check()
        job.stream.passthrough = request.layout == "wide"
        start, rows = time.monotonic(), 0
        devs = place(len(job.used), devices.resolve(request.devices or "auto", len(job.used)))
        members = {i: MemberGroup([load_run_member(request.run_dir, job.manifest, i, d)], [d],
                                  [i], task=job.task) for i, d in zip(job.used, devs)}
        meta = {"prediction": json.dumps({"mode": self.name})}
        with PredictionWriter(request.out, meta) as writer:
            for b in prefetch(job.stream):
                job.write(writer, {i: g.predict(b.x)[0][0] for i, g in members.items()}, None, b)
                rows += len(b.x)
        placed = {i: [d] for i, d in zip(job.used, devs)}
        return job.finish(self.name, rows, time.monotonic() - start, placed), {}


def test_get_refuses_what_is_not_a_mode():
    from ensemble.core.errors import UsageError
    from ensemble.runs import builtin_modes

    for bad in (dict, "sideways", "collections:OrderedDict", 3):
        with pytest.raises(UsageError, match="Expected `mode` to be one of in-graph"):
            builtin_modes.get(bad)
    assert builtin_modes.names() == ("in-graph", "between-graph")


def test_a_mode_object_is_found_again_by_its_spec():
    from ensemble.runs import builtin_modes

    spec = Sequential().spec()
    assert spec == f"{Path(__file__).resolve()}:Sequential"
    again = builtin_modes.get(spec)  # as a process that `compare` starts loads it
    assert again.name == "sequential" and again.member_files
    assert builtin_modes.get("in-graph").spec() == "in-graph"


def test_compare_times_a_third_mode_with_members_identical_to_in_graph(tiny_config, tmp_path):
    """Only in-graph and sequential: compare then trains and predicts each once
    (between-graph in `ensemble compare` is test_compare's end-to-end run)."""
    from ensemble.config import schema
    from ensemble.core import artifacts
    from pipelines import compare

    cfg = schema.load(tiny_config, overrides={"members.count": 2, "training.epochs": 1})
    summary, runs = compare.compare(cfg, tmp_path, repeats=1,
                                    modes=["in-graph", Sequential()])
    assert set(summary.column("mode").to_pylist()) == {"in-graph", "sequential"}
    assert set(runs.column("phase").to_pylist()) == {"train", "predict"}
    assert all(w > 0 for w in runs.column("wall_seconds").to_pylist())
    assert artifacts.read_manifest(tmp_path / "sequential")["mode"] == "sequential"
    ig, sq = (compare.members_test(artifacts.read_parquet(tmp_path / m / artifacts.PREDICTIONS))
              for m in ("in-graph", "sequential"))
    assert ig.num_rows == sq.num_rows > 0
    assert compare.parity(ig, sq)[0] <= 1e-5  # the same members, trained another way
    ig, sq = (artifacts.read_parquet(tmp_path / f"{m}.predictions.parquet")
              for m in ("in-graph", "sequential"))
    assert pc.equal(ig.column("y_pred"), sq.column("y_pred")).to_numpy().all()
    probs = [np.column_stack([t.column(c).to_numpy() for c in t.column_names
                              if c.startswith("p_")]) for t in (ig, sq)]
    assert np.abs(probs[0] - probs[1]).max() <= 1e-5
    assert "sequential" in compare.verdict(summary)


ROOT = Path(__file__).resolve().parents[1]
MODE_BRANCH = re.compile(r'(==|!=)\s*"(in-graph|between-graph)"'
                         r'|"(in-graph|between-graph)"\s*(==|!=)')


def test_no_mode_string_branches_outside_replication():
    """Callers ask the mode object (`ensemble.replication.modes`), never compare its name."""
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in [*ROOT.glob("ensemble/**/*.py"),
                                                    *ROOT.glob("pipelines/**/*.py")]
            if not str(p.relative_to(ROOT)).startswith("ensemble/replication/")
            for n, line in enumerate(p.read_text().splitlines(), 1) if MODE_BRANCH.search(line)]
    assert hits == []


def test_no_process_ensemble_starts_runs_a_pipelines_module():
    """`ensemble` names no `pipelines` module to run (its processes are the client and the
    aggregator modules), and `run_process` has no default module."""
    import inspect

    from ensemble.replication import processes

    named = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in ROOT.glob("ensemble/**/*.py")
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Call) and any(
                 isinstance(c, ast.Constant) and isinstance(c.value, str)
                 and c.value.startswith("pipelines") for c in ast.walk(node))]
    assert named == []
    module = inspect.signature(processes.run_process).parameters["module"]
    assert module.default is inspect.Parameter.empty


def test_client_request_round_trips_and_refuses_other_json():
    from ensemble.core.errors import UsageError
    from ensemble.replication import client, protocol

    request = protocol.ClientRequest("run", [0, 2], threads=2, predict="x.parquet", out="o",
                                     devices=["/device:CPU:0", "/device:CPU:1"])
    flag, text = request.argv()
    assert flag == "--request" and protocol.ClientRequest.from_json(text) == request
    with pytest.raises(ValueError, match="not a client request"):
        protocol.ClientRequest.from_json('{"run": "r", "members": [0], "color": 1}')
    with pytest.raises(UsageError, match="--device names 1 devices for 2 members"):
        client.check(protocol.ClientRequest("run", [0, 1], predict="x", out="o",
                                            devices=["/device:CPU:0"]))
    with pytest.raises(UsageError, match="--batch-size applies with --predict only"):
        client.check(protocol.ClientRequest("run", [0], batch_size=10))
