"""One spelling of a categorical value from any source, so that a number is one category
whether a CSV's text, a Parquet or DataFrame number, or a served string holds it.

pandas writes a float column to CSV as `1935.0`, which a categorical CSV column reads as that
text, while a Parquet float or int column holds the number 1935. Every categorical value is
therefore written in its canonical spelling before it is counted at training or looked up at
predict (`columns.category_values`, `whole_input.unknown_categories`; the exported graph's
`export_graph.canonical_numbers` does the same in TensorFlow):

- a number (an integer, float or decimal column): an integral value below 2**63 in size as
  its integer digits (`1935.0`, `1935` and `-0.0` become `1935` and `0`), any other as Python
  writes the float (`repr`: `1.5`, `1.5e-05`, `1e+20`, `inf`, `nan`; a float32 column's
  shortest float32 text, `0.1`, as pandas writes it to a CSV);
- text that spells a whole number in decimal form without a leading zero (`-?(0|[1-9][0-9]*)`,
  then an optional `.digits` and exponent, of an integral value): its integer digits
  (`1935.0`, `1.935e3` become `1935`); plain integer text keeps its digits exactly (`-0`
  becomes `0`);
- any other text as written: `007` (a code: leading zeros kept), ` 5`, `+5`, `.5`, `A`, and
  text of a number that is not whole (`3.10` stays apart from `3.1`, as two versions of a
  program would; pandas writes a float column's `1.5` to a CSV as a Parquet float is spelt).

Booleans are matched in their own way (`preprocessing.BOOL_WORDS`): only in a column whose
training categories are booleans. A vocabulary file spelt otherwise is respelt by
`canonical_vocabulary` when its run is loaded.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]+)?"  # text that is a number
INTEGER = r"-?(0|[1-9][0-9]*)"  # integer text: kept digit for digit (beyond float64's 2**53)
INT_LIMIT = 2.0 ** 63  # integral values below it in size are written as integers (int64)


def canonical(value: str) -> str:
    """The canonical spelling of one categorical value `value` (text), as `arrow_text` gives
    it (the same rule, `_text`): `"1935.0"` -> `"1935"`; `"1.50"`, `"007"` and `"A"`
    unchanged."""
    return _text(pa.array([value], pa.string()))[0].as_py()


def _whole(x) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Float Arrow array `x` `[n]` as float64 values `[n]`, the mask of its integral values
    below `INT_LIMIT` in size `[n]`, and their int64 digits `[n]` (`0` elsewhere)."""
    v = np.asarray(x.to_numpy(zero_copy_only=False), np.float64)
    with np.errstate(invalid="ignore"):
        integral = (v == np.floor(v)) & (np.abs(v) < INT_LIMIT)
    return v, integral, pc.cast(pa.array(np.where(integral, v, 0).astype(np.int64)), pa.string())


def _numbers(x, short=repr) -> pa.Array:
    """Float Arrow array `x` `[n]` as canonical text `[n]` (null where `x` is): integral
    values as int64 digits, the others as `short` (the shortest text of the float) writes
    them, once per distinct value (a hash lookup)."""
    v, integral, whole = _whole(x)
    if not integral.all():
        other = pa.array(v[~integral]).unique()  # NaN once: `nan`
        words = pa.array([short(f) for f in other.to_pylist()], pa.string())
        spelt = pc.take(words, pc.index_in(pa.array(v), value_set=other))
        whole = pc.if_else(pa.array(integral), whole, spelt)
    return pc.if_else(pc.is_null(x), pa.scalar(None, pa.string()), whole) if x.null_count \
        else whole


def _text(s: pa.Array) -> pa.Array:
    """Text `s` `[n]` in canonical spelling: whole numbers in decimal form as their digits."""
    parse = pc.fill_null(pc.and_(pc.match_substring_regex(s, f"^{NUMBER}$"),
                                 pc.invert(pc.match_substring_regex(s, f"^{INTEGER}$"))), False)
    if pc.any(parse).as_py():
        _, integral, whole = _whole(pc.cast(pc.if_else(parse, s, "0"), pa.float64()))
        s = pc.if_else(pc.and_(parse, pa.array(integral)), whole, s)
    return pc.if_else(pc.fill_null(pc.equal(s, "-0"), False), "0", s)


def arrow_text(col) -> pa.Array:
    """A categorical column `col` (Arrow array or chunked array `[n]` of any type) as canonical
    text: string `[n]` (one array), null where `col` is.

    Raises:
        pyarrow.ArrowInvalid: bytes that are not UTF-8 (the caller names the column).
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_floating(col.type) and col.type.bit_width < 64:  # as numpy writes it
        small = np.float16 if col.type.bit_width == 16 else np.float32
        return _numbers(col, lambda f: str(small(f)))  # (pandas to a CSV: 0.1, not float64's
        # 0.10000000149011612)
    if pa.types.is_floating(col.type) or pa.types.is_decimal(col.type):
        return _numbers(pc.cast(col, pa.float64()))
    if pa.types.is_integer(col.type) or pa.types.is_boolean(col.type) \
            or pa.types.is_null(col.type):
        return pc.cast(col, pa.string())  # digits (booleans: `BOOL_WORDS`)
    return _text(pc.cast(col, pa.string()))


def canonical_vocabulary(categories: list[str]) -> list[str]:
    """A saved vocabulary `categories` (a run trained before the canonical spelling:
    `1935.0`) respelt, in its order; an entry whose canonical spelling another entry already
    has keeps its old spelling (the run learned `1` and `1.0` as two categories: new rows,
    spelt `1`, take the first)."""
    out, taken = [], set(categories)
    for c, new in zip(categories, _text(pa.array(categories, pa.string())).to_pylist()):
        if new != c and new not in taken:
            taken.add(new)
            c = new
        out.append(c)
    return out
