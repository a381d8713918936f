"""`python -m benchmarks.embedding_bench`: entity embeddings against one-hot encoding, and an
imbalanced binary table against HistGradientBoosting.

Two synthetic tables (made here; nothing is downloaded):

- `highcard`: `--rows` rows (50,000), 4 classes, 4 numeric columns and a text column of
  `--categories` categories (10,000) that carries most of the signal (each category its own
  logit offsets), categories drawn with Zipf-like frequencies (a long tail of rare ones).
  Trained with the defaults (the column embedded) and with every category one-hot
  (`data.embed_above=0`, `data.max_categories=0`), each in its own process (`os.wait4`:
  peak resident memory).
- `imbalanced`: scikit-learn's `make_classification` with 6% positives (6,000 rows, 20
  features); the ensemble's ROC AUC (scikit-learn's `roc_auc_score` of the predictions)
  against `HistGradientBoostingClassifier` (defaults) fitted on the run's training rows.

Figures on the test split: log loss (probabilities clipped at 1e-12), the prior's log loss
(the training split's class shares), accuracy, ROC AUC for the binary table, wall seconds
and peak memory of the training process. Goals (issue 63): defaults beat the prior and come
within 0.002 log loss of every-category one-hot at a fraction of its memory, peak memory
under 1.5 GB; ROC AUC at least HGB's minus 0.01.

Options: `--rows`, `--categories`, `--out DIR`, `--set KEY=VALUE` (a config key for every
run, repeatable), `--tables highcard,imbalanced`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.tabular_bench import run_child, run_rows


def highcard(rows: int, categories: int, seed: int = 0):
    """The high-cardinality table (a pandas DataFrame, target `label`)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, categories + 1) ** 0.5
    city = rng.choice(categories, rows, p=weights / weights.sum())
    offsets = rng.normal(size=(categories, 4)) * 1.5
    x = rng.normal(size=(rows, 4))
    logits = offsets[city] + x @ rng.normal(size=(4, 4)) * 0.7
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    label = (p.cumsum(1) > rng.random((rows, 1))).argmax(1)
    frame = pd.DataFrame(x, columns=[f"x{j}" for j in range(4)])
    frame["city"] = [f"city-{c}" for c in city]
    frame["label"] = label
    return frame


def imbalanced(rows: int = 6000, seed: int = 0):
    """The imbalanced binary table (6% positives; a pandas DataFrame, target `label`)."""
    import pandas as pd
    from sklearn.datasets import make_classification

    x, y = make_classification(rows, 20, n_informative=6, weights=[0.94], flip_y=0.02,
                               random_state=seed)
    frame = pd.DataFrame(x, columns=[f"f{j}" for j in range(20)])
    frame["label"] = y
    return frame


def figures(run: Path, frame) -> dict:
    """Test log loss, the prior's, accuracy and (binary) ROC AUC of the run's first
    aggregator, from its `predictions.parquet`."""
    import json

    import pyarrow.parquet as pq
    from sklearn.metrics import log_loss, roc_auc_score

    from ensemble.tasks.choice import default_aggregator

    fit = json.loads((run / "aggregators.json").read_text())
    chosen = default_aggregator(fit["aggregators"], fit)
    p = pq.read_table(run / "predictions.parquet").to_pandas()
    t = p[(p.split == "test") & (p.model == f"ensemble-{chosen}")].sort_values("row")
    classes = sorted(frame.label.unique())
    prob = np.clip(t[[f"p_{c}" for c in classes]].to_numpy(np.float64), 1e-12, 1)
    prob /= prob.sum(1, keepdims=True)  # float32 rows: sum to 1 within 1e-6
    y = t.y_true.to_numpy().astype(int)
    rows = run_rows(run)
    held = np.zeros(len(frame), bool)
    held[rows["validation"]] = held[rows["test"]] = True
    share = np.bincount(frame.label.to_numpy()[~held], minlength=len(classes)) / (~held).sum()
    out = {"log_loss": log_loss(y, prob, labels=classes),
           "prior": log_loss(y, np.tile(share, (len(y), 1)), labels=classes),
           "accuracy": float((prob.argmax(1) == y).mean())}
    if len(classes) == 2:
        out["roc_auc"] = roc_auc_score(y, prob[:, 1])
    return out


def hgb_auc(frame, run: Path) -> float:
    """ROC AUC on the run's test rows of HGB (defaults) fitted on its training rows."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import roc_auc_score

    rows = run_rows(run)
    held = np.zeros(len(frame), bool)
    held[rows["validation"]] = held[rows["test"]] = True
    x, y = frame.drop(columns="label").to_numpy(), frame.label.to_numpy()
    hgb = HistGradientBoostingClassifier(random_state=0).fit(x[~held], y[~held])
    return roc_auc_score(y[rows["test"]], hgb.predict_proba(x[rows["test"]])[:, 1])


def train(table: Path, run: Path, settings: list[str]) -> tuple[float, float]:
    """`ensemble train` on `table` in its own process: (wall seconds, peak MiB)."""
    sets = [a for s in settings for a in ("--set", s)]
    return run_child([sys.executable, "-m", "pipelines.cli", "train", "--data", str(table),
                      "--target", "label", "--run-dir", str(run), "--quiet", *sets])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--categories", type=int, default=10_000)
    ap.add_argument("--tables", default="highcard,imbalanced")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--set", action="append", default=[], dest="settings")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="embedding-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'table / encoding':32} {'log loss':>9} {'prior':>8} {'accuracy':>9} "
          f"{'ROC AUC':>8} {'wall s':>7} {'peak MiB':>9}")
    if "highcard" in args.tables:
        frame = highcard(args.rows, args.categories)
        frame.to_csv(out / "highcard.csv", index=False)
        for name, extra in (("embedded (defaults)", []),
                            ("one-hot, every category", ["data.embed_above=0",
                                                         "data.max_categories=0"])):
            run = out / f"highcard-{extra and 'onehot' or 'embedded'}"
            wall, peak = train(out / "highcard.csv", run, args.settings + extra)
            f = figures(run, frame)
            print(f"highcard {name:23} {f['log_loss']:9.4f} {f['prior']:8.4f} "
                  f"{f['accuracy']:9.4f} {'':>8} {wall:7.1f} {peak:9.0f}")
    if "imbalanced" in args.tables:
        frame = imbalanced()
        frame.to_csv(out / "imbalanced.csv", index=False)
        wall, peak = train(out / "imbalanced.csv", out / "imbalanced", args.settings)
        f = figures(out / "imbalanced", frame)
        print(f"imbalanced {'ensemble (defaults)':21} {f['log_loss']:9.4f} {f['prior']:8.4f} "
              f"{f['accuracy']:9.4f} {f['roc_auc']:8.4f} {wall:7.1f} {peak:9.0f}")
        print(f"imbalanced {'HistGradientBoosting':21} {'':>9} {'':>8} {'':>9} "
              f"{hgb_auc(frame, out / 'imbalanced'):8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
