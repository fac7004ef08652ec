"""MedMNIST3D reader: official MD5s, shapes and ranges on the real AdrenalMNIST3D files, offline download through a
local file:// URL, and clear errors for wrong checksums, corrupt archives and wrong layouts."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from hoformer.data import MEDMNIST3D_INFO, MedMNIST3D, MedMNIST3DDataModule, medmnist3d_url
from hoformer.data import medmnist as medmnist_mod
from hoformer.data import ChecksumError, SchemaError, download_url


def _fake_npz(path, counts=(6, 3, 4), size=28, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in zip(("train", "val", "test"), counts):
        arrays[f"{split}_images"] = rng.integers(0, 256, size=(n, size, size, size), dtype=np.uint8)
        arrays[f"{split}_labels"] = rng.integers(0, 2, size=(n, 1), dtype=np.uint8)
    np.savez_compressed(path, **arrays)
    return arrays, hashlib.md5(path.read_bytes()).hexdigest()


def test_real_adrenal(data_root):
    root = data_root / "medmnist3d"
    for size, name in ((28, "adrenalmnist3d.npz"), (64, "adrenalmnist3d_64.npz")):
        assert hashlib.md5((root / name).read_bytes()).hexdigest() == MEDMNIST3D_INFO["adrenalmnist3d"]["md5"][size]
    ds = {s: MedMNIST3D(root, "AdrenalMNIST3D", s) for s in ("train", "val", "test")}
    assert {s: len(d) for s, d in ds.items()} == MEDMNIST3D_INFO["adrenalmnist3d"]["n_samples"]
    x, y = ds["train"][0]
    assert x.shape == (1, 28, 28, 28) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert y.shape == (1,) and y.dtype == torch.int64
    assert set(ds["test"].labels.unique().tolist()) == {0, 1} and ds["test"].num_classes == 2
    with np.load(root / "adrenalmnist3d.npz") as z:  # values are the file's uint8 / 255
        np.testing.assert_allclose(ds["val"][5][0][0].numpy(), z["val_images"][5] / 255.0, rtol=1e-6)
    x64, _ = MedMNIST3D(root, "adrenal", "val", size=64)[0]
    assert x64.shape == (1, 64, 64, 64)


def test_download_offline_real_copy(data_root, tmp_path, monkeypatch):
    src = data_root / "medmnist3d"
    monkeypatch.setattr(medmnist_mod, "_ZENODO", src.as_uri() + "/{}.npz")
    ds = MedMNIST3D(tmp_path, "adrenalmnist3d", "test", download=True)  # canonical path, local "mirror"
    assert len(ds) == 298 and (tmp_path / "adrenalmnist3d.npz").is_file()
    assert list(tmp_path.iterdir()) == [tmp_path / "adrenalmnist3d.npz"]  # no partial files left


def test_download_and_checksum_errors(tmp_path, monkeypatch):
    assert medmnist3d_url("organmnist3d", 64) == "https://zenodo.org/records/10519652/files/organmnist3d_64.npz?download=1"
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    arrays, md5 = _fake_npz(mirror / "nodulemnist3d.npz")
    monkeypatch.setattr(medmnist_mod, "_ZENODO", mirror.as_uri() + "/{}.npz")
    dest = tmp_path / "cache"
    # the official MD5 does not match the fake file: the download is refused and nothing is left behind
    with pytest.raises(ChecksumError, match="md5 checksum mismatch"):
        MedMNIST3D(dest, "nodulemnist3d", "train", download=True)
    assert not dest.exists() or list(dest.iterdir()) == []
    monkeypatch.setitem(MEDMNIST3D_INFO["nodulemnist3d"]["md5"], 28, md5)
    ds = MedMNIST3D(dest, "nodulemnist3d", "train", download=True)
    assert len(ds) == 6 and ds.task == "binary-class"
    torch.testing.assert_close(ds[2][0][0], torch.from_numpy(arrays["train_images"][2]).float() / 255)
    assert ds[2][1].tolist() == arrays["train_labels"][2].tolist()
    # corrupt the cached file: the MD5 check catches it
    (dest / "nodulemnist3d.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ChecksumError, match="nodulemnist3d.npz"):
        MedMNIST3D(dest, "nodulemnist3d", "val")
    with pytest.raises(FileNotFoundError, match="download=True"):
        MedMNIST3D(dest, "vesselmnist3d", "val")
    with pytest.raises(OSError, match="could not download"):
        download_url((tmp_path / "nope.npz").as_uri(), tmp_path / "x.npz")


def test_schema_errors(tmp_path):
    (tmp_path / "adrenalmnist3d.npz").write_bytes(b"not a zip archive")
    with pytest.raises(SchemaError, match="not a readable .npz"):
        MedMNIST3D(tmp_path, split="train", verify=False)
    _fake_npz(tmp_path / "adrenalmnist3d.npz", size=20)
    with pytest.raises(SchemaError, match=r"uint8 \(N, 28, 28, 28\)"):
        MedMNIST3D(tmp_path, split="train", verify=False)
    np.savez(tmp_path / "adrenalmnist3d.npz", train_images=np.zeros((2, 28, 28, 28), np.uint8))
    with pytest.raises(SchemaError, match="missing arrays"):
        MedMNIST3D(tmp_path, split="train", verify=False)
    with pytest.raises(ValueError, match="flag must be one of"):
        MedMNIST3D(tmp_path, "chestmnist3d")
    with pytest.raises(ValueError, match="size must be 28 or 64"):
        MedMNIST3D(tmp_path, size=32)


def test_datamodule(tmp_path):
    _fake_npz(tmp_path / "synapsemnist3d.npz", counts=(5, 3, 3))
    with pytest.raises(ChecksumError):
        MedMNIST3DDataModule(str(tmp_path), "synapsemnist3d").setup("fit")
    md5 = hashlib.md5((tmp_path / "synapsemnist3d.npz").read_bytes()).hexdigest()
    info = MEDMNIST3D_INFO["synapsemnist3d"]["md5"]
    old, info[28] = info[28], md5
    try:
        dm = MedMNIST3DDataModule(str(tmp_path), "synapse", batch_size=2, flip_augment=True)
        dm.setup("fit")
        batches = list(dm.train_dataloader())
        assert [b[0].shape[0] for b in batches] == [2, 2, 1] and batches[0][0].shape[1:] == (1, 28, 28, 28)
        assert sum(b[0].shape[0] for b in dm.val_dataloader()) == 3 and dm.num_classes == 2
    finally:
        info[28] = old


def test_labels_out_of_range(tmp_path):
    """Labels outside [0, num_classes) of the dataset (here AdrenalMNIST3D: 2 classes) are a clear SchemaError."""
    path = tmp_path / "adrenalmnist3d.npz"
    arrays, _ = _fake_npz(path)
    arrays["val_labels"][1, 0] = 2
    np.savez_compressed(path, **arrays)
    assert len(MedMNIST3D(tmp_path, split="train", verify=False)) == 6  # other splits are fine
    with pytest.raises(SchemaError, match=r"val_labels must be class ids in \[0, 2\).*e\.g\. 2"):
        MedMNIST3D(tmp_path, split="val", verify=False)
    arrays["val_labels"] = arrays["val_labels"].astype(np.int64)
    arrays["val_labels"][1, 0] = -1
    np.savez_compressed(path, **arrays)
    with pytest.raises(SchemaError, match="out of range"):
        MedMNIST3D(tmp_path, split="val", verify=False)


def test_datamodule_verify_flag(tmp_path):
    """MedMNIST3DDataModule passes ``verify`` through: another copy loads with verify=False, and is still
    schema-checked."""
    arrays, _ = _fake_npz(tmp_path / "nodulemnist3d.npz", counts=(5, 3, 3))
    with pytest.raises(ChecksumError):
        MedMNIST3DDataModule(str(tmp_path), "nodule").setup("fit")
    dm = MedMNIST3DDataModule(str(tmp_path), "nodule", batch_size=4, verify=False)
    dm.setup("fit")
    assert len(dm.dataset("train")) == 5 and dm.hparams.verify is False
    arrays["test_labels"][0, 0] = 7
    np.savez_compressed(tmp_path / "nodulemnist3d.npz", **arrays)
    with pytest.raises(SchemaError, match="class ids"):
        MedMNIST3DDataModule(str(tmp_path), "nodule", verify=False).setup("test")


def test_transforms_and_layout_errors(tmp_path):
    path = tmp_path / "fracturemnist3d.npz"
    arrays, _ = _fake_npz(path, counts=(4, 2, 2))
    ds = MedMNIST3D(tmp_path, "fracture", "train", verify=False, transform=lambda x: x * 2 - 1,
                    target_transform=lambda y: y + 10)
    x, y = ds[3]
    torch.testing.assert_close(x[0], torch.from_numpy(arrays["train_images"][3]).float() / 255 * 2 - 1)
    assert y.tolist() == [int(arrays["train_labels"][3, 0]) + 10] and ds.num_classes == 3
    assert repr(ds) == "MedMNIST3D(flag='fracturemnist3d', split='train', size=28, n=4)"
    for labels, msg in ((arrays["train_labels"][:3], r"train_labels must be integer \(N=4, k\), got uint8 \(3, 1\)"),
                        (arrays["train_labels"][:, 0], r"train_labels must be integer \(N=4, k\), got uint8 \(4,\)"),
                        (arrays["train_labels"].astype(np.float32), "must be integer")):
        np.savez_compressed(path, **{**arrays, "train_labels": labels})
        with pytest.raises(SchemaError, match=msg):
            MedMNIST3D(tmp_path, "fracture", "train", verify=False)
    np.savez_compressed(path, **{**arrays, "train_images": arrays["train_images"].astype(np.float32)})
    with pytest.raises(SchemaError, match=r"train_images must be uint8 \(N, 28, 28, 28\), got float32"):
        MedMNIST3D(tmp_path, "fracture", "train", verify=False)
    with pytest.raises(ValueError, match="split must be one of"):
        MedMNIST3D(tmp_path, "fracture", "dev", verify=False)


def test_datamodule_size_and_flip_augment(tmp_path):
    """``size`` reaches the dataset; ``flip_augment`` flips training volumes (each of the three axes with
    probability 1/2) and never validation / test volumes."""
    arrays, _ = _fake_npz(tmp_path / "organmnist3d_64.npz", counts=(2, 1, 1), size=64)
    dm = MedMNIST3DDataModule(str(tmp_path), "organ", size=64, verify=False)
    assert dm.dataset("val")[0][0].shape == (1, 64, 64, 64) and dm.num_classes == 11

    arrays, _ = _fake_npz(tmp_path / "vesselmnist3d.npz", counts=(2, 2, 2))
    dm = MedMNIST3DDataModule(str(tmp_path), "vessel", flip_augment=True, verify=False)
    raw = torch.from_numpy(arrays["train_images"][1]).float() / 255
    seen = set()
    for _ in range(48):
        x = dm.dataset("train")[1][0][0]
        flips = [axes for axes in ((), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))
                 if torch.equal(x, raw.flip(axes) if axes else raw)]
        assert len(flips) == 1, "a training volume is not a flip of the stored one"
        seen.add(flips[0])
    assert len(seen) >= 6 and {a for f in seen for a in f} == {0, 1, 2}  # all three axes, random subsets
    for split in ("val", "test"):
        for _ in range(5):
            torch.testing.assert_close(dm.dataset(split)[0][0][0],
                                       torch.from_numpy(arrays[f"{split}_images"][0]).float() / 255, rtol=0, atol=0)


def test_datamodule_shift_augment(tmp_path):
    """``shift_augment=k`` translates training volumes by a random offset in [-k, k]^3 with zero fill (every offset
    occurs), never validation / test volumes; out-of-range values are refused."""
    arrays, _ = _fake_npz(tmp_path / "vesselmnist3d.npz", counts=(2, 2, 2))
    raw = torch.from_numpy(arrays["train_images"][1]).float() / 255
    padded = torch.nn.functional.pad(raw, (1,) * 6)

    def shifted(d, h, w):  # the stored volume moved by (d, h, w) voxels, zeros shifted in
        return padded[1 - d:29 - d, 1 - h:29 - h, 1 - w:29 - w]

    dm = MedMNIST3DDataModule(str(tmp_path), "vessel", shift_augment=1, verify=False)
    offsets = [(d, h, w) for d in (-1, 0, 1) for h in (-1, 0, 1) for w in (-1, 0, 1)]
    seen = set()
    for _ in range(300):
        x = dm.dataset("train")[1][0][0]
        match = [o for o in offsets if torch.equal(x, shifted(*o))]
        assert len(match) == 1, "a training volume is not a zero-filled shift of the stored one"
        seen.add(match[0])
    assert seen == set(offsets)
    for split in ("val", "test"):
        torch.testing.assert_close(dm.dataset(split)[0][0][0],
                                   torch.from_numpy(arrays[f"{split}_images"][0]).float() / 255, rtol=0, atol=0)
    both = MedMNIST3DDataModule(str(tmp_path), "vessel", flip_augment=True, shift_augment=2, verify=False)
    assert both.dataset("train")[1][0].shape == (1, 28, 28, 28)
    for bad in (-1, 28, 1.5):
        with pytest.raises(ValueError, match=r"`shift_augment` must be an int in \[0, size=28\)"):
            MedMNIST3DDataModule(str(tmp_path), "vessel", shift_augment=bad, verify=False)


def test_datamodule_download_prefers_the_data_root(tmp_path, monkeypatch):
    """``download=True`` without ``root`` uses ``$HOFORMER_DATA/medmnist3d`` when it already holds the file (no
    download; an offline machine with the shared data works), else the writable cache."""
    data = tmp_path / "data" / "medmnist3d"
    data.mkdir(parents=True)
    _fake_npz(data / "nodulemnist3d.npz", counts=(3, 2, 2))
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("HOFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(medmnist_mod, "_ZENODO", (tmp_path / "offline").as_uri() + "/{}.npz")  # fails if used
    dm = MedMNIST3DDataModule(flag="nodule", download=True, verify=False)
    assert dm.root == data and len(dm.dataset("train")) == 3
    dm = MedMNIST3DDataModule(flag="organ", download=True, verify=False)  # not in the data root: cache
    assert dm.root == tmp_path / "cache" / "medmnist3d"
    with pytest.raises(OSError, match="could not download"):
        dm.dataset("train")
    with pytest.raises(FileNotFoundError, match="organmnist3d.npz"):
        MedMNIST3DDataModule(flag="organ").dataset("train")


def test_size_64_files_are_checked_against_the_64_digest(tmp_path, monkeypatch):
    """``size=64`` verifies ``{flag}_64.npz`` against the official 64^3 MD5, not the 28^3 one."""
    from hoformer.data import MEDMNIST3D_INFO, MedMNIST3D
    from hoformer.data import ChecksumError

    arrays, md5 = _fake_npz(tmp_path / "adrenalmnist3d_64.npz", counts=(2, 1, 1), size=64)
    monkeypatch.setitem(MEDMNIST3D_INFO["adrenalmnist3d"]["md5"], 64, md5)
    ds = MedMNIST3D(tmp_path, "adrenal", "train", size=64)  # the 64 digest matches: accepted
    assert len(ds) == 2 and ds[0][0].shape == (1, 64, 64, 64)
    monkeypatch.setitem(MEDMNIST3D_INFO["adrenalmnist3d"]["md5"], 64, "0" * 32)
    monkeypatch.setitem(MEDMNIST3D_INFO["adrenalmnist3d"]["md5"], 28, md5)
    with pytest.raises(ChecksumError, match="adrenalmnist3d_64.npz"):
        MedMNIST3D(tmp_path, "adrenal", "train", size=64)
