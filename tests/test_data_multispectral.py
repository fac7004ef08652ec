"""SSL4EO-L layout reader on synthetic patches: layout round trip, benchmark split, class mapping, paired transforms,
offline download of the archives, datamodule, and clear errors."""
from __future__ import annotations

import hashlib
import sys
import tarfile

import numpy as np
import pytest
import torch

from hoformer.data import (CDL_CLASSES, NLCD_CLASSES, CenterCrop, Compose, MultispectralDataModule, RandomCrop,
                           RandomFlip, SSL4EOLDataset, make_synthetic_ssl4eo)
from hoformer.data import multispectral as ms_mod
from hoformer.data import ChecksumError, SchemaError


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    return make_synthetic_ssl4eo(tmp_path_factory.mktemp("ssl4eo"), n=12, size=64, seed=3)


def test_round_trip_and_split(synth_root):
    imgs = sorted((synth_root / "ssl4eo_l_oli_sr_benchmark").rglob("all_bands.npy"))
    assert len(imgs) == 12
    ds = {s: SSL4EOLDataset(synth_root, "nlcd", s) for s in ("train", "val", "test")}
    assert [len(d) for d in ds.values()] == [8, 1, 3]  # int(0.7 n), int(0.15 n), rest; torchgeo's permutation
    paths = [p for d in ds.values() for p, _ in d.samples]
    assert sorted(paths) == imgs  # disjoint and complete
    perm = np.arange(12)
    np.random.RandomState(0).shuffle(perm)
    assert [p for p, _ in ds["train"].samples] == [imgs[i] for i in perm[:8]]
    img_path, mask_path = ds["val"].samples[0]
    assert mask_path == synth_root / "ssl4eo_l_oli_nlcd" / img_path.parent.relative_to(
        synth_root / "ssl4eo_l_oli_sr_benchmark") / "nlcd_2019.npy"
    x, y = ds["val"][0]
    raw_x, raw_y = np.load(img_path), np.load(mask_path)
    assert raw_x.shape == (7, 64, 64) and raw_x.dtype == np.uint8 and raw_y.shape == (1, 64, 64)
    assert x.shape == (7, 64, 64) and x.dtype == torch.float32 and y.shape == (64, 64) and y.dtype == torch.int64
    torch.testing.assert_close(x, torch.from_numpy(raw_x).float() / 255)
    assert y.tolist() == [[NLCD_CLASSES.index(c) for c in row] for row in raw_y[0].tolist()]
    assert ds["train"].num_classes == 17 and len(CDL_CLASSES) == 134


def test_a_patch_in_two_formats_is_one_sample(synth_root, tmp_path):
    """A patch folder holding the same image as .npy and .npz (e.g. converted next to the originals) is one sample
    (the .npy): it used to be two, so the benchmark split grew and put copies of a patch into train and test."""
    import shutil

    root = shutil.copytree(synth_root, tmp_path / "two_formats")
    for f in (root / "ssl4eo_l_oli_sr_benchmark").rglob("all_bands.npy"):
        np.savez(f.with_suffix(".npz"), np.load(f))
    for split in ("train", "val", "test"):
        got = SSL4EOLDataset(root, "nlcd", split).samples
        want = SSL4EOLDataset(synth_root, "nlcd", split).samples
        assert [p.relative_to(root) for p, _ in got] == [p.relative_to(synth_root) for p, _ in want], split


def test_synthetic_task_is_learnable(synth_root):
    ds = SSL4EOLDataset(synth_root, "nlcd", "train")
    xs, ys = zip(*(ds[i] for i in range(len(ds))))
    px = torch.stack(xs).permute(0, 2, 3, 1).reshape(-1, 7)
    py = torch.stack(ys).reshape(-1)
    classes = py.unique()
    assert len(classes) == 5
    centroids = torch.stack([px[py == c].mean(0) for c in classes])
    pred = classes[torch.cdist(px, centroids).argmin(1)]
    assert (pred == py).float().mean() > 0.9  # nearest spectral centroid already separates the classes


