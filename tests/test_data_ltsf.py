"""LTSF protocol tests: TSLib/iTransformer split borders, train-only scaling, no evaluation window dropped, schema
and checksum errors. Real ETTh1/weather tests skip without the shared data; the same checks run on synthetic CSVs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hoformer.data import ChecksumError, LTSFDataModule, SchemaError, time_features, write_synthetic_ltsf_csv

SPLITS = ("train", "val", "test")


def _built(root, name, seq_len=96, pred_len=96, **kw):
    """An LTSF datamodule, set up (read, split and scaled once for every split)."""
    dm = LTSFDataModule(None if root is None else str(root), name, seq_len, pred_len, **kw)
    dm.setup()
    return dm


def _split(root, name, split="train", seq_len=96, pred_len=96, **kw):
    """The windows of one split."""
    return _built(root, name, seq_len, pred_len, **kw).dataset(split)



def _item(d):
    """An item as TSLib's tuple ``(x, y[, x_mark, y_mark])``: ``y`` with the ``label_len`` known steps in front."""
    y = torch.cat([d["y_known"], d["y"]]) if "y_known" in d else d["y"]
    return (d["x"], y) + ((d["time"], d["y_time"]) if "time" in d else ())

def _raw(path, n_cols):
    """Independent reader (numpy.loadtxt, universal newlines): the variate columns of an LTSF CSV, float64."""
    return np.loadtxt(path, delimiter=",", skiprows=1, usecols=range(1, n_cols + 1), encoding="utf-8")


