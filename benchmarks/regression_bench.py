"""`python -m benchmarks.regression_bench`: the regression protocol of Lakshminarayanan et al.
2017 (deep ensembles, section 3.2 and Table 1) on the regression data sets that ship offline.

Protocol: 5 Gaussian members, one hidden layer of 50 ReLU units, batch 100, 40 epochs, Adam;
random 90/10 train/test splits (`data.split_seed` = 0..N-1), the validation rows (10% of the
training part) carved from the training part; every run in-graph through `ensemble train`'s
blocks. Printed: mean and standard deviation over the splits of test RMSE and NLL (target
units) of the mean member, the ensemble (`mean`) and the ensemble with `std-scaling` fitted
on validation. Only scikit-learn's `diabetes` ships offline here (the paper's UCI sets,
Boston, Concrete, ..., would need a download).

Options: `--splits N` (default 5), `--epochs N` (40), `--learning-rate X` (0.01),
`--out DIR` (run directories; default a temporary folder).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

DATASETS = ("diabetes",)


def protocol_config(source: str, split_seed: int, epochs: int, learning_rate: float):
    """The protocol's `Config` for one split."""
    from ensemble.config import schema

    return schema.from_dict({
        "data": {"source": source, "task": "regression", "test_size": 0.1,
                 "validation_size": 0.09, "split_seed": split_seed},
        "members": {"count": 5, "hidden": [50], "activation": "relu", "dropout": 0.0},
        "training": {"epochs": epochs, "batch_size": 100, "learning_rate": learning_rate,
                     "optimizer": "adam", "seed": split_seed, "loss": "gaussian_nll"},
        "aggregation": {"aggregators": ["mean", "std-scaling"]},
        "placement": {"devices": "cpu:1"}})


def run_split(source: str, split_seed: int, root: Path, epochs: int, lr: float) -> dict:
    """Train one split; returns test `{name: (rmse, nll)}` for the mean member, `mean` and
    `std-scaling`."""
    import ensemble

    cfg = protocol_config(source, split_seed, epochs, lr)
    m = ensemble.train(cfg, run_dir=root / f"{source}-{split_seed}", overwrite=True).metrics
    test = m[m["split"] == "test"]
    members = test[test["member"].notna()]
    out = {"mean member": (members["rmse"].mean(), members["nll"].mean())}
    for agg in ("mean", "std-scaling"):
        r = test[test["aggregator"] == agg].iloc[0]
        out[f"ensemble {agg}"] = (r["rmse"], r["nll"])
    return out


def table(results: dict[str, list[dict]]) -> str:
    """Markdown table: data set, model, RMSE mean +- std, NLL mean +- std over splits."""
    lines = ["| data set | model | splits | test RMSE | test NLL |", "| --- | --- | --- | --- | --- |"]
    for source, runs in results.items():
        for name in runs[0]:
            rmse = np.array([r[name][0] for r in runs])
            nll = np.array([r[name][1] for r in runs])
            lines.append(f"| {source} | {name} | {len(runs)} | {rmse.mean():.2f} ± "
                         f"{rmse.std():.2f} | {nll.mean():.3f} ± {nll.std():.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.regression_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from ensemble.replication import devices

    devices.split_cpu(1)
    root = args.out or Path(tempfile.mkdtemp(prefix="regression-bench-"))
    results = {s: [run_split(s, k, root, args.epochs, args.learning_rate)
                   for k in range(args.splits)] for s in DATASETS}
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
