"""A third task defined in this file alone, subclassing neither built-in task: Poisson counts.

The builder returns one logit per row, the log-rate; the head is `exp` (members output the
rate `[batch, 1]`), the loss the Poisson NLL, the one aggregator the mean of the members'
rates, and the task writes its own prediction columns (`y_true`, `y_pred`: the rate) and
metrics (`nll`, `rmse`, `mae`, `deviance`). Named by its spec in the config, it trains in
both replication modes with identical members, predicts, evaluates and exports through the
same code as the built-in tasks.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from scipy.special import gammaln

from ensemble.tasks.base import Aggregator, Task, registry
from ensemble.tasks.table_parts import chunks, key_columns, metrics_schema, source_row

METRICS = ("nll", "rmse", "mae", "deviance")


def run_cli(*argv) -> int:  # not conftest's: a between-graph client imports this file too
    from pipelines.cli import main

    return main([str(a) for a in argv])


def poisson_nll(y: np.ndarray, rate: np.ndarray) -> float:
    """Mean Poisson NLL (nats per row) of counts `y` under rates `rate` `[n_rows]`."""
    y, rate = np.asarray(y, np.float64), np.maximum(np.asarray(rate, np.float64), 1e-12)
    return float(np.mean(rate - y * np.log(rate) + gammaln(y + 1)))


def deviance(y: np.ndarray, rate: np.ndarray) -> float:
    """Mean Poisson deviance `2 (y log(y / rate) - (y - rate))` (0 log 0 = 0)."""
    y, rate = np.asarray(y, np.float64), np.maximum(np.asarray(rate, np.float64), 1e-12)
    ylog = np.where(y > 0, y * np.log(np.where(y > 0, y, 1) / rate), 0.0)
    return float(np.mean(2 * (ylog - (y - rate))))


def mean_rate(outputs: np.ndarray, params=None) -> np.ndarray:
    """The mixture's mean: `[n_members, n_rows, 1]` rates -> `[n_rows, 1]`."""
    return np.mean(np.asarray(outputs, np.float64), axis=0)


def mean_rate_tf(outputs, params=None):
    """TensorFlow twin of `mean_rate`."""
    import tensorflow as tf

    return tf.reduce_mean(tf.cast(outputs, tf.float64), axis=0)


