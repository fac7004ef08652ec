"""Reading and validating series files: :func:`read_series_table` (a CSV, cached per file) and the checks every
table of series gets (:func:`check_series_frame`, :func:`check_time_order`); each error names the file, the column
and the line."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import numpy as np

from .._utils import SchemaError

__all__ = ["read_series_table", "check_series_frame", "check_time_order"]


def _decode_error(path: str, encoding: str) -> str | None:
    """``"line N (byte 0x.. at column k)"`` of the first line of ``path`` that does not decode as ``encoding``."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                line.decode(encoding)
            except UnicodeDecodeError as e:
                return f"line {n} (byte 0x{line[e.start]:02x} at column {e.start + 1})"
    return None


def _repeated(names, source: str, first_column: int = 1) -> None:
    """SchemaError naming the first column name that appears twice (pandas would rename the second ``a.1``)."""
    seen: dict[str, int] = {}
    for j, name in enumerate(names):
        key = str(name).strip()
        if key in seen:
            raise SchemaError(f"{source}: column name {key!r} is repeated in the header (columns #{seen[key]} and "
                              f"#{j + first_column}); expected one distinct name per column: rename or drop one")
        seen[key] = j + first_column


def check_series_frame(df, source: str, where: Callable[[int], str], *, first_column: int = 1,
                       complete_hint: str = "", dtype=np.float64) -> np.ndarray:
    """The values of a table of series (a ``pandas.DataFrame``, one column per series) as a ``(T, C)`` array of
    ``dtype``, after the checks every series file gets: distinct column names, at least one row, numeric columns,
    finite values. Each error is a :class:`SchemaError` naming ``source``, the column (name and 1-based number
    ``#j``, counted from ``first_column``) and the row (``where(i)`` of the 0-based row ``i``, e.g. its file line)."""
    import pandas as pd

    _repeated(list(df.columns), source, first_column)
    if len(df) == 0 or df.shape[1] == 0:
        raise SchemaError(f"{source}: no data rows" if df.shape[1] else f"{source}: no data columns")
    for j, c in enumerate(df.columns):
        col = df.iloc[:, j]
        if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            num = pd.to_numeric(col, errors="coerce")
            bad = np.flatnonzero(num.isna().to_numpy() & col.notna().to_numpy())
            i = int(bad[0]) if bad.size else 0
            raise SchemaError(f"{source}: column {c!r} (#{j + first_column}) must be numeric, got {col.iloc[i]!r} "
                              f"at {where(i)}")
    values = np.asarray(df.to_numpy(), dtype=dtype)
    bad = np.argwhere(~np.isfinite(values))
    if bad.size:
        i, j = bad[0]
        raise SchemaError(f"{source}: missing or non-finite value (NaN or inf) in column {df.columns[j]!r} "
                          f"(#{j + first_column}) at {where(int(i))} ({len(bad)} such cells){complete_hint}")
    return values


def check_time_order(dates: np.ndarray, source: str, where: Callable[[int], str], hint: str = "") -> None:
    """SchemaError when timestamps go back in time (a newest-first or shuffled export would be windowed out of
    order); repeated timestamps are allowed (the Weather file repeats one)."""
    back = np.flatnonzero(np.diff(np.asarray(dates).astype("datetime64[ns]").astype("int64")) < 0)
    if back.size:
        import pandas as pd

        i = int(back[0]) + 1
        raise SchemaError(f"{source}: timestamps go back in time at {where(i)} ({pd.Timestamp(dates[i - 1])} then "
                          f"{pd.Timestamp(dates[i])}; {back.size} such step(s)); the rows must be in time order, "
                          f"oldest first{hint}")


def read_series_table(path, header: bool = True, *, dated: bool | None = None, encoding: str = "utf-8"):
    """Parse and schema-check a CSV of series -> ``(dates datetime64[ns] | None, values float64 (T, C), columns)``;
    arrays are read-only and cached per (path, mtime, size, options), so every user of one file parses it once.

    ``header=True``: a header line of column names (each name once); ``dated`` (default: ``header``): the first
    column is ``date`` (the LTSF layout ``date,<series_1>,...``), whose timestamps must not go back in time (repeated
    ones are allowed; UTC offsets are converted to naive UTC). ``header=False``: bare comma-separated values (solar,
    an adjacency matrix), columns named ``0, 1, ...``. Every other column must be numeric and finite
    (:func:`check_series_frame`). A line that does not decode as ``encoding`` is an error naming it."""
    dated = header if dated is None else dated
    if dated and not header:
        raise ValueError("read_series_table: a `date` column needs a header (dated=True, header=False)")
    st = Path(path).stat()
    return _read_table(str(path), header, dated, encoding, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_table(path: str, header: bool, dated: bool, encoding: str, _mtime_ns: int, _size: int):
    import pandas as pd

    try:
        if header:
            df = pd.read_csv(path, encoding=encoding, skipinitialspace=True)
            names = pd.read_csv(path, encoding=encoding, skipinitialspace=True, header=None, nrows=1).iloc[0].tolist()
        else:  # solar_AL.txt, an adjacency: comma-separated values, no header, no date column
            df = pd.read_csv(path, header=None, encoding=encoding)
            names = list(df.columns)
    except UnicodeDecodeError as e:
        where = _decode_error(path, encoding) or f"byte offset {e.start}"
        raise SchemaError(f"{path}: {where} is not valid {encoding} text ({e.reason}); pass the file's encoding, "
                          "e.g. encoding='latin-1'") from e
    except LookupError as e:
        raise ValueError(f"{path}: unknown encoding {encoding!r} ({e})") from e
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise SchemaError(f"{path}: not a readable CSV ({type(e).__name__}: {e})") from e
    _repeated(names, path)
    columns = [str(c).strip() for c in df.columns]
    first_row = 2 if header else 1  # file line number of the first data row
    line = lambda i: f"line {i + first_row}"  # noqa: E731
    dates = None
    if dated:
        if not columns or columns[0] != "date":
            raise SchemaError(f"{path}: expected the LTSF layout 'date,<variate_1>,...,<variate_C>' with a 'date' "
                              f"first column, got columns {columns[:6]}{' ...' if len(columns) > 6 else ''}")
        if len(columns) < 2:
            raise SchemaError(f"{path}: expected at least one variate column after 'date', got none")
        # utc=True: timestamps with UTC offsets (mixed across DST, as pandas writes tz-aware series) become naive UTC;
        # naive ones are unchanged
        parsed = pd.to_datetime(df.iloc[:, 0], errors="coerce", utc=True).dt.tz_localize(None)
        bad = np.flatnonzero(parsed.isna().to_numpy())
        if bad.size:
            raise SchemaError(f"{path}: unparsable 'date' value {df.iloc[bad[0], 0]!r} at {line(bad[0])}")
        dates = parsed.to_numpy(dtype="datetime64[ns]")
        check_time_order(dates, path, line, hint=": sort the file by its 'date' column")
        dates.setflags(write=False)  # cached: shared by every user of the file
        df, columns = df.iloc[:, 1:], columns[1:]
    if header:
        df = df.set_axis(columns, axis=1)
    values = check_series_frame(df, path, line, first_column=2 if dated else 1,
                                complete_hint="; series files must be complete")
    values.setflags(write=False)
    return dates, values, tuple(columns)

