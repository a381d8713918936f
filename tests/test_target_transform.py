"""The regression target transforms (`log1p`, `log`) against SciPy's log-normal."""

import numpy as np
import pytest
from scipy import integrate, stats

from ensemble.core.errors import UsageError
from ensemble.tasks.regression import transform as T

RNG = np.random.default_rng(0)
MU = RNG.normal(1.0, 0.7, 40)
SD = RNG.uniform(0.1, 0.9, 40)


def _lognorm(name, mu, sd):
    shift = 1.0 if name == "log1p" else 0.0
    return stats.lognorm(s=sd, scale=np.exp(mu), loc=-shift)


@pytest.mark.parametrize("name", ["log1p", "log"])
def test_moments_quantiles_and_nll_are_scipys_lognormal(name):
    t = T.get(name)
    dist = _lognorm(name, MU, SD)
    y = dist.rvs(random_state=1)
    mean, var = t.moments(MU, SD ** 2)
    np.testing.assert_allclose(mean, dist.mean(), rtol=1e-10)
    np.testing.assert_allclose(var, dist.var(), rtol=1e-10)
    np.testing.assert_allclose(t.quantile(MU, SD, 0.95), dist.ppf(0.95), rtol=1e-10)
    assert t.nll(y, MU, SD) == pytest.approx(-np.mean(dist.logpdf(y)), rel=1e-10)
    mu2, s2 = t.to_gaussian(mean, var)
    np.testing.assert_allclose(mu2, MU, rtol=1e-9)
    np.testing.assert_allclose(s2, SD ** 2, rtol=1e-9)


@pytest.mark.parametrize("name", ["log1p", "log"])
def test_mixture_nll_and_crps(name):
    t = T.get(name)
    mu_m, var_m = np.stack([MU, MU + 0.3]), np.stack([SD ** 2, (SD / 2) ** 2])
    y = _lognorm(name, MU, SD).rvs(random_state=2)
    dens = 0.5 * (_lognorm(name, mu_m[0], SD).pdf(y) + _lognorm(name, mu_m[1], SD / 2).pdf(y))
    assert t.mixture_nll(y, mu_m, var_m) == pytest.approx(-np.mean(np.log(dens)), rel=1e-9)
    for i in range(3):  # CRPS = integral of (F(x) - 1{x >= y})^2 dx
        d = _lognorm(name, MU[i], SD[i])
        lo = -t.shift
        num = (integrate.quad(lambda x: d.cdf(x) ** 2, lo, y[i])[0]
               + integrate.quad(lambda x: d.sf(x) ** 2, y[i], np.inf)[0])
        assert t.crps(y[i:i + 1], MU[i:i + 1], SD[i:i + 1]) == pytest.approx(num, rel=1e-6)


def test_metrics_on_the_target_scale():
    t = T.get("log")
    dist = _lognorm("log", MU, SD)
    y = dist.rvs(random_state=3)
    m = t.all_metrics(y, MU, SD)
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((y - dist.mean()) ** 2)))
    lo, hi = dist.ppf(0.05), dist.ppf(0.95)
    assert m["coverage_90"] == pytest.approx(np.mean((y >= lo) & (y <= hi)))
    assert m["width_90"] == pytest.approx(np.mean(hi - lo))
    assert m["nll"] == pytest.approx(-np.mean(dist.logpdf(y)))


def test_targets_outside_the_domain_are_refused():
    T.get("log1p").check(np.array([0.0, 3.0, np.nan]))
    with pytest.raises(UsageError, match=r"log1p.*-1\.5"):
        T.get("log1p").check(np.array([0.0, -1.5]), "income")
    with pytest.raises(UsageError, match=r"'log'.* 0\.0"):
        T.get("log").check(np.array([0.0, 2.0]), "income")
    with pytest.raises(UsageError, match="sqrt"):
        T.get("sqrt")
