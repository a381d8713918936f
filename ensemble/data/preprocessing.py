"""Data preparation fitted on the training split, stored as JSON (never a pickle): imputation,
one-hot encoding of categorical columns and standardisation, plus column matching by name.

The parameters are those scikit-learn's `SimpleImputer`, `OneHotEncoder(max_categories=)` and
`StandardScaler` learn on the training rows only, fitted in one streaming pass
(`ensemble.data.table_stats`); what they learned (fill values, categories, mean and scale) is
stored in `preprocessing.json` and applied with numpy, which is exactly the estimators'
`transform` for these parameters (one-hot: an unknown category is an all-zero block, or joins
the column's infrequent group when it has one: `handle_unknown="infrequent_if_exist"`) and
needs no pickled estimator. A categorical column with more categories than
`data.embed_above` is embedded instead (`ensemble.data.embedding`): one index column (`0`
out of vocabulary, `1` infrequent, `2 + k` its k-th category), looked up the same way, and
the members learn its embedding: memory per row and column, whatever its categories.

`Preprocessing.read_input` is the one place where new data meets a trained run: it reads a
source, matches its columns to the training columns by name (any order), ignores extra columns
with one notice (or refuses them with `strict`), and reports every problem in one message.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ensemble.data import messages, sources, spelling
from ensemble.data.messages import merge_unknown
from ensemble.data.columns import FLOAT32_MAX
from ensemble.core.notices import notice
from ensemble.data.settings import DataConfig
from ensemble.data.sources import Dataset
from ensemble.core.errors import UsageError


BLOCK_ROWS = 4096  # rows encoded at a time (`encode_scaled`): float64 blocks of ~2 MiB
HIGH_CARDINALITY = 50  # distinct values of a categorical column that earn a notice
INFREQUENT = "infrequent"  # the output column of a column's grouped infrequent categories
# how a boolean is written in a CSV: pyarrow's default `true_values` / `false_values`, which
# type a training column as bool (its categories then `true`/`false`, `is_boolean`)
BOOL_WORDS = {"true": ("true", "True", "TRUE", "1"), "false": ("false", "False", "FALSE", "0")}


def is_boolean(categories) -> bool:
    """True when a categorical column's training `categories` are a boolean's (`true`,
    `false`): the column was read as booleans, so new rows are matched as booleans too (a
    CSV's `True`, a DataFrame's text `"False"`, `1`), not as the text `True`."""
    return bool(categories) and set(categories) <= set(BOOL_WORDS)


def boolean_words(col: np.ndarray) -> np.ndarray:
    """Text column `col` `[n_rows]` with every spelling of `BOOL_WORDS` as `true` / `false`."""
    out = col.astype(object)
    for word, spellings in BOOL_WORDS.items():
        out[np.isin(col, spellings)] = word
    return out


def _one_hot(col: np.ndarray, categories: list[str]) -> np.ndarray:
    """`[n_rows, len(categories)]` float64 one-hot rows of the text `col` `[n_rows]` (all
    zeros for a value not among `categories`), by Arrow's hash lookup (`pyarrow.compute.index_in`):
    its cost does not grow with the number of categories."""
    at = pc.fill_null(pc.index_in(pa.array(col, pa.string()),
                                  value_set=pa.array(categories, pa.string())), -1).to_numpy()
    out = np.zeros((len(col), len(categories)))
    hit = np.flatnonzero(at >= 0)
    out[hit, at[hit]] = 1.0
    return out


def _notice_id_columns(names, x: np.ndarray) -> None:
    """A notice for each numeric column that holds a different whole number on every training
    row (more than `HIGH_CARDINALITY` rows): most likely an id, which a model learns as a
    feature (and which can leak the row order)."""
    if len(x) <= HIGH_CARDINALITY:
        return
    for j, name in enumerate(names):
        col = x[:, j]
        col = col[np.isfinite(col)]
        if len(col) == len(x) and np.all(col == np.round(col)) and \
                len(np.unique(col)) == len(col):
            notice(f"column {name!r} holds a different whole number on every training row "
                           f"(an id?): it is used as a feature; leave it out with --drop "
                           f"{shlex.quote(name)}", once=True)


@dataclass(frozen=True)
class Preprocessing:
    """Impute, one-hot encode and standardise, with the run's feature names and classes.

    Attributes:
        feature_names: the numeric training column names, in training order.
        mean, scale: `[n_outputs]` float64 standardisation of every output column (numeric
            columns, then the one-hot columns), from `StandardScaler`.
        classes: sorted class labels `[n_classes]` (int64 or str).
        fill: numeric fill values `[len(feature_names)]` (empty when `impute == "error"`).
        categories: categorical column -> its sorted training categories (one output each),
            in their canonical spelling (`ensemble.data.spelling`: `1935`, never `1935.0`).
        category_fill: categorical column -> fill category for missing values.
        impute: the `data.impute` setting the run was trained with.
        identifiers: identifier-like text columns left out of the features at training
            (`ensemble.data.identifiers`); predict carries them through without a notice.
        infrequent: categorical columns whose infrequent categories (and unknown ones) share
            one last one-hot column, `<column>=infrequent` (`data.max_categories`).
        embedded: categorical columns encoded as one index column each, `<column>:index`
            (after the one-hot columns), their `categories` the vocabulary
            (`ensemble.data.embedding`).
        rare: embedded column -> its infrequent training categories (the infrequent index).
    """

    kind = "table"  # its input kind (`ensemble.data.kinds`)

    feature_names: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    classes: np.ndarray
    fill: np.ndarray = field(default_factory=lambda: np.zeros(0))
    categories: dict[str, list[str]] = field(default_factory=dict)
    category_fill: dict[str, str] = field(default_factory=dict)
    impute: str = "error"
    identifiers: tuple[str, ...] = ()  # text columns carried as ids (ensemble.data.identifiers)
    infrequent: tuple[str, ...] = ()  # categorical columns with an infrequent group
    embedded: tuple[str, ...] = ()  # categorical columns as an index and an embedding
    rare: dict[str, list[str]] = field(default_factory=dict)

    @property
    def columns(self) -> tuple[str, ...]:
        """The input columns a data set must have: numeric, then categorical."""
        return self.feature_names + tuple(self.categories)

    @property
    def one_hot(self) -> dict[str, list[str]]:
        """The one-hot encoded columns' categories (every categorical column not embedded)."""
        return {c: v for c, v in self.categories.items() if c not in self.embedded}

    @property
    def output_names(self) -> list[str]:
        """Names of the `n_outputs` model inputs (`column=category` for one-hot columns, then
        `column:index` for embedded ones)."""
        return list(self.feature_names) + [
            f"{c}={v}" for c, cats in self.one_hot.items()
            for v in [*cats, *([INFREQUENT] if c in self.infrequent else [])]] + [
            f"{c}:index" for c in self.embedded]

    def indices(self, name: str, col: np.ndarray) -> np.ndarray:
        """`[n_rows]` float64 indices of embedded column `name`'s text values `col` `[n_rows]`
        (filled and respelt): `2 + k` for the vocabulary's k-th category, `1` for an
        infrequent one, `0` for a category the training rows never held."""
        text = pa.array(col, pa.string())
        at = pc.fill_null(pc.index_in(text, value_set=pa.array(self.categories[name],
                                                               pa.string())), -1).to_numpy()
        out = at.astype(np.float64) + 2
        out[at < 0] = 0
        if self.rare.get(name):
            rare = pc.is_in(text, value_set=pa.array(self.rare[name], pa.string())).to_numpy(
                zero_copy_only=False)
            out[(at < 0) & rare] = 1
        return out

    def scaling_layer(self):
        """The members' first layer: None (table rows are scaled before the model,
        `transform`), or with embedded columns their `CategoryEmbedding`
        (`ensemble.data.embedding`; Keras imported)."""
        if not self.embedded:
            return None
        from ensemble.data.embedding import CategoryEmbedding

        return CategoryEmbedding(len(self.output_names) - len(self.embedded),
                                 [len(self.categories[c]) + 2 for c in self.embedded],
                                 columns=list(self.embedded), name="category_embedding")

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one model input row: `(n_outputs,)`."""
        return (len(self.output_names),)

    @classmethod
    def fit(cls, ds: Dataset, train_rows: np.ndarray, classes: np.ndarray,
            impute: str = "error", cfg: DataConfig | None = None) -> "Preprocessing":
        """Fit imputer, encoder and scaler on the training rows `train_rows` of `ds` only (a
        table held in memory: `table_stats.TableStats` over one chunk; `cfg` gives
        `max_categories` and the sample's seed)."""
        from ensemble.data.table_stats import TableStats

        _notice_id_columns(ds.feature_names, ds.x[train_rows])
        stats = TableStats(ds.feature_names, tuple(ds.categorical), impute,
                           cfg.max_categories if cfg else 0, cfg.split_seed if cfg else 0,
                           cfg.embed_above if cfg else 0, cfg.min_frequency if cfg else 1)
        stats.update(ds.rows(train_rows))
        return cls(**stats.fitted(classes, ds.identifiers))

    def _encode(self, ds: Dataset, rows: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """Impute and one-hot encode (before scaling); returns (`[n_rows, n_outputs]` float64,
        {column: {unknown category: rows}})."""
        pos = {name: i for i, name in enumerate(ds.feature_names)}
        missing = [n for n in self.columns if n not in pos and n not in ds.categorical]
        if missing:
            raise UsageError(
                f"Feature column {missing[0]!r} missing from {ds.name}; expected the "
                f"{len(self.columns)} training columns ({len(missing)} missing)."
            )
        take = slice(None) if rows is None else rows
        order = [pos[n] for n in self.feature_names]
        x = ds.x[take] if order == list(range(len(pos))) else ds.x[take][:, order]
        x = x.astype(np.float64)
        if len(self.fill):
            x = np.where(np.isnan(x), self.fill, x)
        blocks, index, unknown = [x], [], {}
        for name in [*self.one_hot, *self.embedded]:
            cats = self.categories[name]
            col = raw = np.asarray(ds.categorical[name][take], dtype=object)
            if name in self.category_fill:
                col = np.where(col == None, self.category_fill[name], col)  # noqa: E711
            col = col.astype(str)
            if is_boolean(cats):
                col = boolean_words(col)
            if name in self.embedded:
                at = self.indices(name, col)
                if (at == 0).any():
                    unknown[name] = Counter(None if v is None else str(v) for v in raw[at == 0])
                index.append(at[:, None])
                continue
            onehot = _one_hot(col, cats)
            other = onehot.sum(axis=1) == 0
            if name in self.infrequent:  # infrequent and unknown categories: one column
                onehot = np.concatenate([onehot, other[:, None].astype(np.float64)], axis=1)
            elif other.any():  # value -> rows (a missing value: None)
                unknown[name] = Counter(None if v is None else str(v) for v in raw[other])
            blocks.append(onehot)
        blocks += index
        return (np.concatenate(blocks, axis=1) if len(blocks) > 1 else x), unknown

    def transform(self, ds: Dataset) -> np.ndarray:
        """Impute, encode and scale `ds` after matching its columns to the training columns by
        name. Unknown categories (none at training) become all-zero blocks, with one notice
        counting them per column.

        Returns:
            `[n_rows, n_outputs]` float32.

        Raises:
            UsageError: a training column missing from `ds`, or an unexpected extra column.
        """
        x, unknown = self.encode_scaled(ds)
        if unknown:
            notice(messages.unknown_categories(unknown))
        return x

    def encode_scaled(self, ds: Dataset, first_row: int | np.ndarray = 0
                      ) -> tuple[np.ndarray, dict[str, int]]:
        """`transform` without the notice, for a batch of a streamed input (its first row is
        row `first_row` of the source, for messages; or `first_row` is `[n_rows]`, each
        row's position in the source).

        Returns:
            (`[n_rows, n_outputs]` float32, {categorical column: {unknown category: rows}}).

        Raises:
            UsageError: an unexpected column, or a value that scaled by the run's
            standardisation no longer fits float32 (names the column and row).
        """
        extra = sorted(set(ds.columns) - set(self.columns))
        if extra:
            raise UsageError(f"Unexpected column {extra[0]!r} in {ds.name}; not a training feature.")
        z32 = np.empty((len(ds.x), len(self.output_names)), np.float32)
        unknown: dict[str, Counter] = {}
        for lo in range(0, max(len(z32), 1), BLOCK_ROWS):  # float64 blocks that stay in
            # the cache (one, empty, for no rows: `_encode` checks the columns)
            z, unk = self._encode(ds, slice(lo, lo + BLOCK_ROWS))  # new: scaled in place
            z -= self.mean
            z /= self.scale
            with np.errstate(over="ignore"):  # beyond float32 becomes inf: found below
                z32[lo:lo + len(z)] = z
            merge_unknown(unknown, unk)
        if z32.size and not (-FLOAT32_MAX <= z32.min()
                             and z32.max() <= FLOAT32_MAX):  # two reductions
            x = self._encode(ds)[0]
            self._check_fits((x - self.mean) / self.scale, x, ds.name, first_row)
        return z32, dict(unknown)

    def _check_fits(self, z: np.ndarray, x: np.ndarray, name: str,
                    first_row: int | np.ndarray) -> None:
        """Raises UsageError for the first scaled value `z` beyond float32 (the model's dtype):
        it would become inf and the members' probabilities NaN."""
        bad = ~(np.abs(z) <= FLOAT32_MAX)
        if not bad.any():
            return
        r, j = (int(v[0]) for v in np.nonzero(bad))
        row = int(first_row[r]) if np.ndim(first_row) else first_row + r
        raise UsageError(
            f"Value {x[r, j]:.6g} of column {self.output_names[j]!r} at row {row} of "
            f"{name} does not fit float32 (the model's dtype) once scaled by the run's "
            f"standardisation (mean {self.mean[j]:.4g}, scale {self.scale[j]:.4g}); expected "
            f"values within the range the run was trained on.")

    def read_input(self, source: str, target: str, strict: bool = False) -> Dataset:
        """Read new data for this run: columns matched by name, extra columns ignored with one
        notice (refused when `strict`), missing values allowed only if the run imputes.

        Raises:
            UsageError: every problem of the input in one message (missing training columns,
            extra columns under `strict`, unreadable values).
        """
        cfg = DataConfig(source=source, target=target,
                         categorical=tuple(self.categories) or "none", impute=self.impute)
        return sources.load(cfg, require_target=False, expected=self.columns, strict=strict,
                            identifiers=self.identifiers)

    def to_json(self) -> str:
        return json.dumps({
            "scaler": "standard",
            "feature_names": list(self.feature_names),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "classes": self.classes.tolist(),
            "impute": self.impute,
            "fill": self.fill.tolist(),
            "categories": self.categories,
            "category_fill": self.category_fill,
            "output_names": self.output_names,
            "identifiers": list(self.identifiers),
            "infrequent": list(self.infrequent),
            "embedded": list(self.embedded),
            "rare": self.rare,
        }, indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> "Preprocessing":
        """The preprocessing stored as `d` (`to_json`'s content; read by
        `ensemble.data.kinds.read_preprocessing`, which turns its errors into one line).
        Categories in their canonical spelling (`spelling.canonical_vocabulary`: a run
        trained before it stored a CSV's `1935.0`, which new rows spell `1935`)."""
        classes = np.asarray(d["classes"])
        saved = {str(k): [str(c) for c in v] for k, v in d.get("categories", {}).items()}
        cats = {k: spelling.canonical_vocabulary(v) for k, v in saved.items()}
        fill = {str(k): str(v) for k, v in d.get("category_fill", {}).items()}
        fill = {k: dict(zip(saved.get(k, []), cats.get(k, []))).get(v, spelling.canonical(v))
                for k, v in fill.items()}
        return cls(tuple(d["feature_names"]), np.asarray(d["mean"], np.float64),
                   np.asarray(d["scale"], np.float64), classes,
                   np.asarray(d.get("fill", []), np.float64), cats, fill,
                   d.get("impute", "error"),
                   tuple(str(c) for c in d.get("identifiers", [])),
                   tuple(str(c) for c in d.get("infrequent", [])),
                   tuple(str(c) for c in d.get("embedded", [])),
                   {str(k): [str(c) for c in v] for k, v in d.get("rare", {}).items()})
