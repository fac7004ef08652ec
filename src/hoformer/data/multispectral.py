"""Multispectral land-cover segmentation in the SSL4EO-L benchmark layout (Stewart et al., NeurIPS 2023; torchgeo's
``SSL4EOLBenchmark``).

On-disk layout (``sensor`` e.g. ``oli_sr`` = Landsat 8/9 surface reflectance, 7 bands; ``product`` nlcd | cdl)::

    root/ssl4eo_l_{sensor}_benchmark/<patch>/<scene>/all_bands.{tif,npy,npz}       (bands, 264, 264) uint8
    root/ssl4eo_l_{sensor[:3]}_{product}/<patch>/<scene>/{product}_{year}.{...}     (1, 264, 264) raw class codes

Raw NLCD / CDL codes are mapped to ordinal classes (NLCD 17, CDL 134; unknown codes -> 0 = background), samples are
split 70/15/15 with the benchmark's seeded permutation, and images are scaled by 1/255. ``.npy`` / ``.npz`` files are
read with numpy; GeoTIFFs need the optional ``rasterio`` (imported lazily). :func:`make_synthetic_ssl4eo` writes files
in the same layout for tests and demos (no real patches are available on the development machines).
"""
from __future__ import annotations

import posixpath
import tarfile
import tempfile
from pathlib import Path, PureWindowsPath
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from ._utils import SchemaError, download_url

__all__ = [
    "NLCD_CLASSES",
    "CDL_CLASSES",
    "SSL4EO_SENSORS",
    "SSL4EOLDataset",
    "RandomCrop",
    "CenterCrop",
    "RandomFlip",
    "Compose",
    "make_synthetic_ssl4eo",
]

# raw codes kept by the benchmark (torchgeo NLCD.cmap / CDL.cmap keys); ordinal class = position in the tuple
NLCD_CLASSES = (0, 11, 12, 21, 22, 23, 24, 31, 41, 42, 43, 52, 71, 81, 82, 90, 95)
CDL_CLASSES = (
    0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38,
    39, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 63, 64, 65, 66, 67, 68,
    69, 70, 71, 72, 74, 75, 76, 77, 81, 82, 83, 87, 88, 92, 111, 112, 121, 122, 123, 124, 131, 141, 142, 143, 152,
    176, 190, 195, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222,
    223, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 244,
    245, 246, 247, 248, 249, 250, 254,
)
_PRODUCTS = {"nlcd": NLCD_CLASSES, "cdl": CDL_CLASSES}
# sensor -> (bands, mask year)
SSL4EO_SENSORS = {"tm_toa": (7, 2011), "etm_toa": (9, 2019), "etm_sr": (6, 2019), "oli_tirs_toa": (11, 2019),
                  "oli_sr": (7, 2019)}
_URL = "https://hf.co/datasets/torchgeo/ssl4eo-l-benchmark/resolve/da96ae2b04cb509710b72fce9131c2a3d5c211c2/{}.tar.gz"
_IMG_MD5 = {"tm_toa": "8e3c5bcd56d3780a442f1332013b8d15", "etm_toa": "1b051c7fe4d61c581b341370c9e76f1f",
            "etm_sr": "34a24fa89a801654f8d01e054662c8cd", "oli_tirs_toa": "6e9d7cf0392e1de2cbdb39962ba591aa",
            "oli_sr": "0700cd15cc2366fe68c2f8c02fa09a15"}
_MASK_MD5 = {("tm", "cdl"): "3d676770ffb56c7e222a7192a652a846", ("tm", "nlcd"): "261149d7614fcfdcb3be368eefa825c7",
             ("etm", "cdl"): "008098c968544049eaf7b307e14241de", ("etm", "nlcd"): "9c031049d665202ba42ac1d89b687999",
             ("oli", "cdl"): "1cb057de6eafeca975deb35cb9fb036f", ("oli", "nlcd"): "9de0d6d4d0b94313b80450f650813922"}
_EXTS = (".npy", ".npz", ".tif", ".tiff")
_SPLITS = ("train", "val", "test")


def _dirs(sensor: str, product: str) -> tuple[str, str, str]:
    """(image dir, mask dir, mask file stem) of the SSL4EO-L benchmark layout."""
    return (f"ssl4eo_l_{sensor}_benchmark", f"ssl4eo_l_{sensor.split('_')[0]}_{product}",
            f"{product}_{SSL4EO_SENSORS[sensor][1]}")


