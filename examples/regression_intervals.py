"""Regression with intervals: a Gaussian deep ensemble on scikit-learn's diabetes data.

Each member predicts a mean and a variance; the ensemble's predictive distribution gives a
central 90% interval `mean +- 1.645 std` per row, split into aleatoric (noise) and epistemic
(the members disagree) parts. Run: `python examples/regression_intervals.py [--epochs 30]`.
"""
import argparse
import contextlib
import tempfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--workdir", help="keep the run here (default: a temporary folder, "
                   "removed at the end)")
    args = p.parse_args()
    with (contextlib.nullcontext(args.workdir) if args.workdir
          else tempfile.TemporaryDirectory(prefix="ensemble-example-")) as work:
        run_example(Path(work), args)


def run_example(work: Path, args: argparse.Namespace) -> None:
    """The example itself, its files in `work`."""
    from sklearn.datasets import load_diabetes

    import ensemble

    run = ensemble.train({"data": {"source": "diabetes"},      # built-in: a regression target
                          "members": {"count": args.members},
                          "training": {"epochs": args.epochs}},
                         run_dir=work / "runs" / "diabetes")
    cols = ["model", "rmse", "nll", "coverage_90", "width_90"]
    print(run.metrics.query("split == 'test'")[cols].to_string(index=False))

    d = load_diabetes(as_frame=True)
    new = d.frame.head(5)                               # rows to predict (with their target)
    pred = run.predict(new)                             # y_pred (mean), std, aleatoric/epistemic
    pred["low_90"] = pred.y_pred - 1.645 * pred["std"]
    pred["high_90"] = pred.y_pred + 1.645 * pred["std"]
    print(pred[["y_true", "y_pred", "low_90", "high_90", "aleatoric_std",
                "epistemic_std"]].round(1).to_string(index=False))
    # The same from the command line:
    #   ensemble train --data diabetes && ensemble predict --run RUN --data new.csv --out p.csv


if __name__ == "__main__":
    main()
