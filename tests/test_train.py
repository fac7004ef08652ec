"""Training: 1-epoch fits (real data when present), metrics against naive references, exact resume, DDP agreement,
atomic checkpoints, save_pretrained export."""
from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset, TensorDataset

from hoformer.train import Optimization
from hoformer.models import create_model
from hoformer.data import LTSFDataModule, MedMNIST3DDataModule, MultispectralDataModule
from hoformer.models import from_pretrained
from hoformer.train import ClassificationTask, ForecastingTask, SegmentationTask
from hoformer.train.tasks import AtomicCheckpointIO, ExportPretrained

from _trainer import quiet_trainer

TINY_FC = dict(dim=16, num_heads=2, depth=1, patch_size=8)


class _DM(pl.LightningDataModule):
    """Fixed datasets, no shuffling (used by the metric reference tests)."""

    def __init__(self, test_ds, batch_size):
        super().__init__()
        self.test_ds, self.bs = test_ds, batch_size

    def test_dataloader(self):
        return DataLoader(self.test_ds, batch_size=self.bs)


# ------------------------------------------------------------------------------------------ 1-epoch fits
def test_fit_one_epoch_real_etth1(data_root, tmp_path):
    dm = LTSFDataModule(root=str(data_root / "ltsf"), name="ETTh1", seq_len=96, pred_len=24, batch_size=32,
                        eval_batch_size=256)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=96, pred_len=24, num_variates=7, **TINY_FC)),
                           optim=Optimization(lr=1e-3, weight_decay=0.1), original_scale=True)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/mae", mode="min", save_last=True)
    export = ExportPretrained()
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=8, limit_val_batches=2, limit_test_batches=2,
                       logger=CSVLogger(tmp_path), callbacks=[ckpt, export], plugins=[AtomicCheckpointIO()],
                       enable_checkpointing=True)
    trainer.fit(task, dm)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert Path(ckpt.best_model_path).is_file() and (tmp_path / "ckpt" / "last.ckpt").is_file()
    (res,) = trainer.test(task, dm, ckpt_path="best", verbose=False)
    for k in ("test/mse", "test/mae", "test/smape", "test/mse_orig", "test/mae_orig", "test/loss"):
        assert np.isfinite(res[k]), k
    assert res["test/mse_orig"] > res["test/mse"]  # ETTh1 raw scale is larger than the standardised one
    assert Path(task.forecast_plot_path).is_file() and Path(task.forecast_plot_path).suffix == ".png"
    metrics_csv = Path(trainer.logger.log_dir) / "metrics.csv"
    assert "val/mae" in metrics_csv.read_text().splitlines()[0]
    exported = from_pretrained(export.path)
    for (k, v), (k2, v2) in zip(task.model.state_dict().items(), exported.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)


def test_fit_one_epoch_real_adrenalmnist3d(data_root, tmp_path):
    dm = MedMNIST3DDataModule(root=str(data_root / "medmnist3d"), flag="adrenal", batch_size=16)
    task = ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=2, dim=16, num_heads=2, depth=1,
                                                            patch_size=7)),
                              optim=Optimization(lr=1e-3, weight_decay=0.1))
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=4, limit_val_batches=2)
    trainer.fit(task, dm)
    m = trainer.callback_metrics
    assert torch.isfinite(m["train/loss_epoch"])
    changed = [k for k, v in task.model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before), "some weights were not trained"
    # the logged validation metrics are those of the trained model on the first two validation batches
    task.eval()
    probs, labels = [], []
    with torch.no_grad():
        for i, (x, y) in enumerate(dm.val_dataloader()):
            if i == 2:
                break
            probs.append(task.model(x).softmax(-1)[:, 1])
            labels.append(y.view(-1))
    p, y = torch.cat(probs).double(), torch.cat(labels)
    pos, neg = p[y == 1], p[y == 0]
    auc = ((pos[:, None] > neg[None]).double() + 0.5 * (pos[:, None] == neg[None]).double()).mean()
    assert float(m["val/auc"]) == pytest.approx(float(auc), abs=1e-6)
    assert float(m["val/acc"]) == pytest.approx(float(((p > 0.5).long() == y).double().mean()), abs=1e-6)


def test_fit_one_epoch_synthetic_segmentation(tmp_path):
    dm = MultispectralDataModule(root=str(tmp_path / "ssl4eo"), product="nlcd", synthetic=True, synthetic_n=8,
                                 synthetic_size=32, crop_size=None, batch_size=4)
    task = SegmentationTask(create_model("hot_segmenter", **dict(in_channels=7, num_classes=17, input_size=32, dim=16, num_heads=2,
                                                  depth=1, patch_size=8)),
                            optim=Optimization(lr=1e-3, weight_decay=0.1))
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(task, dm)
    (res,) = trainer.test(task, dm, verbose=False)
    # pixel accuracy and mIoU (mean over classes present in the predictions or the labels) by hand
    task.eval()
    with torch.no_grad():
        pairs = [(task.model(x).argmax(1), y) for x, y in dm.test_dataloader()]
    pred, y = torch.cat([p.flatten() for p, _ in pairs]), torch.cat([t.flatten() for _, t in pairs])
    assert res["test/acc"] == pytest.approx((pred == y).double().mean().item(), abs=1e-6)
    ious = [((pred == c) & (y == c)).sum().item() / ((pred == c) | (y == c)).sum().item()
            for c in range(17) if ((pred == c) | (y == c)).any()]
    assert res["test/miou"] == pytest.approx(float(np.mean(ious)), abs=1e-6)


# ----------------------------------------------------------------------------- metrics vs naive references
def test_forecasting_metrics_score_every_window(tmp_path):
    """Epoch metrics over uneven batches equal MSE/MAE/SMAPE over all test windows (nothing dropped)."""
    dm = LTSFDataModule(synthetic=True, synthetic_length=700, seq_len=32, pred_len=8, batch_size=8,
                        eval_batch_size=8)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                           original_scale=True, plot_variates=0)
    (res,) = quiet_trainer(tmp_path).test(task, dm, verbose=False)
    ds = dm.dataset("test")
    assert len(ds) % 8 != 0  # a ragged last batch
    with torch.no_grad():
        x = torch.stack([ds[i]["x"] for i in range(len(ds))]).double()
        y = torch.stack([ds[i]["y"] for i in range(len(ds))]).double()
        p = task.model.eval().double()(x)
    err = p - y
    smape = (2 * err.abs() / (p.abs() + y.abs()).clamp_min(1.17e-6)).mean()
    assert res["test/mse"] == pytest.approx(err.pow(2).mean().item(), rel=1e-5)
    assert res["test/mae"] == pytest.approx(err.abs().mean().item(), rel=1e-5)
    assert res["test/smape"] == pytest.approx(smape.item(), rel=1e-4)
    po, yo = dm.scaler.inverse_transform(p.numpy()), dm.scaler.inverse_transform(y.numpy())
    assert res["test/mse_orig"] == pytest.approx(float(((po - yo) ** 2).mean()), rel=1e-4)


@pytest.mark.parametrize("features, label_len", [("MS", 0), ("M", 16), ("MS", 16)])
def test_forecasting_task_follows_tslib_for_ms_and_label_len(tmp_path, features, label_len):
    """features="MS" scores the last output variate (the target); with label_len > 0 the known steps come apart
    (``y_known``) and only the horizon ``y`` is scored."""
    from hoformer.data import write_synthetic_ltsf_csv

    write_synthetic_ltsf_csv(tmp_path / "custom.csv", "electricity", 600, num_variates=4)  # date,0,1,2,OT
    dm = LTSFDataModule(root=str(tmp_path), name="custom.csv", seq_len=32, pred_len=8, batch_size=8, eval_batch_size=64,
                        features=features, label_len=label_len)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=4, **TINY_FC)),
                           plot_variates=0)
    (res,) = quiet_trainer(tmp_path).test(task, dm, verbose=False)
    ds = dm.dataset("test")
    with torch.no_grad():
        x = torch.stack([ds[i]["x"] for i in range(len(ds))])
        y = torch.stack([ds[i]["y"] for i in range(len(ds))])
        p = task.model.eval()(x)
    assert y.shape[1] == 8 and y.shape[2] == (1 if features == "MS" else 4)
    assert ds[0].get("y_known", torch.zeros(0, y.shape[2])).shape == (label_len, y.shape[2])
    ref = (p[..., -y.shape[2]:] - y).pow(2).mean()
    assert res["test/mse"] == pytest.approx(ref.item(), rel=1e-5)


