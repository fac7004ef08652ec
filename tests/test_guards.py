"""Run guards: weights-only checkpoint reads under any environment, the non-finite stop, stale temp-file cleanup."""
from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl

from hoformer.models import create_model
from hoformer.train import ForecastingTask
from hoformer.checkpoint import read_checkpoint
from hoformer.train.guards import CleanStaleTempFiles, NonFiniteError, NonFiniteGuard
from hoformer.train.tasks import AtomicCheckpointIO

from _trainer import quiet_trainer

TINY = dict(seq_len=16, pred_len=8, num_variates=3, dim=16, num_heads=2, depth=1, patch_size=8)
SRC = str(Path(__file__).resolve().parents[1] / "src")


class _Data(pl.LightningDataModule):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4):
        super().__init__()
        self.ds, self.bs = TensorDataset(x, y), batch_size

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.bs)

    def val_dataloader(self):
        return DataLoader(self.ds, batch_size=self.bs)


def _data(n: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, 3, generator=g), torch.randn(n, 8, 3, generator=g)


class _Evil:
    """A pickle payload that writes a marker file when unpickled."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


# ------------------------------------------------------------------------------------ weights-only loading
def test_fit_refuses_a_pickle_payload_even_with_weights_only_forced_off(tmp_path, monkeypatch):
    """trainer.fit(model, dm, ckpt_path=evil.ckpt) on a trainer with hoformer's checkpoint IO, with
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (torch's pre-2.6 default; torch reads it at every ``torch.load``): the payload
    must not run."""
    marker, evil = tmp_path / "marker.txt", tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": _Evil(str(marker))}, evil)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, plugins=[AtomicCheckpointIO()],
                         default_root_dir=tmp_path)
    with pytest.raises(pickle.UnpicklingError, match=re.escape(str(evil))):
        trainer.fit(ForecastingTask(create_model("hot_forecaster", **TINY)), _Data(*_data()), ckpt_path=str(evil))
    assert not marker.exists(), "the checkpoint's pickle payload ran"
    # the control: torch's own default in this environment would have run it
    torch.load(evil)
    assert marker.exists()


def test_a_plain_trainer_restores_a_task_weights_only(tmp_path, monkeypatch):
    """A hoformer task given to a plain ``lightning.Trainer`` (default checkpoint IO, or a user's own IO) with
    ``fit / test(ckpt_path=evil.ckpt)`` under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: the payload must not run (the task
    installs the weights-only IO in ``setup``, before Lightning's restore)."""
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    class MyIO(TorchCheckpointIO):
        pass

    marker, evil = tmp_path / "marker.txt", tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "pytorch-lightning_version": "2.6.0", "payload": _Evil(str(marker))}, evil)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch reads it at every torch.load
    for name, plugins, run in [("default-fit", [], "fit"), ("default-test", [], "test"),
                               ("own-io", [MyIO()], "fit"), ("async-io", [AsyncCheckpointIO()], "fit")]:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, plugins=plugins,
                             default_root_dir=tmp_path)
        with pytest.raises(pickle.UnpicklingError):
            getattr(trainer, run)(ForecastingTask(create_model("hot_forecaster", **TINY)), _Data(*_data()),
                                  ckpt_path=str(evil))
        assert not marker.exists(), f"{name}: the checkpoint's pickle payload ran"
    # the control: torch's own default in this environment would have run it
    torch.load(evil)
    assert marker.exists()


def test_torch_load_is_called_only_by_the_checkpoint_reader():
    root = Path(SRC) / "hoformer"
    call = re.compile(r"(?<!`)torch\.load\(")  # a call, not a ``torch.load(...)`` in a docstring
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if call.search(p.read_text()))
    assert users == ["_io.py"], users  # hoformer._io.read_checkpoint, which hoformer.checkpoint exports


def test_every_torch_load_in_the_package_passes_weights_only_true():
    root = Path(SRC) / "hoformer"
    calls = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        start = 0
        while (i := text.find("torch.load(", start)) >= 0:
            depth, j = 0, i + len("torch.load")
            while True:  # the call's text up to its closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            calls.append((path.relative_to(root), text[i:j]))
            start = j
    assert calls, "no torch.load call found: the scan is broken"
    bad = [(str(p), c) for p, c in calls if "weights_only=True" not in c]
    assert not bad, bad


