"""The results ledger: one JSON line per finished run or measurement (``results/ledger.jsonl`` of a checkout; the
fields are documented in ``results/README.md``), read and appended here, with the provenance every line carries.

* :func:`read_ledger` / :func:`append_ledger` - the one reader and writer: a line that is not a JSON object, or
  that lacks a field every line has (:data:`REQUIRED`), is an error naming the file, the line number and the field.
* :func:`provenance` - the fields that say where a line comes from: hardware, torch version, commit, date, command
  and ``record`` (``run``: a training run measured by the command it holds, at the commit it holds; ``tune``: a
  trial of ``hoformer tune``; ``benchmark``: a benchmark script's measurement; ``transcribed``: a number copied from
  a document).

``hoformer tune`` and the benchmark scripts (``benchmarks/``) write through these functions.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["REQUIRED", "RECORDS", "LedgerError", "read_ledger", "append_ledger", "check_line", "hardware", "commit",
           "provenance", "repository_root"]

#: the fields every ledger line has (results/README.md)
REQUIRED = ("experiment", "task", "dataset", "model", "metrics", "seed", "hardware", "commit", "date", "command")
#: the values of ``record``: how a line was obtained (absent on the oldest campaign lines: ``campaign``)
RECORDS = ("campaign", "run", "tune", "benchmark", "transcribed")


class LedgerError(ValueError):
    """A ledger line that is not what a ledger line must be (names the file, the line and the field)."""


def repository_root() -> Path | None:
    """The git checkout holding this hoformer's source (``src/hoformer`` inside it), or None for an installed copy."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".git").exists() else None


def check_line(row: Any, where: str) -> dict:
    """``row`` if it is a ledger line (a JSON object with every :data:`REQUIRED` field, ``metrics`` an object,
    ``record`` one of :data:`RECORDS` or a transcription note); else :class:`LedgerError` naming ``where``."""
    if not isinstance(row, dict):
        raise LedgerError(f"{where}: a ledger line must be a JSON object, got a JSON {type(row).__name__}")
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise LedgerError(f"{where}: the line of experiment {row.get('experiment', '?')!r} has no field "
                          f"{missing[0]!r} (every line has {', '.join(REQUIRED)}; results/README.md)")
    if not isinstance(row["experiment"], str) or not row["experiment"]:
        raise LedgerError(f"{where}: field 'experiment' must be a non-empty string, got {row['experiment']!r}")
    if not isinstance(row["metrics"], dict):
        raise LedgerError(f"{where}: field 'metrics' of {row['experiment']!r} must be an object of numbers, got "
                          f"{type(row['metrics']).__name__}")
    record = row.get("record", "campaign")
    if not (record in RECORDS or (isinstance(record, str) and record.startswith("transcribed"))):
        raise LedgerError(f"{where}: field 'record' of {row['experiment']!r} must be one of {list(RECORDS)}, got "
                          f"{record!r}")
    return row


def read_ledger(path: str | Path) -> list[dict]:
    """Every line of the ledger ``path`` (none if the file does not exist), each checked (:func:`check_line`)."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise LedgerError(f"{path}:{i}: not a JSON line ({e})") from None
        rows.append(check_line(row, f"{path}:{i}"))
    return rows


def append_ledger(row: dict, path: str | Path) -> None:
    """Append ``row`` (checked first) to the ledger ``path`` as one line, flushed and fsynced."""
    path = Path(path)
    check_line(row, f"{path} (a new line)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def hardware(device: str, threads: int) -> str:
    """The machine a line was measured on: the GPU's name and CUDA version, or the CPU model, cores and threads."""
    if str(device).startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    model = platform.processor() or "CPU"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, {threads} thread(s) per run"


def commit(root: str | Path | None = None) -> str:
    """The commit of the checkout ``root`` (default: :func:`repository_root`), ``+dirty`` when ``src/``,
    ``configs/`` or ``benchmarks/`` differ from it; ``unknown`` outside a git checkout."""
    root = Path(root) if root is not None else repository_root()
    if root is None:
        return "unknown"

    def git(*a):
        return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()

    sha = git("rev-parse", "--short=10", "HEAD") or "unknown"
    return sha + ("+dirty" if git("status", "--porcelain", "--", "src", "configs", "benchmarks") else "")


def provenance(device: str, threads: int, command: str, record: str, *, machine: str | None = None,
               at: str | None = None) -> dict:
    """The provenance fields of a line: hardware (``machine``, default :func:`hardware`), torch version, commit
    (``at``, default :func:`commit`), date, command and ``record``."""
    import torch

    if record not in RECORDS:
        raise ValueError(f"provenance: `record` must be one of {list(RECORDS)}, got {record!r}")
    return {"hardware": machine if machine is not None else hardware(device, threads),
            "torch": torch.__version__.split("+")[0], "commit": at if at is not None else commit(),
            "date": dt.date.today().isoformat(), "command": command, "record": record}
