"""Options of the HOT models and of the forecasting task: the attention settings reachable from a config, the
reference forecaster's architecture options and preset, joint-horizon training, and the teacher-forcing hook."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from hoformer.models import HoformerModel
from hoformer.train import ForecastingTask

from _trainer import quiet_trainer

F64 = torch.float64


# ------------------------------------------------------------------------------------------ teacher forcing
class _TeacherForced(HoformerModel):
    """A per-step linear map; ``teacher_forced`` predicts each target step from the previous one (its own training
    targets, of another shape than ``model(x)``'s).

    Args:
        seq_len: lookback.
        pred_len: horizon.
        num_variates: variates.
    """

    def __init__(self, seq_len: int = 8, pred_len: int = 4, num_variates: int = 2) -> None:
        super().__init__()
        self.seq_len, self.pred_len, self.num_variates = seq_len, pred_len, num_variates
        self.lin = torch.nn.Linear(seq_len, pred_len)
        self.scale = torch.nn.Parameter(torch.tensor(0.5))
        self.calls: list[str] = []

    def forward(self, x):
        self.calls.append("forward")
        return self.lin(x.transpose(1, 2)).transpose(1, 2)

    def teacher_forced(self, x, y):
        self.calls.append("teacher_forced")
        seq = torch.cat([x, y], 1)  # (B, L + S, C)
        return self.scale * seq[:, :-1], seq[:, 1:]

    def example_inputs(self, batch_size: int = 2):
        return (torch.randn(batch_size, self.seq_len, self.num_variates),), {}


def _batch(b=3, seq_len=8, pred_len=4, c=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(b, seq_len, c, generator=g), "y": torch.randn(b, pred_len, c, generator=g)}


def test_teacher_forced_model_trains_on_its_own_targets_and_evaluates_with_forward():
    model = _TeacherForced()
    task = ForecastingTask(model, plot_variates=0)
    batch = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        model.calls.clear()
        loss = task.training_step(batch, 0)
        assert model.calls == ["teacher_forced"]
        pred, target = model.teacher_forced(batch["x"], batch["y"])
        torch.testing.assert_close(loss, F.mse_loss(pred, target))
        loss.backward()
        assert model.scale.grad is not None and model.lin.weight.grad is None  # only teacher_forced's graph
        model.calls.clear()
        val = task.validation_step(batch, 0)
        assert model.calls == ["forward"]
        torch.testing.assert_close(val, F.mse_loss(model(batch["x"]), batch["y"]))


def test_teacher_forced_fit_and_test_run(tmp_path):
    data = [_batch(seed=s) for s in range(4)]
    loader = DataLoader(data, batch_size=None)
    task = ForecastingTask(_TeacherForced(), plot_variates=0)
    trainer = quiet_trainer(tmp_path, max_epochs=1)
    trainer.fit(task, loader, loader)
    (res,) = trainer.test(task, loader, verbose=False)
    assert set(res) >= {"test/mse", "test/mae", "test/loss"}


def test_teacher_forced_rejects_masked_targets_and_mismatched_shapes():
    model = _TeacherForced()
    task = ForecastingTask(model, plot_variates=0)
    batch = _batch()
    with pytest.raises(ValueError, match="y_mask"):
        task.training_step({**batch, "y_mask": torch.ones_like(batch["y"], dtype=torch.bool)}, 0)
    model.teacher_forced = lambda x, y: (x, y)
    with pytest.raises(ValueError, match="teacher_forced.*different shapes"):
        task.training_step(batch, 0)