def test_forecasting_task_rejects_a_horizon_mismatch(tmp_path):
    """A model whose pred_len differs from the datamodule's is an error, not silently re-sliced."""
    dm = LTSFDataModule(synthetic=True, synthetic_length=400, seq_len=32, pred_len=16, batch_size=8)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                           plot_variates=0)
    with pytest.raises(ValueError, match=r"model output .* != target"):
        quiet_trainer(tmp_path).test(task, dm, verbose=False)


def _naive_auc(score, y):
    pos, neg = score[y == 1], score[y == 0]
    wins = sum(float(p > n) + 0.5 * float(p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("num_classes", [2, 3])
def test_classification_metrics_match_naive(tmp_path, num_classes):
    torch.manual_seed(0)
    x, y = torch.rand(37, 1, 8, 8, 8), torch.arange(37) % num_classes
    task = ClassificationTask(create_model("hot_volume_classifier", **dict(input_size=8, patch_size=4, num_classes=num_classes,
                                                            dim=16, num_heads=2, depth=1)))
    (res,) = quiet_trainer(tmp_path).test(task, _DM(TensorDataset(x, y[:, None]), 5), verbose=False)
    with torch.no_grad():
        prob = task.model.eval()(x).softmax(-1)
    acc = (prob.argmax(-1) == y).float().mean().item()
    if num_classes == 2:
        auc = _naive_auc(prob[:, 1], y)
    else:  # MedMNIST: macro average of one-vs-rest AUCs
        auc = np.mean([_naive_auc(prob[:, c], (y == c).long()) for c in range(num_classes)])
    assert res["test/acc"] == pytest.approx(acc, abs=1e-6)
    assert res["test/auc"] == pytest.approx(auc, abs=1e-5)


def test_image_tasks_need_a_model_with_classes():
    """The metric size comes from the model (every image model sets ``num_classes``); a model without classes is
    named in the error instead of an AttributeError."""
    for task in (ClassificationTask, SegmentationTask):
        with pytest.raises(TypeError, match=f"{task.__name__}: model 'hot_forecaster' has no `num_classes`"):
            task(create_model("hot_forecaster", seq_len=16, pred_len=8, num_variates=2, dim=16, num_heads=2, depth=1))


def test_segmentation_metrics_match_naive(tmp_path):
    torch.manual_seed(0)
    k = 5
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, k, (6, 16, 16))
    task = SegmentationTask(create_model("hot_segmenter", **dict(in_channels=3, num_classes=k, input_size=16, patch_size=4, dim=16,
                                                  num_heads=2, depth=1)))
    (res,) = quiet_trainer(tmp_path).test(task, _DM(TensorDataset(x, y), 4), verbose=False)
    with torch.no_grad():
        pred = task.model.eval()(x).argmax(1)
    ious = []
    for c in range(k):
        inter, union = ((pred == c) & (y == c)).sum().item(), ((pred == c) | (y == c)).sum().item()
        if union:
            ious.append(inter / union)
    assert res["test/acc"] == pytest.approx((pred == y).float().mean().item(), abs=1e-6)
    assert res["test/miou"] == pytest.approx(float(np.mean(ious)), abs=1e-5)


# ------------------------------------------------------------------------------------------ resume / io
class _Interrupt(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            raise RuntimeError("simulated crash")


class _Mapped(Dataset):
    """``ds`` with ``fn(item)`` applied to every item (train-split wrappers of the tests below)."""

    def __init__(self, ds, fn):
        self.ds, self.fn = ds, fn

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.fn(self.ds[i])


def _augment(item):
    """Noise drawn from the global ``torch``, ``numpy`` and ``random`` RNGs, as a random train-time augmentation
    (MedMNIST3D ``flip_augment``, SSL4EO flips) does, in the main process or in a worker."""
    return {**item, "x": item["x"] + 0.1 * (float(torch.randn(())) + float(np.random.rand()) + random.random())}


class _AugmentedLTSF(LTSFDataModule):
    def _make_splits(self, names):
        out = super()._make_splits(names)
        return {**out, "train": _Mapped(out["train"], _augment)}


def _resume_run(tmp_path, callbacks, ckpt_path=None, augment=False, num_workers=0):
    pl.seed_everything(0, verbose=False)
    dm = (_AugmentedLTSF if augment else LTSFDataModule)(synthetic=True, synthetic_length=800, seq_len=32, pred_len=8,
                                                         batch_size=16, num_workers=num_workers)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, dropout=0.2, **TINY_FC)), optim=Optimization(lr=3e-3, warmup_steps=3, weight_decay=0.1), plot_variates=0)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = quiet_trainer(tmp_path, max_epochs=3, limit_train_batches=6, limit_val_batches=2,
                       callbacks=[ckpt, *callbacks], enable_checkpointing=True, plugins=[AtomicCheckpointIO()])
    trainer.fit(task, dm, ckpt_path=ckpt_path)
    return task


