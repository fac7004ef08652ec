"""MedMNIST v3 3D datasets (``{flag}.npz`` at 28^3 and ``{flag}_64.npz`` at 64^3).

Each ``.npz`` holds ``{train,val,test}_images`` uint8 ``(N, S, S, S)`` and ``{train,val,test}_labels`` ``(N, 1)``.
URLs and MD5s are the official ones of the MedMNIST ``INFO`` table (``MedMNIST/MedMNIST`` ``medmnist/info.py``,
Zenodo record 10519652); every file is MD5-checked and schema-checked (shapes, dtypes, labels within the dataset's
classes) before use.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from ._utils import SchemaError, cache_dir, default_data_root, download_url, verify_file

__all__ = ["MEDMNIST3D_INFO", "MedMNIST3D", "medmnist3d_url"]

_ZENODO = "https://zenodo.org/records/10519652/files/{}.npz?download=1"

# flag -> (md5 28^3, md5 64^3, class names, n_samples train/val/test)
MEDMNIST3D_INFO: dict[str, dict] = {
    "organmnist3d": {"md5": {28: "a0c5a1ff56af4f155c46d46fbb45a2fe", 64: "58a2205adf14a9d0a189cb06dc78bf10"},
                     "task": "multi-class",
                     "labels": ["liver", "kidney-right", "kidney-left", "femur-right", "femur-left", "bladder",
                                "heart", "lung-right", "lung-left", "spleen", "pancreas"],
                     "n_samples": {"train": 971, "val": 161, "test": 610}},
    "nodulemnist3d": {"md5": {28: "8755a7e9e05a4d9ce80a24c3e7a256f3", 64: "c47c5b7d457bf6332200d2ea6d64ecd8"},
                      "task": "binary-class", "labels": ["benign", "malignant"],
                      "n_samples": {"train": 1158, "val": 165, "test": 310}},
    "adrenalmnist3d": {"md5": {28: "bbd3c5a5576322bc4cdfea780653b1ce", 64: "17721accfe9fb005146a47d33bc54b2f"},
                       "task": "binary-class", "labels": ["normal", "hyperplasia"],
                       "n_samples": {"train": 1188, "val": 98, "test": 298}},
    "fracturemnist3d": {"md5": {28: "6aa7b0143a6b42da40027a9dda61302f", 64: "f01d7e6316aedf4210da0da5b7437b42"},
                        "task": "multi-class",
                        "labels": ["buckle rib fracture", "nondisplaced rib fracture", "displaced rib fracture"],
                        "n_samples": {"train": 1027, "val": 103, "test": 240}},
    "vesselmnist3d": {"md5": {28: "b41fd4f7e7e2feedddb201585ecafa1b", 64: "6bb274a8846e1097066dcd64e2c4520f"},
                      "task": "binary-class", "labels": ["vessel", "aneurysm"],
                      "n_samples": {"train": 1335, "val": 191, "test": 382}},
    "synapsemnist3d": {"md5": {28: "1235b78a3cd6280881dd7850a78eadb6", 64: "43bd14ebf3af9d3dd072446fedc14d5e"},
                       "task": "binary-class", "labels": ["inhibitory synapse", "excitatory synapse"],
                       "n_samples": {"train": 1230, "val": 177, "test": 352}},
}
_SPLITS = ("train", "val", "test")


def _flag(flag: str) -> str:
    f = str(flag).lower()
    f = f if f.endswith("mnist3d") else f + "mnist3d"  # "adrenal" -> "adrenalmnist3d"
    if f not in MEDMNIST3D_INFO:
        raise ValueError(f"flag must be one of {sorted(MEDMNIST3D_INFO)}, got {flag!r}")
    return f


def _filename(flag: str, size: int) -> str:
    return f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"


def medmnist3d_url(flag: str, size: int = 28) -> str:
    """Canonical Zenodo URL of a MedMNIST3D file."""
    return _ZENODO.format(_filename(_flag(flag), size)[:-4])


class MedMNIST3D(Dataset):
    """A MedMNIST3D split.

    Args:
        root: directory holding ``{flag}.npz`` / ``{flag}_64.npz``; ``None`` = ``$HOFORMER_DATA/medmnist3d`` if it
            exists, else the cache ``~/.cache/hoformer/medmnist3d`` (``$HOFORMER_CACHE``).
        flag: organmnist3d | nodulemnist3d | adrenalmnist3d | fracturemnist3d | vesselmnist3d | synapsemnist3d
            (case-insensitive, the ``mnist3d`` suffix may be omitted).
        split: "train" | "val" | "test".
        size: 28 or 64 (edge of the cubic volume).
        transform / target_transform: applied to the image tensor / the label tensor.
        download: fetch a missing file from Zenodo (atomic, MD5-checked).
        verify: check the official MD5 (on by default; cached per file, so the three splits hash once).

    Items: ``(image, label)`` with ``image`` float32 ``(1, S, S, S)`` in [0, 1] and ``label`` int64 ``(1,)`` (the
    files store labels as ``(N, 1)``; use ``label.squeeze(-1)`` for cross-entropy).
    """

    def __init__(self, root=None, flag: str = "adrenalmnist3d", split: str = "train", size: int = 28,
                 transform: Callable | None = None, target_transform: Callable | None = None,
                 download: bool = False, verify: bool = True):
        self.flag = _flag(flag)
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
        if size not in (28, 64):
            raise ValueError(f"size must be 28 or 64 (MedMNIST3D resolutions), got {size!r}")
        if root is None:
            base = default_data_root()
            root = base / "medmnist3d" if base is not None and (base / "medmnist3d").is_dir() else cache_dir(
                "medmnist3d")
        info = MEDMNIST3D_INFO[self.flag]
        md5 = info["md5"][size] if verify else None
        path = Path(root) / _filename(self.flag, size)
        if not path.exists() and download:
            download_url(medmnist3d_url(self.flag, size), path, md5=md5)
        verify_file(path, md5=md5, hint=f"Pass download=True to fetch it from {medmnist3d_url(self.flag, size)}."
                    if not path.is_file() else "Delete it and re-download (download=True).")
        self.path, self.split, self.size = path, split, size
        self.transform, self.target_transform = transform, target_transform
        self.info, self.task, self.class_names = info, info["task"], list(info["labels"])
        self.images, self.labels = self._load(path, split, size, len(self.class_names))

    @staticmethod
    def _load(path: Path, split: str, size: int, num_classes: int):
        try:
            with np.load(path, allow_pickle=False) as z:
                keys = set(z.files)
                need = {f"{split}_images", f"{split}_labels"}
                if not need <= keys:
                    raise SchemaError(f"{path}: missing arrays {sorted(need - keys)} (has {sorted(keys)})")
                images, labels = z[f"{split}_images"], z[f"{split}_labels"]
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"{path}: not a readable .npz archive ({type(e).__name__}: {e})") from e
        if images.ndim != 4 or images.shape[1:] != (size, size, size) or images.dtype != np.uint8:
            raise SchemaError(f"{path}: {split}_images must be uint8 (N, {size}, {size}, {size}), got "
                              f"{images.dtype} {images.shape}")
        if labels.ndim != 2 or labels.shape[0] != images.shape[0] or not np.issubdtype(labels.dtype, np.integer):
            raise SchemaError(f"{path}: {split}_labels must be integer (N={images.shape[0]}, k), got "
                              f"{labels.dtype} {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            bad = labels[(labels < 0) | (labels >= num_classes)]
            raise SchemaError(f"{path}: {split}_labels must be class ids in [0, {num_classes}) for this dataset's "
                              f"{num_classes} classes, got {int(bad.size)} out of range (e.g. {int(bad.flat[0])}; "
                              f"range [{int(labels.min())}, {int(labels.max())}])")
        return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int):
        image = self.images[index].unsqueeze(0).float().div_(255.0)
        label = self.labels[index]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def __repr__(self) -> str:
        return f"MedMNIST3D(flag={self.flag!r}, split={self.split!r}, size={self.size}, n={len(self)})"