class Poisson(Task):
    """Counts with a Poisson rate per row: `log rate` from the builder, `exp` as the head."""

    name = "poisson"
    gaussian = False
    target_dtype = np.float64
    stratified = False
    losses = ("poisson_nll",)
    score_names = ("val_loss", "val_rmse")
    member_score_names = ("val_nll", "val_rmse")
    aggregators = registry(Aggregator("mean", mean_rate, mean_rate_tf))
    default_aggregators = ("mean",)
    tf_module = ""  # its TensorFlow side is its own methods
    shift_metrics = ("nll", "rmse")

    def n_outputs(self, n_classes: int) -> int:
        return 1

    def head(self, logits, name: str = "rate"):
        import keras

        return keras.layers.Activation("exponential", name=name)(logits)

    def loss(self, y, outputs):
        import tensorflow as tf

        rate = tf.cast(outputs[:, 0], tf.float32)
        y = tf.cast(y, tf.float32)
        return tf.reduce_mean(rate - y * tf.math.log(rate + 1e-12))

    def validation_scores(self, y, outputs):
        rate = np.asarray(outputs)[:, 0]
        return {"val_loss": poisson_nll(y, rate),
                "val_rmse": float(np.sqrt(np.mean((np.asarray(y) - rate) ** 2)))}

    def member_scores(self, y, outputs):
        s = self.validation_scores(y, outputs)
        return {"val_nll": s["val_loss"], "val_rmse": s["val_rmse"]}

    def fit_target(self, y_train):
        return self, {}

    def with_target(self, loc, scale):
        return self

    def target_entries(self):
        return {}

    def member_losses(self, y, outputs):
        return [poisson_nll(y, o[:, 0]) for o in np.asarray(outputs)]

    def ensemble_nll(self, y, rows, name):
        return poisson_nll(y, rows[:, 0])

    def epoch_scalars(self, y, outputs, names):
        return {"mean/val_nll": poisson_nll(y, mean_rate(outputs)[:, 0])}

    def refusal(self, name, names):
        return f"Aggregator {name!r} is not a Poisson aggregator; expected mean. Received: {list(names)}"

    # -- its tables ----------------------------------------------------------------------------
    def output_columns(self, classes):
        return ["y_pred"]

    def prediction_chunks(self, split, pred, classes, aggregators, params, chunk_rows):
        stacked = np.stack([o for _, o in sorted(pred.members.items())])
        ensembles = pred.ensembles or {a: self.aggregate(stacked, a) for a in aggregators}
        for key, y, out, _ in chunks(split, pred, ensembles, aggregators, chunk_rows):
            cols = key_columns(key)
            n = len(key.rows)
            cols["y_true"] = (pa.nulls(n, pa.float64()) if y is None
                              else pa.array(np.asarray(y, np.float64)))
            cols["y_pred"] = pa.array(np.asarray(out, np.float64)[:, 0])
            cols["source_row"] = source_row(key)
            yield pa.table(cols)

    def metrics_of(self, splits, aggregators, params, best_member, classes, prior, meta):
        gains, schema = metrics_schema(METRICS, (), ("nll",))
        rows = []
        for split, p in splits.items():
            if p.y is None:
                continue
            models = [(f"member-{i}", i, None, o) for i, o in sorted(p.members.items())]
            models += [(f"ensemble-{a}", None, a, p.ensembles[a]) for a in aggregators]
            for model, member, agg, out in models:
                rate = np.asarray(out, np.float64)[:, 0]
                rows.append({"model": model, "member": member, "aggregator": agg,
                             "split": split, "n": len(rate), "nll": poisson_nll(p.y, rate),
                             "rmse": float(np.sqrt(np.mean((p.y - rate) ** 2))),
                             "mae": float(np.mean(np.abs(p.y - rate))),
                             "deviance": deviance(p.y, rate), "best_member": best_member})
        return pa.Table.from_pylist(rows, schema=schema)

    def format_table(self, metrics_table, fit=None, extra=()):
        lines = [f"{'model':<16} {'split':<11} " + " ".join(f"{m:>9}" for m in METRICS)]
        for r in metrics_table.to_pylist():
            lines.append(f"{r['model']:<16} {r['split']:<11} "
                         + " ".join(f"{r[m]:>9.4f}" for m in METRICS))
        return "\n".join([*lines, *extra])

    def write_plots(self, folder, preds, metrics_table, run_dir):
        return []

    def ood_scores(self, outputs, aggregators, params, members):
        rates = np.asarray(outputs, np.float64)[..., 0]  # [n_members, n_rows]
        rows = [{"model": f"member-{i}", "member": i, "aggregator": None,
                 "scores": {"std": np.sqrt(r), "epistemic_std": None}}
                for i, r in zip(members, rates)]
        mix_var = rates.mean(axis=0) + rates.var(axis=0)  # the Poisson mixture's variance
        return rows + [{"model": f"ensemble-{a}", "member": None, "aggregator": a,
                        "scores": {"std": np.sqrt(mix_var), "epistemic_std": rates.std(axis=0)}}
                       for a in aggregators]

    def shift_scores(self, y, outputs, aggregator):
        rate = np.asarray(outputs, np.float64)[:, 0]
        return {"nll": poisson_nll(y, rate), "rmse": float(np.sqrt(np.mean((y - rate) ** 2)))}

    def serving_outputs(self, stacked, name, params, classes):
        import tensorflow as tf

        rate = self.aggregate_tf(stacked, name, params)
        return {"rate": rate[:, 0],
                "member_rate": tf.transpose(tf.cast(stacked, tf.float64)[..., 0])}


SPEC = f"{os.path.abspath(__file__)}:Poisson"


def _counts(path, n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = rng.poisson(np.exp(0.8 + 0.6 * x[:, 0] - 0.4 * x[:, 1]))
    pq.write_table(pa.table({"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2],
                             "count": y.astype(np.int64)}), path)
    return x, y


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("poisson")
    _counts(base / "counts.parquet")
    cfg = base / "poisson.toml"
    cfg.write_text(f'[data]\nsource = "{base / "counts.parquet"}"\ntarget = "count"\n'
                   f'task = "{SPEC}"\n'
                   "[members]\ncount = 2\nhidden = [8]\n"
                   "[training]\nepochs = 2\nbatch_size = 64\nlearning_rate = 0.01\nseed = 3\n"
                   '[placement]\ndevices = "cpu:2"\n')
    # between-graph: one client trains both members in turn (the client count is
    # test_between_graph's and test_parity_cnn's; each client process is a TensorFlow start)
    for mode, jobs in (("in-graph", []), ("between-graph", ["--jobs", "1"])):
        assert run_cli("train", "--config", cfg, "--mode", mode, *jobs, "--run-dir", base / mode,
                       "--quiet") == 0
    return base


def _rates(path, model: str) -> np.ndarray:
    t = pq.read_table(path)
    t = t.filter(pc.equal(t.column("model"), model))
    return t.column("y_pred").to_numpy()


def test_both_modes_train_identical_poisson_members(runs):
    import keras

    from ensemble.core import artifacts

    manifest = artifacts.read_manifest(runs / "between-graph")
    assert manifest["task"] == SPEC
    member = keras.saving.load_model(runs / "in-graph" / "members" / "member-0.keras",
                                     safe_mode=True)
    assert member.layers[-1].name == "rate" and member.output.shape[-1] == 1
    for model in ("member-0", "member-1", "ensemble-mean"):
        a = _rates(runs / "in-graph" / "predictions.parquet", model)
        b = _rates(runs / "between-graph" / "predictions.parquet", model)
        assert np.all(a > 0)
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max()), model
    t = pq.read_table(runs / "in-graph" / "predictions.parquet")
    m0, m1, ens = (_rates(runs / "in-graph" / "predictions.parquet", m)
                   for m in ("member-0", "member-1", "ensemble-mean"))
    assert np.allclose(ens, (m0 + m1) / 2)  # the mixture's mean rate
    assert "p_0" not in t.column_names and "std" not in t.column_names


