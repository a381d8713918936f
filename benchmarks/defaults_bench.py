"""`python -m benchmarks.defaults_bench`: the regression defaults' figures on `diabetes`.

What a user gets from `ensemble train --data diabetes` with no other setting, over split seeds
`[data] split_seed` = 0..N-1 (one `ensemble train` process per seed): the test NLL (Gaussian,
nats per row, target units) of the ensemble that `predict` answers with (the run's best
aggregator on validation NLL, `ensemble.tasks.choice`), of the mean member and of the best member
(chosen on validation, as `evaluate` reports it), and the ensemble's 90% interval coverage.
Printed per seed, with the acceptance of issue 30 (ensemble NLL below the mean member's and at
most 0.05 nats above the best member's; coverage within 0.05 of 0.90), then the means.

Options: `--seeds N` (default 5), `--out DIR` (run directories, reused when complete;
default a temporary folder), and any further `ensemble train` options after `--`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

NOMINAL, COVERAGE_TOLERANCE, BEST_TOLERANCE = 0.90, 0.05, 0.05


def seed_figures(run: Path) -> dict:
    """The figures of one completed run (see the module docstring)."""
    import pyarrow.parquet as pq

    from ensemble.tasks.choice import default_aggregator

    fit = json.loads((run / "aggregators.json").read_text())
    chosen = default_aggregator(fit["aggregators"], fit)
    m = pq.read_table(run / "metrics.parquet").to_pandas()
    test = m[m.split == "test"]
    members = test[test.member.notna()]
    ens = test[test.model == f"ensemble-{chosen}"].iloc[0]
    best = members[members.member == int(ens.best_member)].iloc[0]
    return {"aggregator": chosen, "ensemble_nll": float(ens.nll),
            "mean_member_nll": float(members.nll.mean()), "best_member_nll": float(best.nll),
            "coverage_90": float(ens.coverage_90), "n_test": int(ens.n),
            "scale": fit["params"].get("std-scaling", {}).get("scale")}


def per_split_chance(n_test: int) -> float:
    """The probability that an exact 90% interval covers a share within the tolerance of 0.90
    of `n_test` independent rows (binomial, SciPy)."""
    from scipy.stats import binom

    lo = int(np.ceil((NOMINAL - COVERAGE_TOLERANCE) * n_test - 1e-9))
    hi = int(np.floor((NOMINAL + COVERAGE_TOLERANCE) * n_test + 1e-9))
    return float(binom.cdf(hi, n_test, NOMINAL) - binom.cdf(lo - 1, n_test, NOMINAL))


def accepted(f: dict) -> bool:
    """Issue 30's acceptance for the figures `f` of one seed (or their means over the seeds)."""
    return (f["ensemble_nll"] < f["mean_member_nll"]
            and f["ensemble_nll"] <= f["best_member_nll"] + BEST_TOLERANCE
            and abs(f["coverage_90"] - NOMINAL) <= COVERAGE_TOLERANCE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.defaults_bench")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("train", nargs="*", help="extra `ensemble train` options (after --)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="defaults-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(args.seeds):
        cfg, run = out / f"split-{seed}.toml", out / f"split-{seed}"
        cfg.write_text(f'[data]\nsource = "diabetes"\nsplit_seed = {seed}\n')
        if not (run / "metrics.parquet").is_file():
            subprocess.run([sys.executable, "-m", "pipelines.cli", "train", "--config", str(cfg),
                            "--run-dir", str(run), "--overwrite", "--quiet", *args.train],
                           check=True, stdout=subprocess.DEVNULL)
        f = seed_figures(run)
        rows.append(f)
        print(f"split {seed}: ensemble-{f['aggregator']} NLL {f['ensemble_nll']:.3f}, mean "
              f"member {f['mean_member_nll']:.3f}, best member {f['best_member_nll']:.3f}; "
              f"coverage_90 {f['coverage_90']:.3f}"
              + (f" (std scale {f['scale']:.3f})" if f["scale"] else "")
              + f" - {'meets' if accepted(f) else 'misses'} the acceptance", flush=True)
    means = {}
    for key in ("ensemble_nll", "mean_member_nll", "best_member_nll", "coverage_90"):
        v = np.array([r[key] for r in rows])
        means[key] = float(v.mean())
        print(f"{key}: {v.mean():.3f} ± {v.std():.3f} over {len(v)} splits")
    print(f"splits meeting the acceptance: {sum(map(accepted, rows))}/{len(rows)}; the means "
          f"{'meet' if accepted(means) else 'miss'} it")
    n_test = rows[0]["n_test"]
    se = np.sqrt(NOMINAL * (1 - NOMINAL) / n_test)
    print(f"noise floor: with {n_test} test rows the coverage of even an exact 90% interval has "
          f"standard error {se:.3f}, so it is within {COVERAGE_TOLERANCE} of {NOMINAL} on one "
          f"split with probability {per_split_chance(n_test):.2f}, on all {len(rows)} with "
          f"{per_split_chance(n_test) ** len(rows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
