"""Class weighting and balanced accuracy of the classification tasks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

from hoformer.models import create_model
from hoformer.train import ClassificationTask
from hoformer.train.class_balance import BalancedAccuracy, balanced_class_weights, count_labels

from _trainer import quiet_trainer

VOL = dict(input_size=8, patch_size=4, dim=16, num_heads=2, depth=1)


class _DM(pl.LightningDataModule):
    def __init__(self, x, y, bs=8):
        super().__init__()
        self.ds, self.bs = TensorDataset(x, y), bs

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.bs, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.ds, batch_size=self.bs)

    test_dataloader = val_dataloader


def _naive_balanced_accuracy(pred, y):
    return sum(((pred == y) & (y == c)).sum().item() / (y == c).sum().item() for c in y.unique()) / len(y.unique())


@pytest.mark.parametrize("num_classes,present", [(2, 2), (3, 2), (4, 3)])
def test_balanced_accuracy_is_the_mean_recall_over_present_classes(num_classes, present):
    """Binary (scores of the positive class) and multi-class; a class that never occurs (``present <
    num_classes``) is left out of the mean."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, present, (50,), generator=g)
    assert len(y.unique()) == present
    scores = torch.randn(50, num_classes, generator=g)
    m = BalancedAccuracy(num_classes)
    for i in range(0, 50, 7):
        m.update(scores[i:i + 7] if num_classes > 2 else scores[i:i + 7].softmax(-1)[:, 1], y[i:i + 7])
    pred = scores.argmax(-1)
    assert m.compute().item() == pytest.approx(_naive_balanced_accuracy(pred, y), abs=1e-6)
    assert _naive_balanced_accuracy(pred, y) != pytest.approx((pred == y).float().mean().item())  # not accuracy
    majority = BalancedAccuracy(num_classes)
    majority.update(F.one_hot(torch.zeros(50, dtype=torch.long), num_classes).float(), y)
    assert majority.compute().item() == pytest.approx(1 / len(y.unique()))


def test_balanced_weights_follow_n_over_k_times_count():
    counts = count_labels([torch.tensor([0, 0, 0, 1]), torch.tensor([0, 0, 0, 0, 2])], lambda b: b, 4)
    assert counts.tolist() == [7, 1, 1, 0]
    w = balanced_class_weights(counts)
    assert torch.allclose(w, torch.tensor([9 / 28, 9 / 4, 9 / 4, 0.0]))


def test_balanced_class_weight_weights_the_loss_and_travels_in_the_checkpoint(tmp_path):
    torch.manual_seed(0)
    x, y = torch.rand(36, 1, 8, 8, 8), (torch.arange(36) % 9 == 0).long()  # 4 positives of 36 (11 %)
    task = ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=2, **VOL)), class_weight="balanced")
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ck", filename="last")
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_val_batches=1, callbacks=[ckpt], enable_checkpointing=True)
    trainer.fit(task, _DM(x, y[:, None]))
    want = torch.tensor([36 / (2 * 32), 36 / (2 * 4)])
    assert torch.allclose(task.class_weights(), want)
    with torch.no_grad():
        logits = task.model.eval()(x[:8])
    got = F.cross_entropy(logits, y[:8], weight=task.class_weights())
    assert not torch.allclose(got, F.cross_entropy(logits, y[:8]))
    # a fresh task tested from the checkpoint uses the stored weights without counting again
    fresh = ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=2, **VOL)), class_weight="balanced")
    (res,) = quiet_trainer(tmp_path).test(fresh, DataLoader(TensorDataset(x, y), batch_size=9),
                                          ckpt_path=ckpt.best_model_path, verbose=False)
    assert torch.allclose(fresh.class_weights(), want)
    assert {"test/acc", "test/bacc", "test/auc"} <= set(res)


def test_explicit_weights_and_unweighted_metrics(tmp_path):
    x, y = torch.rand(12, 1, 8, 8, 8), torch.arange(12) % 3
    task = ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=3, **VOL)), class_weight=[1.0, 2.0, 0.5])
    assert task.class_weights().tolist() == [1.0, 2.0, 0.5]
    (res,) = quiet_trainer(tmp_path).test(task, DataLoader(TensorDataset(x, y), batch_size=5), verbose=False)
    with torch.no_grad():
        pred = task.model.eval()(x).argmax(-1)
    assert res["test/bacc"] == pytest.approx(_naive_balanced_accuracy(pred, y), abs=1e-6)
    plain = ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=3, **VOL)))
    assert plain.class_weights() is None


def test_balanced_without_training_data_is_a_clear_error():
    task = ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=2, **VOL)), class_weight="balanced")
    with pytest.raises(ValueError, match="class_weight='balanced' counts the training labels"):
        task.class_weights()


def test_balanced_weights_count_plain_training_loaders_before_the_first_epoch(tmp_path):
    """``fit`` with plain loaders and no epoch count (``max_epochs=-1``: the training loader is not loaded before the
    sanity check): the validation loss of the sanity check already uses the weights, counted from the training loader
    the trainer was given, the same as through a datamodule."""
    torch.manual_seed(0)
    x, y = torch.rand(36, 1, 8, 8, 8), (torch.arange(36) % 9 == 0).long()
    want = torch.tensor([36 / (2 * 32), 36 / (2 * 4)])
    for data in ({"datamodule": _DM(x, y)},
                 {"train_dataloaders": DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True),
                  "val_dataloaders": DataLoader(TensorDataset(x, y), batch_size=8)}):
        task = ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=2, **VOL)),
                                  class_weight="balanced")
        trainer = quiet_trainer(tmp_path, max_epochs=-1, max_steps=1, limit_val_batches=1, num_sanity_val_steps=1)
        trainer.fit(task, **data)
        assert torch.allclose(task.class_weights(), want)