def _assert_resume_exact(tmp_path, **kw):
    ref = _resume_run(tmp_path / "a", [], **kw)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _resume_run(tmp_path / "b", [_Interrupt()], **kw)
    assert (tmp_path / "b" / "last.ckpt").is_file()
    resumed = _resume_run(tmp_path / "b", [], ckpt_path=str(tmp_path / "b" / "last.ckpt"), **kw)
    for (k, v), v2 in zip(ref.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(v, v2), f"{k} differs after resume"


def test_resume_is_exact(tmp_path):
    """A run killed after epoch 1 and resumed from last.ckpt ends with exactly the weights of an uninterrupted run
    (shuffling, dropout, optimizer and LR schedule all restored)."""
    _assert_resume_exact(tmp_path)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_is_exact_with_random_augmentation(tmp_path, num_workers):
    """Same with a random train-time augmentation drawn from the global RNGs, in the main process or in workers: the
    resumed epochs (the first one, whose iterator Lightning creates before ``on_train_epoch_start``, and the next)
    draw the same augmentations as the uninterrupted run."""
    _assert_resume_exact(tmp_path, augment=True, num_workers=num_workers)


class _Worsening(pl.LightningModule):
    """Logs a monitored metric that gets worse every epoch (whatever the mode), so only epoch 0 is ever "best"."""

    def __init__(self, monitor: str, mode: str):
        super().__init__()
        self.lin, self.monitor, self.sign = torch.nn.Linear(2, 1), monitor, 1.0 if mode == "min" else -1.0

    def training_step(self, batch, i):
        return self.lin(batch[0]).pow(2).mean()

    def validation_step(self, batch, i):
        self.log(self.monitor, self.sign * float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("rel", ["hot/ltsf/etth1_96_96_hot_product.yaml", "hot/ltsf_cpu/etth1_96_96_hot_product.yaml",
                                 "hot/medmnist3d/adrenal_hot_sum.yaml", "weaver/los_loop_t.yaml",
                                 "weaver/los_loop_cpu.yaml", "hoba/cpu_trec_teacher.yaml"])
def test_config_checkpoints_keep_last_ckpt_at_the_last_epoch(rel, tmp_path, monkeypatch, data_root):
    """The checkpoint callbacks of the committed configs (given there, or added by the CLI from the task's model
    selection metric) write ``last.ckpt`` after *every* epoch (the resume point), also when the monitored metric
    stops improving: Lightning >= 2.6 writes ``save_last`` only together with a new top-k checkpoint, which left
    ``last.ckpt`` at the best epoch (a resume lost every epoch after it). The best-validation checkpoint is still the
    first checkpoint callback (what ``--ckpt_path best`` and the export read)."""
    from hoformer.cli import HoformerCLI
    from hoformer.config import expand_configs
    from lightning.pytorch.callbacks import EarlyStopping

    monkeypatch.chdir(tmp_path)  # the configs' runs/... paths are relative
    cfg = expand_configs(["--config", str(Path(__file__).resolve().parents[1] / "configs" / rel)])
    extra = ["--data.train_limit=300"] if rel.startswith("hoba") else []
    built = HoformerCLI(args=[*cfg, *extra, "--trainer.logger=false"], run=False).trainer.callbacks
    callbacks = [c for c in built if isinstance(c, (ModelCheckpoint, EarlyStopping))]
    ckpts = [c for c in callbacks if isinstance(c, ModelCheckpoint)]
    best = ckpts[0] if ckpts[0].monitor else None
    monitor = best.monitor if best else "val/acc"
    dl = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    trainer = pl.Trainer(max_epochs=3, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, plugins=[AtomicCheckpointIO()])
    trainer.fit(_Worsening(monitor, best.mode if best else "max"), dl, dl)
    last = [c for c in ckpts if c.last_model_path or c.filename == "last"]
    (path,) = {Path(c.dirpath) / "last.ckpt" for c in last}
    assert torch.load(path, weights_only=False)["epoch"] == 2  # the end of the last epoch, not the best one
    if best is not None:
        assert trainer.checkpoint_callback is best and Path(best.best_model_path).name.startswith("best-")
        assert torch.load(best.best_model_path, weights_only=False)["epoch"] == 0


def test_atomic_checkpoint_never_torn(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "model.ckpt"
    old = os.umask(0o022)
    try:
        io.save_checkpoint({"w": torch.ones(3)}, path)
        assert path.stat().st_mode & 0o777 == 0o644  # a plain file's permissions, not mkstemp's 0o600
        path.chmod(0o640)
        io.save_checkpoint({"w": torch.ones(3)}, path)
        assert path.stat().st_mode & 0o777 == 0o640  # an existing file keeps its permissions
    finally:
        os.umask(old)

    def crash(obj, f, *a, **k):
        Path(f).write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]  # no temporary left behind


# ------------------------------------------------------------------------------------------------ DDP
_DDP_SCRIPT = textwrap.dedent("""
    import json, sys, torch, lightning.pytorch as pl
    from hoformer.data import LTSFDataModule
    from hoformer.models import create_model
    from hoformer.train import ForecastingTask, Optimization
    from hoformer.train.tasks import SavePredictions

    class Count(pl.Callback):  # windows scored on this rank by trainer.validate / trainer.test
        def __init__(self):
            self.n = {"validate": 0, "test": 0}

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if trainer.state.fn == "validate":
                self.n["validate"] += len(batch["x"])

        def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            self.n["test"] += len(batch["x"])

    out, devices = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    # the stock datamodule: 136 training windows, one batch per step (68 per rank under DDP), so every step averages
    # the gradient over all of them whatever order the samplers deal them in; 19 validation and 43 test windows in
    # batches of 7 (DDP: 22 + 21 test windows, 4 + 3 batches)
    dm = LTSFDataModule(synthetic=True, synthetic_length=251, seq_len=32, pred_len=8, batch_size=136 // devices,
                        eval_batch_size=7)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, dim=16, num_heads=2,
                           depth=1, patch_size=8, dropout=0.0)), optim=Optimization(lr=3e-3, weight_decay=0.1),
                           original_scale=True, plot_variates=0)
    count = Count()
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                         max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[count, SavePredictions(out)])
    trainer.fit(task, dm)
    res = {"fit": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}}
    (res["validate"],) = trainer.validate(task, dm, verbose=False)
    (res["test"],) = trainer.test(task, dm, verbose=False)
    res["scored"] = count.n
    res["split_len"] = {"validate": len(dm.dataset("val")), "test": len(dm.dataset("test"))}
    res["direct_call_len"] = len(dm.test_dataloader().sampler)  # outside the trainer: the whole split on every rank
    trainer.predict(task, dm, return_predictions=False)  # SavePredictions: the test split, rank 0 writes it in order
    with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
        json.dump(res, f)
    if trainer.is_global_zero:
        torch.save(task.model.state_dict(), f"{out}/weights.pt")
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_match_single_process(tmp_path, monkeypatch):
    """The stock datamodule and task on 2 gloo DDP processes: the trained weights, the validation metrics of fit,
    validate and test and the saved predictions (one file, dataset order) equal one process's, and every validation /
    test window (odd counts, uneven batches per rank) is scored exactly once across the ranks."""
    import runpy

    script = tmp_path / "ddp_run.py"
    script.write_text(_DDP_SCRIPT)
    for devices in (1, 2):
        (tmp_path / f"d{devices}").mkdir()
    with monkeypatch.context() as m:  # one process: the script run in this one
        m.setattr(sys, "argv", [str(script), str(tmp_path / "d1"), "1"])
        m.setenv("PL_GLOBAL_SEED", "0")  # (seed_everything's; restored afterwards)
        runpy.run_path(str(script), run_name="__main__")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "PL_DISABLE_FORK": "1"}
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "d2"), "2"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    one = json.loads((tmp_path / "d1" / "rank0.json").read_text())
    ranks = [json.loads((tmp_path / "d2" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert one["split_len"] == {"validate": 19, "test": 43}  # odd: a padded DistributedSampler would repeat a window
    for stage, n in one["split_len"].items():
        assert one["scored"][stage] == n
        assert sorted(r["scored"][stage] for r in ranks) == [n // 2, n - n // 2]  # disjoint, unpadded shares
    assert [r["direct_call_len"] for r in ranks] == [43, 43]
    for stage in ("fit", "validate", "test"):
        assert one[stage] and one[stage].keys() == ranks[0][stage].keys(), stage
        for k, v in one[stage].items():
            assert ranks[0][stage][k] == pytest.approx(v, rel=1e-5), f"{stage}: {k}"
            assert ranks[1][stage][k] == ranks[0][stage][k], f"{stage}: {k} differs between ranks"
    # predict: one file in dataset order (not rank-interleaved shares written per rank)
    assert sorted(p.name for p in (tmp_path / "d2").glob("predictions*")) == ["predictions.pt"]
    p1, p2 = (torch.load(tmp_path / d / "predictions.pt", weights_only=True) for d in ("d1", "d2"))
    assert p1.shape == (43, 8, 7)
    torch.testing.assert_close(p2, p1, rtol=1e-3, atol=1e-4)
    w1, w2 = (torch.load(tmp_path / d / "weights.pt", weights_only=True) for d in ("d1", "d2"))
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=f"{k} differs between DDP and 1 process")
    pl.seed_everything(0, verbose=False)  # same initial weights as the scripts
    init = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, dim=16, num_heads=2, depth=1,
                                                  patch_size=8, dropout=0.0))).model.state_dict()
    assert max((w1[k] - init[k]).abs().max().item() for k in w1) > 1e-3  # training really moved the weights


# ------------------------------------------------------------------------------------ optimizer and schedule
class _RecordLR(pl.Callback):
    """Learning rate of every optimizer step (read before the step) and the optimizers used."""

    def __init__(self):
        self.lrs = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append([g["lr"] for g in trainer.optimizers[0].param_groups])


def _fit_for_schedule(tmp_path, **optim):
    dm = LTSFDataModule(synthetic=True, synthetic_length=300, seq_len=32, pred_len=8, batch_size=16)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                           optim=Optimization(**optim), plot_variates=0)
    rec = _RecordLR()
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_train_batches=4, limit_val_batches=0, callbacks=[rec])
    trainer.fit(task, dm)
    return task, trainer, rec.lrs


def test_adamw_groups_and_cosine_warmup_schedule(tmp_path):
    """AdamW with the task's lr / betas / weight decay (none on biases and norms) and, per optimizer step s of T:
    lr * (s + 1) / W during warm-up, then lr * (r + (1 - r) (1 + cos(pi (s - W) / (T - W))) / 2)."""
    import math

    lr, warm, r, total = 2e-3, 3, 0.1, 8
    task, trainer, lrs = _fit_for_schedule(tmp_path, lr=lr, weight_decay=0.3, betas=(0.8, 0.95),
                                           warmup_steps=warm, min_lr_ratio=r)
    (opt,) = trainer.optimizers
    assert isinstance(opt, torch.optim.AdamW)
    ref = [lr * (s + 1) / warm if s < warm else
           lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))) for s in range(total)]
    assert len(lrs) == total
    for s, (got, want) in enumerate(zip(lrs, ref)):
        assert got == pytest.approx([want, want], rel=1e-12), f"step {s}"
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in task.model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == {n for n, p in task.model.named_parameters() if p.ndim >= 2}
    assert {names[id(p)] for p in no_decay["params"]} == {n for n, p in task.model.named_parameters() if p.ndim < 2}
    assert any(n.endswith(".bias") for n in map(names.get, map(id, no_decay["params"])))
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.3, 0.0)
    assert decay["betas"] == no_decay["betas"] == (0.8, 0.95)
    assert decay["initial_lr"] == lr


def test_constant_schedule(tmp_path):
    _, _, lrs = _fit_for_schedule(tmp_path / "a", lr=1e-3, schedule="constant", warmup_steps=2)
    assert [g[0] for g in lrs] == pytest.approx([5e-4] + [1e-3] * 7, rel=1e-12)
    _, trainer, lrs = _fit_for_schedule(tmp_path / "b", lr=1e-3, schedule="constant")
    assert [g[0] for g in lrs] == [1e-3] * 8 and trainer.lr_scheduler_configs == []
    with pytest.raises(ValueError, match="`schedule` must be 'cosine', 'constant' or 'exponential', got 'step'"):
        Optimization(lr=2e-4, schedule="step", weight_decay=0.1)
    with pytest.raises(ValueError, match="`loss` must be 'mse' or 'mae', got 'huber'"):
        ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                        loss="huber")


class _Indexed(Dataset):
    """Records the order in which the training windows are fetched."""

    def __init__(self, ds, log):
        self.ds, self.log = ds, log

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        self.log.append(int(i))
        return self.ds[i]


def test_epoch_shuffle_is_drawn_from_seed_and_epoch(tmp_path):
    """Epoch e shuffles with its own generator seeded from (seed, e), so orders differ between epochs and seeds and
    do not depend on how much of the global RNG was used before (model init, other callbacks)."""
    log: list[int] = []

    class DM(LTSFDataModule):
        def _make_splits(self, names):
            out = super()._make_splits(names)
            return {**out, "train": _Indexed(out["train"], log)}

    def run(seed, burn=0):
        log.clear()
        pl.seed_everything(seed, verbose=False)
        torch.rand(burn)
        dm = DM(synthetic=True, synthetic_length=300, seq_len=32, pred_len=8, batch_size=64)
        task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)), plot_variates=0)
        quiet_trainer(tmp_path, max_epochs=3, limit_val_batches=0).fit(task, dm)
        n = len(dm.dataset("train"))
        assert len(log) == 3 * n
        return [log[e * n:(e + 1) * n] for e in range(3)], n

    orders, n = run(5)
    for e, order in enumerate(orders):
        seed = (5 + 1_000_003 * (e + 1)) % (2**31 - 1)
        assert order == torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist(), f"epoch {e}"
    assert orders[0] != orders[1] != orders[2]
    assert run(5, burn=17)[0] == orders
    assert run(6)[0][0] != orders[0]


def test_epoch_seed_follows_torch_manual_seed_without_seed_everything(monkeypatch):
    """A Python-API user who seeds with torch.manual_seed(s) (no seed_everything, so no PL_GLOBAL_SEED) gets
    per-epoch seeds from s: different s, different shuffles / dropout / augmentations; the same s, the same ones."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)))
    seeds = []
    for s in (1, 2, 1):
        torch.manual_seed(s)
        seeds.append(task._epoch_seed())
    assert seeds[0] != seeds[1] and seeds[0] == seeds[2]
    monkeypatch.setenv("PL_GLOBAL_SEED", "5")  # seed_everything's seed wins
    assert task._epoch_seed() == (5 + 1_000_003) % (2**31 - 1)


def test_cosine_schedule_needs_a_bounded_run(tmp_path):
    dm = LTSFDataModule(synthetic=True, synthetic_length=300, seq_len=32, pred_len=8, batch_size=64)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)))
    with pytest.raises(ValueError, match=r"schedule='cosine' decays over the whole run, which needs a finite trainer "
                                         r"`max_epochs` or `max_steps`"):  # was an OverflowError from int(inf)
        quiet_trainer(tmp_path, max_epochs=-1, limit_val_batches=0).fit(task, dm)


