"""A generic text-classification table reader: any CSV / TSV file (optionally ``.gz``) with a header, one text column
and one label column.

:func:`read_text_table` returns the texts, the integer labels and the class names; :func:`find_table` finds a file
among candidate names (plain or ``.gz``) and lists every path it tried when none exists. ``TextDataModule(dataset=
"csv", train_file=..., test_file=..., text_column=..., label_column=...)`` trains on such files, and the IMDB reader
is this reader with IMDB's column names.

Columns are chosen by header name or 0-based index; left as None, the first header among :data:`TEXT_COLUMNS` /
:data:`LABEL_COLUMNS` (case-insensitive) is used. Labels are mapped to ids by ``labels``: a list of class names
(id = position), a dict ``{raw value: id}``, or None: the sorted distinct values (numerically when all are integers).
A test file is read with the training file's class names, so a label the training file lacks is an error naming the
file and line.
"""
from __future__ import annotations

import csv
import gzip
import io
import os
from collections import Counter
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

from ._utils import SchemaError, require_file

__all__ = ["TEXT_COLUMNS", "LABEL_COLUMNS", "TextTable", "read_text_table", "find_table", "label_report"]

#: header names tried, in order, when ``text_column`` is None
TEXT_COLUMNS = ("text", "sentence", "review", "content", "document", "body", "question", "tweet")
#: header names tried, in order, when ``label_column`` is None
LABEL_COLUMNS = ("label", "labels", "sentiment", "class", "category", "target", "y")

csv.field_size_limit(1 << 28)  # long documents (a review per row) exceed csv's default 128 KiB field limit


class TextTable(NamedTuple):
    texts: list[str]
    labels: list[int]
    class_names: list[str]


def find_table(folder: str | os.PathLike, names: Sequence[str], what: str) -> Path:
    """The first of ``folder / name`` and ``folder / name.gz`` that exists, for each of ``names`` in order; else
    ``FileNotFoundError`` listing every path tried."""
    folder = Path(folder)
    tried = []
    for name in names:
        for cand in (folder / name, folder / f"{name}.gz"):
            tried.append(str(cand))
            if cand.exists():
                return require_file(cand, what)
    held = sorted(p.name for p in folder.iterdir() if p.is_file() and any(
        p.name.lower().endswith(s) for s in (".csv", ".csv.gz", ".tsv", ".tsv.gz"))) if folder.is_dir() else []
    found = (f"; {folder} holds {', '.join(held[:8])}{' ...' if len(held) > 8 else ''}: rename them, or read them "
             "as TextDataModule(dataset='csv', train_file=..., test_file=...)" if held else
             f"; {folder} holds no .csv / .tsv table" if folder.is_dir() else f"; the folder {folder} does not exist")
    raise FileNotFoundError(f"{what}: none of the expected files exists; looked for {', '.join(tried)}{found} (set "
                            "HOFORMER_DATA or pass root=...; any other table: TextDataModule(dataset='csv', "
                            "train_file=..., test_file=...))")


def _delimiter(path: Path, first_line: str, delimiter: str | None) -> str:
    if delimiter is not None:
        if not isinstance(delimiter, str) or len(delimiter) != 1:
            raise ValueError(f"read_text_table: `delimiter` must be one character or None, got {delimiter!r}")
        return delimiter
    suffixes = [s.lower() for s in path.suffixes]
    if ".tsv" in suffixes or ".tab" in suffixes:
        return "\t"
    if ".csv" in suffixes:
        return ","
    return "\t" if first_line.count("\t") > first_line.count(",") else ","


def _once(names: list[str], name: str, kind: str, path: Path, header: list[str]) -> int:
    """The index of ``name`` in ``names``; a SchemaError when the header has it more than once (which one would be
    read is a guess)."""
    where = [i for i, n in enumerate(names) if n == name]
    if len(where) > 1:
        raise SchemaError(f"read_text_table: {path}: the {kind} column {name!r} appears {len(where)} times in the "
                          f"header {header} (columns {', '.join(f'#{i + 1}' for i in where)}); expected one column "
                          f"of that name: rename the others, or pass {kind}_column=<0-based index>")
    return where[0]


def _column(header: list[str], chosen, candidates: Sequence[str], kind: str, path: Path) -> int:
    """Index of the ``kind`` column: ``chosen`` (a header name or a 0-based index) or the first candidate present;
    a name must appear once in the header."""
    if chosen is None:
        lower = [h.strip().lower() for h in header]
        for cand in candidates:
            if cand in lower:
                return _once(lower, cand, kind, path, header)
        raise SchemaError(f"read_text_table: {path}: no {kind} column found; looked for a header named one of "
                          f"{list(candidates)} (case-insensitive), the header is {header}; pass "
                          f"{kind}_column=<name or 0-based index>")
    if isinstance(chosen, bool) or not isinstance(chosen, (int, str)):
        raise TypeError(f"read_text_table: `{kind}_column` must be a header name, a 0-based index or None, got "
                        f"{type(chosen).__name__} {chosen!r}")
    if isinstance(chosen, int):
        if not 0 <= chosen < len(header):
            raise SchemaError(f"read_text_table: {path}: `{kind}_column`={chosen} is out of range for the "
                              f"{len(header)} columns {header}")
        return chosen
    stripped = [h.strip() for h in header]
    if chosen.strip() not in stripped:
        raise SchemaError(f"read_text_table: {path}: `{kind}_column`={chosen!r} is not in the header {header}")
    return _once(stripped, chosen.strip(), kind, path, header)


