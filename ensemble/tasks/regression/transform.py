"""Target transforms of a regression run (`log1p`, `log`): log-normal members on the target's scale.

As scikit-learn's `TransformedTargetRegressor`, the members are fitted on `z = g(y)`, with
`g(y) = log(y + c)` (`log`: c = 0; `log1p`: c = 1), and each predicts a Gaussian
`z ~ N(mu, s^2)`; on the target's own scale that is the shifted log-normal `y = exp(z) - c`:

    mean      = exp(mu + s^2 / 2) - c
    variance  = (exp(s^2) - 1) exp(2 mu + s^2)
    quantile  = exp(mu + s Phi^-1(p)) - c

(Johnson, Kotz and Balakrishnan 1994, "Continuous Univariate Distributions", vol. 1, ch. 14).
Its density is the Gaussian density of `z` times the Jacobian `|dz/dy| = 1 / (y + c)`, so its
NLL is the Gaussian NLL of `z` plus `log(y + c)` per row. Its CRPS is Baran and Lerch's (2015,
"Log-normal distribution based Ensemble Model Output Statistics models for probabilistic
wind-speed forecasting", eq. 4), shifted by `c` (the CRPS is translation invariant).
The moments determine `(mu, s)` back: `s^2 = log(1 + variance / (mean + c)^2)`,
`mu = log(mean + c) - s^2 / 2` (`to_gaussian`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ensemble.core.errors import UsageError
from ensemble.tasks.regression import metrics as RM

NAMES = ("none", "log1p", "log")  # `data.target_transform`


class TargetTransform(NamedTuple):
    """`z = log(y + shift)`: `log1p` (shift 1) or `log` (shift 0); module docstring."""

    name: str
    shift: float

    def forward(self, y: np.ndarray) -> np.ndarray:
        """`z = log(y + shift)`, `[n_rows]` float64 (NaN stays NaN)."""
        return np.log(np.asarray(y, np.float64) + self.shift)

    def check(self, y: np.ndarray, column: str = "the target") -> None:
        """Refuse targets outside the transform's domain (`y + shift > 0`; NaN ignored).

        Raises:
            UsageError: names the column, the smallest target and how many rows are outside.
        """
        y = np.asarray(y, np.float64)
        bad = (y + self.shift <= 0) & ~np.isnan(y)
        if bad.any():
            need = "> -1" if self.shift == 1 else "> 0"
            raise UsageError(
                f"Expected every target of {column!r} {need} for `data.target_transform = "
                f"{self.name!r}`. Received: {int(bad.sum())} rows outside, the smallest "
                f"{float(np.nanmin(y))!r}; expected another transform (log1p takes targets "
                "> -1, log > 0) or none.")

    def moments(self, mu, var) -> tuple[np.ndarray, np.ndarray]:
        """The target-scale mean and variance of `z ~ N(mu, var)`, `[n_rows]` each."""
        mu, var = np.asarray(mu, np.float64), np.asarray(var, np.float64)
        mean = np.exp(mu + var / 2) - self.shift
        return mean, np.expm1(var) * np.exp(2 * mu + var)

    def to_gaussian(self, mean, var) -> tuple[np.ndarray, np.ndarray]:
        """The `(mu, s^2)` of `z` from the target-scale `mean`, `var` (inverse of `moments`)."""
        m = np.asarray(mean, np.float64) + self.shift
        s2 = np.log1p(np.asarray(var, np.float64) / m ** 2)
        return np.log(m) - s2 / 2, s2

    def quantile(self, mu, sd, p: float) -> np.ndarray:
        """The `p` quantile on the target's scale of `z ~ N(mu, sd^2)`."""
        return np.exp(np.asarray(mu, np.float64)
                      + np.asarray(sd, np.float64) * RM._norm_ppf(p)) - self.shift

    def nll(self, y, mu, sd) -> float | None:
        """Mean NLL of the targets `y` (target units) under the log-normal of `N(mu, sd^2)`
        on `z`: the Gaussian NLL of `z` plus `mean(log(y + shift))`; None when an `sd` is 0."""
        y = np.asarray(y, np.float64)
        value = RM.nll(self.forward(y), mu, sd)
        return None if value is None else value + float(np.mean(np.log(y + self.shift)))

    def mixture_nll(self, y, mu_m, var_m, weights=None) -> float | None:
        """Mean NLL of `y` under the exact mixture of the members' log-normals (`mu_m`,
        `var_m` `[n_members, n_rows]` on `z`): `RM.mixture_nll` of `z` plus the Jacobian."""
        y = np.asarray(y, np.float64)
        value = RM.mixture_nll(self.forward(y), mu_m, var_m, weights)
        return None if value is None else value + float(np.mean(np.log(y + self.shift)))

    def crps(self, y, mu, sd) -> float:
        """Mean CRPS (target units) of the log-normal of `N(mu, sd^2)` on `z` at `y`
        (module docstring); the absolute error where `sd` is 0."""
        from scipy.special import ndtr

        x = np.asarray(y, np.float64) + self.shift
        mu, sd = np.asarray(mu, np.float64), np.asarray(sd, np.float64)
        safe = np.where(sd > 0, sd, 1.0)
        w = (np.log(x) - mu) / safe
        score = (x * (2 * ndtr(w) - 1)
                 - 2 * np.exp(mu + safe ** 2 / 2) * (ndtr(w - safe) + ndtr(safe / np.sqrt(2)) - 1))
        return float(np.mean(np.where(sd > 0, score, np.abs(x - np.exp(mu)))))

    def all_metrics(self, y, mu, sd, mu_m=None, var_m=None, weights=None
                    ) -> dict[str, float | None]:
        """`RM.all_metrics`'s metrics on the target's scale for Gaussians on `z` (`mu`, `sd`
        `[n_rows]`; an ensemble's members `mu_m`, `var_m` `[n_members, n_rows]`): RMSE, MAE
        and R^2 of the log-normal mean; NLL with the Jacobian; the central intervals
        `exp(mu +- s Phi^-1((1 + level) / 2)) - shift` (coverage as on `z`, the transform
        being increasing; width on the target's scale); calibration as on `z`; the CRPS of
        the log-normal of the moment-matched Gaussian."""
        y = np.asarray(y, np.float64)
        mu, sd = np.asarray(mu, np.float64), np.asarray(sd, np.float64)
        z = self.forward(y)
        mean, _ = self.moments(mu, sd ** 2)
        out = RM.all_metrics(z, mu, sd, mu_m, var_m, weights)
        out.update(rmse=RM.rmse(y, mean), mae=RM.mae(y, mean), r2=RM.r2(y, mean),
                   nll=self.nll(y, mu, sd), crps=self.crps(y, mu, sd))
        out["mixture_nll"] = (out["nll"] if mu_m is None
                              else self.mixture_nll(y, mu_m, var_m, weights))
        for level in RM.COVERAGE_LEVELS:
            k = int(round(100 * level))
            lo, hi = (self.quantile(mu, sd, p) for p in ((1 - level) / 2, (1 + level) / 2))
            out[f"width_{k}"] = float(np.mean(hi - lo))
        return out


def get(name: str | None) -> TargetTransform | None:
    """The transform named by `data.target_transform` (None for `"none"`).

    Raises:
        UsageError: another name.
    """
    if name in (None, "none"):
        return None
    if name == "log1p":
        return TargetTransform("log1p", 1.0)
    if name == "log":
        return TargetTransform("log", 0.0)
    raise UsageError(f"Expected `data.target_transform` to be one of {', '.join(NAMES)}. "
                     f"Received: {name!r}")