# -------------------------------------------------------------------------------------- losses and options
def _all_windows(ds):
    return (torch.stack([ds[i]["x"] for i in range(len(ds))]).double(),
            torch.stack([ds[i]["y"] for i in range(len(ds))]).double())


@pytest.mark.parametrize("loss", ["mse", "mae"])
def test_forecasting_loss_and_original_scale_metrics(tmp_path, loss):
    """The logged loss is the chosen criterion over every test window; ``*_orig`` metrics are computed on the
    inverse-transformed (original-scale) forecasts; the forecast plot shows the first test window."""
    dm = LTSFDataModule(synthetic=True, synthetic_length=700, seq_len=32, pred_len=8, batch_size=8,
                        eval_batch_size=16)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                           loss=loss, original_scale=True, plot_variates=0)
    (res,) = quiet_trainer(tmp_path).test(task, dm, verbose=False)
    x, y = _all_windows(dm.dataset("test"))
    with torch.no_grad():
        p = task.model.eval().double()(x)
    err = p - y
    want = err.pow(2).mean() if loss == "mse" else err.abs().mean()
    assert res["test/loss"] == pytest.approx(want.item(), rel=1e-5)
    mean, std = torch.from_numpy(dm.scaler.mean), torch.from_numpy(dm.scaler.std)
    err_orig = (p * std + mean) - (y * std + mean)  # by hand: x * std + mean per variate
    assert res["test/mae_orig"] == pytest.approx(err_orig.abs().mean().item(), rel=1e-5)
    assert res["test/mse_orig"] == pytest.approx(err_orig.pow(2).mean().item(), rel=1e-5)
    xs, ys, ps = task._plot_sample
    torch.testing.assert_close(xs.double(), x[0])
    torch.testing.assert_close(ys.double(), y[0])
    torch.testing.assert_close(ps.double(), p[0], rtol=1e-4, atol=1e-5)


def _ce_naive(logits, y, eps):
    """Cross-entropy with label smoothing by explicit loops (float64)."""
    total = 0.0
    for row, t in zip(logits.double().tolist(), y.tolist()):
        m = max(row)
        lse = m + np.log(sum(np.exp(v - m) for v in row))
        logp = [v - lse for v in row]
        total += -(1 - eps) * logp[t] - eps / len(row) * sum(logp)
    return total / len(y)


def test_classification_label_smoothing_loss(tmp_path):
    torch.manual_seed(1)
    x, y = torch.rand(13, 1, 8, 8, 8), torch.arange(13) % 3
    task = ClassificationTask(create_model("hot_volume_classifier", **dict(input_size=8, patch_size=4, num_classes=3, dim=16,
                                                            num_heads=2, depth=1)), label_smoothing=0.2)
    (res,) = quiet_trainer(tmp_path).test(task, _DM(TensorDataset(x, y[:, None]), 13), verbose=False)
    with torch.no_grad():
        logits = task.model.eval()(x)
    assert res["test/loss"] == pytest.approx(_ce_naive(logits, y, 0.2), rel=1e-5)
    assert abs(_ce_naive(logits, y, 0.2) - _ce_naive(logits, y, 0.0)) > 1e-3  # the smoothing matters here


@pytest.mark.parametrize("ignore", [255, 0])
def test_segmentation_ignore_index(tmp_path, ignore):
    """``ignore_index`` pixels are left out of the loss, the pixel accuracy and the IoUs; an ignored class inside
    [0, K) is not averaged into the mIoU. Masks may come as (B, 1, H, W)."""
    torch.manual_seed(0)
    k = 4
    x, y = torch.randn(5, 3, 16, 16), torch.randint(0, k, (5, 16, 16))
    y[:, :5] = ignore
    task = SegmentationTask(create_model("hot_segmenter", **dict(in_channels=3, num_classes=k, input_size=16, patch_size=4, dim=16,
                                                  num_heads=2, depth=1)), ignore_index=ignore)
    (res,) = quiet_trainer(tmp_path).test(task, _DM(TensorDataset(x, y[:, None]), 2), verbose=False)
    with torch.no_grad():
        logits = task.model.eval()(x).double()
    pred = logits.argmax(1)
    valid = y != ignore
    logp = logits.log_softmax(1)
    ious = []
    for c in range(k):
        if c == ignore:
            continue
        inter = ((pred == c) & (y == c) & valid).sum().item()
        union = (((pred == c) | (y == c)) & valid).sum().item()
        if union:
            ious.append(inter / union)
    # the epoch loss: mean over the batches (2, 2, 1 samples, weighted by size) of the mean NLL of valid pixels
    per_batch = [np.mean([-logp[b, y[b, i, j], i, j].item() for b in range(lo, hi) for i in range(16)
                          for j in range(16) if valid[b, i, j]]) for lo, hi in ((0, 2), (2, 4), (4, 5))]
    assert res["test/loss"] == pytest.approx((2 * per_batch[0] + 2 * per_batch[1] + per_batch[2]) / 5, rel=1e-5)
    assert res["test/acc"] == pytest.approx(((pred == y) & valid).sum().item() / valid.sum().item(), abs=1e-6)
    assert res["test/miou"] == pytest.approx(float(np.mean(ious)), abs=1e-6)