def _label_map(raw: list[str], labels) -> tuple[dict[str, int], list[str]]:
    if labels is None:
        distinct = sorted(set(raw))
        if all(v.lstrip("-").isdigit() for v in distinct):
            distinct = sorted(distinct, key=int)
        return {v: i for i, v in enumerate(distinct)}, distinct
    if isinstance(labels, Mapping):
        ids = sorted(set(labels.values()))
        if ids != list(range(len(ids))) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise ValueError(f"read_text_table: `labels` dict values must be the ids 0..K-1, got "
                             f"{sorted(labels.values())}")
        names = [""] * len(ids)
        for k, i in labels.items():
            names[i] = names[i] or str(k)
        return {str(k).strip(): int(i) for k, i in labels.items()}, names
    if isinstance(labels, str) or not isinstance(labels, Sequence) or not labels:
        raise TypeError(f"read_text_table: `labels` must be a list of class names, a dict {{value: id}} or None, "
                        f"got {labels!r}")
    names = [str(x).strip() for x in labels]
    if len(set(names)) != len(names):
        raise ValueError(f"read_text_table: `labels` has repeated class names: {names}")
    return {n: i for i, n in enumerate(names)}, names


def read_text_table(path: str | os.PathLike, *, text_column: str | int | None = None,
                    label_column: str | int | None = None, labels=None, delimiter: str | None = None,
                    encoding: str = "utf-8") -> TextTable:
    """``(texts, labels, class_names)`` of a CSV / TSV file with a header (``.gz`` read transparently).

    Args:
        path: the file; ``.tsv`` / ``.tab`` are tab-separated, ``.csv`` comma-separated, others sniffed from the
            header line (``delimiter`` overrides).
        text_column, label_column: header name or 0-based index; None picks the first of :data:`TEXT_COLUMNS` /
            :data:`LABEL_COLUMNS` in the header.
        labels: class names (id = position), ``{raw value: id}``, or None (sorted distinct values).
        encoding: the file's text encoding.

    Raises ``FileNotFoundError`` / ``IsADirectoryError`` naming the path, :class:`~hoformer.data.SchemaError` (a
    ``ValueError``) naming the file, the column or the line for a bad header (a missing or repeated text or label
    column name), an empty text or label, an unknown label, and ``ValueError`` for undecodable bytes (naming the file and the encoding).
    """
    p = require_file(path, "read_text_table")
    opener = gzip.open if p.suffix.lower() == ".gz" else open
    try:
        with opener(p, "rb") as fb:
            data = fb.read()
        content = data.decode(encoding)
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(f"read_text_table: {p} line {line}: bytes {data[e.start:e.end]!r} are not valid {encoding} "
                         f"({e.reason}); pass the file's encoding: read_text_table(..., encoding='latin-1'), "
                         "TextDataModule(encoding='latin-1'), --data.init_args.encoding latin-1") from e
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ValueError(f"read_text_table: cannot read {p} ({type(e).__name__}: {e})") from e
    content = content.lstrip("\ufeff")
    first = content.split("\n", 1)[0]
    rows = csv.reader(io.StringIO(content, newline=""), delimiter=_delimiter(p, first, delimiter))
    header = next(rows, None)
    if not header:
        raise SchemaError(f"read_text_table: {p} is empty; expected a header line naming a text and a label column")
    ti = _column(header, text_column, TEXT_COLUMNS, "text", p)
    li = _column(header, label_column, LABEL_COLUMNS, "label", p)
    if ti == li:
        raise SchemaError(f"read_text_table: {p}: the text and the label column are the same, {header[ti]!r}")
    texts, raw, lines = [], [], []
    for row in rows:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        n = rows.line_num
        if len(row) <= max(ti, li):
            raise SchemaError(f"read_text_table: {p} line {n}: {len(row)} field(s), expected at least "
                              f"{max(ti, li) + 1} (header {header})")
        text, lab = row[ti].strip(), row[li].strip()
        if not text:
            raise SchemaError(f"read_text_table: {p} line {n}: empty text in column {header[ti]!r}; expected a text "
                              "to classify (drop the row or fill it in)")
        if not lab:
            raise SchemaError(f"read_text_table: {p} line {n}: empty label in column {header[li]!r}")
        texts.append(text)
        raw.append(lab)
        lines.append(n)
    if not texts:
        raise SchemaError(f"read_text_table: {p} has a header but no rows")
    mapping, names = _label_map(raw, labels)
    unknown = [(n, v) for n, v in zip(lines, raw) if v not in mapping]
    if unknown:
        n, v = unknown[0]
        raise SchemaError(f"read_text_table: {p} line {n}: label {v!r} in column {header[li]!r} is not one of the "
                          f"classes {list(mapping)} ({len(unknown)} row(s) affected)")
    return TextTable(texts, [mapping[v] for v in raw], names)


def label_report(table: TextTable, name: str = "") -> str:
    """One line: each class name with its id and count, e.g. ``negative=0 (120), positive=1 (80)``."""
    counts = Counter(table.labels)
    body = ", ".join(f"{c}={i} ({counts.get(i, 0)})" for i, c in enumerate(table.class_names))
    return f"{name}: {len(table.labels)} rows, labels {body}" if name else body
