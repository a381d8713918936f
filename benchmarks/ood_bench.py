"""Measure what deep ensembles are for, on built-in data (figures printed, nothing asserted):

1. digits trained on classes 0-4 only, 5-9 as the OOD set: OOD AUROC of the ensemble against
   its mean member (entropy, max probability, mutual information), per seed;
2. ensemble accuracy and share kept against the confidence threshold;
3. table-noise and feature-dropout shift: the ensemble's NLL against the mean member's per
   severity;
4. adversarial training (`training.adversarial_epsilon = 0.01`, the paper's) against none:
   test NLL on digits (all classes) and diabetes, and training seconds per epoch.

    python -m benchmarks.ood_bench [--seeds 0,1,2] [--epochs 30] [--members 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np


def _digits_split(folder: Path) -> tuple[str, str]:
    import pandas as pd
    from sklearn.datasets import load_digits

    d = load_digits()
    df = pd.DataFrame(d.data, columns=[f"p{i}" for i in range(64)])
    df["target"] = d.target
    df[df.target < 5].to_csv(folder / "digits_0_4.csv", index=False)
    df[df.target >= 5].drop(columns="target").to_csv(folder / "digits_5_9.csv", index=False)
    return str(folder / "digits_0_4.csv"), str(folder / "digits_5_9.csv")


def _config(source: str, seed: int, members: int, epochs: int, **training) -> dict:
    return {"data": {"source": source, "target": "target"},
            "members": {"count": members},
            "training": {"seed": seed, "epochs": epochs, **training}}


def ood_and_shift(folder: Path, seeds, members: int, epochs: int) -> None:
    import ensemble
    from ensemble.tasks import risk_coverage as RC

    train_csv, ood_csv = _digits_split(folder)
    print(f"digits 0-4 -> OOD 5-9: {members} members, {epochs} epochs")
    print(f"{'seed':>4} {'score':>20} {'mean member':>12} {'best member':>12} {'ensemble':>9}")
    rising, shift_ok = [], []
    for seed in seeds:
        run = ensemble.train(_config(train_csv, seed, members, epochs),
                             run_dir=folder / f"ood-{seed}", overwrite=True)
        ood = run.evaluate_ood(ood_csv)
        for score in ("entropy", "max_probability", "mutual_information"):
            part = ood[ood.score == score]
            mem = part[part.member.notna()].auroc
            ens = part[part.model == "ensemble-mean"].auroc.iloc[0]
            print(f"{seed:>4} {score:>20} {mem.mean():>12.4f} {mem.max():>12.4f} {ens:>9.4f}"
                  if mem.notna().all() else f"{seed:>4} {score:>20} {'n/a':>12} {'n/a':>12} "
                  f"{ens:>9.4f}")
        preds = run.predictions
        test = preds[(preds.split == "test") & (preds.model == "ensemble-mean")]
        cols = [c for c in test.columns if c.startswith("p_")]
        acc, kept = RC.accuracy_vs_confidence(test.y_true.to_numpy(), test[cols].to_numpy(),
                                              (0.0, 0.5, 0.7, 0.9, 0.95))
        print("     ensemble accuracy at tau 0/.5/.7/.9/.95 on test: "
              + " ".join(f"{a:.3f}({k:.2f} kept)" for a, k in zip(acc, kept)))
        # the paper's Fig. 6: test plus the OOD rows, which are always wrong (label -1)
        import pandas as pd

        out = run.predict(pd.read_csv(ood_csv), layout="long")
        out = out[out.model == "ensemble-mean"]
        y = np.r_[test.y_true.to_numpy(), -np.ones(len(out), int)]
        p = np.r_[test[cols].to_numpy(), out[cols].to_numpy()]
        acc, kept = RC.accuracy_vs_confidence(y, p, (0.0, 0.5, 0.7, 0.9, 0.95))
        rising.append(bool(np.all(np.diff(acc[~np.isnan(acc)]) >= -1e-12)))
        print("     ... on test + OOD (OOD counted wrong): "
              + " ".join(f"{a:.3f}({k:.2f} kept)" for a, k in zip(acc, kept)))
        shift = run.evaluate_shift()
        for name in ("gaussian_noise", "feature_dropout"):
            part = shift[shift.corruption == name]
            line = []
            for sev in range(1, 6):
                s = part[part.severity == sev]
                mem = s[s.member.notna()].nll.mean()
                ens = s[s.model == "ensemble-mean"].nll.iloc[0]
                shift_ok.append(ens <= mem)
                line.append(f"{mem:.3f}/{ens:.3f}")
            print(f"     shift {name:<16} NLL mean member/ensemble, severity 1-5: "
                  + " ".join(line))
    print(f"ensemble accuracy on test + OOD non-decreasing in tau: {sum(rising)}/{len(rising)} "
          "seeds; "
          f"ensemble NLL <= mean member's under shift: {sum(shift_ok)}/{len(shift_ok)} "
          "(corruption, severity, seed)")


def adversarial(folder: Path, seeds, members: int, epochs: int) -> None:
    import ensemble

    print(f"adversarial training, epsilon 0.01 of the scaled input range ({members} members, "
          f"{epochs} epochs): ensemble-mean test NLL, seconds per epoch (mean member)")
    for source in ("digits", "diabetes"):
        for eps in (0.0, 0.01):
            nll, secs = [], []
            for seed in seeds:
                cfg = _config(source, seed, members, epochs, adversarial_epsilon=eps)
                cfg["data"].pop("target")
                run = ensemble.train(cfg, run_dir=folder / f"adv-{source}-{eps}-{seed}",
                                     overwrite=True)
                m = run.metrics
                nll.append(m[(m.split == "test") & (m.model == "ensemble-mean")].nll.iloc[0])
                h = run.history
                secs.append(h[h.epoch > 0].groupby("epoch").seconds.mean().mean())
            print(f"  {source:<9} eps {eps:<5} NLL " + " ".join(f"{v:.4f}" for v in nll)
                  + f" (mean {np.mean(nll):.4f}); {np.mean(secs):.3f} s/epoch")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--members", type=int, default=5)
    p.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    p.add_argument("--skip", default="", help="ood,adversarial: parts to skip")
    a = p.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    with tempfile.TemporaryDirectory(prefix="ood-bench-") as tmp:
        folder = Path(a.out or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if "ood" not in a.skip:
            ood_and_shift(folder, seeds, a.members, a.epochs)
        if "adversarial" not in a.skip:
            adversarial(folder, seeds, a.members, a.epochs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