# ------------------------------------------------------------------------------------------- predict / export
def test_predictions_written_in_order(tmp_path):
    """``SavePredictions`` writes one tensor over every predict batch, in dataset order: class probabilities,
    label maps and forecasts of the model."""
    from hoformer.train.tasks import SavePredictions

    torch.manual_seed(0)
    x3 = torch.rand(11, 1, 8, 8, 8)
    x2 = torch.randn(7, 3, 16, 16)
    cases = [  # the reference: the model's float32 outputs, softmax in float64 / argmax
        (ClassificationTask(create_model("hot_volume_classifier", **dict(input_size=8, patch_size=4, num_classes=3, dim=16,
                                                          num_heads=2, depth=1))),
         TensorDataset(x3, torch.zeros(11, 1, dtype=torch.long)), lambda m: m(x3).double().softmax(-1)),
        (SegmentationTask(create_model("hot_segmenter", **dict(in_channels=3, num_classes=5, input_size=16, patch_size=4, dim=16,
                                                num_heads=2, depth=1))),
         TensorDataset(x2, torch.zeros(7, 16, 16, dtype=torch.long)), lambda m: m(x2).argmax(1)),
    ]
    for i, (task, ds, ref) in enumerate(cases):
        writer = SavePredictions(str(tmp_path / f"p{i}"))

        class DM(pl.LightningDataModule):
            def predict_dataloader(self):
                return DataLoader(ds, batch_size=4)  # 4 + 4 + 3 / 4 + 3: a ragged last batch

        quiet_trainer(tmp_path, callbacks=[writer]).predict(task, DM(), return_predictions=False)
        got = torch.load(writer.path, weights_only=True)
        with torch.no_grad():
            want = ref(task.model.eval())
        assert got.shape == want.shape
        if want.is_floating_point():
            torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
            torch.testing.assert_close(got.double().sum(-1), torch.ones(len(ds), dtype=torch.float64))
        else:
            assert torch.equal(got, want)


class _FakeScore(pl.Callback):
    """Logs ``score`` = epoch, so with ``mode="min"`` the first epoch's checkpoint stays the best one."""

    def on_validation_epoch_end(self, trainer, pl_module):
        pl_module.log("score", float(trainer.current_epoch))


def _fit_with_export(tmp_path, monitor: str, extra_callback, max_epochs: int, limit_train_batches: int):
    """A tiny synthetic forecaster fitted with ``extra_callback`` (one or a list), a best-by-``monitor`` ModelCheckpoint and
    ExportPretrained -> ``(task, checkpoint callback, export callback)``."""
    dm = LTSFDataModule(synthetic=True, synthetic_length=300, seq_len=32, pred_len=8, batch_size=16)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                           optim=Optimization(lr=1e-2, weight_decay=0.1), plot_variates=0)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor=monitor, mode="min")
    export = ExportPretrained(str(tmp_path / "pretrained"))
    trainer = quiet_trainer(tmp_path, max_epochs=max_epochs, limit_train_batches=limit_train_batches, limit_val_batches=1,
                       num_sanity_val_steps=0, enable_checkpointing=True,
                       callbacks=[*(extra_callback if isinstance(extra_callback, list) else [extra_callback]), ckpt, export])
    trainer.fit(task, dm)
    return task, ckpt, export


def test_export_pretrained_uses_the_best_checkpoint(tmp_path):
    task, ckpt, export = _fit_with_export(tmp_path, "score", _FakeScore(), max_epochs=2, limit_train_batches=3)
    assert Path(ckpt.best_model_path).name.startswith("epoch=0")
    best = torch.load(ckpt.best_model_path, weights_only=True)["state_dict"]
    exported = from_pretrained(export.path).state_dict()
    assert exported.keys() == {k[len("model."):] for k in best}
    for k, v in exported.items():
        assert torch.equal(v, best[f"model.{k}"]), k
    assert any(not torch.equal(v, task.model.state_dict()[k]) for k, v in exported.items())  # not the last weights


def test_ema_weights_are_checkpointed_validated_and_exported(tmp_path):
    """Lightning's EMAWeightAveraging (the `ema` variants of benchmarks/paper_configs.py VARIANTS): the best checkpoint's
    ``state_dict`` holds the averaged weights (the raw ones go to ``current_model_state``), and ExportPretrained
    exports the averaged ones."""
    from lightning.pytorch.callbacks import EMAWeightAveraging

    _, ckpt, export = _fit_with_export(tmp_path, "val/mae", EMAWeightAveraging(decay=0.5), max_epochs=1,
                                       limit_train_batches=4)
    saved = torch.load(ckpt.best_model_path, weights_only=True)
    raw, avg = saved["current_model_state"], saved["state_dict"]
    assert any(not torch.equal(avg[k], raw[k]) for k in avg if k.startswith("model."))
    for k, v in from_pretrained(export.path).state_dict().items():
        assert torch.equal(v, avg[f"model.{k}"]), k


def _with_worker_seed(item):
    """The window plus the torch seed of the process that loaded it (a worker: base seed + worker id)."""
    return {**item, "seed": torch.tensor(torch.initial_seed())}


def test_worker_seeds_are_drawn_from_seed_and_epoch(tmp_path):
    """Each epoch's worker base seed comes from the loader's own generator seeded from (seed, epoch) + 1, as
    DataLoader draws it (``int64.random_(generator)``); worker ``i`` then seeds torch with base + i."""
    seen = []

    class DM(LTSFDataModule):
        def _make_splits(self, names):
            out = super()._make_splits(names)
            return {**out, "train": _Mapped(out["train"], _with_worker_seed)}

    class Grab(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(int(batch["seed"][0]))

    pl.seed_everything(3, verbose=False)
    dm = DM(synthetic=True, synthetic_length=300, seq_len=32, pred_len=8, batch_size=8, num_workers=1)
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                           plot_variates=0)
    quiet_trainer(tmp_path, max_epochs=2, limit_train_batches=1, limit_val_batches=0, callbacks=[Grab()]).fit(task, dm)
    want = [torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(
        (3 + 1_000_003 * (e + 1)) % (2**31 - 1) + 1)).item() for e in range(2)]
    assert seen == want


def test_out_of_range_labels_name_the_problem():
    """A label >= num_classes (or < 0) is a dataset / config mismatch: a clear error naming num_classes, not an
    IndexError from inside cross_entropy (a device-side assert on CUDA); ignore_index pixels stay allowed."""
    torch.manual_seed(0)
    cls = ClassificationTask(create_model("hot_volume_classifier", **dict(input_size=8, patch_size=4, num_classes=3, dim=16,
                                                           num_heads=2, depth=1)))
    x = torch.rand(2, 1, 8, 8, 8)
    for bad in (3, -1):
        with pytest.raises(ValueError, match=rf"ClassificationTask: labels must lie in \[0, num_classes=3\).*\[{bad}\]"):
            cls.shared_step((x, torch.tensor([[0], [bad]])), "train")
    assert torch.isfinite(cls.shared_step((x, torch.tensor([[0], [2]])), "train"))
    assert torch.isfinite(cls.shared_step((x, torch.tensor([0, 2], dtype=torch.uint8)), "train"))
    # one-hot / multi-label rows were read as their first column (in range, so silently wrong labels)
    with pytest.raises(ValueError, match=r"ClassificationTask: labels must be \(B,\) or \(B, 1\) class ids for a "
                                         r"batch of 2, got shape \(2, 3\)"):
        cls.shared_step((x, torch.tensor([[0, 0, 1], [1, 0, 0]])), "train")
    with pytest.raises(TypeError, match=r"ClassificationTask: labels must be integer class ids.*torch.float32"):
        cls.shared_step((x, torch.tensor([0.9, 2.0])), "train")  # was truncated to [0, 2]
    seg = SegmentationTask(create_model("hot_segmenter", **dict(in_channels=3, num_classes=5, input_size=16, patch_size=4, dim=16,
                                                 num_heads=2, depth=1)), ignore_index=255)
    x = torch.randn(2, 3, 16, 16)
    y = torch.randint(0, 5, (2, 16, 16))
    y[0, :4] = 255  # ignored pixels are fine
    assert torch.isfinite(seg.shared_step((x, y), "train"))
    with pytest.raises(TypeError, match=r"SegmentationTask: labels must be integer class ids"):
        seg.shared_step((x, y.float()), "train")
    y[1, 3, 3] = 17
    with pytest.raises(ValueError, match=r"SegmentationTask: labels must lie in \[0, num_classes=5\) \(or "
                                         r"ignore_index=255\), got 1 label\(s\) outside it, values \[17\]"):
        seg.shared_step((x, y), "train")


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_fit_and_test_in_bf16(tmp_path, precision):
    """Lightning's bf16 precisions (the usual GPU setting; bf16 runs on CPU too): a few training steps and a test
    epoch of the forecasting and segmentation tasks give finite losses and metrics, with gradient clipping;
    mixed precision keeps fp32 master weights."""
    cases = [
        (ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                         optim=Optimization(lr=1e-3, weight_decay=0.1), plot_variates=0),
         LTSFDataModule(synthetic=True, synthetic_length=400, seq_len=32, pred_len=8, batch_size=8)),
        (SegmentationTask(create_model("hot_segmenter", **dict(in_channels=7, num_classes=17, input_size=32, dim=16, num_heads=2,
                                                depth=1, patch_size=8)), optim=Optimization(lr=1e-3, weight_decay=0.1)),
         MultispectralDataModule(root=str(tmp_path / "ssl4eo"), product="nlcd", synthetic=True, synthetic_n=8,
                                 synthetic_size=32, crop_size=None, batch_size=4)),
    ]
    for task, dm in cases:
        trainer = quiet_trainer(tmp_path, max_steps=3, limit_val_batches=1, precision=precision,
                                gradient_clip_val=1.0)
        trainer.fit(task, dm)
        assert torch.isfinite(trainer.callback_metrics["train/loss"])
        # Lightning refuses clipping with a fused step under mixed precision: the default then keeps the plain one
        assert trainer.optimizers[0].defaults["fused"] is (precision != "bf16-mixed")
        (res,) = trainer.test(task, dm, verbose=False)
        assert res and all(np.isfinite(v) for v in res.values()), res
        want = torch.float32 if precision == "bf16-mixed" else torch.bfloat16
        assert {p.dtype for p in task.parameters()} == {want}


