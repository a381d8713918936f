"""The table preprocessing fitted in one streaming pass over the training rows.

`TableStats.update` takes one chunk of training rows at a time (a `sources.Dataset`);
`TableStats.fitted` then gives the fitted `Preprocessing`'s fields, equal to fitting
scikit-learn's `SimpleImputer`, `OneHotEncoder` and `StandardScaler` on all training rows at
once:

- numeric columns: count, mean and sum of squared deviations of the known values, merged chunk
  by chunk (Chan, Golub and LeVeque 1979, the pairwise update `StandardScaler.partial_fit`
  uses); the fill value of `impute` comes from `SimpleImputer` on a uniform sample of at most
  `SAMPLE_ROWS` training rows (every row when there are fewer: then it is exact); the
  standardisation after imputation follows in closed form (the filled rows add `n_missing`
  copies of the fill value);
- categorical columns: the count of every category (and of missing values); the categories,
  the fill category (the most frequent, ties to the smallest, as `SimpleImputer`), the grouping
  of infrequent categories (`OneHotEncoder(max_categories=)`'s rule: the `max_categories - 1`
  most frequent categories stay, ties kept for the larger in sort order, the rest share one
  column) and each one-hot column's mean `p` and variance `p (1 - p)`; a column with more
  categories than `embed_above` is embedded instead (`ensemble.data.embedding`): its
  vocabulary is the categories seen at least `min_frequency` times, the others are its
  infrequent categories, and its one index column is not standardised (mean 0, scale 1).

Own code rather than the estimators' `partial_fit`: `SimpleImputer` and `OneHotEncoder` have
none, and the scaler's statistics depend on both.
"""

from __future__ import annotations

import shlex
from collections import Counter

import numpy as np

from ensemble.core.notices import notice

SAMPLE_ROWS = 1 << 17  # training rows kept for the imputer's median / most frequent value
HIGH_CARDINALITY = 50  # distinct values of a categorical column that earn a notice