def test_cdl_npz_mapping_and_errors(tmp_path):
    root = make_synthetic_ssl4eo(tmp_path, n=3, size=32, product="cdl", fmt="npz", seed=1)
    ds = SSL4EOLDataset(root, "cdl", "train")
    i, mask_file = 0, ds.samples[0][1]
    assert mask_file.suffix == ".npz"
    codes = np.array([[0, 254, 7, 176]], dtype=np.uint8).repeat(32, 0).repeat(8, 1)  # 7 is not a CDL class
    np.savez_compressed(mask_file, mask=codes[None])
    assert ds[i][1][0, ::8].tolist() == [0, 133, 0, CDL_CLASSES.index(176)]
    assert ds.num_classes == 134

    img_file = ds.samples[i][0]
    np.savez_compressed(img_file, image=np.zeros((6, 32, 32), np.uint8))
    with pytest.raises(SchemaError, match=r"bands=7"):
        ds[i]
    np.savez_compressed(img_file, image=np.zeros((7, 32, 32), np.uint8))
    np.savez_compressed(mask_file, mask=np.zeros((1, 16, 32), np.uint8))
    with pytest.raises(SchemaError, match="expected a mask"):
        ds[i]
    mask_file.write_bytes(b"garbage")
    with pytest.raises(SchemaError, match="unreadable"):
        ds[i]
    mask_file.unlink()
    with pytest.raises(FileNotFoundError, match="cdl_2019"):
        SSL4EOLDataset(root, "cdl", "train")
    with pytest.raises(FileNotFoundError, match="make_synthetic_ssl4eo"):
        SSL4EOLDataset(tmp_path / "empty", "nlcd")
    with pytest.raises(ValueError, match="product"):
        SSL4EOLDataset(root, "landcover")