def test_compile_model_callback_trains_like_eager_and_keeps_checkpoints_plain(tmp_path):
    """CompileModel (backend aot_eager: no C++ toolchain) compiles the model in place: a fit gives the eager fit's
    weights (same seed), checkpoints and the export keep the plain state-dict keys, and EMA (which deep-copies the
    module) works on top of it."""
    import torch._dynamo
    from lightning.pytorch.callbacks import EMAWeightAveraging

    from hoformer.train import CompileModel

    with pytest.raises(ValueError, match="`backend` must be one of"):
        CompileModel(backend="nope")

    saved = {}
    for name, cb in (("compiled", [CompileModel(backend="aot_eager")]), ("eager", [])):
        torch._dynamo.reset()
        pl.seed_everything(0)
        task, ckpt, export = _fit_with_export(tmp_path / name, "val/mae", [*cb, EMAWeightAveraging(decay=0.5)],
                                              max_epochs=1, limit_train_batches=3)
        saved[name] = torch.load(ckpt.best_model_path, weights_only=True)
        for states in ("state_dict", "current_model_state"):  # the averaged weights, the raw ones
            assert all(k.startswith("model.") and "_orig_mod" not in k for k in saved[name][states])
        assert from_pretrained(export.path).state_dict().keys() == task.model.state_dict().keys()
        assert (task.model._compiled_call_impl is not None) == (name == "compiled")
        assert (task.example_input_array is None) == (name == "compiled")  # no batch-1 summary graph to compile
    for states in ("current_model_state", "state_dict"):
        for k, v in saved["eager"][states].items():
            torch.testing.assert_close(saved["compiled"][states][k], v, rtol=1e-4, atol=1e-5, msg=f"{states}: {k}")
    torch._dynamo.reset()
    state = saved["compiled"]  # EMA on top of the compiled model: the checkpoint holds the average
    assert any(not torch.equal(state["state_dict"][k], state["current_model_state"][k]) for k in state["state_dict"])


def test_compile_model_resolves_fallback_random_per_device(monkeypatch):
    """Inductor on CPU gets ``fallback_random`` (a ``mode`` spelled out as its options, since torch.compile refuses
    mode + options); accelerators, other backends, an explicit choice and user options that set it are left alone;
    ``setup`` compiles for the strategy's device."""
    from types import SimpleNamespace

    from torch._inductor import list_mode_options

    from hoformer.train import CompileModel

    kw = CompileModel.compile_kwargs
    assert kw("cpu") == dict(backend="inductor", mode=None, fullgraph=False, dynamic=None,
                             options={"fallback_random": True})
    assert kw("cpu", mode="max-autotune")["options"] == {**list_mode_options("max-autotune"), "fallback_random": True}
    assert kw("cpu", mode="max-autotune")["mode"] is None
    assert kw("cpu", options={"epilogue_fusion": False})["options"] == {"epilogue_fusion": False,
                                                                       "fallback_random": True}
    plain = dict(backend="inductor", mode="max-autotune", fullgraph=False, dynamic=None, options=None)
    assert kw("cuda", mode="max-autotune") == plain
    assert kw(torch.device("cpu"), mode="max-autotune", fallback_random=False) == plain
    assert kw("cuda", fallback_random=True)["options"] == {"fallback_random": True}
    assert kw("cpu", backend="aot_eager")["options"] is None
    assert kw("cpu", options={"fallback_random": False})["options"] == {"fallback_random": False}
    with pytest.raises(TypeError, match="`fallback_random` must be a bool or None"):
        CompileModel(fallback_random="yes")

    seen = {}
    task = SimpleNamespace(model=torch.nn.Linear(2, 2))
    monkeypatch.setattr(task.model, "compile", lambda **k: seen.update(k))
    for device, want in (("cpu", {"fallback_random": True}), ("cuda", None)):
        trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
        CompileModel().setup(trainer, task, "fit")
        assert seen["options"] == want, device


@pytest.mark.slow  # an Inductor C++ build (tens of seconds); the CPU arguments it relies on: the test above
@pytest.mark.skipif(not any(map(shutil.which, ("c++", "g++", "clang++"))), reason="Inductor needs a C++ compiler")
def test_compile_model_inductor_on_cpu_draws_eager_dropout_masks():
    """What ``fallback_random`` is for: compiled with CompileModel's CPU arguments (Inductor), a dropout model's
    training forward and gradients equal eager ones from the same seed (Inductor's own generated random numbers give
    other masks: outputs ~1 apart on this case)."""
    import copy

    import torch._dynamo

    from hoformer.models import create_model
    from hoformer.train import CompileModel

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = create_model("hot_forecaster", seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1, num_heads=2,
                         patch_size=4, dropout=0.3).train()
    (x,), _ = eager.example_inputs(batch_size=4)
    compiled = copy.deepcopy(eager)
    compiled.compile(**CompileModel.compile_kwargs("cpu"))
    runs = []
    for model in (eager, compiled):
        torch.manual_seed(1)
        y = model(x)
        y.pow(2).mean().backward()
        runs.append((y.detach(), [p.grad for p in model.parameters()]))
    torch._dynamo.reset()
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=1e-5, atol=1e-5)
    for g_compiled, g_eager in zip(runs[1][1], runs[0][1]):
        torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-5)


def test_atomic_checkpoint_io_refuses_storage_options(tmp_path):
    from hoformer.train.tasks import AtomicCheckpointIO

    with pytest.raises(TypeError, match="storage_options"):
        AtomicCheckpointIO().save_checkpoint({"a": 1}, tmp_path / "x.ckpt", storage_options={"compress": True})
    assert not (tmp_path / "x.ckpt").exists()


def test_compile_model_setup_passes_an_explicit_fallback_random(monkeypatch):
    """An explicit ``fallback_random`` overrides the per-device default in ``setup``: off on CPU, on for a GPU; and
    ``compile_kwargs`` itself refuses ``mode`` with ``options`` like the constructor."""
    from types import SimpleNamespace

    from hoformer.train import CompileModel

    seen = {}
    task = SimpleNamespace(model=torch.nn.Linear(2, 2))
    monkeypatch.setattr(task.model, "compile", lambda **k: seen.update(k))
    for device, choice, want in (("cpu", False, None), ("cuda", True, {"fallback_random": True})):
        trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
        CompileModel(fallback_random=choice).setup(trainer, task, "fit")
        assert seen["options"] == want, (device, choice)
    with pytest.raises(ValueError, match="give `mode` or `options`, not both"):
        CompileModel.compile_kwargs("cpu", mode="max-autotune", options={"epilogue_fusion": False})


def _tiny_hot_tasks() -> list:
    """One tiny task of each HOT kind: forecasting, 3D classification, segmentation."""
    return [
        ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC))),
        ClassificationTask(create_model("hot_volume_classifier", **dict(input_size=8, patch_size=4, num_classes=3, dim=16,
                                                         num_heads=2, depth=1))),
        SegmentationTask(create_model("hot_segmenter", **dict(in_channels=3, num_classes=5, input_size=16, patch_size=4, dim=16,
                                               num_heads=2, depth=1))),
    ]


def test_predict_step_takes_a_bare_input_tensor():
    """A predict batch may be the input tensor itself (no labels), an ``(x, y)`` pair or an ``{"x", "y"}`` dict:
    the same predictions for every task."""
    torch.manual_seed(0)
    for task in _tiny_hot_tasks():
        task.eval()
        (x,), _ = task.model.example_inputs(batch_size=3)
        y = torch.zeros(3, dtype=torch.long)
        with torch.no_grad():
            bare = task.predict_step(x, 0)
            for batch in ((x, y), [x, y], {"x": x, "y": y}):
                assert torch.equal(task.predict_step(batch, 0), bare), type(task).__name__