def _check_protocol(root, name, raw, b2, seq=96, pred=96, **kw):
    """Borders b2 = (train_end, val_end, test_end); checks lengths, scaler, window positions, inverse."""
    dm = _built(root, name, seq, pred, **kw)
    ds = {s: dm.dataset(s) for s in SPLITS}
    starts = (0, b2[0] - seq, b2[1] - seq)
    for (s, d), b1, e in zip(ds.items(), starts, b2):
        assert d.starts[0] == b1 and d.starts[-1] + seq + pred == e  # absolute rows of the file
        assert len(d) == e - b1 - seq - pred + 1  # every window of the slice, none dropped
        assert d.data is ds["train"].data  # one scaled series shared by the splits
    mean, std = raw[:b2[0]].mean(0), raw[:b2[0]].std(0)  # scaler fitted on the training rows only
    np.testing.assert_allclose(dm.scaler.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(dm.scaler.std, std, rtol=1e-10)
    scaled = (raw - mean) / std
    x, y = _item(ds["val"][0])  # first validation window starts seq_len early: its target starts right after train
    np.testing.assert_allclose(x.numpy(), scaled[b2[0] - seq:b2[0]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.numpy(), scaled[b2[0]:b2[0] + pred], rtol=1e-5, atol=1e-5)
    x, y = _item(ds["test"][0])
    np.testing.assert_allclose(y.numpy(), scaled[b2[1]:b2[1] + pred], rtol=1e-5, atol=1e-5)
    x, y = _item(ds["test"][len(ds["test"]) - 1])  # the last test window ends on the last test row
    np.testing.assert_allclose(y.numpy(), scaled[b2[2] - pred:b2[2]], rtol=1e-5, atol=1e-5)
    assert x.dtype == y.dtype == torch.float32 and x.shape == (seq, raw.shape[1]) and y.shape == (pred, raw.shape[1])
    np.testing.assert_allclose(dm.scaler.inverse_transform(y.double()).numpy(), raw[b2[2] - pred:b2[2]],
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(IndexError):
        ds["test"][len(ds["test"])]
    return dm, ds


# ------------------------------------------------------------------------------------------------ real data
def test_etth1_protocol(data_root):
    root = data_root / "ltsf"
    raw = _raw(root / "ETT-small/ETTh1.csv", 7)
    _, ds = _check_protocol(root, "etth1", raw, (8640, 11520, 14400))
    assert [len(d) for d in ds.values()] == [8449, 2785, 2785]
    assert ds["train"].columns[-1] == "OT" and ds["train"].num_variates == 7


def test_weather_protocol(data_root):
    root = data_root / "ltsf"
    raw = _raw(root / "weather/weather.csv", 21)  # CRLF line endings, non-ASCII header
    n = len(raw)
    n_train, n_test = int(0.7 * n), int(0.2 * n)
    _, ds = _check_protocol(root, "Weather", raw, (n_train, n - n_test, n))
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
    _, ds = _check_protocol(ett_root, "ETTh1", raw, (8640, 11520, 14400), verify=False)
    assert [len(d) for d in ds.values()] == [8449, 2785, 2785]
    # other lookbacks / horizons move the val/test starts with seq_len
    d = _split(ett_root, "ETTh1", "test", 336, 720, verify=False)
    assert d.starts[0] == 11520 - 336 and d.starts[-1] + 336 + 720 == 14400 and len(d) == 2880 + 336 - 336 - 720 + 1


def test_synthetic_weather_format_protocol(ett_root):
    path = ett_root / "weather/weather.csv"
    blob = path.read_bytes()
    assert b"\r\n" in blob and "\u00b5mol".encode() in blob.split(b"\r\n")[0]  # same quirks as the real file
    raw = _raw(path, 21)
    dm, ds = _check_protocol(ett_root, "weather", raw, (1050, 1200, 1500), seq=48, pred=24, verify=False)
    assert ds["val"].starts[0] == 1050 - 48  # val slice starts seq_len rows early
    torch.testing.assert_close(ds["val"][0]["x"], ds["train"].data[1050 - 48:1050])


def test_features_marks_and_inverse(ett_root):
    kw = dict(verify=False, seq_len=24, pred_len=12)
    s = _split(ett_root, "ETTh1", "val", features="S", **kw)
    dm_ms = _built(ett_root, "ETTh1", features="MS", label_len=6, **kw)
    dm_m = _built(ett_root, "ETTh1", time_features=True, **kw)
    ms, m = dm_ms.dataset("val"), dm_m.dataset("val")
    assert _item(s[0])[0].shape == (24, 1) and _item(s[0])[1].shape == (12, 1)
    assert _item(ms[0])[0].shape == (24, 7) and _item(ms[0])[1].shape == (18, 1)
    torch.testing.assert_close(_item(ms[0])[1][:, 0],  # target = OT
                               torch.cat([_item(m[0])[0][-6:, -1], _item(m[0])[1][:, -1]]))
    torch.testing.assert_close(_item(s[0])[1], _item(m[0])[1][:, -1:])  # S scales OT with its own train statistics
    x, y, xm, ym = _item(m[0])
    assert xm.shape == (24, 4) and ym.shape == (12, 4) and xm.abs().max() <= 0.5
    # hour-of-day feature of the first val input row (8640 - 24 hours after 2016-07-01 00:00 -> 00:00)
    assert xm[0, 0].item() == pytest.approx(-0.5)
    raw = dm_m.scaler.inverse_transform(y)
    torch.testing.assert_close(dm_m.scaler.transform(raw), y)
    target = dm_ms.scaler.channels(slice(-1, None))  # MS: the scaler of the target column
    np.testing.assert_allclose(target.inverse_transform(ms[0]["y"].numpy())[:, 0], raw[:, -1].numpy(), rtol=1e-5)
    # the batch's statistics give the same original scale (the target's under MS)
    torch.testing.assert_close(ms[0]["y"] * ms[0]["std"] + ms[0]["mean"], raw[:, -1:].float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="expected a last dimension of 7"):
        dm_m.scaler.inverse_transform(torch.zeros(3, 5))
    tf = time_features(np.array(["2020-01-01T23:59"], dtype="datetime64[ns]"), "t")
    np.testing.assert_allclose(tf[0, :2], [0.5, 0.5])


def test_errors(ett_root, tmp_path):
    with pytest.raises(ChecksumError, match="sha256 checksum mismatch"):
        _built(ett_root, "ETTh1")  # the synthetic file is not the reference ETTh1
    with pytest.raises(FileNotFoundError, match="ETTm1.csv"):
        _built(ett_root, "ETTm1")
    with pytest.raises(ValueError, match="name must be one of"):
        _built(ett_root, "nope")
    with pytest.raises(ValueError, match=r"LTSFDataModule.dataset: `split` must be one of .*, got 'dev'"):
        _split(ett_root, "ETTh1", "dev", verify=False)
    with pytest.raises(ValueError, match="too few"):
        _built(ett_root, "weather", seq_len=96, pred_len=200, verify=False)
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
            _built(tmp_path, "ETTh1", verify=False)


def test_synthetic_dataset_and_datamodule():
    def synthetic(**kw):
        return _split(None, "synthetic", "train", 48, 24, synthetic=True, synthetic_length=1200, **kw).data

    a = synthetic()
    torch.testing.assert_close(a, synthetic())  # deterministic
    assert not torch.allclose(a, synthetic(seed=1))
    train = a[:840].double()  # 70 % of the rows: the scaler's
    torch.testing.assert_close(train.mean(0), torch.zeros(7, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(train.std(0, unbiased=False), torch.ones(7, dtype=torch.float64), atol=1e-6, rtol=0)
    corr = np.corrcoef(a.numpy().T)
    assert np.abs(corr[np.triu_indices(7, 1)]).max() > 0.3  # variates are coupled

    dm = LTSFDataModule(synthetic=True, seq_len=48, pred_len=24, batch_size=7, synthetic_length=1200)
    dm.setup("test")
    test = dm.dataset("test")
    assert len(test) == 240 + 48 - 48 - 24 + 1 and dm.num_variates == 7
    n, last = 0, None
    for b in dm.test_dataloader():  # batch 7 does not divide len(test): nothing is dropped
        x, y = b["x"], b["y"]
        n += x.shape[0]
        last = y[-1]
    assert n == len(test)
    torch.testing.assert_close(last, test.data[-24:])
    assert dm.scaler.inverse_transform(last).shape == (24, 7)


def test_datamodule_real_layout(ett_root, monkeypatch, tmp_path):
    dm = LTSFDataModule(str(ett_root), "ETTh1", 96, 96, batch_size=64, verify=False)
    assert dm.num_variates == 7
    dm.setup("fit")
    b = next(iter(dm.train_dataloader()))
    x, y = b["x"], b["y"]
    assert x.shape == (64, 96, 7) and y.shape == (64, 96, 7)
    assert len(DataLoader(dm.dataset("val"), batch_size=64).dataset) == 2785
    monkeypatch.delenv("HOFORMER_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="HOFORMER_DATA"):
        LTSFDataModule(name="ETTh1")
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="missing/ltsf"):
        LTSFDataModule(name="ETTh1")


def test_one_read_one_scaler_fit_for_every_split(ett_root, monkeypatch):
    """However the splits are asked for, the file is read, split and the scaler fitted once; the splits are windows
    (absolute start rows) over one scaled series."""
    from hoformer.data import series

    calls = []
    for name in ("fit", "transform"):
        real = getattr(series.StandardScaler, name)
        monkeypatch.setattr(series.StandardScaler, name,
                            lambda self, *a, _real=real, _name=name, **k: calls.append(_name) or _real(self, *a, **k))
    real_read = LTSFDataModule.read_series
    monkeypatch.setattr(LTSFDataModule, "read_series", lambda self: calls.append("read") or real_read(self))
    dm = LTSFDataModule(str(ett_root), "ETTh1", 24, 12, verify=False)
    for split in ("test", "train", "val", "test"):
        dm.dataset(split)
    dm.setup("fit")
    dm.setup("test")
    next(iter(dm.val_dataloader()))
    assert calls == ["read", "fit", "transform"]
    assert all(dm.dataset(s).data is dm.dataset("train").data for s in SPLITS)
    assert [int(dm.dataset(s).starts[0]) for s in SPLITS] == [0, 8640 - 24, 11520 - 24]


def test_public_names_not_shadowed():
    """``hoformer.data`` star-imports every module: a later module must not shadow one of the data API names."""
    import hoformer.data as data
    from hoformer.data import _utils, datamodules, ltsf, medmnist, multispectral, series, traffic

    for mod in (_utils, series, ltsf, medmnist, multispectral, traffic, datamodules):
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

    for kw, arg in (({"batch_size": 0}, "batch_size"), ({"batch_size": 2.5}, "batch_size"),
                    ({"eval_batch_size": -1}, "eval_batch_size"), ({"num_workers": -1}, "num_workers"),
                    ({"num_workers": True}, "num_workers")):
        with pytest.raises(ValueError, match=f"PerSplit: `{arg}` must be an int"):
            PerSplit(**kw)
    with pytest.raises(ValueError, match="`batch_size` must be an int >= 1, got 0"):
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
    dm = _built(None, "ETTh1", download=True)
    assert dm.series.source == str(cache / "ETT-small" / "ETTh1.csv") and len(dm.dataset("val")) == 2785


# ------------------------------------------------------------------------------------------------ protocol details
def _tslib_borders(protocol, n, seq):
    """Time-Series-Library ``data_loader.py`` border arithmetic, written out per dataset class."""
    if protocol == "etth":  # Dataset_ETT_hour
        return [0, 12 * 30 * 24 - seq, 12 * 30 * 24 + 4 * 30 * 24 - seq], \
            [12 * 30 * 24, 12 * 30 * 24 + 4 * 30 * 24, 12 * 30 * 24 + 8 * 30 * 24]
    if protocol == "ettm":  # Dataset_ETT_minute
        return [0, 12 * 30 * 24 * 4 - seq, 12 * 30 * 24 * 4 + 4 * 30 * 24 * 4 - seq], \
            [12 * 30 * 24 * 4, 12 * 30 * 24 * 4 + 4 * 30 * 24 * 4, 12 * 30 * 24 * 4 + 8 * 30 * 24 * 4]
    num_train, num_test = int(n * 0.7), int(n * 0.2)
    num_vali = int(n * 0.1) if protocol == "solar" else n - num_train - num_test  # Dataset_Solar / Dataset_Custom
    return [0, num_train - seq, n - num_test - seq], [num_train, num_train + num_vali, n]


@pytest.mark.parametrize("protocol,n", [("etth", 17420), ("ettm", 69680), ("custom", 52696), ("custom", 1003),
                                        ("custom", 966), ("solar", 52560), ("solar", 1003)])
@pytest.mark.parametrize("seq", [36, 96, 336])
def test_borders_match_tslib(protocol, n, seq):
    from hoformer.data import ltsf_borders

    b1, b2 = ltsf_borders(protocol, n, seq)
    assert (list(b1), list(b2)) == _tslib_borders(protocol, n, seq)


def test_border_errors():
    from hoformer.data import ltsf_borders

    with pytest.raises(ValueError, match=r"seq_len=400 is longer than the training slice \(350 rows of 500\)"):
        ltsf_borders("custom", 500, 400)
    with pytest.raises(SchemaError, match="needs at least 57600 rows, the file has 57599"):
        ltsf_borders("ettm", 57599, 96)
    with pytest.raises(ValueError, match="protocol must be"):
        ltsf_borders("ett", 20000, 96)
    for protocol, n_train in (("etth", 8640), ("ettm", 34560)):  # a lookback longer than the training months
        with pytest.raises(ValueError, match=f"seq_len={n_train + 1} is longer than the training slice"):
            ltsf_borders(protocol, 80000, n_train + 1)
    assert ltsf_borders("etth", 14400, 8640)[0] == [0, 0, 2880]


def _fast_ett_csv(path, n, minutes, seed=0):
    """ETT-layout CSV written with numpy only (fast for the 57,600 rows of the ETTm protocol)."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n, 7)) * rng.uniform(1, 5, 7) + rng.uniform(-5, 20, 7)
    dates = np.datetime64("2016-07-01T00:00") + np.arange(n) * np.timedelta64(minutes, "m")
    text = np.char.replace(np.datetime_as_string(dates, unit="s"), "T", " ")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, np.column_stack([text, np.char.mod("%.6f", values)]), fmt="%s", delimiter=",",
               header="date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT", comments="")
    return path


def test_ettm_protocol(tmp_path):
    """ETTm: the same 12/4/4 months at 15 minutes (x4 rows); calendar marks default to the minute features."""
    path = _fast_ett_csv(tmp_path / "ETT-small" / "ETTm1.csv", 57600 + 17, 15)
    raw = _raw(path, 7)
    _, ds = _check_protocol(tmp_path, "ETTm1", raw, (34560, 46080, 57600), verify=False)
    assert [len(d) for d in ds.values()] == [34369, 11425, 11425]  # rows past the 20 months are never used
    m = _split(tmp_path, "ETTm1", "val", 96, 96, verify=False, time_features=True, label_len=48)
    _, y, xm, ym = _item(m[3])
    dates = np.datetime64("2016-07-01T00:00") + np.arange(57600) * np.timedelta64(15, "m")
    np.testing.assert_array_equal(xm.numpy(), time_features(dates[34560 - 96 + 3:34560 + 3], "t"))
    # y_known holds the label_len steps before the horizon; the target marks are the horizon's
    np.testing.assert_array_equal(ym.numpy(), time_features(dates[34560 + 3:34560 + 99], "t"))
    scaled = (raw - raw[:34560].mean(0)) / raw[:34560].std(0)
    np.testing.assert_allclose(y.numpy(), scaled[34560 - 48 + 3:34560 + 99], rtol=1e-5, atol=1e-5)


def test_solar_protocol(tmp_path):
    """solar_AL.txt: no header, no dates; TSLib's Dataset_Solar takes int(0.1 n) validation rows, so a row can fall
    between validation and test; calendar marks are zeros."""
    path = write_synthetic_ltsf_csv(tmp_path / "Solar" / "solar_AL.txt", "solar", 1003, seed=5)
    raw = np.loadtxt(path, delimiter=",")
    assert raw.shape == (1003, 137)
    seq, pred = 24, 12
    dm = _built(tmp_path, "solar", seq, pred, time_features=True)
    ds = {s: dm.dataset(s) for s in SPLITS}
    assert [(d.starts[0], d.starts[-1] + seq + pred) for d in ds.values()] == [(0, 702), (702 - seq, 802),
                                                                             (803 - seq, 1003)]
    assert [len(d) for d in ds.values()] == [702 - seq - pred + 1, 100 - pred + 1, 200 - pred + 1]
    mean, std = raw[:702].mean(0), raw[:702].std(0)
    std = np.where(std == 0, 1.0, std)
    scaled = (raw - mean) / std
    x, y, xm, ym = _item(ds["test"][len(ds["test"]) - 1])
    np.testing.assert_allclose(x.numpy(), scaled[1003 - pred - seq:1003 - pred], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.numpy(), scaled[1003 - pred:], rtol=1e-5, atol=1e-5)
    assert xm.shape == (seq, 1) and ym.shape == (pred, 1) and not xm.any() and not ym.any()
    x, y, _, _ = _item(ds["val"][0])
    np.testing.assert_allclose(y.numpy(), scaled[702:702 + pred], rtol=1e-5, atol=1e-5)


def test_constant_column_scaled_with_unit_std(tmp_path):
    """A variate that is constant on the training rows keeps std 1 (TSLib / sklearn StandardScaler), not inf/NaN."""
    raw_a = np.array([5.0 if i < 700 else 6.0 + i % 3 for i in range(1000)])
    dates = np.char.replace(np.datetime_as_string(np.datetime64("2020-01-01T00:00") + np.arange(1000)
                                                  * np.timedelta64(1, "h"), unit="s"), "T", " ")
    (tmp_path / "c.csv").write_text("date,a,OT\n" + "".join(f"{d},{a},{np.sin(i):.6f}\n"
                                                            for i, (d, a) in enumerate(zip(dates, raw_a))))
    dm = _built(tmp_path, "c.csv", 24, 12)
    ds = dm.dataset("test")
    assert dm.scaler.std[0] == 1.0 and dm.scaler.mean[0] == 5.0
    assert torch.isfinite(ds.data).all()
    np.testing.assert_allclose(_item(ds[0])[0][:, 0].numpy(), raw_a[800 - 24:800] - 5.0)


def _write_custom(path, n=400, seed=0):
    """A custom CSV whose target column OT is *not* last (TSLib moves it there)."""
    rng = np.random.default_rng(seed)
    raw = rng.normal(size=(n, 3)) * [1.0, 10.0, 100.0] + [0.0, 50.0, -20.0]  # columns OT, a, b
    dates = np.char.replace(np.datetime_as_string(np.datetime64("2020-01-01T00:00") + np.arange(n)
                                                  * np.timedelta64(1, "h"), unit="s"), "T", " ")
    path.write_text("date,OT,a,b\n" + "".join(f"{d},{r[0]:.6f},{r[1]:.6f},{r[2]:.6f}\n" for d, r in zip(dates, raw)))
    return np.loadtxt(path, delimiter=",", skiprows=1, usecols=(1, 2, 3))


def test_target_moved_last_and_features(tmp_path):
    raw = _write_custom(tmp_path / "c.csv")  # (400, 3): OT, a, b
    n_train, n_test = 280, 80
    seq, pred = 24, 8
    m = _split(tmp_path, "c.csv", "val", seq, pred)
    assert m.columns == ["a", "b", "OT"]
    ref = raw[:, [1, 2, 0]]
    mean, std = ref[:n_train].mean(0), ref[:n_train].std(0)
    x, y = _item(m[5])
    np.testing.assert_allclose(x.numpy(), ((ref - mean) / std)[n_train - seq + 5:n_train + 5], rtol=1e-5, atol=1e-5)
    # S with another target: that column alone, scaled with its own training statistics
    s = _split(tmp_path, "c.csv", "test", seq, pred, features="S", target="a")
    assert s.columns == ["a"] and s.num_variates == 1
    a = raw[:, 1]
    x, y = _item(s[0])
    np.testing.assert_allclose(x[:, 0].numpy(), ((a - a[:n_train].mean()) / a[:n_train].std())[
        400 - n_test - seq:400 - n_test], rtol=1e-5, atol=1e-5)
    # MS: all variates in, the target (last) out; the scaler of every column, channels(-1:) of the target
    dm_ms = _built(tmp_path, "c.csv", seq, pred, features="MS", target="b")
    ms, scaler = dm_ms.dataset("test"), dm_ms.scaler
    assert ms.columns == dm_ms.variate_names == ["OT", "a", "b"]
    x, y = _item(ms[0])
    assert x.shape == (seq, 3) and y.shape == (pred, 1)
    np.testing.assert_allclose(scaler.inverse_transform(x.double().numpy()), raw[400 - n_test - seq:400 - n_test],
                               rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(scaler.channels(slice(-1, None)).inverse_transform(y.double().numpy())[:, 0],
                               raw[400 - n_test:400 - n_test + pred, 2],
                               rtol=1e-6, atol=1e-3)
    ms_mean, ms_std = raw[:n_train].mean(0), raw[:n_train].std(0)
    np.testing.assert_allclose(scaler.transform(raw[:4]), (raw[:4] - ms_mean) / ms_std, rtol=1e-12)
    np.testing.assert_allclose(scaler.channels([2]).transform(raw[:4, 2:]), (raw[:4, 2:] - ms_mean[2]) / ms_std[2],
                               rtol=1e-12)
    dm_raw = _built(tmp_path, "c.csv", seq, pred, scale=False)
    unscaled = dm_raw.dataset("test")
    np.testing.assert_allclose(_item(unscaled[0])[0].numpy(), ref[400 - n_test - seq:400 - n_test], rtol=1e-6)
    assert dm_raw.scaler is None and unscaled[0]["std"].tolist() == [1.0, 1.0, 1.0]


def test_negative_index_and_argument_errors(ett_root):
    kw = dict(verify=False, seq_len=24, pred_len=12)
    ds = _split(ett_root, "ETTh1", "test", **kw)
    n = len(ds)
    for i, j in ((-1, n - 1), (-n, 0), (-7, n - 7)):
        torch.testing.assert_close(ds[i], ds[j], rtol=0, atol=0)
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match=f"index {bad} out of range for {n} windows"):
            ds[bad]
    cases = [({"label_len": 25}, r"label_len must be an int in \[0, seq_len=24\], got 25"),
             ({"label_len": -1}, "label_len must be"),
             ({"features": "X"}, "features must be 'M', 'S' or 'MS', got 'X'"),
             ({"features": "S", "target": "nope"}, "target 'nope' is not a column of 'ETTh1'"),
             ({"seq_len": 0}, "LTSFDataModule: `seq_len` must be an int >= 1, got 0"),
             ({"pred_len": True}, "LTSFDataModule: `pred_len` must be an int >= 1, got True"),
             ({"seq_len": 24.0}, "LTSFDataModule: `seq_len` must be an int >= 1, got 24.0"),
             ({"seq_len": 8641}, r"seq_len=8641 is longer than the training slice \(8640 rows of 14400\)"),
             ({"seq_len": 8640, "pred_len": 2881}, "too few for seq_len=8640 \\+ pred_len=2881")]
    for over, msg in cases:
        with pytest.raises(ValueError, match=msg):
            _built(ett_root, "ETTh1", **{**kw, **over})


_FEATURE_SETS = {"s": ["second", "minute", "hour", "dow", "dom", "doy"], "t": ["minute", "hour", "dow", "dom", "doy"],
                 "h": ["hour", "dow", "dom", "doy"], "d": ["dow", "dom", "doy"], "b": ["dow", "dom", "doy"],
                 "w": ["dom", "woy"], "m": ["moy"]}


def _naive_calendar(dt, name):
    """TSLib ``utils/timefeatures.py`` (timeenc=1) for one ``datetime``."""
    return {"second": dt.second / 59.0, "minute": dt.minute / 59.0, "hour": dt.hour / 23.0,
            "dow": dt.weekday() / 6.0, "dom": (dt.day - 1) / 30.0, "doy": (dt.timetuple().tm_yday - 1) / 365.0,
            "moy": (dt.month - 1) / 11.0, "woy": (dt.isocalendar()[1] - 1) / 52.0}[name] - 0.5


@pytest.mark.parametrize("freq,key", [("h", "h"), ("H", "h"), ("t", "t"), ("15min", "t"), ("10min", "t"),
                                      ("T", "t"), ("s", "s"), ("d", "d"), ("b", "b"), ("w", "w"), ("m", "m")])
def test_time_features_match_naive_calendar(freq, key):
    import datetime as dtm

    rng = np.random.default_rng(0)
    secs = rng.integers(0, 7 * 365 * 86400, 60)
    stamps = [dtm.datetime(2015, 1, 1) + dtm.timedelta(seconds=int(s)) for s in secs]
    stamps += [dtm.datetime(2020, 12, 31, 23, 59, 59), dtm.datetime(2021, 1, 3), dtm.datetime(2020, 2, 29, 12)]
    got = time_features(np.array(stamps, dtype="datetime64[ns]"), freq)
    ref = np.array([[_naive_calendar(dt, f) for f in _FEATURE_SETS[key]] for dt in stamps])
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-7)


def test_time_features_bad_freq():
    with pytest.raises(ValueError, match=r"freq must be one of .* got 'q'"):
        time_features(np.array(["2020-01-01"], dtype="datetime64[ns]"), "q")


def test_cached_arrays_are_read_only(ett_root):
    """Users of one file share the parsed table: editing one datamodule's dates or values cannot change another's."""
    a = _built(ett_root, "ETTh1", 24, 12, verify=False, time_features=True)
    for array in (a.series.dates, a.series.values):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = array[1]
    b = _built(ett_root, "ETTh1", 24, 12, verify=False, time_features=True)
    assert b.series.dates[8640 - 24] == np.datetime64("2016-07-01T00:00") + np.timedelta64(8640 - 24, "h")
    torch.testing.assert_close(a.dataset("val")[0]["time"], b.dataset("val")[0]["time"])
    syn = _built(None, "synthetic", 24, 12, synthetic=True, synthetic_length=500)
    with pytest.raises(ValueError, match="read-only"):
        syn.series.dates[0] = np.datetime64("2000-01-01")


def test_synthetic_features_and_datamodule_options():
    """LTSFDataModule(synthetic=True) honours features, target, seed, label_len (not silently M)."""
    def synthetic(**kw):
        return _split(None, "synthetic", "test", 24, 12, synthetic=True, synthetic_length=600, **kw)

    m = synthetic()
    s = synthetic(features="S")
    ms = synthetic(features="MS", label_len=6)
    assert s.num_variates == 1 and _item(s[0])[0].shape == (24, 1) and _item(ms[0])[1].shape == (18, 1)
    torch.testing.assert_close(_item(s[0])[0], _item(m[0])[0][:, -1:])  # per-variate scaling: OT alone == OT of M
    torch.testing.assert_close(_item(ms[0])[1][:, 0],
                               torch.cat([_item(m[0])[0][-6:, -1], _item(m[0])[1][:, -1]]))
    v1 = synthetic(features="S", target="v1")
    torch.testing.assert_close(_item(v1[0])[0][:, 0], _item(m[0])[0][:, 1])
    with pytest.raises(ValueError, match="target 'x' is not a column of 'synthetic'"):
        synthetic(features="S", target="x")

    for features, c_in, c_out in (("M", 7, 7), ("S", 1, 1), ("MS", 7, 1)):
        dm = LTSFDataModule(synthetic=True, seq_len=24, pred_len=12, label_len=4, features=features,
                            synthetic_length=600, seed=3, batch_size=5)
        b = next(iter(dm.test_dataloader()))
        x, y = b["x"], torch.cat([b["y_known"], b["y"]], 1)
        assert dm.num_variates == c_in and x.shape == (5, 24, c_in) and y.shape == (5, 16, c_out)
        assert b["mean"].shape == b["std"].shape == (5, c_out)  # the target's scaler statistics
        ref = synthetic(seed=3, features=features, label_len=4)
        torch.testing.assert_close(x[0], _item(ref[0])[0])
    assert not torch.allclose(synthetic(seed=3).data, m.data)


# ------------------------------------------------------------------------------------------------ _utils helpers
def test_verify_file_and_roots(tmp_path, monkeypatch):
    import hashlib

    from hoformer.data import default_data_root, verify_file

    f = tmp_path / "blob.bin"
    f.write_bytes(b"hoformer")
    md5 = hashlib.md5(b"hoformer").hexdigest()
    assert verify_file(f, md5=md5.upper()) == f  # hex digests compare case-insensitively
    with pytest.raises(ChecksumError, match=f"expected {'0' * 32}, got {md5} \\(size 8 bytes\\)"):
        verify_file(f, md5="0" * 32)
    with pytest.raises(FileNotFoundError, match="nope.bin: file not found. fetch it"):
        verify_file(tmp_path / "nope.bin", hint="fetch it")
    monkeypatch.delenv("HOFORMER_DATA", raising=False)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert default_data_root() is None  # no ../shared/data next to the working directory
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert default_data_root() == tmp_path / "shared" / "data"
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "elsewhere"))
    assert default_data_root() == tmp_path / "elsewhere"


def test_download_url_keeps_verified_file_and_overwrites(tmp_path):
    import hashlib

    from hoformer.data import download_url

    src = tmp_path / "src.bin"
    src.write_bytes(b"new contents")
    dest = tmp_path / "out" / "f.bin"
    dest.parent.mkdir()
    dest.write_bytes(b"old contents")
    missing = (tmp_path / "missing.bin").as_uri()
    old_md5 = hashlib.md5(b"old contents").hexdigest()
    assert download_url(missing, dest, md5=old_md5) == dest  # verified and kept: nothing fetched
    with pytest.raises(ChecksumError, match="overwrite=True"):
        download_url(missing, dest, md5="0" * 32)
    download_url(src.as_uri(), dest, md5=hashlib.md5(b"new contents").hexdigest(), overwrite=True)
    assert dest.read_bytes() == b"new contents" and sorted(p.name for p in dest.parent.iterdir()) == ["f.bin"]


def test_failed_download_closes_its_temporary_file(tmp_path, monkeypatch):
    import os
    import tempfile

    from hoformer.data import _utils

    fds, real_mkstemp = [], tempfile.mkstemp

    def mkstemp(*a, **k):
        fd, name = real_mkstemp(*a, **k)
        fds.append(fd)
        return fd, name

    monkeypatch.setattr(_utils.tempfile, "mkstemp", mkstemp)
    with pytest.raises(OSError, match="could not download"):
        _utils.download_url((tmp_path / "absent.bin").as_uri(), tmp_path / "d" / "x.bin")
    (fd,) = fds
    with pytest.raises(OSError):  # EBADF: the descriptor was closed
        os.fstat(fd)
    assert list((tmp_path / "d").iterdir()) == []


# ------------------------------------------------------------------------------------------- DDP evaluation share
def test_trainer_eval_sampler_shares(monkeypatch):
    """Under a DDP Trainer's loader build each rank gets a disjoint, unpadded, in-order share; otherwise ``None``
    (plain in-order loader): a direct call, a 1-process Trainer next to a stale process group, a split smaller than
    the world, an iterable dataset."""
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    from hoformer import compat

    class T:
        def __init__(self, world_size):
            self.world_size = world_size

    ds = TensorDataset(torch.arange(7))
    monkeypatch.setattr(compat.dist, "is_available", lambda: True)
    monkeypatch.setattr(compat.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(compat.dist, "get_world_size", lambda: 3)
    assert compat.trainer_eval_sampler(ds, T(3)) is None  # not inside Lightning's loader build: whole split
    monkeypatch.setattr(DataLoader, "__old__init__", DataLoader.__init__, raising=False)
    shares = []
    for rank in range(3):
        monkeypatch.setattr(compat.dist, "get_rank", lambda rank=rank: rank)
        shares.append(list(compat.trainer_eval_sampler(ds, T(3))))
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]  # == range(rank, n, world): every window exactly once
    assert compat.trainer_eval_sampler(ds, T(1)) is None  # a 1-device Trainer ignores a leftover process group
    assert compat.trainer_eval_sampler(ds, None) is None
    assert compat.trainer_eval_sampler(TensorDataset(torch.arange(2)), T(3)) is None  # fewer windows than ranks

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(5))

    assert compat.trainer_eval_sampler(Stream(), T(3)) is None
    monkeypatch.setattr(compat.dist, "is_initialized", lambda: False)
    assert compat.trainer_eval_sampler(ds, T(3)) is None


def test_write_synthetic_ltsf_csv_checks_num_variates(tmp_path):
    """num_variates sets the width of generic files, must match fixed-layout ones, and 0 is refused (it used to be
    read as "the dataset's width")."""
    path = write_synthetic_ltsf_csv(tmp_path / "ecl.csv", "electricity", n_rows=50, num_variates=4)
    assert path.read_text().splitlines()[0] == "date,0,1,2,OT"
    with pytest.raises(ValueError, match="`num_variates` must be an int >= 1 or None, got 0"):
        write_synthetic_ltsf_csv(tmp_path / "x.csv", "electricity", n_rows=50, num_variates=0)
    with pytest.raises(ValueError, match="ETTh1 has 7 variates, got num_variates=3"):
        write_synthetic_ltsf_csv(tmp_path / "y.csv", "ETTh1", num_variates=3)
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "y.csv").exists()