def _read_array(path: Path) -> np.ndarray:
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                for key in ("image", "mask", "arr_0"):
                    if key in z.files:
                        return z[key]
                if len(z.files) == 1:
                    return z[z.files[0]]
                raise SchemaError(f"{path}: expected one array or an 'image'/'mask' key, got keys {z.files}")
    except SchemaError:
        raise
    except (OSError, ValueError) as e:
        raise SchemaError(f"{path}: unreadable array file ({type(e).__name__}: {e})") from e
    try:
        import rasterio
    except ImportError as e:
        raise ImportError(f"reading GeoTIFF {path} needs rasterio: pip install rasterio (or convert the patches to "
                          f".npy)") from e
    with rasterio.open(path) as src:
        return src.read()


def _safe_extractall(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract ``tar`` under ``dest`` without letting a member escape it.

    Uses the standard library's ``"data"`` filter where it exists (Python >= 3.12, 3.11.4, 3.10.12); on older
    interpreters every member is validated first and the archive is refused as a whole (``tarfile.TarError``) if one
    fails: only regular files, directories and links; relative paths without ``..``; no member below a symbolic link
    of the archive; link targets inside ``dest``. Permission bits are reduced to ``0o755`` (no set-uid/gid)."""
    dest = Path(dest)
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    base = dest.resolve()
    members = tar.getmembers()
    symlinks = {posixpath.normpath(m.name.replace("\\", "/")) for m in members if m.issym()}

    def refuse(m, why):
        raise tarfile.TarError(f"refusing to extract {tar.name}: member {m.name!r} {why}")

    def check(m, rel: str, what: str) -> str:
        rel = rel.replace("\\", "/")
        if rel.startswith("/") or PureWindowsPath(rel).drive or ".." in rel.split("/"):
            refuse(m, f"has {what} {rel!r} that is absolute or contains '..'")
        norm = posixpath.normpath(rel)
        parts = norm.split("/")
        for k in range(1, len(parts)):
            if "/".join(parts[:k]) in symlinks:
                refuse(m, f"has {what} {rel!r} that goes through a symbolic link of the archive")
        target = (base / norm).resolve()
        if target != base and base not in target.parents:
            refuse(m, f"has {what} {rel!r} that resolves outside {base}")
        return norm

    for m in members:
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            refuse(m, "is a device, FIFO or other special file")
        name = check(m, m.name, "path")
        if m.issym():
            link = m.linkname.replace("\\", "/")  # relative to the link's own folder
            if not link.startswith("/"):
                link = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
            check(m, link, "link target")
        elif m.islnk():
            check(m, m.linkname, "link target")
        m.mode &= 0o755
    tar.extractall(dest, members=members)


class SSL4EOLDataset(Dataset):
    """SSL4EO-L land-cover segmentation patches (image, mask) pairs.

    Args:
        root: directory holding ``ssl4eo_l_{sensor}_benchmark/`` and ``ssl4eo_l_{sensor[:3]}_{product}/``.
        product: "nlcd" (17 classes) or "cdl" (134 classes).
        split: "train" | "val" | "test" (70/15/15, benchmark permutation with seed 0).
        sensor: one of :data:`SSL4EO_SENSORS` (default "oli_sr", 7 bands).
        transform: callable ``(image, mask) -> (image, mask)``, e.g. ``Compose([RandomCrop(224), RandomFlip()])``.
        scale: images are divided by this (SSL4EO-L benchmark patches are uint8; 255 -> [0, 1]).
        download: fetch and extract the benchmark archives from Hugging Face (MD5-checked) when missing.

    Items: ``image`` float32 ``(bands, H, W)``, ``mask`` int64 ``(H, W)`` of ordinal classes.
    """

    def __init__(self, root, product: str = "nlcd", split: str = "train", sensor: str = "oli_sr",
                 transform: Callable | None = None, scale: float = 255.0, download: bool = False):
        if product not in _PRODUCTS:
            raise ValueError(f"product must be one of {sorted(_PRODUCTS)}, got {product!r}")
        if sensor not in SSL4EO_SENSORS:
            raise ValueError(f"sensor must be one of {sorted(SSL4EO_SENSORS)}, got {sensor!r}")
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
        self.root, self.product, self.split, self.sensor = Path(root), product, split, sensor
        self.transform, self.scale = transform, scale
        self.in_channels = SSL4EO_SENSORS[sensor][0]
        self.classes = _PRODUCTS[product]
        lut = np.zeros(256, dtype=np.int64)
        lut[list(self.classes)] = np.arange(len(self.classes))
        self._lut = torch.from_numpy(lut)
        img_dir, self._mask_dir, self._mask_stem = _dirs(sensor, product)
        self._img_dir = img_dir
        if download:  # images and masks are separate archives: fetch whichever is missing
            self._download(images=not self._find_images(), masks=not (self.root / self._mask_dir).is_dir())
        images = self._find_images()
        if not images:
            raise FileNotFoundError(
                f"no SSL4EO-L patches found under {self.root / img_dir} (expected <patch>/<scene>/all_bands"
                f"{{.npy,.npz,.tif}}); pass download=True, or use make_synthetic_ssl4eo(root) for a synthetic set")
        perm = np.arange(len(images))
        np.random.RandomState(0).shuffle(perm)  # == torchgeo: np.random.seed(0); np.random.shuffle(...)
        sizes = (np.array([0.7, 0.15, 0.15]) * len(images)).astype(int)
        groups = np.split(perm, np.cumsum(sizes)[:-1])
        self.samples = [(images[i], self._mask_path(images[i])) for i in groups[_SPLITS.index(split)]]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _find_images(self) -> list[Path]:
        """One image per patch folder, sorted by folder: a patch stored in several formats (e.g. the .tif originals
        next to their .npy conversion) is one sample (was one per file: duplicates across the splits), read from
        the first format of ``_EXTS`` present."""
        base = self.root / self._img_dir
        if not base.is_dir():
            return []
        rank = {e: i for i, e in enumerate(_EXTS)}
        best: dict[Path, Path] = {}
        for p in base.rglob("all_bands.*"):
            ext = p.suffix.lower()
            if ext in rank and (p.parent not in best or rank[ext] < rank[best[p.parent].suffix.lower()]):
                best[p.parent] = p
        return [best[d] for d in sorted(best)]

    def _mask_path(self, img: Path) -> Path:
        rel = img.parent.relative_to(self.root / self._img_dir)
        folder = self.root / self._mask_dir / rel
        for ext in (img.suffix, *_EXTS):
            p = folder / f"{self._mask_stem}{ext}"
            if p.is_file():
                return p
        raise FileNotFoundError(f"mask for {img} not found: expected {folder / self._mask_stem}{{.npy,.npz,.tif}}")

    def _download(self, images: bool = True, masks: bool = True) -> None:
        """Fetch (MD5-checked) and extract the image and / or mask archive. Each is extracted into a temporary
        directory first and moved into place whole, so an existing directory always means a complete extraction."""
        wanted = [(self._img_dir, _IMG_MD5[self.sensor])] if images else []
        if masks:
            wanted.append((self._mask_dir, _MASK_MD5[(self.sensor.split("_")[0], self.product)]))
        for name, md5 in wanted:
            archive = download_url(_URL.format(name), self.root / f"{name}.tar.gz", md5=md5)
            with tarfile.open(archive) as tar, tempfile.TemporaryDirectory(dir=self.root) as tmp:
                _safe_extractall(tar, Path(tmp))
                for entry in Path(tmp).iterdir():
                    if not (self.root / entry.name).exists():
                        entry.rename(self.root / entry.name)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        img_path, mask_path = self.samples[index]
        image, mask = _read_array(img_path), _read_array(mask_path)
        if image.ndim != 3 or image.shape[0] != self.in_channels:
            raise SchemaError(f"{img_path}: expected an image (bands={self.in_channels}, H, W) for sensor "
                              f"{self.sensor!r}, got shape {image.shape}")
        if mask.ndim == 3 and mask.shape[0] == 1:
            mask = mask[0]
        if mask.shape != image.shape[1:]:
            raise SchemaError(f"{mask_path}: expected a mask (H, W) = {image.shape[1:]} (or (1, H, W)), got {mask.shape}")
        if not np.issubdtype(mask.dtype, np.integer) or mask.min() < 0 or mask.max() > 255:
            raise SchemaError(f"{mask_path}: expected integer {self.product.upper()} codes in [0, 255], got "
                              f"{mask.dtype} in [{mask.min()}, {mask.max()}]")
        image = torch.from_numpy(image.astype(np.float32)) / self.scale
        mask = self._lut[torch.from_numpy(mask.astype(np.int64))]
        if self.transform is not None:
            image, mask = self.transform(image, mask)
        return image, mask

    def __repr__(self) -> str:
        return (f"SSL4EOLDataset(root={str(self.root)!r}, sensor={self.sensor!r}, product={self.product!r}, "
                f"split={self.split!r}, n={len(self)})")


# ---------------------------------------------------------------------------------------------- paired transforms
class RandomCrop:
    """Crop the same random ``size x size`` window from image ``(C, H, W)`` and mask ``(H, W)``."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, image: torch.Tensor, mask: torch.Tensor):
        h, w = mask.shape[-2:]
        if h < self.size or w < self.size:
            raise ValueError(f"crop size {self.size} is larger than the patch ({h}, {w})")
        i = int(torch.randint(0, h - self.size + 1, ()))
        j = int(torch.randint(0, w - self.size + 1, ()))
        return image[..., i:i + self.size, j:j + self.size], mask[..., i:i + self.size, j:j + self.size]


class CenterCrop(RandomCrop):
    """Crop the central ``size x size`` window (evaluation)."""

    def __call__(self, image: torch.Tensor, mask: torch.Tensor):
        h, w = mask.shape[-2:]
        if h < self.size or w < self.size:
            raise ValueError(f"crop size {self.size} is larger than the patch ({h}, {w})")
        i, j = (h - self.size) // 2, (w - self.size) // 2
        return image[..., i:i + self.size, j:j + self.size], mask[..., i:i + self.size, j:j + self.size]


class RandomFlip:
    """Random horizontal and vertical flips (each with probability ``p``), applied to image and mask alike."""

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, image: torch.Tensor, mask: torch.Tensor):
        for dim in (-1, -2):
            if float(torch.rand(())) < self.p:
                image, mask = image.flip(dim), mask.flip(dim)
        return image, mask


