"""Out-of-distribution evaluation: train on digits 0-4, then ask how well the ensemble's
uncertainty tells digits 5-9 (never seen) from its own test split; and its dataset shift.

Run: `python examples/ood_evaluation.py [--members 5] [--epochs 30]`. The CLI equivalent:
`ensemble evaluate --run RUN --ood digits_5_9.csv --shift --plots`.
"""
import argparse
import contextlib
import tempfile
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=5)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--workdir", help="keep the run here (default: a temporary folder, "
                   "removed at the end)")
    args = p.parse_args()
    with (contextlib.nullcontext(args.workdir) if args.workdir
          else tempfile.TemporaryDirectory(prefix="ensemble-example-")) as work:
        run_example(Path(work), args)


def run_example(work: Path, args: argparse.Namespace) -> None:
    """The example itself, its files in `work`."""
    import pandas as pd
    from sklearn.datasets import load_digits

    import ensemble

    d = load_digits()
    df = pd.DataFrame(d.data, columns=[f"p{i}" for i in range(64)]).assign(target=d.target)
    df[df.target < 5].to_csv(work / "digits_0_4.csv", index=False)           # training data
    df[df.target >= 5].drop(columns="target").to_csv(work / "digits_5_9.csv", index=False)

    run = ensemble.train({"data": {"source": str(work / "digits_0_4.csv"), "target": "target"},
                          "members": {"count": args.members},
                          "training": {"epochs": args.epochs}},
                         run_dir=work / "runs" / "digits_0_4")
    ood = run.evaluate_ood(work / "digits_5_9.csv", plots=True)   # also RUN/ood_entropy.png
    print("AUROC/AUPR of telling digits 5-9 from the test split (higher: better):")
    print(ood[ood.score.isin(["entropy", "mutual_information"])]
          [["model", "score", "auroc", "aupr"]].to_string(index=False))
    shift = run.evaluate_shift()                                  # RUN/shift.parquet
    worst = shift[(shift.severity == 5) & shift.aggregator.isin(["mean"])]
    print("ensemble-mean under the strongest corruptions:")
    print(worst[["corruption", "accuracy", "nll", "ece"]].to_string(index=False))


if __name__ == "__main__":
    main()
