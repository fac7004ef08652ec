"""LTSF protocol tests: TSLib/iTransformer split borders, train-only scaling, no evaluation window dropped, schema
and checksum errors. Real ETTh1/weather tests skip without the shared data; the same checks run on synthetic CSVs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hoformer.data import LTSFDataModule, LTSFDataset, SyntheticLTSF, ltsf_time_features, write_synthetic_ltsf_csv
from hoformer.data._utils import ChecksumError, SchemaError


def _raw(path, n_cols):
    """Independent reader (numpy.loadtxt, universal newlines): the variate columns of an LTSF CSV, float64."""
    return np.loadtxt(path, delimiter=",", skiprows=1, usecols=range(1, n_cols + 1), encoding="utf-8")


def _check_protocol(root, name, raw, b2, seq=96, pred=96, **kw):
    """Borders b2 = (train_end, val_end, test_end); checks lengths, scaler, window positions, inverse."""
    ds = {s: LTSFDataset(root, name, s, seq, pred, **kw) for s in ("train", "val", "test")}
    starts = (0, b2[0] - seq, b2[1] - seq)
    for (s, d), b1, e in zip(ds.items(), starts, b2):
        assert d.borders == (b1, e)
        assert len(d) == e - b1 - seq - pred + 1  # every window of the slice, none dropped
    mean, std = raw[:b2[0]].mean(0), raw[:b2[0]].std(0)  # scaler fitted on the training rows only
    np.testing.assert_allclose(ds["test"].mean, mean, rtol=1e-10)
    np.testing.assert_allclose(ds["test"].std, std, rtol=1e-10)
    scaled = (raw - mean) / std
    x, y = ds["val"][0]  # first validation window starts seq_len early: its target starts right after train
    np.testing.assert_allclose(x.numpy(), scaled[b2[0] - seq:b2[0]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.numpy(), scaled[b2[0]:b2[0] + pred], rtol=1e-5, atol=1e-5)
    x, y = ds["test"][0]
    np.testing.assert_allclose(y.numpy(), scaled[b2[1]:b2[1] + pred], rtol=1e-5, atol=1e-5)
    x, y = ds["test"][len(ds["test"]) - 1]  # the last test window ends on the last test row
    np.testing.assert_allclose(y.numpy(), scaled[b2[2] - pred:b2[2]], rtol=1e-5, atol=1e-5)
    assert x.dtype == y.dtype == torch.float32 and x.shape == (seq, raw.shape[1]) and y.shape == (pred, raw.shape[1])
    np.testing.assert_allclose(ds["test"].inverse_transform(y.double()).numpy(), raw[b2[2] - pred:b2[2]],
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(IndexError):
        ds["test"][len(ds["test"])]
    return ds


# ------------------------------------------------------------------------------------------------ real data
def test_etth1_protocol(data_root):
    root = data_root / "ltsf"
    raw = _raw(root / "ETT-small/ETTh1.csv", 7)
    ds = _check_protocol(root, "etth1", raw, (8640, 11520, 14400))
    assert [len(d) for d in ds.values()] == [8449, 2785, 2785]
    assert ds["train"].columns[-1] == "OT" and ds["train"].num_variates == 7


def test_weather_protocol(data_root):
    root = data_root / "ltsf"
    raw = _raw(root / "weather/weather.csv", 21)  # CRLF line endings, non-ASCII header
    n = len(raw)
    n_train, n_test = int(0.7 * n), int(0.2 * n)
    ds = _check_protocol(root, "Weather", raw, (n_train, n - n_test, n))
    assert [len(d) for d in ds.values()] == [36696, 5175, 10444]  # the published TSLib / iTransformer counts
    assert ds["train"].num_variates == 21


# ------------------------------------------------------------------------------------------------ synthetic CSVs
@pytest.fixture(scope="module")
def ett_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ltsf")
    write_synthetic_ltsf_csv(root / "ETT-small/ETTh1.csv", "ETTh1", seed=1)
    write_synthetic_ltsf_csv(root / "weather/weather.csv", "weather", n_rows=1500, seed=2)
    return root


def test_synthetic_ett_protocol(ett_root):
    path = ett_root / "ETT-small/ETTh1.csv"
    assert path.read_text().splitlines()[0] == "date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT"
    raw = _raw(path, 7)
    ds = _check_protocol(ett_root, "ETTh1", raw, (8640, 11520, 14400), verify=False)
    assert [len(d) for d in ds.values()] == [8449, 2785, 2785]
    # other lookbacks / horizons move the val/test starts with seq_len
    d = LTSFDataset(ett_root, "ETTh1", "test", 336, 720, verify=False)
    assert d.borders == (11520 - 336, 14400) and len(d) == 2880 + 336 - 336 - 720 + 1


def test_synthetic_weather_format_protocol(ett_root):
    path = ett_root / "weather/weather.csv"
    blob = path.read_bytes()
    assert b"\r\n" in blob and "\u00b5mol".encode() in blob.split(b"\r\n")[0]  # same quirks as the real file
    raw = _raw(path, 21)
    ds = _check_protocol(ett_root, "weather", raw, (1050, 1200, 1500), seq=48, pred=24, verify=False)
    assert ds["val"].dates[0] == ds["train"].dates[1050 - 48]  # val slice starts seq_len rows early


def test_features_marks_and_inverse(ett_root):
    kw = dict(verify=False, seq_len=24, pred_len=12)
    s = LTSFDataset(ett_root, "ETTh1", "val", features="S", **kw)
    ms = LTSFDataset(ett_root, "ETTh1", "val", features="MS", label_len=6, **kw)
    m = LTSFDataset(ett_root, "ETTh1", "val", time_features=True, **kw)
    assert s[0][0].shape == (24, 1) and s[0][1].shape == (12, 1)
    assert ms[0][0].shape == (24, 7) and ms[0][1].shape == (18, 1)
    torch.testing.assert_close(ms[0][1][:, 0], torch.cat([m[0][0][-6:, -1], m[0][1][:, -1]]))  # target = OT
    torch.testing.assert_close(s[0][1], m[0][1][:, -1:])  # S scales OT with its own train statistics
    x, y, xm, ym = m[0]
    assert xm.shape == (24, 4) and ym.shape == (12, 4) and xm.abs().max() <= 0.5
    # hour-of-day feature of the first val input row (8640 - 24 hours after 2016-07-01 00:00 -> 00:00)
    assert xm[0, 0].item() == pytest.approx(-0.5)
    raw = m.inverse_transform(y)
    torch.testing.assert_close(m.transform(raw), y)
    np.testing.assert_allclose(ms.inverse_transform(ms[0][1][6:].numpy())[:, 0], raw[:, -1].numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="last dimension"):
        m.inverse_transform(torch.zeros(3, 5))
    tf = ltsf_time_features(np.array(["2020-01-01T23:59"], dtype="datetime64[ns]"), "t")
    np.testing.assert_allclose(tf[0, :2], [0.5, 0.5])


def test_errors(ett_root, tmp_path):
    with pytest.raises(ChecksumError, match="sha256 checksum mismatch"):
        LTSFDataset(ett_root, "ETTh1", "train")  # the synthetic file is not the reference ETTh1
    with pytest.raises(FileNotFoundError, match="ETTm1.csv"):
        LTSFDataset(ett_root, "ETTm1", "train")
    with pytest.raises(ValueError, match="name must be one of"):
        LTSFDataset(ett_root, "nope", "train")
    with pytest.raises(ValueError, match="split"):
        LTSFDataset(ett_root, "ETTh1", "dev", verify=False)
    with pytest.raises(ValueError, match="too few"):
        LTSFDataset(ett_root, "weather", "val", seq_len=96, pred_len=200, verify=False)
    bad = tmp_path / "ETT-small"
    bad.mkdir()
    lines = (ett_root / "ETT-small/ETTh1.csv").read_text().splitlines()
    cases = {
        "'date' first column": ["time" + lines[0][4:]] + lines[1:],
        "must be numeric": lines[:5] + [lines[5].rsplit(",", 1)[0] + ",abc"] + lines[6:],
        "missing or non-finite": lines[:5] + [lines[5].rsplit(",", 1)[0] + ","] + lines[6:],
        "unparsable 'date'": lines[:5] + ["yesterday" + lines[5][19:]] + lines[6:],
        "needs at least 14400 rows": lines[:10000],
    }
    for msg, content in cases.items():
        (bad / "ETTh1.csv").write_text("\n".join(content) + "\n")
        with pytest.raises(SchemaError, match=msg):
            LTSFDataset(tmp_path, "ETTh1", "train", verify=False)


def test_synthetic_dataset_and_datamodule():
    a, b = SyntheticLTSF("train", 48, 24, length=1200), SyntheticLTSF("train", 48, 24, length=1200)
    torch.testing.assert_close(a.data, b.data)  # deterministic
    assert not torch.allclose(a.data, SyntheticLTSF("train", 48, 24, length=1200, seed=1).data)
    torch.testing.assert_close(a.data.double().mean(0), torch.zeros(7, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(a.data.double().std(0, unbiased=False), torch.ones(7, dtype=torch.float64),
                               atol=1e-6, rtol=0)
    corr = np.corrcoef(a.data.numpy().T)
    assert np.abs(corr[np.triu_indices(7, 1)]).max() > 0.3  # variates are coupled

    dm = LTSFDataModule(synthetic=True, seq_len=48, pred_len=24, batch_size=7, synthetic_length=1200)
    dm.setup("test")
    test = dm.dataset("test")
    assert len(test) == 240 + 48 - 48 - 24 + 1 and dm.num_variates == 7
    n, last = 0, None
    for x, y in dm.test_dataloader():  # batch 7 does not divide len(test): nothing is dropped
        n += x.shape[0]
        last = y[-1]
    assert n == len(test)
    torch.testing.assert_close(last, test.data[-24:])
    assert dm.inverse_transform(last).shape == (24, 7)


def test_datamodule_real_layout(ett_root, monkeypatch, tmp_path):
    dm = LTSFDataModule(str(ett_root), "ETTh1", 96, 96, batch_size=64, verify=False)
    assert dm.num_variates == 7
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 96, 7) and y.shape == (64, 96, 7)
    assert len(DataLoader(dm.dataset("val"), batch_size=64).dataset) == 2785
    monkeypatch.delenv("HOFORMER_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="HOFORMER_DATA"):
        LTSFDataModule(name="ETTh1")
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="missing/ltsf"):
        LTSFDataModule(name="ETTh1")


def test_public_names_not_shadowed():
    """``hoformer.data`` star-imports every module: a later module must not shadow one of the data API names."""
    import hoformer.data as data
    from hoformer.data import datamodules, ltsf, medmnist, multispectral

    for mod in (ltsf, medmnist, multispectral, datamodules):
        for name in mod.__all__:
            assert getattr(data, name) is getattr(mod, name), f"hoformer.data.{name} is shadowed"


def test_split_datamodule_base():
    """Shared datamodule base: per-split ``_make`` (built lazily, cached) and all-at-once ``_make_splits`` hooks;
    training loaders shuffle, evaluation loaders keep order, nothing is dropped; clear argument errors."""
    from torch.utils.data import SequentialSampler, TensorDataset

    from hoformer.data._base import SplitDataModule

    class PerSplit(SplitDataModule):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.made = []

        def _make(self, split):
            self.made.append(split)
            return TensorDataset(torch.arange({"train": 10, "val": 7, "test": 5}[split]))

    class AllAtOnce(PerSplit):
        def _make_splits(self, names):
            self.made.append(tuple(names))
            return {s: TensorDataset(torch.arange(n)) for s, n in (("train", 10), ("val", 7), ("test", 5))}

        def collate_fn(self, split):
            return lambda items: torch.stack([it[0] for it in items])

    dm = PerSplit(batch_size=3, eval_batch_size=4)
    dm.setup("fit")
    assert dm.made == ["train", "val"] and sorted(dm.datasets) == ["train", "val"]
    train, val, test, pred = dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()
    assert dm.made == ["train", "val", "test"]  # test built on first use, then cached
    assert dm.dataset("test") is test.dataset is pred.dataset
    assert train.batch_size == 3 and not isinstance(train.sampler, SequentialSampler) and not train.drop_last
    assert not train.pin_memory and train.num_workers == 0 and not train.persistent_workers
    for loader in (val, test, pred):
        assert loader.batch_size == 4 and isinstance(loader.sampler, SequentialSampler) and not loader.drop_last
    assert torch.cat([b[0] for b in val]).tolist() == list(range(7))  # 4 + 3: in order, last partial batch kept
    assert sorted(torch.cat([b[0] for b in train]).tolist()) == list(range(10))
    assert PerSplit(batch_size=5).eval_batch_size == 5
    loader = PerSplit(num_workers=2, pin_memory=True).val_dataloader()  # flags only: no iteration, no workers
    assert loader.num_workers == 2 and loader.persistent_workers and loader.pin_memory

    dm = AllAtOnce(batch_size=2)
    assert [b.tolist() for b in dm.test_dataloader()] == [[0, 1], [2, 3], [4]]  # collate_fn hook
    dm.setup()
    dm.train_dataloader()
    assert dm.made == [("test",)]  # one build serves every split

    for kw, arg in (({"batch_size": 0}, "batch_size"), ({"eval_batch_size": -1}, "eval_batch_size"),
                    ({"num_workers": -1}, "num_workers")):
        with pytest.raises(ValueError, match=f"PerSplit: {arg} must be"):
            PerSplit(**kw)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        LTSFDataModule(synthetic=True, batch_size=0)
    with pytest.raises(NotImplementedError, match="_make"):
        SplitDataModule().setup()


# ------------------------------------------------------------------------------------------------ download
def _fresh_machine(monkeypatch, tmp_path):
    """No HOFORMER_DATA, no ../shared/data next to the working directory, an empty cache."""
    monkeypatch.delenv("HOFORMER_DATA", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOFORMER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "ltsf"


def test_download_on_fresh_machine(tmp_path, monkeypatch):
    """download=True needs no existing data root: the cache (root=None) or the given root is created, the file is
    fetched from the canonical URL (a local file:// mirror here) and verified against the pinned SHA-256."""
    import dataclasses
    import hashlib

    from hoformer.data import ltsf as ltsf_mod

    mirror = write_synthetic_ltsf_csv(tmp_path / "mirror" / "ETTh2.csv", "ETTh2", seed=3)
    sha = hashlib.sha256(mirror.read_bytes()).hexdigest()
    spec = ltsf_mod.LTSF_DATASETS["ETTh2"]
    monkeypatch.setitem(ltsf_mod.LTSF_DATASETS, "ETTh2", dataclasses.replace(spec, url=mirror.as_uri(), sha256=sha))
    cache = _fresh_machine(monkeypatch, tmp_path)

    dm = LTSFDataModule(name="ETTh2", download=True, batch_size=64)  # used to raise "no data root"
    dm.setup("test")
    assert (cache / "ETT-small" / "ETTh2.csv").read_bytes() == mirror.read_bytes()
    assert len(dm.dataset("test")) == 2785 and sorted(p.name for p in (cache / "ETT-small").iterdir()) == ["ETTh2.csv"]

    root = tmp_path / "new" / "ltsf"  # a root that does not exist yet is created by the download
    dm = LTSFDataModule(str(root), "ETTh2", download=True)
    dm.setup("fit")
    assert (root / "ETT-small" / "ETTh2.csv").is_file() and len(dm.dataset("train")) == 8449

    # a download that does not match the pinned checksum is refused and leaves nothing behind
    monkeypatch.setitem(ltsf_mod.LTSF_DATASETS, "ETTh2", dataclasses.replace(spec, url=mirror.as_uri(),
                                                                             sha256="0" * 64))
    bad = tmp_path / "bad"
    with pytest.raises(ChecksumError, match="sha256 checksum mismatch"):
        LTSFDataModule(str(bad), "ETTh2", download=True).setup("fit")
    assert not (bad / "ETT-small" / "ETTh2.csv").exists() and list((bad / "ETT-small").iterdir()) == []
    # without download=True a missing root is still an error that says how to fix it
    with pytest.raises(FileNotFoundError, match="HOFORMER_DATA"):
        LTSFDataModule(name="ETTh2")


def test_download_real_ett_offline(data_root, tmp_path, monkeypatch):
    """The real ETTh1 served from a file:// mirror passes the pinned (canonical) checksum on a fresh machine."""
    import dataclasses

    from hoformer.data import ltsf as ltsf_mod

    src = data_root / "ltsf" / "ETT-small" / "ETTh1.csv"
    spec = ltsf_mod.LTSF_DATASETS["ETTh1"]
    monkeypatch.setitem(ltsf_mod.LTSF_DATASETS, "ETTh1", dataclasses.replace(spec, url=src.as_uri()))
    cache = _fresh_machine(monkeypatch, tmp_path)
    ds = LTSFDataset(None, "ETTh1", "val", download=True)
    assert ds.path == cache / "ETT-small" / "ETTh1.csv" and len(ds) == 2785
