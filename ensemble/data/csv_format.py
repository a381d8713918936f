"""How a table file is read: its format from its name (`.parquet`, `.csv`, or `.csv.gz` /
`.csv.bz2`, which pyarrow decompresses by the same rule), and how a CSV file separates its
fields, decided from its first lines: commas (the default), or semicolons, tabs or bars when
the header holds no comma (spreadsheets in locales whose decimal mark is a comma write `;` and
`1,5`); and pyarrow's reading options for it.

Own code rather than `csv.Sniffer`: the sniffer guesses from every character's frequency and
can pick a letter or a space; here only the header line decides, and a header with a comma
always reads as it did before.

A file read in batches (`pyarrow.dataset`) takes each column's type from its first block (about
a megabyte); a column empty there is typed null and its first number further on refused.
`settled_types` reads such columns through to type them as a whole-file read does.
`record_batches` streams CSV files block by block, in memory that does not grow with the file.
"""

from __future__ import annotations

import re
from pathlib import Path

COMPRESSED = (".gz", ".bz2")  # CSV compressions read by name (pyarrow and the stdlib both)
SEPARATORS = (";", "\t", "|")  # tried, in this order of preference, when the header has no ","
SAMPLE_BYTES = 1 << 16  # bytes read to decide


def table_format(path: str | Path) -> str | None:
    """`"parquet"`, `"csv"` (also compressed: `x.csv.gz`, `x.csv.bz2`) or None, by name (the
    suffixes as written: pyarrow picks a compression by its lower-case suffix)."""
    suffixes = Path(path).suffixes[-2:]
    if suffixes[-1:] == [".parquet"]:
        return "parquet"
    if suffixes[-1:] == [".csv"] or (len(suffixes) == 2 and suffixes[0] == ".csv"
                                     and suffixes[1] in COMPRESSED):
        return "csv"
    return None


def folder_files(folder: Path) -> list[Path]:
    """The `.parquet` or `.csv` files (`table_format`) in `folder` and its sub-folders (a
    partitioned data set, as Spark or `pyarrow.dataset.write_dataset` write it), sorted by
    path; a file or folder whose name starts with `.` or `_` is left out with all it holds
    (`_SUCCESS`, `_temporary/`, `.ipynb_checkpoints/`). Training and `predict` read the same
    files."""
    return sorted(p for p in folder.rglob("*") if table_format(p) and p.is_file()
                  and not any(part.startswith((".", "_"))
                              for part in p.relative_to(folder).parts))


def table_files(source: str, builtin=()) -> tuple[list[str], str]:
    """The files of a file or folder source and their format (`parquet` or `csv`; a CSV file
    may be compressed, `table_format`): a folder's `.parquet` or `.csv` files of one kind
    (`folder_files`); `builtin`: the built-in data sets' names, for the message of an unknown
    name.

    Raises:
        UsageError: no such file, an empty one, an unknown name, a folder of mixed kinds.
    """
    from ensemble.core.errors import UsageError

    path = Path(source)
    if path.is_dir():
        files = folder_files(path)
        kinds = {table_format(p) for p in files}
        if len(kinds) != 1:
            raise UsageError(f"Expected folder {source} to hold .parquet or .csv files (one "
                             f"kind). Received: {', '.join(sorted(kinds)) or 'none'}")
        return [str(p) for p in files], kinds.pop()
    kind = table_format(path)
    if kind is None:
        raise UsageError(f"Unknown data source {source!r}; expected one of "
                         f"{', '.join(builtin)}, a .parquet or .csv (or .csv.gz) file, "
                         "or a folder of them.")
    if not path.is_file():
        raise UsageError(f"Data file not found: {source}")
    if path.stat().st_size == 0:
        raise UsageError(f"Data file is empty: {source}")
    return [str(path)], kind


def open_text(path: str | Path):
    """The CSV file at `path` as UTF-8 text (bytes that are not UTF-8 as U+FFFD), decompressed
    when its name ends in one of `COMPRESSED`."""
    import bz2
    import gzip

    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(Path(path).suffix, open)
    return opener(path, "rt", encoding="utf-8", errors="replace", newline="")


def dialect(path: str | Path) -> tuple[str, str]:
    """`(delimiter, decimal point)` of the CSV file at `path`: `(",", ".")` unless its header
    line holds no comma and one of `SEPARATORS`; then the most frequent of those, with `","`
    as the decimal point when the fields of its first `SAMPLE_BYTES` hold numbers written with
    one (`-1,5`) and none written with a dot (`-1.5`): one text cell `12,5` beside numbers
    with dots leaves the dot."""
    with open_text(path) as f:
        lines = f.read(SAMPLE_BYTES).splitlines()
    header = lines[0] if lines else ""
    counts = {s: header.count(s) for s in SEPARATORS}
    sep = max(SEPARATORS, key=lambda s: counts[s])
    if "," in header or not counts[sep]:
        return ",", "."
    fields = [v.strip().strip('"') for line in lines[1:] for v in line.split(sep)]
    comma = any(re.fullmatch(r"-?\d+,\d+", v) for v in fields)
    dot = any(re.fullmatch(r"-?\d*\.\d+(e-?\d+)?", v) for v in fields)
    return sep, ("," if comma and not dot else ".")