class Compose:
    """Chain paired transforms."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, image, mask):
        for t in self.transforms:
            image, mask = t(image, mask)
        return image, mask


# ------------------------------------------------------------------------------------------------ synthetic data
def make_synthetic_ssl4eo(root, n: int = 16, *, product: str = "nlcd", sensor: str = "oli_sr", size: int = 264,
                          num_classes: int = 5, fmt: str = "npy", seed: int = 0) -> Path:
    """Write ``n`` synthetic patches in the SSL4EO-L benchmark layout under ``root`` and return ``root``.

    Masks are smooth random regions of ``num_classes`` raw product codes (stored as ``(1, size, size)`` uint8);
    each class has its own spectral signature, so images ``(bands, size, size)`` uint8 are class-dependent plus noise
    and a segmentation model can learn the task. ``fmt``: "npy" or "npz".
    """
    if fmt not in ("npy", "npz"):
        raise ValueError(f"fmt must be 'npy' or 'npz', got {fmt!r}")
    if product not in _PRODUCTS or sensor not in SSL4EO_SENSORS:
        raise ValueError(f"product must be in {sorted(_PRODUCTS)} and sensor in {sorted(SSL4EO_SENSORS)}, got "
                         f"{product!r}, {sensor!r}")
    codes = np.array(_PRODUCTS[product][1:num_classes + 1], dtype=np.uint8)
    bands = SSL4EO_SENSORS[sensor][0]
    rng = np.random.default_rng(seed)
    signature = rng.uniform(30, 220, size=(len(codes), bands))
    img_dir, mask_dir, stem = _dirs(sensor, product)
    root = Path(root)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for k in range(n):
        # a few random plane waves -> smooth field -> quantised into regions
        field = sum(np.sin(2 * np.pi * (rng.uniform(0.5, 3) * (np.cos(a) * xx + np.sin(a) * yy)) + rng.uniform(0, 6))
                    for a in rng.uniform(0, np.pi, 3))
        edges = np.quantile(field, np.linspace(0, 1, len(codes) + 1)[1:-1])
        cls = np.digitize(field, edges)
        image = signature[cls].transpose(2, 0, 1) + rng.normal(scale=12.0, size=(bands, size, size))
        image = np.clip(image, 0, 255).astype(np.uint8)
        mask = codes[cls][None]
        rel = Path(f"{k:07d}") / f"LC08_SYNTH_{20190101 + k % 28:08d}"
        for folder, name, arr, key in ((img_dir, "all_bands", image, "image"), (mask_dir, stem, mask, "mask")):
            out = root / folder / rel
            out.mkdir(parents=True, exist_ok=True)
            if fmt == "npy":
                np.save(out / f"{name}.npy", arr)
            else:
                np.savez_compressed(out / f"{name}.npz", **{key: arr})
    return root