def test_atomic_checkpoint_io_loads_weights_only_and_refuses_weights_only_false(tmp_path):
    io, path = AtomicCheckpointIO(), tmp_path / "a.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "pytorch-lightning_version": "2.6", "epoch": 3}, path)
    assert io.load_checkpoint(path)["epoch"] == 3
    assert io.load_checkpoint(path, weights_only=True)["epoch"] == 3
    with pytest.raises(ValueError, match="weights_only"):
        io.load_checkpoint(path, weights_only=False)


def test_read_checkpoint_names_truncated_and_empty_files(tmp_path):
    good = tmp_path / "good.ckpt"
    torch.save({"w": torch.arange(1000.0)}, good)
    data = good.read_bytes()
    for name, content in (("half.ckpt", data[: len(data) // 2]), ("empty.ckpt", b""), ("text.ckpt", b"hello")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match="truncated") as e:
            read_checkpoint(tmp_path / name)
        assert name in str(e.value)
    assert torch.equal(read_checkpoint(good)["w"], torch.arange(1000.0))


# -------------------------------------------------------------------------------------------- non-finite
def test_nonfinite_inputs_stop_training_naming_step_batch_and_inputs(tmp_path):
    x, y = _data()
    x[9, 3, 1] = float("nan")  # batch index 2 with batch size 4
    task = ForecastingTask(create_model("hot_forecaster", **TINY))
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    before = {k: v.clone() for k, v in task.state_dict().items()}
    with pytest.raises(NonFiniteError) as e:
        trainer.fit(task, _Data(x, y))
    msg = str(e.value)
    assert "global step 2" in msg and "batch index 2" in msg and "inputs went non-finite" in msg
    assert "batch[0] (1 NaN" in msg
    assert trainer.global_step == 2  # two optimizer steps, none on the non-finite batch
    assert any(not torch.equal(before[k], v) for k, v in task.state_dict().items())
    assert all(torch.isfinite(v).all() for v in task.state_dict().values() if v.is_floating_point())


def test_nonfinite_weights_name_the_first_module(tmp_path):
    task = ForecastingTask(create_model("hot_forecaster", **TINY))
    first_linear = next(n for n, m in task.model.named_modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        task.model.get_submodule(first_linear).weight.fill_(float("inf"))
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    with pytest.raises(NonFiniteError) as e:
        trainer.fit(task, _Data(*_data()))
    msg = str(e.value)
    assert "global step 0" in msg and "batch index 0" in msg and "outputs went non-finite" in msg
    assert f"module {first_linear} (Linear)" in msg, msg


def test_nonfinite_guard_is_a_default_and_can_be_disabled(tmp_path):
    x, y = _data()
    x[0, 0, 0] = float("inf")
    task = ForecastingTask(create_model("hot_forecaster", **TINY))
    trainer = quiet_trainer(tmp_path, max_epochs=1, callbacks=[NonFiniteGuard(enabled=False)])
    trainer.fit(task, _Data(x, y))  # the user's disabled guard replaces the default one: trains on
    assert sum(isinstance(c, NonFiniteGuard) for c in trainer.callbacks) == 1
    assert trainer.global_step == 3


# --------------------------------------------------------------------------------------- stale temp files
def test_stale_checkpoint_temp_files_are_removed_at_the_next_start(tmp_path, capsys):
    ckdir = tmp_path / "ckpt"
    ckdir.mkdir()
    stale = [ckdir / ".best-epoch=0.ckpt.ab12_xyz.tmp", ckdir / ".last.ckpt.00000000.tmp"]
    keep = [ckdir / "notes.tmp", ckdir / ".best.ckpt.tmp", ckdir / ".model.safetensors.abcdefgh.tmp",
            ckdir / "best-epoch=0.ckpt"]
    for p in stale + keep:
        p.write_bytes(b"partial")
    ckpt = ModelCheckpoint(dirpath=ckdir, filename="last", enable_version_counter=False)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1, limit_val_batches=0, callbacks=[ckpt],
                            enable_checkpointing=True, plugins=[AtomicCheckpointIO()])
    trainer.fit(ForecastingTask(create_model("hot_forecaster", **TINY)), _Data(*_data()))
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in keep)
    assert sum(isinstance(c, CleanStaleTempFiles) for c in trainer.callbacks) == 1
    err = capsys.readouterr().err
    assert all(p.name in err for p in stale)


def test_pickle_is_refused_by_read_checkpoint_naming_the_file(tmp_path):
    marker, evil = tmp_path / "m", tmp_path / "evil.ckpt"
    torch.save({"x": _Evil(str(marker))}, evil)
    with pytest.raises(pickle.UnpicklingError, match="evil.ckpt"):
        read_checkpoint(evil)
    assert not marker.exists()