def test_geotiff_needs_rasterio(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rasterio", None)  # `import rasterio` raises ImportError, installed or not
    d = tmp_path / "ssl4eo_l_oli_sr_benchmark/0000000/s"
    d.mkdir(parents=True)
    (d / "all_bands.tif").write_bytes(b"II*\x00")
    m = tmp_path / "ssl4eo_l_oli_nlcd/0000000/s"
    m.mkdir(parents=True)
    (m / "nlcd_2019.tif").write_bytes(b"II*\x00")
    ds = SSL4EOLDataset(tmp_path, "nlcd", "test")
    with pytest.raises(ImportError, match="pip install rasterio"):
        ds[0]


def test_paired_transforms_stay_aligned():
    torch.manual_seed(0)
    mask = torch.arange(40 * 48).reshape(40, 48) % 17
    image = torch.stack([mask.float(), -mask.float()])
    tf = Compose([RandomCrop(24), RandomFlip(p=0.5)])
    seen = set()
    for _ in range(20):
        x, y = tf(image, mask)
        assert x.shape == (2, 24, 24) and y.shape == (24, 24)
        torch.testing.assert_close(x[0], y.float())
        seen.add(tuple(y[0, :2].tolist()))
    assert len(seen) > 5  # crops and flips actually vary
    x, y = CenterCrop(24)(image, mask)
    torch.testing.assert_close(y, mask[8:32, 12:36])
    with pytest.raises(ValueError, match="larger than the patch"):
        RandomCrop(64)(image, mask)


def test_download_offline(tmp_path, monkeypatch):
    src = make_synthetic_ssl4eo(tmp_path / "src", n=4, size=32)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    md5s = {}
    for name in ("ssl4eo_l_oli_sr_benchmark", "ssl4eo_l_oli_nlcd"):
        with tarfile.open(mirror / f"{name}.tar.gz", "w:gz") as tar:
            tar.add(src / name, arcname=name)
        md5s[name] = hashlib.md5((mirror / f"{name}.tar.gz").read_bytes()).hexdigest()
    monkeypatch.setattr(ms_mod, "_URL", mirror.as_uri() + "/{}.tar.gz")
    with pytest.raises(ChecksumError):  # the official MD5s do not match the synthetic archives
        SSL4EOLDataset(tmp_path / "dl", "nlcd", download=True)
    monkeypatch.setitem(ms_mod._IMG_MD5, "oli_sr", md5s["ssl4eo_l_oli_sr_benchmark"])
    monkeypatch.setitem(ms_mod._MASK_MD5, ("oli", "nlcd"), md5s["ssl4eo_l_oli_nlcd"])
    ds = SSL4EOLDataset(tmp_path / "dl", "nlcd", "train", download=True)
    ref = SSL4EOLDataset(src, "nlcd", "train")
    torch.testing.assert_close(ds[0][0], ref[0][0])


def test_download_fetches_the_missing_mask_archive_only(tmp_path, monkeypatch):
    """Images (per sensor) and masks (per product) are separate archives: with the images and the NLCD masks in
    place, asking for CDL downloads the CDL mask archive alone; the data root counts only with both present."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for product in ("nlcd", "cdl"):
        src = make_synthetic_ssl4eo(tmp_path / f"src_{product}", n=4, size=32, product=product)
        for name in ("ssl4eo_l_oli_sr_benchmark", f"ssl4eo_l_oli_{product}"):
            with tarfile.open(mirror / f"{name}.tar.gz", "w:gz") as tar:
                tar.add(src / name, arcname=name)
            md5 = hashlib.md5((mirror / f"{name}.tar.gz").read_bytes()).hexdigest()
            table, key = (ms_mod._IMG_MD5, "oli_sr") if name.endswith("benchmark") else (ms_mod._MASK_MD5, ("oli", product))
            monkeypatch.setitem(table, key, md5)
    monkeypatch.setattr(ms_mod, "_URL", mirror.as_uri() + "/{}.tar.gz")
    fetched = []
    real = ms_mod.download_url
    monkeypatch.setattr(ms_mod, "download_url", lambda url, *a, **k: (fetched.append(url.rsplit("/", 1)[1]),
                                                                       real(url, *a, **k))[1])
    root = tmp_path / "dl"
    SSL4EOLDataset(root, "nlcd", download=True)
    assert fetched == ["ssl4eo_l_oli_sr_benchmark.tar.gz", "ssl4eo_l_oli_nlcd.tar.gz"]
    ds = SSL4EOLDataset(root, "cdl", "train", download=True)
    assert fetched[2:] == ["ssl4eo_l_oli_cdl.tar.gz"]
    ref = SSL4EOLDataset(tmp_path / "src_cdl", "cdl", "train")
    torch.testing.assert_close(ds[0][1], ref[0][1])
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["ssl4eo_l_oli_cdl", "ssl4eo_l_oli_nlcd",
                                                                     "ssl4eo_l_oli_sr_benchmark"]  # no temp left

    # the data root holds images and NLCD masks only: a CDL datamodule does not take it for complete
    data = tmp_path / "data"
    (data / "ssl4eo_l").mkdir(parents=True)
    for name in ("ssl4eo_l_oli_sr_benchmark", "ssl4eo_l_oli_nlcd"):
        (root / name).rename(data / "ssl4eo_l" / name)
    monkeypatch.setenv("HOFORMER_DATA", str(data))
    monkeypatch.setenv("HOFORMER_CACHE", str(tmp_path / "cache"))
    assert MultispectralDataModule(download=True, product="nlcd").root == data / "ssl4eo_l"
    assert MultispectralDataModule(download=True, product="cdl").root == tmp_path / "cache" / "ssl4eo_l"


def test_datamodule(tmp_path):
    dm = MultispectralDataModule(str(tmp_path / "syn"), synthetic=True, synthetic_n=10, synthetic_size=48,
                                 crop_size=32, batch_size=4)
    dm.prepare_data()
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 7, 32, 32) and y.shape == (4, 32, 32) and y.dtype == torch.int64
    assert dm.in_channels == 7 and dm.num_classes == 17
    v1 = next(iter(dm.val_dataloader()))[1]
    v2 = next(iter(dm.val_dataloader()))[1]
    torch.testing.assert_close(v1, v2)  # evaluation is deterministic (centre crop, no flips)
    dm.setup("test")
    assert sum(b[0].shape[0] for b in dm.test_dataloader()) == len(dm.dataset("test")) == 2


def _simulate_old_python(monkeypatch):
    """An interpreter before 3.10.12 / 3.11.4 / 3.12: no ``tarfile.data_filter``, ``extractall`` has no ``filter``."""
    monkeypatch.delattr(tarfile, "data_filter")
    orig = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kw):
        if kw:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kw))!r}")
        return orig(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def test_download_without_tarfile_data_filter(tmp_path, monkeypatch):
    _simulate_old_python(monkeypatch)
    src = make_synthetic_ssl4eo(tmp_path / "src", n=4, size=32)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name, table, key in (("ssl4eo_l_oli_sr_benchmark", ms_mod._IMG_MD5, "oli_sr"),
                             ("ssl4eo_l_oli_nlcd", ms_mod._MASK_MD5, ("oli", "nlcd"))):
        with tarfile.open(mirror / f"{name}.tar.gz", "w:gz") as tar:
            tar.add(src / name, arcname=name)
        monkeypatch.setitem(table, key, hashlib.md5((mirror / f"{name}.tar.gz").read_bytes()).hexdigest())
    monkeypatch.setattr(ms_mod, "_URL", mirror.as_uri() + "/{}.tar.gz")
    ds = SSL4EOLDataset(tmp_path / "dl", "nlcd", "train", download=True)
    torch.testing.assert_close(ds[0][0], SSL4EOLDataset(src, "nlcd", "train")[0][0])


def _tar_with(path, *members):
    """A .tar whose members are (TarInfo, bytes | None)."""
    import io

    with tarfile.open(path, "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _info(name, kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def test_safe_extract_fallback_refuses_escapes(tmp_path, monkeypatch):
    _simulate_old_python(monkeypatch)
    dest = tmp_path / "root" / "dest"
    dest.mkdir(parents=True)
    ok = _tar_with(tmp_path / "ok.tar", (_info("d", tarfile.DIRTYPE), None), (_info("d/a.txt"), b"abc"),
                   (_info("d/link", tarfile.SYMTYPE, "a.txt"), None),
                   (_info("d/sub/up", tarfile.SYMTYPE, "../a.txt"), None),  # links inside dest are fine
                   (_info("d/hard", tarfile.LNKTYPE, "d/a.txt"), None))
    with tarfile.open(ok) as tar:
        ms_mod._safe_extractall(tar, dest)
    assert [(dest / f).read_bytes() for f in ("d/link", "d/sub/up", "d/hard")] == [b"abc"] * 3
    cases = {
        "dotdot": ((_info("../evil.txt"), b"x"),),
        "nested dotdot": ((_info("d/../../evil.txt"), b"x"),),
        "absolute": ((_info(str(tmp_path / "root" / "evil.txt")), b"x"),),
        "symlink out": ((_info("out", tarfile.SYMTYPE, "../.."), None),),
        "absolute symlink": ((_info("out", tarfile.SYMTYPE, str(tmp_path / "root")), None),),
        "hard link out": ((_info("h", tarfile.LNKTYPE, "../evil.txt"), None),),
        "through a link": ((_info("x", tarfile.SYMTYPE, "."), None), (_info("x/y", tarfile.SYMTYPE, ".."), None),
                           (_info("x/y/evil.txt"), b"x")),
        "fifo": ((_info("pipe", tarfile.FIFOTYPE), None),),
    }
    for what, members in cases.items():
        bad = _tar_with(tmp_path / f"{what}.tar", (_info("first.txt"), b"1"), *members)
        with tarfile.open(bad) as tar, pytest.raises(tarfile.TarError, match="refusing to extract"):
            ms_mod._safe_extractall(tar, dest)
        assert not (dest / "first.txt").exists(), what  # refused as a whole: nothing extracted
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["dest"]


def test_random_crop_reaches_every_offset_and_flip_probability():
    mask = torch.arange(10 * 11).reshape(10, 11)
    image = mask[None].float()
    torch.manual_seed(0)
    offsets = set()
    for _ in range(200):
        x, y = RandomCrop(8)(image, mask)
        i, j = divmod(int(y[0, 0]), 11)
        torch.testing.assert_close(y, mask[i:i + 8, j:j + 8])
        torch.testing.assert_close(x[0], y.float())
        offsets.add((i, j))
    assert offsets == {(i, j) for i in range(3) for j in range(4)}  # the last row / column offsets included
    x, y = RandomFlip(p=0.0)(image, mask)
    assert torch.equal(y, mask) and torch.equal(x, image)
    x, y = RandomFlip(p=1.0)(image, mask)
    assert torch.equal(y, mask.flip(0).flip(1)) and torch.equal(x, image.flip(-1).flip(-2))
    x, y = CenterCrop(8)(image, mask)
    assert torch.equal(y, mask[1:9, 1:9])


def test_mask_codes_must_be_integers_in_range(tmp_path):
    root = make_synthetic_ssl4eo(tmp_path, n=2, size=16, seed=2)
    ds = SSL4EOLDataset(root, "nlcd", "test")
    mask_file = ds.samples[0][1]
    for bad, msg in ((np.full((1, 16, 16), 11.5, np.float32), r"in \[0, 255\], got float32"),
                     (np.full((1, 16, 16), 300, np.uint16), r"got uint16 in \[300, 300\]"),
                     (np.full((1, 16, 16), -1, np.int16), r"in \[-1, -1\]")):
        np.save(mask_file, bad)
        with pytest.raises(SchemaError, match=f"{mask_file.name}: expected integer NLCD codes .*{msg}"):
            ds[0]


def test_mask_with_the_image_format_is_preferred(tmp_path):
    root = make_synthetic_ssl4eo(tmp_path, n=1, size=16, fmt="npz", seed=4)
    img, mask = SSL4EOLDataset(root, "nlcd", "test").samples[0]
    np.save(mask.with_suffix(".npy"), np.zeros((1, 16, 16), np.uint8))  # a stray copy in another format
    assert SSL4EOLDataset(root, "nlcd", "test").samples[0][1] == mask


def test_safe_extract_fallback_drops_setuid_bits(tmp_path, monkeypatch):
    _simulate_old_python(monkeypatch)
    info = _info("tool")
    info.mode = 0o6777
    with tarfile.open(_tar_with(tmp_path / "suid.tar", (info, b"#!/bin/sh\n"))) as tar:
        ms_mod._safe_extractall(tar, tmp_path / "dest")
    assert (tmp_path / "dest" / "tool").stat().st_mode & 0o7777 == 0o755


def test_datamodule_options_reach_the_dataset(tmp_path):
    """sensor, seed, crop (random for training, centred for evaluation) and flips (training only)."""
    dm = MultispectralDataModule(str(tmp_path / "etm"), sensor="etm_sr", product="cdl", synthetic=True,
                                 synthetic_n=8, synthetic_size=24, crop_size=16, seed=7, batch_size=2)
    ref = make_synthetic_ssl4eo(tmp_path / "ref", n=8, size=24, sensor="etm_sr", product="cdl", seed=7)
    assert dm.in_channels == 6 and dm.num_classes == 134
    val, ref_val = dm.dataset("val"), SSL4EOLDataset(ref, "cdl", "val", "etm_sr")
    x, y = val[0]
    rx, ry = ref_val[0]
    assert x.shape == (6, 16, 16)
    torch.testing.assert_close(x, rx[:, 4:20, 4:20], rtol=0, atol=0)  # same seed -> same data; centre crop
    torch.testing.assert_close(y, ry[4:20, 4:20], rtol=0, atol=0)
    train, ref_train = dm.dataset("train"), SSL4EOLDataset(ref, "cdl", "train", "etm_sr")
    rx, ry = ref_train[0]
    windows = {}
    for _ in range(40):
        x, y = train[0]
        hits = [(i, j, fl) for i in range(9) for j in range(9) for fl in ((), (-1,), (-2,), (-1, -2))
                if torch.equal(x, rx[:, i:i + 16, j:j + 16].flip(fl) if fl else rx[:, i:i + 16, j:j + 16])
                and torch.equal(y, ry[i:i + 16, j:j + 16].flip(fl) if fl else ry[i:i + 16, j:j + 16])]
        assert hits, "a training sample is not a (flipped) window of the stored patch"
        windows[hits[0][:2]] = windows.get(hits[0][:2], set()) | {h[2] for h in hits}
    assert len(windows) > 10 and set().union(*windows.values()) == {(), (-1,), (-2,), (-1, -2)}
    other = MultispectralDataModule(str(tmp_path / "etm2"), sensor="etm_sr", product="cdl", synthetic=True,
                                    synthetic_n=8, synthetic_size=24, seed=8)
    assert not torch.equal(other.dataset("val")[0][0], dm.dataset("val")[0][0])


def test_synthetic_prepare_data_is_crash_safe(tmp_path, monkeypatch):
    """The synthetic set is moved into place image folder last: a crash in between leaves no image folder, so the
    next prepare_data regenerates instead of accepting patches without masks."""
    from hoformer.data import datamodules

    real_replace, calls = datamodules.os.replace, []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("killed")
        return real_replace(src, dst)

    dm = MultispectralDataModule(str(tmp_path / "syn"), synthetic=True, synthetic_n=4, synthetic_size=16)
    monkeypatch.setattr(datamodules.os, "replace", flaky)
    with pytest.raises(OSError, match="killed"):
        dm.prepare_data()
    monkeypatch.setattr(datamodules.os, "replace", real_replace)
    assert [p.name for p in calls] == ["ssl4eo_l_oli_nlcd", "ssl4eo_l_oli_sr_benchmark"]
    assert not (tmp_path / "syn" / "ssl4eo_l_oli_sr_benchmark").exists()
    dm.prepare_data()
    assert len(dm.dataset("train")) + len(dm.dataset("val")) + len(dm.dataset("test")) == 4


def test_datamodule_download_prefers_the_data_root(tmp_path, monkeypatch):
    make_synthetic_ssl4eo(tmp_path / "data" / "ssl4eo_l", n=4, size=16)
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("HOFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ms_mod, "_URL", (tmp_path / "offline").as_uri() + "/{}.tar.gz")  # fails if used
    dm = MultispectralDataModule(download=True)
    assert dm.root == tmp_path / "data" / "ssl4eo_l" and len(dm.dataset("train")) == 2
    dm = MultispectralDataModule(download=True, sensor="tm_toa")  # that sensor is not there: the cache
    assert dm.root == tmp_path / "cache" / "ssl4eo_l"
    with pytest.raises(OSError, match="could not download"):
        dm.dataset("train")
