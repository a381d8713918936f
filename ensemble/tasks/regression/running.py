"""Regression metrics over row chunks: `Running.update` takes one chunk of targets and a model's
predictive means and standard deviations (and, for an ensemble, the exact mixture's components),
`Running.result` gives `ensemble.tasks.regression.metrics.all_metrics` of the rows put
together, from float64 running sums: the means' sums (NLL, mixture NLL, CRPS, MAE, coverage and
width), the squared error's sum (RMSE), the per-level counts of the calibration error, and the
targets' count, mean and sum of squared deviations merged by Chan, Golub and LeVeque's pairwise
update (1979) for R^2's total sum of squares. Under a target transform
(`ensemble.tasks.regression.transform`) the predictive means and stds are the log-normals'
moments, and the metrics those of the log-normals (`TargetTransform.all_metrics`).
"""

from __future__ import annotations

import numpy as np

from ensemble.tasks.regression import metrics as RM


class Running:
    """`all_metrics` of one model over chunks of rows (module docstring)."""

    def __init__(self, transform=None) -> None:
        self.transform = transform  # a `transform.TargetTransform`, or None: Gaussians
        self.n = 0
        self.sums: dict[str, float] = {}
        self.undefined: set[str] = set()  # NLLs with a zero sigma in some chunk: None
        self.below = np.zeros(len(RM.CALIBRATION_LEVELS))
        self.sq_err = 0.0
        self.y_mean, self.y_m2 = 0.0, 0.0

    def update(self, y, mu, sigma, mu_m=None, var_m=None, weights=None) -> None:
        """Add one chunk: `y`, `mu`, `sigma` `[n]` (target units); `mu_m`, `var_m`
        `[n_members, n]` and `weights` `[n_members]` for an ensemble's mixture."""
        y, mu, sigma = (np.asarray(a, np.float64) for a in (y, mu, sigma))
        n = len(y)
        if n == 0:
            return
        if self.transform is None:
            part = RM.all_metrics(y, mu, sigma, mu_m, var_m, weights)
            yq, loc, sd = y, mu, sigma
        else:  # the log-normals' metrics, from the Gaussians of z their moments determine
            t = self.transform
            loc, s2 = t.to_gaussian(mu, sigma ** 2)
            sd, yq = np.sqrt(s2), t.forward(y)
            if mu_m is not None:
                mu_m, var_m = t.to_gaussian(mu_m, var_m)
            part = t.all_metrics(y, loc, sd, mu_m, var_m, weights)
        for name in ("mae", "nll", "mixture_nll", "crps", "coverage_90", "width_90",
                     "coverage_95", "width_95"):
            if part[name] is None:
                self.undefined.add(name)
            else:
                self.sums[name] = self.sums.get(name, 0.0) + part[name] * n
        self.sq_err += float(np.sum((y - mu) ** 2))
        self.below += [np.sum(yq <= loc + sd * RM._norm_ppf(p))
                       for p in RM.CALIBRATION_LEVELS]
        mean, m2 = float(y.mean()), float(np.sum((y - y.mean()) ** 2))
        total = self.n + n
        delta = mean - self.y_mean
        self.y_m2 += m2 + delta * delta * self.n * n / total
        self.y_mean += delta * n / total
        self.n = total

    def result(self) -> dict[str, float | None]:
        """Every metric of `RM.METRICS` of the rows added.

        Raises:
            ValueError: no row was added.
        """
        if self.n == 0:
            raise ValueError("Expected at least one row. Received: 0")
        out = {k: (None if k in self.undefined else v / self.n) for k, v in self.sums.items()}
        out["rmse"] = float(np.sqrt(self.sq_err / self.n))
        shares = self.below / self.n
        out["calibration_error"] = float(np.mean(
            [abs(p - s) for p, s in zip(RM.CALIBRATION_LEVELS, shares)]))
        if self.n < 2:
            out["r2"] = None
        elif self.y_m2 == 0:
            out["r2"] = 1.0 if self.sq_err == 0 else 0.0
        else:
            out["r2"] = float(1.0 - self.sq_err / self.y_m2)
        return {k: out.get(k) for k in RM.METRICS}
