"""TensorBoard: `--tensorboard` writes tf.summary scalars per member and for the ensemble; the
event files are read back with TensorFlow's own reader and compared with history.parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli


def _scalars(folder: Path) -> dict[tuple[str, int], float]:
    """(tag, step) -> value of every scalar in the event files of `folder`."""
    import tensorflow as tf

    out = {}
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert files, f"no event file in {folder}"
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                assert v.metadata.plugin_data.plugin_name == "scalars"
                out[(v.tag, event.step)] = float(tf.make_ndarray(v.tensor))
    return out


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_tensorboard_scalars_per_member_and_epoch(mode, tmp_path, tiny_config):
    import pandas as pd

    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", tiny_config, "--mode", mode, "--members", 2,
                   "--run-dir", run_dir, "--tensorboard", "--quiet") == 0
    history = pd.read_parquet(run_dir / "history.parquet")
    epochs = sorted(history["epoch"].unique())
    assert epochs == [0, 1]
    for member in (0, 1):
        got = _scalars(run_dir / "tensorboard" / f"member-{member}")
        for _, row in history[history["member"] == member].iterrows():
            for tag in ("loss", "val_loss", "val_accuracy"):
                assert got[(tag, row["epoch"])] == pytest.approx(row[tag], rel=1e-6)
    ens = _scalars(run_dir / "tensorboard" / "ensemble")
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    final = metrics[(metrics["model"] == "ensemble-mean") & (metrics["split"] == "validation")]
    last = epochs[-1]
    # the last epoch's ensemble scalars are the ensemble of the final members
    assert ens[("mean/val_accuracy", last)] == pytest.approx(final["accuracy"].item(), rel=1e-6)
    assert ens[("mean/val_nll", last)] == pytest.approx(final["nll"].item(), rel=1e-4)
    assert ("vote/val_accuracy", last) in ens and ("vote/val_nll", last) not in ens
    steps = {step for _, step in ens}
    assert steps == ({0, 1} if mode == "in-graph" else {1})  # per epoch only in-graph


def test_config_key_turns_tensorboard_on(tmp_path, tiny_config):
    cfg = tmp_path / "tb.toml"
    cfg.write_text(Path(tiny_config).read_text().replace("seed = 3", "seed = 3\ntensorboard = true"))
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", cfg, "--members", 1, "--epochs", 1,
                   "--run-dir", run_dir, "--quiet") == 0
    got = _scalars(run_dir / "tensorboard" / "member-0")
    assert {tag for tag, _ in got} == {"loss", "val_loss", "val_accuracy"}
    assert all(np.isfinite(v) for v in got.values())


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_tensorboard_of_a_regression_run(mode, tmp_path):
    import pandas as pd

    run_dir = tmp_path / "run"
    assert run_cli("train", "--data", "diabetes", "--mode", mode, "--members", 2, "--epochs", 2,
                   "--devices", "cpu:2", "--run-dir", run_dir, "--tensorboard", "--quiet") == 0
    history = pd.read_parquet(run_dir / "history.parquet")
    got = _scalars(run_dir / "tensorboard" / "member-1")
    for r in history[history.member == 1].itertuples():
        assert got[("val_rmse", r.epoch)] == pytest.approx(r.val_rmse, rel=1e-5)
        assert got[("val_loss", r.epoch)] == pytest.approx(r.val_loss, rel=1e-5)
    ens = _scalars(run_dir / "tensorboard" / "ensemble")
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    row = metrics[(metrics.model == "ensemble-mean") & (metrics.split == "validation")].iloc[0]
    assert ens[("mean/val_rmse", 1)] == pytest.approx(row.rmse, rel=1e-4)
    assert ens[("mean/val_nll", 1)] == pytest.approx(row.nll, rel=1e-4)


def test_between_graph_tensorboard_with_auto_epochs(tmp_path, tiny_config, monkeypatch):
    """`training.epochs = "auto"` (the default): the ensemble's scalars go at the last epoch
    the run resolved (the driver's config still says "auto")."""
    from ensemble.config import auto

    monkeypatch.setattr(auto, "epochs_for", lambda *a, **k: 2)  # resolved in this process
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", tiny_config, "--mode", "between-graph", "--members", 2,
                   "--set", "training.epochs=auto", "--run-dir", run_dir, "--tensorboard",
                   "--quiet") == 0
    ens = _scalars(run_dir / "tensorboard" / "ensemble")
    assert {step for _, step in ens} == {1}
