"""The results ledger: one JSON line per finished run or measurement (``results/ledger.jsonl`` of a checkout; the
fields are documented in ``results/README.md``), its schema, reader, writer and the provenance every line carries.

* :class:`Line` - the schema: every field and its type; :func:`check_line` the one validator (a bad line is a
  :class:`LedgerError` naming the file, the line number and the field).
* ``record`` says how a line was obtained: ``run`` (a training run measured by the command it holds, at the commit it
  holds; ``test_command`` tested it), ``transcribed`` (a number copied from a document before the ledger existed:
  ``source`` names the file and commit, ``command_reconstructed`` whether the command was rewritten afterwards),
  ``tune`` (a trial of ``hoformer tune``) or ``benchmark`` (a benchmark script's measurement).
* :func:`read_ledger` / :func:`append_ledger`; :func:`migrate` rewrites the lines of the first ledger format
  (``python -m hoformer.results migrate FILE``).
* :func:`provenance`, :func:`benchmark_line`, :func:`append_benchmarks`: the provenance fields, built in one place.

``hoformer tune``, ``benchmarks/campaign.py`` and the benchmark scripts (``benchmarks/``) write through these.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any, Literal, TypedDict, Union

__all__ = ["Line", "REQUIRED", "RECORDS", "LedgerError", "read_ledger", "append_ledger", "check_line", "migrate",
           "hardware", "commit", "provenance", "repository_root", "benchmark_line", "benchmark_command",
           "append_benchmarks", "add_ledger_argument", "device_suffix"]

Number = Union[int, float]
RECORDS = ("run", "transcribed", "tune", "benchmark")


class Line(TypedDict, total=False):
    """One ledger line (results/README.md describes each field). Fields not listed here are free."""

    experiment: str
    task: str
    dataset: str
    model: str
    scale: Literal["paper", "cpu", "gpu"]
    split: str
    metrics: dict[str, Number]
    seed: Union[int, list[int], None]
    epochs: Union[int, None]
    best_epoch: Union[int, None]
    stopping: Union[dict, None]
    wall_s: Union[Number, None]
    hardware: str
    torch: Union[str, None]
    commit: str
    date: str
    command: str
    record: Literal["run", "transcribed", "tune", "benchmark"]
    # optional
    lookback: Union[int, None]
    horizon: Union[int, list[int], None]
    protocol: Union[str, None]
    best_val: dict[str, Number]
    metrics_std: dict[str, Number]
    fit_s: Union[Number, None]
    test_s: Union[Number, None]
    test_command: str
    attempts: int
    device: str
    variant: str
    params: Union[int, dict]
    source: dict[str, str]
    command_reconstructed: bool
    study: str
    trial: int
    state: Literal["complete", "pruned"]
    curve: list[Number]


#: the fields every line has; and those a line of a given ``record`` has as well
REQUIRED = ("experiment", "task", "dataset", "model", "scale", "split", "metrics", "seed", "epochs", "best_epoch",
            "stopping", "wall_s", "hardware", "torch", "commit", "date", "command", "record")
REQUIRED_BY = {"transcribed": ("source", "command_reconstructed"), "tune": ("study", "trial", "state")}
_TYPES = typing.get_type_hints(Line)
_LEGACY = re.compile(r"transcribed: (\S+) at (\w+); run log not kept")


class LedgerError(ValueError):
    """A ledger line that is not what a ledger line must be (names the file, the line and the field)."""


def _ok(value: Any, tp) -> bool:
    """Whether the JSON ``value`` has the type ``tp`` (a :class:`Line` annotation)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return value is None
    if origin is Union:
        return any(_ok(value, a) for a in args)
    if origin is Literal:
        return value in args
    if origin in (list, dict):
        if not isinstance(value, origin):
            return False
        items = value if origin is list else value.values()
        return all(_ok(v, args[-1]) for v in items) if args else True
    if tp is float or tp is int:
        return isinstance(value, (int, float) if tp is float else int) and not isinstance(value, bool)
    return isinstance(value, tp)


def check_line(row: Any, where: str) -> dict:
    """``row`` if it is a ledger line (:class:`Line`); else :class:`LedgerError` naming ``where`` and the field."""
    if not isinstance(row, dict):
        raise LedgerError(f"{where}: a ledger line must be a JSON object, got a JSON {type(row).__name__}")
    name = row.get("experiment", "?")
    if row.get("record") == "campaign" or _LEGACY.fullmatch(str(row.get("record"))) or (
            "record" not in row and all(k in row for k in REQUIRED if k != "record")):
        raise LedgerError(f"{where}: the line of {name!r} is in the first ledger format (record "
                          f"{row.get('record', '(absent)')!r}); `python -m hoformer.results migrate FILE` rewrites it")
    for k in REQUIRED + REQUIRED_BY.get(row.get("record"), ()):
        if k not in row:
            raise LedgerError(f"{where}: the line of {name!r} has no field {k!r} (a {row.get('record')!r} line has "
                              f"{', '.join(REQUIRED + REQUIRED_BY.get(row.get('record'), ()))}; results/README.md)")
    for k, v in row.items():
        if k in _TYPES and not _ok(v, _TYPES[k]):
            want = re.sub(r"typing\.|<class '(\w+)'>", r"\1", str(_TYPES[k]))
            raise LedgerError(f"{where}: field {k!r} of {name!r} must be {want}, got {v!r}")
    if not row["experiment"]:
        raise LedgerError(f"{where}: field 'experiment' must be a non-empty string, got ''")
    return row