def test_metrics_are_the_poisson_ones(runs):
    metrics = pq.read_table(runs / "in-graph" / "metrics.parquet")
    assert set(METRICS) <= set(metrics.column_names)
    preds = pq.read_table(runs / "in-graph" / "predictions.parquet")
    row = next(r for r in metrics.to_pylist()
               if r["model"] == "ensemble-mean" and r["split"] == "test")
    t = preds.filter(pc.and_(pc.equal(preds.column("model"), "ensemble-mean"),
                             pc.equal(preds.column("split"), "test")))
    y, rate = t.column("y_true").to_numpy(), t.column("y_pred").to_numpy()
    want = np.mean(rate - y * np.log(rate) + gammaln(y + 1))
    assert row["nll"] == pytest.approx(want, rel=1e-9)


def test_predict_evaluate_and_export(runs, tmp_path, capsys, plain_tf):
    run = runs / "in-graph"
    x, _ = _counts(tmp_path / "counts.parquet")
    out = tmp_path / "p.parquet"
    assert run_cli("predict", "--run", run, "--data", tmp_path / "counts.parquet", "--out", out,
                   "--quiet") == 0
    wide = pq.read_table(out)
    want = pq.read_table(run / "predictions.parquet").filter(
        pc.equal(pc.field("model"), "ensemble-mean"))
    got = wide.column("y_pred").to_numpy()[want.column("source_row").to_numpy()]
    assert np.abs(got - want.column("y_pred").to_numpy()).max() <= 1e-9
    capsys.readouterr()
    assert run_cli("evaluate", "--run", run) == 0
    text = capsys.readouterr().out
    assert "ensemble-mean" in text and "deviance" in text
    models = tmp_path / "models"
    assert run_cli("export", "--run", run, "--out", models) == 0
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    code = ("import sys, numpy as np, tensorflow as tf\n"
            "m = tf.saved_model.load(sys.argv[1])\n"
            "p = m.signatures['serving_default'](features=tf.constant(np.load(sys.argv[2])))\n"
            "np.save(sys.argv[3], p['rate'].numpy())\n")
    proc = plain_tf.run(code, models / "1", tmp_path / "x.npy", tmp_path / "served.npy",
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    served = np.load(tmp_path / "served.npy")
    assert np.abs(served - wide.column("y_pred").to_numpy()).max() <= 1e-5 * served.max()


def test_ood_scores_and_target_transform_ask_the_task(runs, tmp_path, capsys):
    run = runs / "in-graph"
    x, y = _counts(tmp_path / "far.parquet", n=60, seed=5)
    pq.write_table(pa.table({"x0": 6 + x[:, 0], "x1": x[:, 1], "x2": x[:, 2],
                             "count": y.astype(np.int64)}), tmp_path / "far.parquet")
    assert run_cli("evaluate", "--run", run, "--ood", tmp_path / "far.parquet") == 0
    t = pq.read_table(run / "ood.parquet").to_pylist()
    assert {r["score"] for r in t} == {"std", "epistemic_std"}  # Poisson.ood_scores' scores
    assert {r["model"] for r in t} == {"member-0", "member-1", "ensemble-mean"}
    assert all(r["n_out"] == 60 for r in t)
    assert all((r["auroc"] is None) == (r["member"] is not None and r["score"] == "epistemic_std")
               for r in t)
    capsys.readouterr()
    assert run_cli("train", "--config", runs / "poisson.toml", "--target-transform", "log1p",
                   "--run-dir", tmp_path / "t", "--quiet") == 2
    assert "Expected a regression target" in capsys.readouterr().err


def test_shift_metrics_ask_the_task(runs, capsys):
    run = runs / "between-graph"
    assert run_cli("evaluate", "--run", run, "--shift") == 0
    assert "nll" in capsys.readouterr().out
    rows = pq.read_table(run / "shift.parquet").to_pylist()
    assert {r["model"] for r in rows} == {"member-0", "member-1", "ensemble-mean"}
    assert all(r["accuracy"] is None and r["ece"] is None for r in rows)  # not Poisson's
    for c in dict.fromkeys((r["corruption"], r["severity"]) for r in rows):
        part = {r["model"]: r for r in rows if (r["corruption"], r["severity"]) == c}
        members = [part[f"member-{i}"] for i in (0, 1)]
        # the mean of the rates: RMSE (a norm) and the Poisson NLL (convex in the rate) are at
        # most the members' mean, by Jensen's inequality
        for k in ("rmse", "nll"):
            assert np.isfinite(part["ensemble-mean"][k])
            assert part["ensemble-mean"][k] <= np.mean([m[k] for m in members]) + 1e-9
