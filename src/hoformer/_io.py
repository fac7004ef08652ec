"""File input / output at the lowest level: crash-safe writes (weights, checkpoints, predictions, tokenizers, caches,
figures, CSVs): :func:`atomic_write` for one file, :func:`stage` plus ``os.replace`` for files renamed together
(``save_pretrained``); and :func:`read_checkpoint`, the one ``torch.load`` (weights-only) of the package
(:mod:`hoformer.checkpoint` builds on it)."""
from __future__ import annotations

import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["atomic_write", "read_checkpoint", "check_device", "CheckpointError", "MissingCheckpointError",
           "pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (another user's live process counts as alive): what tells a
    lock or a trial left by a process that is gone from one still held."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDWR)  # Windows refuses fsync on a read-only descriptor
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Persist a directory entry change (a rename). Best effort: some platforms (Windows) cannot open a directory."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _file_mode(path: Path) -> int:
    """Permissions a plain ``open(path, "w")`` would leave: the existing file's, else ``0o666`` minus the umask
    (``mkstemp`` creates its file ``0o600``, which teammates sharing a run directory could not read)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        pass
    try:  # Linux: read the umask without changing it (os.umask(0) would briefly affect every thread)
        with open("/proc/self/status") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0)
        os.umask(umask)
    return 0o666 & ~umask


def stage(path: Path, write_fn: Callable[[str], Any]) -> str:
    """Write a hidden temporary sibling of ``path`` with ``write_fn(tmp)`` and fsync it; returns the temporary path."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_fn(tmp)
        os.chmod(tmp, _file_mode(path))
        _fsync_file(tmp)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _file_size_limit() -> int | None:
    """The soft ``RLIMIT_FSIZE`` of this process in bytes (``ulimit -f``), ``None`` when there is none (or no
    ``resource`` module: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def explain_write_error(path: Path, e: Exception) -> Exception:
    """The error of a failed write of ``path`` naming the file and the cause, when it is the process's file-size limit
    (``ulimit -f``: ``EFBIG``) or a full disk (``ENOSPC`` / ``EDQUOT``), also for a writer such as ``torch.save`` that
    reports only a short write ("unexpected pos"); ``e`` itself otherwise."""
    import errno
    import shutil

    short = isinstance(e, OSError) or "unexpected pos" in str(e) or "write" in str(e).lower()
    limit = _file_size_limit()
    if limit is not None and ((isinstance(e, OSError) and e.errno == errno.EFBIG) or short):
        return OSError(errno.EFBIG, f"cannot write {str(path)!r}: the file-size limit of this process (ulimit -f: "
                                    f"{limit} bytes, {limit / 2**20:.2f} MiB) stopped the write; nothing was written "
                                    "and the previous file, if any, is intact. Raise the limit (ulimit -f unlimited) "
                                    f"or write a smaller file ({type(e).__name__}: "
                                    f"{str(e).splitlines()[0][:200] if str(e) else ''})")
    full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))
    if not full and (isinstance(e, OSError) or "unexpected pos" in str(e) or "write" in str(e).lower()):
        try:
            full = shutil.disk_usage(path.parent).free < 64 * 2**20  # under 64 MiB left: the likely cause
        except OSError:
            pass
    if not full:
        return e
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return OSError(errno.ENOSPC, f"cannot write {str(path)!r}: no space left on the device holding "
                                 f"{str(path.parent)!r} ({free}); nothing was written and the previous file, if any, "
                                 f"is intact ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})")


def mkdir(directory: Path) -> None:
    created = not directory.is_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if created:
        fsync_dir(directory.parent)


def atomic_write(path: str | os.PathLike, write_fn) -> None:
    """Call ``write_fn(tmp_path)`` then atomically rename onto ``path`` (no torn files on crash).

    The temporary file is fsynced before the rename and the parent directory after it, so that after a crash
    ``path`` holds either its previous content or the complete new one.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {str(path)!r}: it is a directory; expected a file path (e.g. "
                                f"{str(path / 'out')!r} with the file's suffix)")
    mkdir(path.parent)
    try:
        tmp = stage(path, write_fn)
    except Exception as e:  # noqa: BLE001 - a full disk surfaces as OSError(ENOSPC) or as torch's "unexpected pos"
        raise explain_write_error(path, e) from e
    try:
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_dir(path.parent)


# the temporary files of :func:`stage`: ``.<target name>.<8 mkstemp characters>.tmp``
_STAGED = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp$")


def stale_temp_files(directory: str | os.PathLike, suffix: str = "") -> list[Path]:
    """The temporary files of :func:`stage` in ``directory`` whose target name ends with ``suffix`` (e.g. ``".ckpt"``):
    what a process killed while writing leaves behind. Only that naming pattern matches; callers remove them at the
    start of a run, before any write of their own."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.iterdir()):
        m = _STAGED.match(p.name)
        if m and m["target"].endswith(suffix) and p.is_file() and not p.is_symlink():
            out.append(p)
    return out


# ------------------------------------------------------------------------------------------------ reads
class CheckpointError(ValueError):
    """A checkpoint that cannot serve the request: unreadable, not a Lightning checkpoint, of another model
    configuration, trained on other data, or not there (``--ckpt_path best`` of a run that saved none)."""


class MissingCheckpointError(CheckpointError, FileNotFoundError):
    """No checkpoint where one was asked for."""


def check_device(map_location: Any, fn: str) -> None:
    """A ``map_location`` / ``--device`` that names a device this machine lacks (``"cuda:7"`` on a one-GPU or CPU-only
    machine) raises a ``ValueError`` naming the argument, before any file is read (torch would blame the file)."""
    if not isinstance(map_location, (str, torch.device)):
        return  # a dict / function / None: torch's own semantics
    try:
        dev = torch.device(map_location)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{fn}: device {str(map_location)!r} is not a device name (expected 'cpu', 'cuda', "
                         f"'cuda:0', 'mps', ...): {e}") from e
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0 or (dev.index is not None and dev.index >= n):
            have = "no CUDA device" if n == 0 else f"{n} CUDA device(s) (cuda:0..cuda:{n - 1})"
            raise ValueError(f"{fn}: device {str(map_location)!r} does not exist on this machine, which has {have}; "
                             "pass 'cpu' or an existing device")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"{fn}: device {str(map_location)!r} is not available on this machine; pass 'cpu'")


def read_checkpoint(path, map_location: Any = "cpu", *, fn: str = "read_checkpoint", what: str = "checkpoint",
                    mmap: bool = False) -> Any:
    """``torch.load(path, map_location, weights_only=True)`` with errors that name the file: ``FileNotFoundError``
    (missing), ``IsADirectoryError`` (a directory), ``ValueError`` (empty, truncated or not a PyTorch file; a device
    that does not exist) and ``pickle.UnpicklingError`` (a pickle that needs more than tensors and plain containers:
    refused, never run). ``what`` names the kind of file in the messages."""
    p = Path(os.fspath(path))
    if not p.exists():
        raise MissingCheckpointError(f"{fn}: {what} file {str(p)!r} not found")
    if p.is_dir():
        raise IsADirectoryError(f"{fn}: {what} {str(p)!r} is a directory; expected a .ckpt file (a "
                                "save_pretrained folder loads with hoformer.models.from_pretrained)")
    check_device(map_location, fn)
    size = p.stat().st_size
    try:
        return torch.load(p, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():  # refusals name the global; bad bytes ("Unsupported operand"): wrong file
            raise CheckpointError(f"{fn}: cannot read {what} {str(p)!r} ({size} bytes): it is not a PyTorch file "
                             f"(UnpicklingError: {str(e).splitlines()[0][:200]})") from e
        raise pickle.UnpicklingError(
            f"{fn}: {what} {str(p)!r} holds objects other than tensors and plain containers; it is refused "
            f"(weights_only=True; only load files you trust with a plain torch.load): {e}") from e
    except Exception as e:  # noqa: BLE001 - torch raises many types (RuntimeError, EOFError, KeyError...) on bad bytes
        detail = str(e).split(". ")[0]  # torch's miniz errors run on for several sentences
        raise CheckpointError(f"{fn}: cannot read {what} {str(p)!r} ({size} bytes): the file is empty, truncated or "
                         f"not a PyTorch file ({type(e).__name__}: {detail})") from e