def read_ledger(path: str | Path) -> list[dict]:
    """Every line of the ledger ``path``, each checked (:func:`check_line`). A ledger that does not exist is an
    error naming it."""
    path = Path(path)
    if not path.is_file():
        raise LedgerError(f"{path}: no such ledger file")
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


def migrate(row: dict) -> dict:
    """A line of the first ledger format in this one: ``record`` absent or ``campaign`` -> ``run``;
    ``transcribed: FILE at SHA; run log not kept`` -> ``transcribed`` with ``source: {file, commit}`` and
    ``command_reconstructed: true`` (those commands were rewritten into the syntax of the day the ledger started).
    Every other field is kept as it is."""
    row = dict(row)
    m = _LEGACY.fullmatch(str(row.get("record")))
    if m:
        row.update(record="transcribed", source={"file": m.group(1), "commit": m.group(2)}, command_reconstructed=True)
    elif row.get("record", "campaign") == "campaign":
        row["record"] = "run"
    return row


def repository_root() -> Path | None:
    """The git checkout holding this hoformer's source (``src/hoformer`` inside it), or None for an installed copy."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".git").exists() else None


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


# ----------------------------------------------------------------------------------- benchmark scripts' lines
def benchmark_line(experiment: str, model: str, split: str, metrics: dict, *, device: str, threads: int,
                   command: str, note: str, **fields) -> dict:
    """A ledger line of a benchmark measurement (``task: benchmark``, synthetic inputs) with its provenance."""
    return {"experiment": experiment, "task": "benchmark", "dataset": "synthetic", "model": model,
            "scale": "gpu" if str(device).startswith("cuda") else "cpu", "split": split, "metrics": metrics, **fields,
            "metrics_note": note, "seed": 0, "epochs": None, "best_epoch": None, "stopping": None, "wall_s": None,
            **provenance(device, threads, command, "benchmark")}


def add_ledger_argument(parser) -> None:
    """A benchmark script's ``--ledger [FILE]`` option (default file ``results/ledger.jsonl``; absent: no lines)."""
    parser.add_argument("--ledger", nargs="?", const="results/ledger.jsonl", default=None, metavar="FILE",
                        help="append the results to the results ledger (default file: results/ledger.jsonl)")


def benchmark_command(script: str, argv: list[str], ledger_file: str | None, local: tuple[str, ...] = ()) -> str:
    """``python benchmarks/SCRIPT ARGS`` without ``--ledger [FILE]`` and the ``local`` options with their values
    (files of the machine that ran it, such as a side output ``--out``)."""
    out, rest = [], list(argv)
    while rest:
        a = rest.pop(0)
        if a == "--ledger" and rest and rest[0] == ledger_file:
            rest.pop(0)
        if a in local and rest:
            rest.pop(0)
            continue
        if not (a == "--ledger" or a.startswith("--ledger=") or a.split("=", 1)[0] in local):
            out.append(a)
    return " ".join([f"python benchmarks/{script}", *out])


def append_benchmarks(entries: list[dict], path: str | Path, script: str, argv: list[str], *, device: str,
                      threads: int) -> None:
    """Append one :func:`benchmark_line` per entry (``experiment``, ``model``, ``split``, ``metrics``, ``note`` and
    optional fields such as ``shape``) to the ledger ``path``; the command is ``script`` with ``argv``."""
    command = benchmark_command(script, argv, str(path))
    for e in entries:
        extra = {k: v for k, v in e.items() if k not in ("experiment", "model", "split", "metrics", "note")}
        append_ledger(benchmark_line(e["experiment"], e["model"], e["split"], e["metrics"], device=str(device),
                                     threads=threads, command=command, note=e["note"], **extra), Path(path))
    print(f"\n{len(entries)} lines appended to {path}")


def device_suffix(device: str, dtype: str = "fp32") -> str:
    """The experiment-name suffix of a benchmark measured off the default setting (CPU, fp32): ``+cuda``,
    ``+bf16``, ``+cuda-bf16``, so that a GPU or bf16 line never stands for a CPU fp32 one."""
    parts = [p for p in (str(device).split(":")[0] if not str(device).startswith("cpu") else "",
                         dtype if dtype != "fp32" else "") if p]
    return "+" + "-".join(parts) if parts else ""


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "migrate":
        print("usage: python -m hoformer.results migrate LEDGER.jsonl", file=sys.stderr)
        return 2
    path = Path(argv[1])
    lines = [json.loads(s) for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]
    new = [migrate(r) for r in lines]
    for i, r in enumerate(new, 1):
        check_line(r, f"{path}:{i} (migrated)")
    path.write_text("".join(json.dumps(r) + "\n" for r in new), encoding="utf-8")
    print(f"{path}: {sum(a != b for a, b in zip(lines, new))} of {len(new)} lines migrated")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
