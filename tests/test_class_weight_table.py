"""`training.class_weight` as a table of class label -> weight, from the command line: the
weights recorded in the manifest in class order (a class left out weighs 1), the loss they
weight, and a label that is not a class refused before training."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ensemble.core.errors import UsageError

from conftest import run_cli


def _table(path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3))
    y = np.where(x[:, 0] + rng.normal(scale=0.5, size=300) > 1.2, "yes", "no")
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": y}), path)
    return path


def _positive_share(run) -> float:
    t = pq.read_table(run / "predictions.parquet").to_pandas()
    test = t[(t.split == "test") & (t.model == "ensemble-mean")]
    return float(test["p_yes"].mean())


def test_a_table_of_weights_is_recorded_in_class_order_and_weights_the_loss(tmp_path, capsys):
    data = _table(tmp_path / "t.parquet")
    common = ["train", "--data", str(data), "--target", "label", "--members", "2",
              "--epochs", "8", "--quiet", "--set", "members.hidden=[8]"]
    assert run_cli(*common, "--run-dir", str(tmp_path / "plain")) == 0
    assert run_cli(*common, "--run-dir", str(tmp_path / "heavy"),
                   "--set", "training.class_weight={yes = 20.0}") == 0
    manifest = json.loads((tmp_path / "heavy" / "manifest.json").read_text())
    assert manifest["dataset"]["class_weight"] == [1.0, 20.0]  # classes sorted: no, yes
    assert _positive_share(tmp_path / "heavy") > _positive_share(tmp_path / "plain") + 0.1
    capsys.readouterr()
    assert run_cli(*common, "--run-dir", str(tmp_path / "bad"),
                   "--set", "training.class_weight={maybe = 2.0}") == 2
    err = capsys.readouterr().err
    assert "Expected `training.class_weight` to name classes of the run (no, yes)" in err
    assert "Received: maybe" in err and "Traceback" not in err
    assert run_cli(*common, "--run-dir", str(tmp_path / "neg"),
                   "--set", "training.class_weight={yes = -1}") == 2
    assert "finite weights >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("value", [{"yes": 0, "no": 0.0}, {"yes": float("nan")}, {"yes": True},
                                   {"yes": "2"}, {"yes": float("inf")}, "heavy"])
def test_a_table_of_bad_weights_is_refused_by_name(value):
    from ensemble.config.checks import check_class_weight

    with pytest.raises(UsageError, match=r"Expected `training.class_weight`"):
        check_class_weight(value)


def test_an_empty_table_weighs_every_class_one():
    from ensemble.config.checks import check_class_weight
    from ensemble.tasks.classification.task import Classification

    check_class_weight({})
    _, entries = Classification().with_class_weight({}, np.array([0, 1]), ["no", "yes"])
    assert entries["class_weight"] == [1.0, 1.0]