class TableStats:
    """Streaming statistics of a table's training rows (see the module docstring).

    Args:
        feature_names: the numeric columns, in order; categorical: the categorical columns.
        impute: `data.impute` (`error`, `median`, `most_frequent`).
        max_categories: one-hot columns per categorical column at most, the infrequent group
            included (0: every category its own column).
        seed: the sample's seed (`data.split_seed`).
        embed_above: columns with more categories are embedded (0: none is).
        min_frequency: an embedded column's categories seen fewer times are infrequent.
    """

    def __init__(self, feature_names, categorical, impute: str = "error",
                 max_categories: int = 0, seed: int = 0, embed_above: int = 0,
                 min_frequency: int = 1):
        self.names, self.impute = tuple(feature_names), impute
        self.max_categories = max_categories
        self.embed_above, self.min_frequency = int(embed_above), int(min_frequency)
        f = len(self.names)
        self.n, self.known = 0, np.zeros(f)
        self.mean, self.m2 = np.zeros(f), np.zeros(f)
        self.counts = {c: Counter() for c in categorical}
        self.missing = dict.fromkeys(categorical, 0)
        self.rng = np.random.default_rng(seed)
        self.sample = np.zeros((0, f))
        self.keys = np.zeros(0)

    def update(self, ds, rows: np.ndarray | None = None) -> None:
        """Add a chunk of training rows: `ds.x` `[m, n_features]` (NaN where missing) and
        `ds.categorical` (`[m]` object arrays, None where missing), or only its rows `rows`
        (`[k]` positions in `ds`). The rows are gathered and widened to float64 into buffers
        kept from one chunk to the next (fresh arrays each chunk cost the kernel's zeroing
        of their pages: about a tenth of preparing a large table)."""
        x = self._float64(ds.x, rows)
        self.n += len(x)
        if self.impute == "error":  # no missing values (the data check refuses them)
            n_b = np.full(x.shape[1], len(x))
            mean_b = x.mean(axis=0) if len(x) else np.zeros(x.shape[1])
            d = x - mean_b if x is ds.x else np.subtract(x, mean_b, out=x)  # (x: ours)
            m2_b = np.einsum("ij,ij->j", d, d)
        else:
            ok = ~np.isnan(x)
            n_b = ok.sum(axis=0)
            mean_b = np.where(n_b > 0, np.where(ok, x, 0).sum(axis=0) / np.maximum(n_b, 1),
                              0.0)
            m2_b = np.where(ok, (x - mean_b) ** 2, 0).sum(axis=0)
        total = self.known + n_b
        delta = mean_b - self.mean
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total > 0, n_b / total, 0.0)
        self.m2 = self.m2 + m2_b + delta ** 2 * self.known * share
        self.mean = self.mean + delta * share
        self.known = total
        if self.impute != "error":  # bottom-k of random keys: a uniform sample of the rows
            keys = np.concatenate([self.keys, self.rng.random(len(x))])
            pooled = np.concatenate([self.sample, x])
            if len(keys) > SAMPLE_ROWS:
                keep = np.argpartition(keys, SAMPLE_ROWS)[:SAMPLE_ROWS]
                keys, pooled = keys[keep], pooled[keep]
            self.keys, self.sample = keys, pooled
        for name, values in ds.categorical.items():
            if rows is not None:
                values = values[rows]
            known = values[values != None]  # noqa: E711 (object array comparison)
            self.missing[name] += len(values) - len(known)
            cats, n = np.unique(known.astype(str), return_counts=True)
            self.counts[name].update(dict(zip(cats.tolist(), n.tolist())))

    def _float64(self, x: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
        """`x[rows]` (all of `x` for None) as float64: `x` itself when it is float64 and
        whole, else a view of this object's buffers (valid until the next call)."""
        if rows is not None:
            x = np.take(x, rows, axis=0, mode="clip",
                        out=self._buffer("_gathered", (len(rows), *x.shape[1:]), x.dtype))
        if x.dtype == np.float64:
            return x
        wide = self._buffer("_wide", x.shape, np.dtype(np.float64))
        np.copyto(wide, x)
        return wide

    def _buffer(self, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """The first `shape[0]` rows of buffer `name`, grown (never shrunk) to hold them."""
        buf = getattr(self, name, None)
        if buf is None or buf.shape[1:] != shape[1:] or buf.dtype != dtype or len(buf) < shape[0]:
            buf = np.empty(shape, dtype)
            setattr(self, name, buf)
        return buf[:shape[0]]

    def fill(self) -> np.ndarray:
        """The numeric fill values `[n_features]` (`SimpleImputer` on the sample); empty
        under `impute = "error"`."""
        if self.impute == "error" or not self.names:
            return np.zeros(0)
        from sklearn.impute import SimpleImputer

        rows = self.sample[np.argsort(self.keys, kind="stable")]
        return SimpleImputer(strategy=self.impute, keep_empty_features=True).fit(rows).statistics_

    def _categories(self, name: str) -> tuple[list[str], bool, dict[str, int], str | None]:
        """(the column's one-hot categories, whether an infrequent column follows them, the
        counts after filling missing values, the fill category or None)."""
        counts = dict(self.counts[name]) or {"missing": 0}
        fill = None
        if self.impute != "error":
            top = max(counts.values())
            fill = min(c for c, k in counts.items() if k == top)  # SimpleImputer's tie rule
            counts[fill] = counts[fill] + self.missing[name]
        cats = sorted(counts)
        limit = self.max_categories
        if not limit or len(cats) <= limit:
            return cats, False, counts, fill
        order = np.argsort([counts[c] for c in cats], kind="mergesort")  # OneHotEncoder's
        frequent = set(order[len(cats) - (limit - 1):].tolist()) if limit > 1 else set()
        kept = [c for i, c in enumerate(cats) if i in frequent]
        notice(f"column {name!r} has {len(cats)} categories in {self.n} training rows: the "
               f"{len(kept)} most frequent are one-hot encoded, the other {len(cats) - len(kept)}"
               f" share one 'infrequent' column; change it with --set data.max_categories=N "
               "(0: every category its own column) or leave the column out with --drop "
               f"{shlex.quote(name)}")
        return kept, True, counts, fill

    def _vocabulary(self, name: str) -> tuple[list[str], list[str], str | None]:
        """An embedded column's (vocabulary: the categories seen at least `min_frequency`
        times, sorted; its infrequent categories, sorted; the fill category or None)."""
        counts = dict(self.counts[name])
        fill = None
        if self.impute != "error" and counts:
            top = max(counts.values())
            fill = min(c for c, k in counts.items() if k == top)  # SimpleImputer's tie rule
            counts[fill] += self.missing[name]
        vocabulary = sorted(c for c, k in counts.items() if k >= self.min_frequency)
        rare = sorted(c for c, k in counts.items() if k < self.min_frequency)
        return vocabulary, rare, fill

    def fitted(self, classes, identifiers=()) -> dict:
        """The fitted `preprocessing.Preprocessing`'s fields (`classes`: the sorted class
        labels; `identifiers`: the identifier columns left out)."""
        fill = self.fill()
        mean, var = self.mean.copy(), self.m2 / max(self.n, 1)
        if len(fill):  # the filled rows: n_missing copies of the fill value
            miss = self.n - self.known
            new_mean = (self.mean * self.known + fill * miss) / max(self.n, 1)
            var = (self.m2 + self.known * (self.mean - new_mean) ** 2
                   + miss * (fill - new_mean) ** 2) / max(self.n, 1)
            mean = new_mean
        means, variances, categories, category_fill, infrequent = [mean], [var], {}, {}, []
        embedded, rare = {}, {}
        for name in self.counts:
            if self.embed_above and len(self.counts[name]) > self.embed_above:
                vocabulary, rare[name], fill_category = self._vocabulary(name)
                embedded[name] = vocabulary
                if fill_category is not None:
                    category_fill[name] = fill_category
                continue
            cats, grouped, counts, fill_category = self._categories(name)
            if fill_category is not None:
                category_fill[name] = fill_category
            categories[name] = cats
            k = np.asarray([counts.get(c, 0) for c in cats], np.float64)
            if grouped:
                infrequent.append(name)
                k = np.append(k, sum(counts.values()) - k.sum())
            p = k / max(self.n, 1)
            means.append(p)
            variances.append(p * (1 - p))
            many = len(counts)
            if not grouped and many > HIGH_CARDINALITY and many > 0.5 * self.n:
                notice(f"column {name!r} has {many} distinct values in {self.n} training rows "
                       f"(free text?): one-hot encoded into {many} columns; leave it out with "
                       f"--drop {shlex.quote(name)}")
        means.append(np.zeros(len(embedded)))  # index columns: as they are
        variances.append(np.ones(len(embedded)))
        mean, var = np.concatenate(means), np.concatenate(variances)
        # StandardScaler's constant features (`_is_constant_feature`) keep scale 1
        eps, n = np.finfo(np.float64).eps, max(self.n, 1)
        constant = var <= n * eps * var + (n * mean * eps) ** 2
        scale = np.where(constant, 1.0, np.sqrt(var))
        return dict(feature_names=self.names, mean=mean, scale=scale,
                    classes=np.asarray(classes), fill=fill,
                    categories={**categories, **embedded}, category_fill=category_fill,
                    impute=self.impute, identifiers=tuple(identifiers),
                    infrequent=tuple(infrequent), embedded=tuple(embedded), rare=rare)
