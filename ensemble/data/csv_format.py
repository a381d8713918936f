"""How a CSV file separates its fields, decided from its first lines: commas (the default), or
semicolons, tabs or bars when the header holds no comma (spreadsheets in locales whose decimal
mark is a comma write `;` and `1,5`); and pyarrow's reading options for it.

Own code rather than `csv.Sniffer`: the sniffer guesses from every character's frequency and
can pick a letter or a space; here only the header line decides, and a header with a comma
always reads as it did before.
"""

from __future__ import annotations

import re
from pathlib import Path

SEPARATORS = (";", "\t", "|")  # tried, in this order of preference, when the header has no ","
SAMPLE_BYTES = 1 << 16  # bytes read to decide
SAMPLE_LINES = 50  # data lines looked at for a decimal comma


def dialect(path: str | Path) -> tuple[str, str]:
    """`(delimiter, decimal point)` of the CSV file at `path`: `(",", ".")` unless its header
    line holds no comma and one of `SEPARATORS`; then the most frequent of those, with `","`
    as the decimal point when a field of its first data lines is a number written with one
    (`-1,5`)."""
    with open(path, "rb") as f:
        lines = f.read(SAMPLE_BYTES).decode("utf-8", errors="replace").splitlines()
    header = lines[0] if lines else ""
    counts = {s: header.count(s) for s in SEPARATORS}
    sep = max(SEPARATORS, key=lambda s: counts[s])
    if "," in header or not counts[sep]:
        return ",", "."
    number = re.compile(r"\s*-?\d+,\d+\s*")
    fields = (v.strip('"') for line in lines[1:SAMPLE_LINES + 1] for v in line.split(sep))
    return sep, ("," if any(number.fullmatch(v) for v in fields) else ".")


def parse_options(path: str | Path):
    """`pyarrow.csv.ParseOptions` with the file's delimiter."""
    import pyarrow.csv as pcsv

    return pcsv.ParseOptions(delimiter=dialect(path)[0])


def convert_options(path: str | Path, **kwargs):
    """`pyarrow.csv.ConvertOptions(**kwargs)` with the file's decimal point."""
    import pyarrow.csv as pcsv

    return pcsv.ConvertOptions(decimal_point=dialect(path)[1], **kwargs)