def test_original_scale_metrics_come_from_the_batch_statistics(tmp_path):
    """The ``*_orig`` metrics use the scaler statistics each batch carries (``y * std + mean``), nothing else: a
    loader whose batches carry twice the ``std`` doubles the original-scale MAE, and leaves the normalised one."""
    from torch.utils.data import DataLoader

    dm = LTSFDataModule(synthetic=True, synthetic_length=400, seq_len=32, pred_len=8)
    ds = dm.dataset("test")
    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)),
                           original_scale=True, plot_variates=0)

    def doubled(items):
        batch = torch.utils.data.default_collate(items)
        return {**batch, "std": 2 * batch["std"]}

    (plain,) = quiet_trainer(tmp_path).test(task, DataLoader(ds, batch_size=16), verbose=False)
    (twice,) = quiet_trainer(tmp_path).test(task, DataLoader(ds, batch_size=16, collate_fn=doubled), verbose=False)
    assert twice["test/mae"] == pytest.approx(plain["test/mae"], rel=1e-6)
    assert twice["test/mae_orig"] == pytest.approx(2 * plain["test/mae_orig"], rel=1e-5)
    x = torch.stack([ds[i]["x"] for i in range(len(ds))]).double()
    y = torch.stack([ds[i]["y"] for i in range(len(ds))]).double()
    with torch.no_grad():
        p = task.model.eval().double()(x)
    std = torch.from_numpy(dm.scaler.std)
    assert plain["test/mae_orig"] == pytest.approx(((p - y) * std).abs().mean().item(), rel=1e-5)


def test_every_task_gives_lightning_a_one_sample_input():
    """``example_input_array`` is one sample of the model's own ``example_inputs``: Lightning's model summary lists
    input / output sizes and the FLOPs of a forward (it printed "Total FLOPs: 0"), and the summary's forward leaves
    the model in training mode."""
    from lightning.pytorch.utilities.model_summary import ModelSummary

    from hoformer.train.text import TextClassificationTask
    from hoformer.train.traffic import TrafficForecastingTask

    tasks = _tiny_hot_tasks() + [
        TextClassificationTask(create_model("hoba_classifier", **dict(vocab_size=100, num_classes=2, max_len=32, dim=16,
                                                       num_heads=2, depth=1))),
        TrafficForecastingTask(create_model("weaver", **dict(num_nodes=5, dim=16, num_heads=4))),
    ]
    for task in tasks:
        name = type(task).__name__
        x = task.example_input_array
        first = x if isinstance(x, torch.Tensor) else next(iter(x.values() if isinstance(x, dict) else x))
        assert first.shape[0] == 1, name
        summary = ModelSummary(task, max_depth=1)
        assert summary.total_flops > 0, name
        assert summary.in_sizes[0] != "?" and summary.out_sizes[0] != "?", name
        assert task.model.training, name
    kw = dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)
    draws = []
    for build in (lambda: create_model("hot_forecaster", **kw),
                  lambda: ForecastingTask(create_model("hot_forecaster", **kw))):
        torch.manual_seed(0)
        build()
        draws.append(torch.rand(3))
    torch.testing.assert_close(draws[1], draws[0])  # the random example input does not move the global RNG



# ------------------------------------------------------------------------------ tasks depend on batches only
def _traffic_dm(tmp_path):
    from hoformer.data import TrafficDataModule

    rng = np.random.default_rng(0)
    values = rng.uniform(20, 70, (400, 5)).round(1)
    values[rng.random(values.shape) < 0.1] = 0.0  # missing readings
    pd = pytest.importorskip("pandas")
    speed = tmp_path / "traffic" / "los_speed.csv"
    speed.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(values, columns=[str(i) for i in range(5)]).to_csv(speed, index=False)
    pd.DataFrame(np.eye(5)).to_csv(tmp_path / "traffic" / "los_adj.csv", index=False, header=False)
    return TrafficDataModule("los_loop", root=str(tmp_path / "traffic"), verify=False, batch_size=16,
                             eval_batch_size=32)


def _task_and_data(kind, tmp_path, data_root):
    from hoformer.train import TrafficForecastingTask

    if kind == "forecasting":
        dm = LTSFDataModule(synthetic=True, synthetic_length=500, seq_len=32, pred_len=8, batch_size=16,
                            eval_batch_size=32)
        return lambda: ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, **TINY_FC)), original_scale=True, plot_variates=0), dm, 16, 32
    if kind == "traffic":
        return lambda: TrafficForecastingTask(create_model("weaver", **dict(num_nodes=5, dim=16, num_heads=4))), \
            _traffic_dm(tmp_path), 16, 32
    if kind == "text":
        from hoformer.data import TextDataModule
        from hoformer.train import TextClassificationTask

        dm = TextDataModule("trec", root=str(data_root / "text"), max_len=32, batch_size=16, eval_batch_size=64,
                            vocab_size=600, train_limit=400, tokenizer_dir=str(tmp_path / "tok"))
        model = dict(vocab_size=dm.vocab_size, pad_id=dm.pad_id, max_len=dm.max_len, num_classes=dm.num_classes,
                     dim=16, num_heads=2, depth=1, attention="hoba", block_size=8)
        return lambda: TextClassificationTask(create_model("hoba_classifier", **model)), dm, 16, 64
    if kind == "classification":
        dm = MedMNIST3DDataModule(root=str(data_root / "medmnist3d"), flag="adrenal", batch_size=16,
                                  eval_batch_size=64)
        return lambda: ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=2, dim=16, num_heads=2, depth=1,
                                                                        patch_size=7)),
                                          optim=Optimization(lr=1e-3, weight_decay=0.1)), dm, 16, 64
    dm = MultispectralDataModule(root=str(tmp_path / "ssl4eo"), product="nlcd", synthetic=True, synthetic_n=8,
                                 synthetic_size=32, crop_size=None, batch_size=4, flip=False)
    return lambda: SegmentationTask(create_model("hot_segmenter", **dict(in_channels=7, num_classes=17, input_size=32, dim=16,
                                                          num_heads=2, depth=1, patch_size=8)),
                                    optim=Optimization(lr=1e-3, weight_decay=0.1)), dm, 4, 4


@pytest.mark.parametrize("kind", ["forecasting", "traffic", "classification", "segmentation", "text"])
def test_tasks_train_and_test_on_plain_dataloaders(kind, tmp_path, data_root):
    """A task needs its batches only: trained and tested on plain ``DataLoader``s over the library's datasets, it
    logs the same metrics (original-scale ones included) as through the datamodule."""
    make, dm, bs, ebs = _task_and_data(kind, tmp_path, data_root)
    limits = dict(max_epochs=1, limit_train_batches=6, limit_val_batches=3, limit_test_batches=3)

    def run(train, val, test):
        pl.seed_everything(7, verbose=False)
        task = make()
        trainer = quiet_trainer(tmp_path, **limits)
        trainer.fit(task, train_dataloaders=train, val_dataloaders=val, datamodule=None) if dm is not train \
            else trainer.fit(task, datamodule=dm)
        fit = {k: float(v) for k, v in trainer.callback_metrics.items()}
        (res,) = trainer.test(task, test, verbose=False) if dm is not test else trainer.test(task, datamodule=dm,
                                                                                             verbose=False)
        return fit, res

    via_dm = run(dm, dm, dm)
    dm.setup()
    sets = dm.datasets  # built by setup() (a traffic datamodule's `dataset` is its name)
    collate = dm.collate_fn("train")  # the batch format's collate function (text: padding), None: PyTorch's default
    plain = run(DataLoader(sets["train"], batch_size=bs, shuffle=True, collate_fn=collate),
                DataLoader(sets["val"], batch_size=ebs, collate_fn=collate),
                DataLoader(sets["test"], batch_size=ebs, collate_fn=collate))
    assert via_dm[0].keys() == plain[0].keys() and via_dm[1].keys() == plain[1].keys()
    for got, want in zip(plain, via_dm):
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-7), k
    if kind in ("forecasting", "traffic"):  # original-scale metrics are among them
        assert any(k.endswith("_orig") or k.startswith("test/mae") for k in via_dm[1])


def test_train_imports_no_analysis_module():
    """Layering: the training tasks draw their forecast PNG with the shared figure primitives (hoformer._plot), not
    through hoformer.analysis."""
    import re

    root = Path(__file__).resolve().parents[1] / "src" / "hoformer" / "train"
    pattern = re.compile(r"^\s*(from|import)\s+(hoformer\.analysis|\.\.analysis)", re.M)
    offenders = [p.name for p in root.rglob("*.py") if pattern.search(p.read_text())]
    assert not offenders, offenders


# ------------------------------------------------------------------------------ restoring onto other data / models
class _SignedData(pl.LightningDataModule):
    """Tiny windowed series (lookback 16, horizon 8, 3 variates) whose ``data_signature()`` is ``signature``."""

    def __init__(self, signature: dict, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.ds = TensorDataset(torch.randn(8, 16, 3, generator=g), torch.randn(8, 8, 3, generator=g))
        self.signature = signature

    def data_signature(self) -> dict:
        return dict(self.signature)

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=4)

    def val_dataloader(self):
        return DataLoader(self.ds, batch_size=4)

    test_dataloader = val_dataloader


