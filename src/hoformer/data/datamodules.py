"""Lightning datamodules of the volume and image tasks (usable as ``data: {class_path:
hoformer.data.MedMNIST3DDataModule, ...}``; the series datamodules are in :mod:`hoformer.data.series`,
:mod:`hoformer.data.ltsf` and :mod:`hoformer.data.traffic`).

Roots default to ``$HOFORMER_DATA/<sub>`` (``medmnist3d``, ``ssl4eo_l``). Each builds one split at a time on
:class:`~hoformer.data._base.SplitDataModule`, whose validation and test loaders never shuffle or drop a batch, so
every evaluation volume / patch is scored.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from torch.utils.data import Dataset

from hoformer._checks import is_int

from ._base import SplitDataModule
from ._utils import cache_dir, default_data_root, resolve_root
from .medmnist import MEDMNIST3D_INFO, MedMNIST3D, _filename, _flag
from .multispectral import SSL4EO_SENSORS, CenterCrop, Compose, RandomCrop, RandomFlip, SSL4EOLDataset, \
    make_synthetic_ssl4eo, _dirs, _PRODUCTS

__all__ = ["MedMNIST3DDataModule", "MultispectralDataModule"]


class MedMNIST3DDataModule(SplitDataModule):
    """MedMNIST3D volumes ``(B, 1, S, S, S)`` in [0, 1] with labels ``(B, 1)`` (int64). ``root=None`` resolves to
    ``$HOFORMER_DATA/medmnist3d``; with ``download=True`` to that folder only if it already holds the file, else the
    writable cache ``~/.cache/hoformer/medmnist3d``. Training-split augmentation (never validation / test):
    ``flip_augment`` flips each of the three spatial axes with probability 1/2; ``shift_augment=k`` then translates
    the volume by a random integer in ``[-k, k]`` voxels along each axis, filling with zeros (a random crop of the
    zero-padded volume). ``verify=False`` skips the official MD5 check (another copy of the file; its layout and
    label range are still checked)."""

    def __init__(self, root: str | None = None, flag: str = "adrenalmnist3d", size: int = 28, batch_size: int = 32,
                 num_workers: int = 0, download: bool = False, flip_augment: bool = False, pin_memory: bool = False,
                 eval_batch_size: int | None = None, verify: bool = True, shift_augment: int = 0):
        super().__init__(batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                         eval_batch_size=eval_batch_size)
        if not is_int(shift_augment) or not 0 <= shift_augment < size:
            raise ValueError(f"MedMNIST3DDataModule: `shift_augment` must be an int in [0, size={size}), got "
                             f"{shift_augment!r}")
        self.save_hyperparameters()
        self.flag, self.size = _flag(flag), size
        if root is None:  # download=True: the data root when it already holds the file, else the writable cache
            base = default_data_root()
            have = base is not None and (base / "medmnist3d" / _filename(self.flag, size)).is_file()
            root = resolve_root(None, "medmnist3d", f"MedMNIST3D {self.flag!r}") if have or not download \
                else cache_dir("medmnist3d")
        self.root = Path(root)

    def _make(self, split: str) -> Dataset:
        h = self.hparams
        augment = split == "train" and (h.flip_augment or h.shift_augment)
        tf = _Augment3D(h.flip_augment, h.shift_augment) if augment else None
        return MedMNIST3D(self.root, self.flag, split, self.size, transform=tf, download=h.download, verify=h.verify)

    sample_unit = "volumes"

    def _split_protocol(self) -> str:
        return f"{_filename(self.flag, self.size)}, MedMNIST's own train / val / test split"

    @property
    def num_classes(self) -> int:
        return len(MEDMNIST3D_INFO[self.flag]["labels"])

    @property
    def in_channels(self) -> int:
        return 1

    @property
    def input_size(self) -> int:
        """Edge of the cubic volumes."""
        return self.size


class _Augment3D:
    """Random flips and integer shifts of a ``(C, D, H, W)`` volume, drawn from the global torch RNG (reseeded per
    epoch and per worker by :class:`~hoformer.train.TaskModule`, so augmented runs resume exactly)."""

    def __init__(self, flip: bool, shift: int) -> None:
        self.flip, self.shift = flip, shift

    def __call__(self, image):
        import torch
        import torch.nn.functional as F

        if self.flip:
            for dim in (-1, -2, -3):
                if float(torch.rand(())) < 0.5:
                    image = image.flip(dim)
        k = self.shift
        if k:
            d, h, w = (int(x) for x in torch.randint(0, 2 * k + 1, (3,)))  # crop offsets in the padded volume
            size = image.shape[-3:]
            image = F.pad(image, (k,) * 6)[..., d:d + size[0], h:h + size[1], w:w + size[2]]
        return image


class MultispectralDataModule(SplitDataModule):
    """SSL4EO-L land-cover segmentation: images ``(B, bands, crop, crop)`` float in [0, 1], masks
    ``(B, crop, crop)`` int64. ``crop_size=None`` (default) keeps the full 264 x 264 patch; otherwise training uses a
    random crop and evaluation a centre crop (torchgeo's SSL4EO-L datamodule uses 224). ``flip`` adds random flips on
    the training split. ``root=None`` resolves to ``$HOFORMER_DATA/ssl4eo_l`` (with ``download=True``: only if it
    already holds the sensor's patches, else the cache ``~/.cache/hoformer/ssl4eo_l``). With ``synthetic=True``
    ``synthetic_n`` patches from :func:`~hoformer.data.make_synthetic_ssl4eo` are written once under ``root`` (default
    ``~/.cache/hoformer/synthetic_ssl4eo``) and used instead."""

    def __init__(self, root: str | None = None, product: str = "nlcd", sensor: str = "oli_sr",
                 crop_size: int | None = None, batch_size: int = 16, num_workers: int = 0, synthetic: bool = False,
                 synthetic_n: int = 64, synthetic_size: int = 264, flip: bool = True, download: bool = False,
                 seed: int = 0, pin_memory: bool = False, eval_batch_size: int | None = None):
        super().__init__(batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory,
                         eval_batch_size=eval_batch_size)
        self.save_hyperparameters()
        if product not in _PRODUCTS or sensor not in SSL4EO_SENSORS:
            raise ValueError(f"product must be in {sorted(_PRODUCTS)} and sensor in {sorted(SSL4EO_SENSORS)}, got "
                             f"{product!r}, {sensor!r}")
        self.product, self.sensor = product, sensor
        if synthetic:
            root = Path(root) if root is not None else cache_dir(
                f"synthetic_ssl4eo/{sensor}_{product}_n{synthetic_n}_s{synthetic_size}_seed{seed}")
        elif root is None:  # download=True: the data root when it already holds the patches, else the cache
            base = default_data_root()
            have = base is not None and all((base / "ssl4eo_l" / d).is_dir() for d in _dirs(sensor, product)[:2])
            root = resolve_root(None, "ssl4eo_l", "SSL4EO-L") if have or not download else cache_dir("ssl4eo_l")
        self.root = Path(root)

    def prepare_data(self) -> None:
        h = self.hparams
        marker = self.root / f"ssl4eo_l_{self.sensor}_benchmark"
        if h.synthetic and not marker.is_dir():  # write elsewhere, then move in (image dir last = done marker)
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.root) as tmp:
                make_synthetic_ssl4eo(tmp, h.synthetic_n, product=self.product, sensor=self.sensor,
                                      size=h.synthetic_size, seed=h.seed)
                for d in sorted(Path(tmp).iterdir(), key=lambda d: d.name == marker.name):
                    if not (self.root / d.name).exists():
                        os.replace(d, self.root / d.name)

    def _make(self, split: str) -> Dataset:
        h = self.hparams
        self.prepare_data()  # idempotent; lets the datamodule be used outside a Trainer
        tfs = []
        if h.crop_size is not None:
            tfs.append(RandomCrop(h.crop_size) if split == "train" else CenterCrop(h.crop_size))
        if split == "train" and h.flip:
            tfs.append(RandomFlip())
        return SSL4EOLDataset(self.root, self.product, split, self.sensor, transform=Compose(tfs) if tfs else None,
                              download=h.download)

    @property
    def in_channels(self) -> int:
        return SSL4EO_SENSORS[self.sensor][0]

    @property
    def input_size(self) -> int:
        """Edge of the model's input: the crop, else the whole patch."""
        h = self.hparams
        return h.crop_size or (h.synthetic_size if h.synthetic else 264)

    @property
    def num_classes(self) -> int:
        return len(_PRODUCTS[self.product])
