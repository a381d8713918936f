"""The refusals inside an exported signature.

`ensemble.runs.export` calls these while it traces each signature, so that the SavedModel itself
answers as `ensemble predict` does, under plain TensorFlow Serving too:

- Refusals (`refuse_missing`, `refuse_nonfinite`, `refuse_unfit`, `refuse_empty`): the values
  `ensemble predict` refuses (`ensemble.data.table_to_dataset`, `ensemble.data.arrays`,
  `Preprocessing.encode_scaled`) make the signature fail with `InvalidArgumentError`
  ("assertion failed: [input `NAME`: ...]", naming the input and, for the `features` matrix,
  its columns): a missing value (NaN; `""` for a string input) in a run trained without
  imputation, an infinite value (a JSON number beyond float32, such as `1e39`, arrives as
  inf once cast to the input's float32), and a value that the run's standardisation scales
  beyond float32. A run that imputes fills NaN and `""` as before, and still refuses inf.
- The outputs themselves, with their per-row uncertainty, are the task's
  (`ensemble.tasks.Task.serving_outputs`).

- The canonical spelling of a number in a categorical input (`canonical_numbers`), as
  `ensemble.data.spelling` writes it at training and predict.

`ensemble serve` turns the refusal into HTTP 400 with its message
(`ensemble.serving.graph_errors`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FLOAT32_MAX = float(np.finfo(np.float32).max)
IMPUTE_HINT = "this run was trained without imputation (ensemble train --impute median fills them)"


def _columns_where(bad, columns):
    """`", "`-joined names of the `columns` (`[n_columns]`) where `bad` `[batch, n_columns]`
    holds a True, as a scalar string tensor."""
    hit = tf.reduce_any(bad, axis=0)
    return tf.strings.reduce_join(tf.boolean_mask(tf.constant(columns), hit), separator=", ")


def _assert(bad, name: str, text: str, columns=None):
    """An assertion op failing when any of `bad` is True, with the message
    "input `NAME`[ column(s) A, B]: TEXT" (the offending `columns` named when `bad` is
    `[batch, n_columns]`)."""
    ok = tf.logical_not(tf.reduce_any(bad))
    if columns is None:
        return tf.debugging.Assert(ok, [tf.constant(f"input `{name}`: {text}")])
    front = f"input `{name}` column(s) " if name else "input(s) "
    return tf.debugging.Assert(ok, [tf.strings.join([front, _columns_where(bad, columns),
                                                     f": {text}"])])


def refuse_missing(x, name: str, columns=None) -> list:
    """Refuse NaN in `x` (a run without imputation): `x` float `[batch]`, `[batch, n_columns]`
    (`columns` its names) or `[batch, *shape]`. Returns the assertion ops."""
    return [_assert(tf.math.is_nan(x), name, "a missing value (NaN or null); " + IMPUTE_HINT,
                    columns)]


def refuse_nonfinite(x, name: str, columns=None) -> list:
    """Refuse inf in `x` (beyond float32: a larger number becomes inf as float32). Shapes as
    `refuse_missing`. Returns the assertion ops."""
    return [_assert(tf.math.is_inf(x), name, "a value that is infinite or beyond float32 "
                    f"(|x| <= {FLOAT32_MAX:.4g}); expected finite numbers", columns)]


def refuse_empty(col, name: str) -> list:
    """Refuse `""` (a missing category) in the string input `col` `[batch]` of a run without
    imputation. Returns the assertion ops."""
    return [_assert(tf.equal(col, ""), name, "a missing value (empty string); " + IMPUTE_HINT)]


def refuse_unfit(z, name: str | None, columns) -> list:
    """Refuse standardised values `z` `[batch, n_outputs]` (float32, after scaling) that do not
    fit float32 (`Preprocessing.encode_scaled`); `columns` names the outputs, `name` the
    input (`features`; None for one input per column, then the columns are the inputs)."""
    return [_assert(tf.logical_not(tf.math.is_finite(z)), name,
                    "a value that does not fit float32 (the model's dtype) once scaled by the "
                    "run's standardisation; expected values within the range the run was "
                    "trained on", list(columns))]


def canonical_numbers(col):
    """String input `col` `[batch]` with whole numbers in their canonical spelling, as
    `spelling.arrow_text` spells them at training and predict (`1935.0`, `1.935e3` ->
    `1935`; `1.5`, `007`, `A` as written), so that the lookup in the run's vocabulary agrees:
    integral values below 2**63 by their int64 digits. Returns the string tensor `[batch]`."""
    from ensemble.data import spelling

    parse = tf.logical_and(tf.strings.regex_full_match(col, spelling.NUMBER),
                           tf.logical_not(tf.strings.regex_full_match(col, spelling.INTEGER)))
    x = tf.strings.to_number(tf.where(parse, col, "0"), tf.float64)
    integral = parse & tf.equal(x, tf.floor(x)) & (tf.abs(x) < spelling.INT_LIMIT)
    whole = tf.strings.as_string(tf.cast(tf.where(integral, x, tf.zeros_like(x)), tf.int64))
    out = tf.where(integral, whole, col)
    return tf.where(tf.equal(out, "-0"), "0", out)