def _tiny_task(**kw):
    return ForecastingTask(create_model("hot_forecaster", seq_len=16, pred_len=8, num_variates=3,
                                        **{**TINY_FC, **kw}))


@pytest.fixture(scope="module")
def signed_ckpt(tmp_path_factory):
    """A one-step fit on data signed {"file": "a.csv", "num_variates": 3}: its last checkpoint."""
    root = tmp_path_factory.mktemp("signed")
    trainer = quiet_trainer(root, max_steps=1, enable_checkpointing=True, num_sanity_val_steps=0,
                            callbacks=[ModelCheckpoint(dirpath=root, filename="last")])
    trainer.fit(_tiny_task(), _SignedData({"file": "a.csv", "num_variates": 3}))
    return root / "last.ckpt"


def test_a_checkpoint_records_its_data_and_refuses_other_data(signed_ckpt, tmp_path):
    from hoformer.checkpoint import DATA_SIGNATURE_KEY, load_checkpoint

    assert torch.load(signed_ckpt, weights_only=True)[DATA_SIGNATURE_KEY] == {"file": "a.csv", "num_variates": 3}
    assert load_checkpoint(signed_ckpt)[1]["data_signature"] == {"file": "a.csv", "num_variates": 3}
    other = _SignedData({"file": "b.csv", "num_variates": 3})
    with pytest.raises(ValueError, match=r"trained on other data.*file.*'a.csv'.*'b.csv'.*allow_data_mismatch"):
        quiet_trainer(tmp_path).test(_tiny_task(), other, ckpt_path=signed_ckpt, verbose=False)
    task = _tiny_task()
    task.allow_data_mismatch = True  # told to: a warning, and the test runs
    with pytest.warns(UserWarning, match="differ"):
        (m,) = quiet_trainer(tmp_path).test(task, other, ckpt_path=signed_ckpt, verbose=False)
    assert "test/mse" in m
    # the same data: no word
    (m,) = quiet_trainer(tmp_path).test(_tiny_task(), _SignedData({"file": "a.csv", "num_variates": 3}),
                                        ckpt_path=signed_ckpt, verbose=False)
    assert "test/mse" in m


def test_restoring_a_checkpoint_of_another_model_configuration_names_the_difference(signed_ckpt, tmp_path):
    data = _SignedData({"file": "a.csv", "num_variates": 3})
    with pytest.raises(ValueError, match=r"does not fit this run's model.*dim=16 vs 32"):
        quiet_trainer(tmp_path, max_steps=2).fit(_tiny_task(dim=32), data, ckpt_path=signed_ckpt)


def test_forecast_and_analyze_refuse_a_checkpoint_on_other_data(signed_ckpt):
    """hoformer forecast / analyze build the checkpoint's datamodule through checkpoint_datamodule, which refuses
    data whose signature differs (--allow-data-mismatch: a warning)."""
    from hoformer.checkpoint import load_checkpoint
    from hoformer.inference import checkpoint_datamodule

    _, info = load_checkpoint(signed_ckpt)
    other = {"signature": {"file": "b.csv", "num_variates": 4}}
    with pytest.raises(ValueError, match=r"last.ckpt.*trained on other data.*num_variates.*3.*4.*--allow-data-mis"):
        checkpoint_datamodule(info, data="test_train._SignedData", data_args=other,
                              override="pass --allow-data-mismatch")
    with pytest.warns(UserWarning, match="num_variates"):
        checkpoint_datamodule(info, data="test_train._SignedData", data_args=other, allow_data_mismatch=True)
    same = {"signature": {"file": "a.csv", "num_variates": 3}}
    assert checkpoint_datamodule(info, data="test_train._SignedData", data_args=same).signature == same["signature"]


def test_warmup_ratio_is_a_fraction_of_the_run_and_a_warmup_longer_than_the_run_is_warned_about():
    """A fixed warm-up longer than a small run (123 steps of a 114-step run) never lets the learning rate peak; a
    warmup_ratio scales with the run."""
    from hoformer.train.optim import configure_optimization

    def lrs(opt, total):
        out = configure_optimization(opt, torch.nn.Linear(2, 2), total)
        sched, rates = out["lr_scheduler"]["scheduler"], []
        for _ in range(total):
            rates.append(sched.get_last_lr()[0])
            out["optimizer"].step()
            sched.step()
        return rates

    rates = lrs(Optimization(lr=1.0, warmup_ratio=0.1), 114)
    assert max(rates) == pytest.approx(1.0) and rates.index(max(rates)) == 10  # 11 warm-up steps = 10 % of 114
    with pytest.warns(UserWarning, match=r"warmup_steps=123 is not shorter than the run \(114 optimiser steps\)"):
        assert max(lrs(Optimization(lr=1.0, warmup_steps=123), 114)) < 1.0
    with pytest.raises(ValueError, match="not both"):
        Optimization(warmup_steps=10, warmup_ratio=0.1)
    with pytest.raises(ValueError, match=r"`warmup_ratio` must be a fraction in \[0, 1\)"):
        Optimization(warmup_ratio=1.5)


def test_balanced_class_weights_are_printed(capsys):
    task = ClassificationTask(create_model("hot_volume_classifier", num_classes=2, input_size=8, patch_size=4, dim=16,
                                           depth=1, num_heads=2), class_weight="balanced")
    x = torch.zeros(8, 1, 8, 8, 8)
    y = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    w = task._count_balanced(DataLoader(TensorDataset(x, y), batch_size=4))
    assert w.tolist() == pytest.approx([8 / 12, 8 / 4])
    assert "class_weight='balanced': training label counts [6, 2] -> cross-entropy weights [0.6667, 2.0]" \
        in capsys.readouterr().err


def test_classification_can_select_its_best_checkpoint_on_balanced_accuracy():
    model = lambda: create_model("hot_volume_classifier", num_classes=2, input_size=8, patch_size=4, dim=16,  # noqa
                                 depth=1, num_heads=2)
    assert ClassificationTask(model()).selection == ("val/auc", "max")
    assert ClassificationTask(model(), select_on="val/bacc").selection == ("val/bacc", "max")
    with pytest.raises(ValueError, match="`select_on` must be"):
        ClassificationTask(model(), select_on="val/loss")


def test_a_run_off_a_terminal_prints_one_line_per_epoch_and_no_advertisement(tmp_path):
    """Without a progress bar on a terminal (a log file, CI), each training epoch prints one line; Lightning's
    advertising tip and its LeafSpec deprecation warning are not shown (a fresh process: pytest resets warnings)."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import lightning.pytorch as pl
        from lightning.pytorch.loggers import CSVLogger
        from test_train import _SignedData, _tiny_task
        pl.Trainer(default_root_dir={str(tmp_path)!r}, accelerator="cpu", devices=1, max_epochs=2,
                   logger=CSVLogger({str(tmp_path)!r}), num_sanity_val_steps=0).fit(_tiny_task(), _SignedData({{}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-W", "default", "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 2 and lines[0].startswith("epoch 0/1: ") and "train/loss" in lines[0] and "val/mae" in lines[0]
    assert "Tip" not in out.stderr + out.stdout and "LeafSpec" not in out.stderr, out.stderr[-2000:]


def test_callbacks_keep_the_class_paths_of_saved_configs():
    """The configs name the callbacks by their module (``hoformer.train.callbacks.ExportPretrained``,
    ``hoformer.train.checkpoint_io.AtomicCheckpointIO``); a config or run folder saved by 0.1.0 names them
    ``hoformer.train.tasks.X``, which stays the same class."""
    import hoformer.train as train
    import hoformer.train.callbacks as callbacks
    import hoformer.train.checkpoint_io as checkpoint_io
    import hoformer.train.tasks as tasks

    for name in ("ExportPretrained", "SavePredictions", "CompileModel", "checkpoint_callbacks"):
        assert getattr(tasks, name) is getattr(callbacks, name) is getattr(train, name), name
    for name in ("AtomicCheckpointIO", "install_checkpoint_io"):
        assert getattr(tasks, name) is getattr(checkpoint_io, name) is getattr(train, name), name
    configs = Path(__file__).resolve().parents[1] / "configs"
    named = {line.split("class_path:")[1].strip() for cfg in sorted(configs.rglob("*.yaml"))
             for line in cfg.read_text().splitlines() if "class_path: hoformer.train." in line}
    assert "hoformer.train.callbacks.ExportPretrained" in named and not any(".tasks." in c for c in named), named