def read_options(path: str | Path, **convert):
    """`(pyarrow.csv.ParseOptions, pyarrow.csv.ConvertOptions(**convert))` with the file's
    delimiter and decimal point (`dialect`, read once)."""
    import pyarrow.csv as pcsv

    sep, decimal = dialect(path)
    return pcsv.ParseOptions(delimiter=sep), pcsv.ConvertOptions(decimal_point=decimal,
                                                                  **convert)


def read_csv(path: str | Path):
    """The whole CSV file at `path` as a `pyarrow.Table`, in its dialect, empty cells null."""
    import pyarrow.csv as pcsv

    parse, convert = read_options(path, strings_can_be_null=True)
    return pcsv.read_csv(path, parse_options=parse, convert_options=convert)


def csv_dataset(files: list[str], parse, convert):
    """The `pyarrow.dataset` of the CSV `files` read with `parse` and `convert` options
    (`read_options`); a column its first block leaves untyped (empty there, values further
    on) is typed by all its values (`settled_types`), the types `convert` gives winning.

    Raises:
        pyarrow.ArrowInvalid, OSError: as `pyarrow.dataset.dataset`.
    """
    import pyarrow as pa
    import pyarrow.dataset as pds

    dataset = pds.dataset(files, format=pds.CsvFileFormat(parse_options=parse,
                                                          convert_options=convert))
    empty = [f.name for f in dataset.schema if pa.types.is_null(f.type)]
    settled = settled_types(files, empty) if empty else {}
    if not settled:
        return dataset
    convert.column_types = {**settled, **convert.column_types}
    return pds.dataset(files, format=pds.CsvFileFormat(parse_options=parse,
                                                       convert_options=convert))


def settled_types(path: str | Path | list, names) -> dict:
    """Column name -> `float64` or `string` for the columns `names` of the CSV file at `path`
    (or files, read in the first one's dialect; the columns a first block left untyped: empty
    there), read as text through the whole input a batch at a time: numbers when every
    non-empty value is one, else text, as `pyarrow.csv.read_csv` types them; a column empty
    in every row is left out (null)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as pds

    files = [str(p) for p in path] if isinstance(path, (list, tuple)) else [str(path)]
    parse, convert = read_options(files[0], strings_can_be_null=True,
                                  column_types={n: pa.string() for n in names})
    text = pds.dataset(files, format=pds.CsvFileFormat(parse_options=parse,
                                                        convert_options=convert))
    types: dict = {}
    for batch in text.to_batches(columns=list(names), batch_readahead=1, fragment_readahead=1):
        for name, col in zip(batch.schema.names, batch.columns):
            values = col.drop_null()
            if not len(values) or types.get(name) == pa.string():
                continue
            if convert.decimal_point != ".":
                values = pc.replace_substring(values, convert.decimal_point, ".")
            try:
                pc.cast(values, pa.float64())
                types[name] = pa.float64()
            except pa.ArrowInvalid:
                types[name] = pa.string()
    return types


def record_batches(files, fmt, schema, columns=None):
    """The record batches of the CSV files `files`, read with `pyarrow.csv.open_csv` in the
    options of `fmt` (a `pyarrow.dataset.CsvFileFormat`): the columns `columns` (None: all) of
    `schema`, each of its type there (a column a file lacks: null), one block at a time.

    Not `pyarrow.dataset`'s scanner: over a CSV file it reads ahead of a slow consumer without
    bound (pyarrow 26: a 600 MB file held whole before the model's first batch, also with
    `batch_readahead=1`); `open_csv` reads a block when asked for it."""
    import copy

    import pyarrow as pa
    import pyarrow.csv as pcsv

    options = fmt.default_fragment_scan_options
    read = copy.copy(options.read_options)
    read.use_threads = False
    convert = copy.copy(options.convert_options)
    convert.column_types = {f.name: f.type for f in schema}
    convert.include_columns = list(columns if columns is not None else schema.names)
    convert.include_missing_columns = True
    for path in files:  # a stream: a path is read 32 MiB ahead (decompressed by its name)
        with pa.input_stream(str(path)) as source, pcsv.open_csv(
                source, read_options=read, parse_options=fmt.parse_options,
                convert_options=convert) as reader:
            yield from reader
