"""Make the documentation's figures from real small runs (run by `docs/hooks.py` at build time).

Usage: `python docs/figures.py OUT_DIR`. Writes into OUT_DIR the PNGs the pages show, each made
by the project's own commands as a user would run them (no figure is drawn here):

- `ensemble compare` of both modes on digits (4 members, 3 epochs): `comparison.png`;
- `ensemble evaluate --plots` of its in-graph run: `reliability.png`, `ensemble_size.png`,
  `members.png`, `confidence.png`;
- `ensemble train` on digits classes 0-4 (a CSV), then `ensemble evaluate --ood
  digits_5_9.csv --shift --plots`: `ood_entropy.png`, `shift.png`;
- `ensemble train --data diabetes` then `ensemble evaluate --plots`: `pit.png`,
  `coverage.png`, `error_vs_std.png`.

Sizes are small (4 members, a few epochs) so the whole script takes about a minute or two on
2 CPU cores; no network (scikit-learn's data sets ship with it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLASSIFICATION = ("reliability.png", "ensemble_size.png", "members.png", "confidence.png")
OOD = ("ood_entropy.png", "shift.png")
REGRESSION = ("pit.png", "coverage.png", "error_vs_std.png")
FIGURES = ("comparison.png", *CLASSIFICATION, *OOD, *REGRESSION)


def ensemble(*args: str) -> None:
    """Run `ensemble ARGS` (`python -m pipelines.cli`) from this checkout; raise on failure."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env,
                          capture_output=True, text=True, timeout=900)
    print(f"figures: ensemble {' '.join(args)} ({time.monotonic() - started:.1f} s)",
          file=sys.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"ensemble {' '.join(args)} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def digits_csvs(folder: Path) -> tuple[Path, Path]:
    """scikit-learn's digits as two CSVs: classes 0-4 with labels (training), 5-9 without (OOD)."""
    import pandas as pd
    from sklearn.datasets import load_digits

    d = load_digits()
    df = pd.DataFrame(d.data, columns=[f"p{i}" for i in range(64)]).assign(target=d.target)
    train, ood = folder / "digits_0_4.csv", folder / "digits_5_9.csv"
    df[df.target < 5].to_csv(train, index=False)
    df[df.target >= 5].drop(columns="target").to_csv(ood, index=False)
    return train, ood


def make(out: Path) -> None:
    """Every figure of FIGURES into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ensemble-docs-") as tmp:
        work = Path(tmp)
        train_csv, ood_csv = digits_csvs(work)
        cmp = work / "compare"
        ensemble("compare", "--data", "digits", "--members", "4", "--epochs", "3",
                 "--repeats", "1", "--run-dir", str(cmp))
        run = cmp / "in-graph"
        ensemble("evaluate", "--run", str(run), "--plots")
        ood = work / "digits_0_4"
        ensemble("train", "--data", str(train_csv), "--target", "target", "--members", "5",
                 "--epochs", "10", "--run-dir", str(ood), "--quiet")
        ensemble("evaluate", "--run", str(ood), "--ood", str(ood_csv), "--shift", "--plots")
        reg = work / "diabetes"
        ensemble("train", "--data", "diabetes", "--members", "4", "--epochs", "20",
                 "--run-dir", str(reg), "--quiet")
        ensemble("evaluate", "--run", str(reg), "--plots")
        sources = {"comparison.png": cmp, **{n: run for n in CLASSIFICATION},
                   **{n: ood for n in OOD},
                   **{n: reg for n in REGRESSION}}
        for name, folder in sources.items():
            if not (folder / name).is_file():
                raise RuntimeError(f"expected {folder / name} after the runs; it is missing")
            shutil.copyfile(folder / name, out / name)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/figures.py OUT_DIR")
    started = time.monotonic()
    make(Path(sys.argv[1]))
    print(f"figures: {len(FIGURES)} written to {sys.argv[1]} in "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
