"""Shared data helpers: checksums, verification, atomic downloads, data/cache directories.

Every reader in ``hoformer.data`` goes through these so that a missing file, a corrupt or truncated download and a
file with the wrong layout all fail early with an error that names the file, what was expected and how to fix it.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

__all__ = [
    "ChecksumError",
    "SchemaError",
    "file_hash",
    "sha256sum",
    "require_file",
    "verify_file",
    "VERIFY_HINT",
    "download_url",
    "default_data_root",
    "resolve_root",
    "cache_dir",
]

_CHUNK = 1 << 20
# appended to a checksum error by every reader that checks a reference digest before parsing
VERIFY_HINT = "Pass verify=False to use another copy (its layout is still checked)."
_HASH_CACHE: dict[tuple[str, str, int, int], str] = {}


class ChecksumError(ValueError):
    """A file's checksum differs from the known one (corrupt, truncated or a different version)."""


class SchemaError(ValueError):
    """A file is readable but its layout is not the expected one (columns, keys, shapes, dtypes, NaNs)."""


def file_hash(path: str | os.PathLike, algo: str = "sha256") -> str:
    """Hex digest of a file, streamed in 1 MiB chunks; cached per (path, algo, size, mtime) so that building the
    train/val/test splits of one file hashes it once."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), algo, st.st_size, st.st_mtime_ns)
    if key not in _HASH_CACHE:
        h = hashlib.new(algo)
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
        _HASH_CACHE[key] = h.hexdigest()
    return _HASH_CACHE[key]


def sha256sum(path: str | os.PathLike) -> str:
    return file_hash(path, "sha256")


def require_file(path: str | os.PathLike, what: str = "", hint: str = "") -> Path:
    """``path`` as a ``Path`` if it is a file; else ``IsADirectoryError`` (a directory is there), ``FileNotFoundError``
    (nothing is), or ``ValueError`` (something else, e.g. a FIFO), each naming the path; ``what`` prefixes the message
    (e.g. ``"LTSF file for 'ETTh1'"``) and ``hint`` ends it."""
    p = Path(path)
    lead = f"{what}: " if what else ""
    if p.is_file():
        return p
    if p.is_dir():
        raise IsADirectoryError(f"{lead}{p}: expected a data file, found a directory (point to the file inside it, "
                                "or move the directory away)")
    if p.exists():
        raise ValueError(f"{lead}{p}: expected a regular data file, found something else (a socket, FIFO or device)")
    raise FileNotFoundError(f"{lead}{p}: file not found. {hint}".strip())


def verify_file(path: str | os.PathLike, *, md5: str | None = None, sha256: str | None = None,
                hint: str = "") -> Path:
    """Check that ``path`` exists and matches the given checksum(s). Raises ``FileNotFoundError`` or
    :class:`ChecksumError` (a ``ValueError``) naming the file, the expected and the received digest."""
    p = require_file(path, hint=hint)
    for algo, want in (("md5", md5), ("sha256", sha256)):
        if want is None:
            continue
        got = file_hash(p, algo)
        if got.lower() != want.lower():
            raise ChecksumError(
                f"{p}: {algo} checksum mismatch: expected {want}, got {got} (size {p.stat().st_size} bytes); the "
                f"file is corrupt, truncated or a different version. {hint}".strip()
            )
    return p


def download_url(url: str, dest: str | os.PathLike, *, md5: str | None = None, sha256: str | None = None,
                 overwrite: bool = False, timeout: float = 60.0) -> Path:
    """Download ``url`` (``https://``, ``http://`` or ``file://``) to ``dest`` atomically.

    The bytes go to a temporary file in the destination folder, are hashed while streaming, and the file is moved
    into place (``os.replace``) only when the checksum matches, so an interrupted or corrupt download never leaves
    a file that looks valid. An existing ``dest`` that passes verification is kept unless ``overwrite``.
    """
    dest = Path(dest)
    if dest.is_file() and not overwrite:
        return verify_file(dest, md5=md5, sha256=sha256,
                           hint="Delete it and download again, or pass overwrite=True.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    hashes = {a: hashlib.new(a) for a, w in (("md5", md5), ("sha256", sha256)) if w is not None}
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        try:  # the temporary file is opened (and so closed) first: a failed request does not leak its descriptor
            with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as r:
                for chunk in iter(lambda: r.read(_CHUNK), b""):
                    f.write(chunk)
                    for h in hashes.values():
                        h.update(chunk)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:  # URLError is an OSError
            raise OSError(f"could not download {url} to {dest}: {e}. Download it manually and place it at {dest}.") from e
        for algo, want in (("md5", md5), ("sha256", sha256)):
            if want is not None and hashes[algo].hexdigest().lower() != want.lower():
                raise ChecksumError(f"downloaded {url}: {algo} checksum mismatch: expected {want}, got "
                                    f"{hashes[algo].hexdigest()}; nothing was written to {dest}.")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def default_data_root() -> Path | None:
    """``$HOFORMER_DATA`` if set, else ``../shared/data`` relative to the working directory if it exists."""
    env = os.environ.get("HOFORMER_DATA")
    if env:
        return Path(env).expanduser()
    cand = Path.cwd().parent / "shared" / "data"
    return cand if cand.is_dir() else None


def resolve_root(root: str | os.PathLike | None, sub: str, what: str) -> Path:
    """``root`` if given, else ``<default_data_root()>/<sub>``; raises ``FileNotFoundError`` with a fix if missing."""
    if root is None:
        base = default_data_root()
        if base is None:
            raise FileNotFoundError(f"no data root for {what}: pass root=... or set HOFORMER_DATA to a directory "
                                    f"containing '{sub}/' (e.g. HOFORMER_DATA=../shared/data)")
        root = base / sub
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data root for {what} not found: {root} (pass root=... or set HOFORMER_DATA so "
                                f"that $HOFORMER_DATA/{sub} exists)")
    return root


def cache_dir(sub: str | None = None) -> Path:
    """Writable cache directory: ``$HOFORMER_CACHE`` or ``~/.cache/hoformer`` (optionally a sub-folder)."""
    base = Path(os.environ.get("HOFORMER_CACHE", Path.home() / ".cache" / "hoformer")).expanduser()
    return base / sub if sub else base

