"""HOT Lightning tasks: forecasting, 3D classification, segmentation (HOT paper appendix B.4).

* :class:`ForecastingTask` - L2 loss; MSE / MAE / SMAPE on the normalised scale as published (and optionally on the
  original scale, from the scaler statistics in the batch); the test stage writes a forecast PNG.
* :class:`ClassificationTask` - cross-entropy; AUC and ACC (MedMNIST protocol: macro one-vs-rest AUC).
* :class:`SegmentationTask` - per-pixel cross-entropy; pixel accuracy and mIoU.

Metric names are ``{stage}/{metric}`` (``val/mae``, ``val/auc``, ``val/acc``, ...): the YAML configs checkpoint on
the paper's model-selection metric (lowest val MAE, highest val AUC, highest val ACC); the CPU-budget grid also
stops early on it, the paper-protocol configs train their fixed epoch count.

:func:`plot_forecast` draws the test forecast. The callbacks of a run (``ExportPretrained``, ``SavePredictions``,
``CompileModel``, :func:`~hoformer.train.callbacks.checkpoint_callbacks`) are in :mod:`hoformer.train.callbacks`, the
atomic checkpoint writer in :mod:`hoformer.train.checkpoint_io`; this module keeps their names importable
(``hoformer.train.tasks.ExportPretrained`` is the class path of configs and saved runs). Resumes are exact: see
:meth:`~hoformer.train.base.TaskModule.on_train_epoch_start`.

Every task depends on its batches only (never on a datamodule): :class:`ForecastingTask` reads the windowed-series
dicts of :mod:`hoformer.data.series` (a one-channel target is the last output channel, Time-Series-Library's
``features="MS"``; ``y_mask``, when present, masks loss and metrics), the image tasks ``(x, y)`` tuples or
``{"x", "y"}`` dicts.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_only
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, SymmetricMeanAbsolutePercentageError
from torchmetrics.classification import AUROC, Accuracy, MulticlassAccuracy, MulticlassJaccardIndex

from hoformer._checks import is_int

from hoformer.data import unscale
from hoformer.models import HoformerModel

from .base import TaskModule, check_labels, integer_labels
# the class paths of configs and saved runs (hoformer.train.tasks.ExportPretrained, ...) keep naming the callbacks
from .callbacks import CompileModel, ExportPretrained, SavePredictions, checkpoint_callbacks  # noqa: F401
from .checkpoint_io import AtomicCheckpointIO, install_checkpoint_io  # noqa: F401
from .optim import Optimization
from .class_balance import BalancedAccuracy, ClassWeighting
from .metrics import MaskedMAE, MaskedMSE, PrefixAverage

#: the forecasting protocols of :class:`ForecastingTask` (``protocol=``); docs/results_hot.md#protocols
PROTOCOLS = ("tslib", "hot")
#: the horizons one ``protocol="hot"`` model answers when ``horizons`` is not given: the four of the LTSF tables
HOT_HORIZONS = (96, 192, 336, 720)

__all__ = [
    "ForecastingTask",
    "PROTOCOLS",
    "HOT_HORIZONS",
    "ClassificationTask",
    "SegmentationTask",
    "plot_forecast",
]

STAGES = ("train", "val", "test")


def _unpack(batch, fn: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y, *extra)`` tuples / lists or ``{"x": .., "y": ..}`` dicts -> ``(x, y)``."""
    if isinstance(batch, dict):
        if "x" not in batch or "y" not in batch:
            raise ValueError(f"{fn}: dict batches need keys 'x' and 'y', got {sorted(batch)}")
        return batch["x"], batch["y"]
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(f"{fn}: expected a batch (x, y) or {{'x', 'y'}}, got {type(batch).__name__}")


class _HotTask(TaskModule):
    """Shared plumbing: per-stage metric collections (per-epoch reseeding lives in :class:`TaskModule`)."""

    def _stage_metrics(self, make) -> None:
        self.metrics = torch.nn.ModuleDict({f"m_{s}": make(f"{s}/") for s in STAGES})  # "train" is a Module attr

    def _model_classes(self) -> int:
        n = getattr(self.model, "num_classes", None)
        if n is None:
            raise TypeError(f"{type(self).__name__}: model {self.model_name!r} has no `num_classes` (a "
                            "classifier / segmenter is needed, see hoformer.models.list_models())")
        return int(n)

    def _predict_input(self, batch) -> torch.Tensor:
        """The model input of a predict batch: the batch itself or the first entry of ``(x, y)``."""
        return batch if isinstance(batch, torch.Tensor) else _unpack(batch, type(self).__name__)[0]

    def _log_metrics(self, stage: str, loss: torch.Tensor, batch_size: int) -> None:
        on_step = stage == "train"
        self.log(f"{stage}/loss", loss, on_step=on_step, on_epoch=True, prog_bar=True, batch_size=batch_size,
                 sync_dist=stage != "train")
        self.log_dict(self.metrics[f"m_{stage}"], on_step=False, on_epoch=True, prog_bar=stage != "train",
                      batch_size=batch_size)


# ------------------------------------------------------------------------------------------------ forecasting
class ForecastingTask(_HotTask):
    """Multivariate long-term forecasting: ``x (B, seq_len, C) -> y (B, pred_len, C)``.

    Args:
        model, optim: see :class:`~hoformer.train.base.TaskModule` (paper: Adam, lr 2e-4, weight decay in {0.01, 0.1,
            0.3, 0.5}).
        loss: ``"mse"`` (the paper's L2 loss) or ``"mae"``.
        original_scale: also log ``{val,test}/{mse,mae}_orig`` on the original scale (:func:`hoformer.data.unscale`
            with the scaler statistics every batch carries).
        plot_variates: number of variates drawn in the test forecast PNG (0 disables it).
        variate_names: the data's column names in the model's variate order (``OT``, ``HUFL``, ...), the labels of
            the forecast PNG's panels (default ``variate <j>``).
        protocol: how the forecaster is trained, scored and selected (docs/results_hot.md#protocols):

            * ``"tslib"`` (Time-Series-Library, the default): one model per horizon, every test window of that
              horizon scored, the checkpoint selected on ``val/mae``;
            * ``"hot"`` (the HOT authors' code): one model whose horizon is the largest of ``horizons`` (default
              :data:`HOT_HORIZONS`, a 720-step model; the data's ``pred_len`` must equal it) trained on the average of
              the prefix losses, so validation and test see only the windows with 720 future steps; every horizon is
              scored on its prefix (``test/mse@96``, ...) and the checkpoint is selected on ``val/mae_mean``, the
              mean of the prefix MAEs. The authors' optimiser settings (batch 128, lr 1e-3, gradient clipping 1.0)
              are in the protocol's config, ``configs/hot/ltsf_hot.yaml``.
        horizons: joint-horizon training: increasing step counts, the largest at most the model's horizon. The loss
            is the average of the losses on the first ``h`` steps for each ``h``, and validation / test also log
            ``{stage}/mse@h`` and ``{stage}/mae@h`` on those prefixes (``mse_orig@h`` / ``mae_orig@h`` with
            ``original_scale``) and their means ``{stage}/mse_mean`` / ``{stage}/mae_mean`` beside the metrics over
            the whole horizon. None: one horizon, the plain loss (``protocol="hot"``: :data:`HOT_HORIZONS`).

    A model with a method ``teacher_forced(x, y) -> (pred, target)`` (a causal forecaster trained on next-step
    prediction at every position) is trained on the loss between the ``pred`` and ``target`` it returns instead of
    ``model(x)`` and ``y``; validation, test and predict call ``model(x)`` as for any model.
    """

    selection = ("val/mae", "min")

    def __init__(
        self,
        model: HoformerModel,
        optim: Optimization | None = Optimization(lr=2e-4, weight_decay=0.1),
        loss: str = "mse",
        original_scale: bool = False,
        plot_variates: int = 3,
        variate_names: list[str] | None = None,
        horizons: list[int] | None = None,
        protocol: Literal["tslib", "hot"] = "tslib",
    ) -> None:
        if loss not in ("mse", "mae"):
            raise ValueError(f"ForecastingTask: `loss` must be 'mse' or 'mae', got {loss!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"ForecastingTask: `protocol` must be one of {list(PROTOCOLS)}, got {protocol!r}")
        if protocol == "hot" and horizons is None:
            horizons = list(HOT_HORIZONS)
        if horizons is not None:
            horizons = list(horizons)
            if not horizons or not all(is_int(h) and h >= 1 for h in horizons) or horizons != sorted(set(horizons)):
                raise ValueError("ForecastingTask: `horizons` must be a non-empty increasing list of step counts >= 1 "
                                 f"(e.g. [96, 192, 336, 720]) or None, got {horizons!r}")
        super().__init__(model, optim)
        if protocol == "hot":
            self.selection = ("val/mae_mean", "min")
        self._stage_metrics(lambda p: MetricCollection(
            {"mse": MeanSquaredError(), "mae": MeanAbsoluteError(), "smape": SymmetricMeanAbsolutePercentageError()},
            prefix=p,
        ))
        if original_scale:
            self.orig_metrics = torch.nn.ModuleDict({
                f"m_{s}": MetricCollection({"mse": MeanSquaredError(), "mae": MeanAbsoluteError()}, prefix=f"{s}/",
                                    postfix="_orig")
                for s in ("val", "test")
            })
        if horizons is not None:  # per-prefix metrics (normalised scale, and original scale when asked)
            scales = ("", "_orig") if original_scale else ("",)
            self.prefix_metrics = torch.nn.ModuleDict({
                f"m_{s}{scale}": MetricCollection(
                    {**{f"{m}{scale}@{h}": cls(upto=h) for h in horizons for m, cls in (("mse", MaskedMSE),
                                                                                        ("mae", MaskedMAE))},
                     **{f"{m}{scale}_mean": PrefixAverage(horizons, m) for m in ("mse", "mae")}},
                    prefix=f"{s}/", compute_groups=False)  # the metrics share state names (see forecasting_metrics)
                for s in ("val", "test") for scale in scales
            })
        self.forecast_plot_path: str | None = None
        self._plot_sample = None

    def shared_step(self, batch, stage: str) -> torch.Tensor:
        name = type(self).__name__
        if not isinstance(batch, dict):  # a bare (x, y) pair: a complete series without scaler statistics
            x, y = _unpack(batch, name)
            batch = {"x": x, "y": y}
        if "x" not in batch or "y" not in batch:
            raise TypeError(f"{name}: batches must be dicts of the windowed-series format (hoformer.data.series) with "
                            f"keys 'x' and 'y' (or (x, y) pairs), got {sorted(batch)}")
        x, y = batch["x"], batch["y"]
        mask = batch.get("y_mask")
        teacher = getattr(self.model, "teacher_forced", None) if stage == "train" else None
        if callable(teacher):  # the model defines its own training targets (e.g. next-patch prediction)
            if mask is not None:
                raise ValueError(f"{name}: a model with `teacher_forced` (here {self.model_name!r}) trains without "
                                 "`y_mask`; the batch carries one (missing targets)")
            pred, y = teacher(x, y)
            if pred.shape != y.shape:
                raise ValueError(f"{name}: {self.model_name!r}.teacher_forced(x, y) returned predictions "
                                 f"{tuple(pred.shape)} and targets {tuple(y.shape)} of different shapes")
        else:
            pred = self.model(x)
        if pred.shape != y.shape and pred.ndim == y.ndim and y.shape[-1] == 1:
            pred = pred[..., -1:]  # one target channel: the last input channel (TSLib's features="MS")
        if pred.shape != y.shape:
            raise ValueError(f"{name}: model output {tuple(pred.shape)} != target {tuple(y.shape)}")
        horizons = self.hparams.horizons
        if horizons is not None and not callable(teacher):
            if pred.ndim < 2 or horizons[-1] > pred.shape[1]:
                raise ValueError(f"{name}: `horizons` {horizons} reach step {horizons[-1]} but the model forecasts "
                                 f"{pred.shape[1] if pred.ndim > 1 else 0} steps (output {tuple(pred.shape)})")
            if self.hparams.protocol == "hot" and pred.shape[1] != horizons[-1]:
                raise ValueError(f"{name}(protocol='hot'): one model answers every horizon {horizons}, so its "
                                 f"horizon (the data's pred_len) must be {horizons[-1]}; the model forecasts "
                                 f"{pred.shape[1]} steps (set data pred_len={horizons[-1]})")
            loss = torch.stack([self._loss(pred[:, :h], y[:, :h], None if mask is None else mask[:, :h])
                                for h in horizons]).mean()
        else:
            loss = self._loss(pred, y, mask)
        p32, y32 = pred.detach().float(), y.float()
        sel = (lambda t: t.reshape(-1)) if mask is None else (lambda t: t[mask])
        self.metrics[f"m_{stage}"].update(sel(p32), sel(y32))
        bool_mask = None if mask is None else mask.bool()
        if horizons is not None and stage != "train":
            self.prefix_metrics[f"m_{stage}"].update(p32, y32, bool_mask)
            self.log_dict(self.prefix_metrics[f"m_{stage}"], on_step=False, on_epoch=True, batch_size=x.shape[0])
        if self.hparams.original_scale and stage != "train":
            if "mean" not in batch or "std" not in batch:
                raise ValueError(f"{name}(original_scale=True): batches must carry the scaler statistics 'mean' and "
                                 f"'std' (hoformer.data.series format), got keys {sorted(batch)}")
            po, yo = unscale(p32, batch), unscale(y32, batch)
            self.orig_metrics[f"m_{stage}"].update(sel(po), sel(yo))
            self.log_dict(self.orig_metrics[f"m_{stage}"], on_step=False, on_epoch=True, batch_size=x.shape[0])
            if horizons is not None:
                self.prefix_metrics[f"m_{stage}_orig"].update(po, yo, bool_mask)
                self.log_dict(self.prefix_metrics[f"m_{stage}_orig"], on_step=False, on_epoch=True,
                              batch_size=x.shape[0])
        self._log_metrics(stage, loss, x.shape[0])
        if stage == "test" and self._plot_sample is None and x.ndim == 3:
            self._plot_sample = (x[0, :, -y.shape[-1]:].detach().float().cpu(), y32[0].cpu(), p32[0].cpu())
        return loss

    def _loss(self, pred: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The training loss (``loss``) over the observed entries (``mask``: True / nonzero = observed)."""
        if mask is None:
            return F.mse_loss(pred, y) if self.hparams.loss == "mse" else F.l1_loss(pred, y)
        err = (pred - y).square() if self.hparams.loss == "mse" else (pred - y).abs()
        return (err * mask).sum() / mask.sum().clamp_min(1)

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0):
        return self.model(self._predict_input(batch))

    def on_test_epoch_start(self) -> None:
        self._plot_sample = None

    def on_test_epoch_end(self) -> None:
        if self.hparams.plot_variates > 0 and self._plot_sample is not None:
            self.forecast_plot_path = self._save_plot()

    @rank_zero_only
    def _save_plot(self) -> str | None:
        root = (self.trainer.log_dir if self.trainer.logger is not None else None) or self.trainer.default_root_dir
        path = plot_forecast(*self._plot_sample, Path(root) / "forecast.png", num_variates=self.hparams.plot_variates,
                             names=self.hparams.variate_names)
        if path is not None:
            import sys

            print(f"{type(self).__name__}: forecast plot of the first test window (standardised values, as the model "
                  f"sees them): {path}", file=sys.stderr, flush=True)
        return path


def plot_forecast(x, y, pred, path, num_variates: int = 3, names=None, scale: str = "standardised") -> str | None:
    """Write a PNG with lookback ``x (L, C)``, truth ``y (S, C)`` and forecast ``pred (S, C)`` for the first
    ``num_variates`` variates (the last variate, usually ``OT``, first), each panel labelled with its column name from
    ``names`` (``C`` names; default ``variate <j>``) and the values' ``scale`` (the task plots the model's
    standardised values). Returns the path, or None without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:  # plots are an optional extra
        return None
    from hoformer._plot import plot_forecast_vs_truth

    c = np.shape(x)[-1]
    channels = [c - 1 - i for i in range(min(num_variates, c))]
    names = list(names)[-c:] if names is not None and len(names) >= c else [f"variate {j}" for j in range(c)]
    return str(plot_forecast_vs_truth(x, y, pred, path, channels=channels, names=names, scale=scale))


# --------------------------------------------------------------------------------------------- classification
class ClassificationTask(ClassWeighting, _HotTask):
    """3D image classification (MedMNIST3D): ``x (B, 1, D, H, W) -> logits (B, num_classes)``; labels ``(B,)`` or
    ``(B, 1)``. Logs ``{stage}/auc`` (macro one-vs-rest; binary: AUC of class 1), ``{stage}/acc`` and
    ``{stage}/bacc`` (balanced accuracy). ``class_weight``: None, ``"balanced"`` or one weight per class for the
    cross-entropy (:mod:`hoformer.train.class_balance`). ``select_on``: the validation metric the best checkpoint is
    selected on (the MedMNIST protocol: ``val/auc``; ``val/bacc`` for imbalanced classes)."""

    selection = ("val/auc", "max")

    def __init__(
        self,
        model: HoformerModel,
        optim: Optimization | None = Optimization(lr=2e-4, weight_decay=0.1),
        label_smoothing: float = 0.0,
        class_weight: str | list[float] | None = None,
        select_on: Literal["val/auc", "val/acc", "val/bacc"] = "val/auc",
    ) -> None:
        if select_on not in ("val/auc", "val/acc", "val/bacc"):
            raise ValueError(f"ClassificationTask: `select_on` must be 'val/auc', 'val/acc' or 'val/bacc', got "
                             f"{select_on!r}")
        super().__init__(model, optim)
        self.selection = (select_on, "max")
        self.num_classes = n = self._model_classes()
        self._init_class_weight(class_weight, n)
        # validate_args=False: check_labels has validated the labels, and torchmetrics' own check (torch.unique +
        # a Python branch) would be a host sync per step on a GPU
        kw = {"validate_args": False}
        if n == 2:
            make = lambda p: MetricCollection({"auc": AUROC(task="binary", **kw), "acc": Accuracy(task="binary", **kw),
                                               "bacc": BalancedAccuracy(2)}, prefix=p)
        else:
            make = lambda p: MetricCollection(
                {"auc": AUROC(task="multiclass", num_classes=n, **kw),
                 "acc": MulticlassAccuracy(n, average="micro", **kw), "bacc": BalancedAccuracy(n)},
                prefix=p,
            )
        self._stage_metrics(make)

    def shared_step(self, batch, stage: str) -> torch.Tensor:
        x, y = _unpack(batch, type(self).__name__)
        name, given = type(self).__name__, tuple(y.shape)
        y = integer_labels(y, name, "(B,) or (B, 1)")
        if y.ndim == 2 and y.shape[1] == 1:  # MedMNIST's (N, 1) label arrays
            y = y[:, 0]
        if y.shape != x.shape[:1]:
            raise ValueError(f"{name}: labels must be (B,) or (B, 1) class ids for a batch of {x.shape[0]}, got "
                             f"shape {given} (multi-label / one-hot targets are not supported)")
        check_labels(y, self.num_classes, name)
        logits = self.model(x)
        loss = F.cross_entropy(logits, y, weight=self.class_weights(), label_smoothing=self.hparams.label_smoothing)
        prob = logits.detach().float().softmax(-1)
        self.metrics[f"m_{stage}"].update(prob[:, 1] if self.num_classes == 2 else prob, y)
        self._log_metrics(stage, loss, x.shape[0])
        return loss

    def _train_labels(self, batch) -> torch.Tensor:
        return _unpack(batch, type(self).__name__)[1]

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0):
        return self.model(self._predict_input(batch)).softmax(-1)


# ----------------------------------------------------------------------------------------------- segmentation
class SegmentationTask(_HotTask):
    """Per-pixel classification: ``x (B, C_in, H, W) -> logits (B, num_classes, H, W)``; masks ``(B, H, W)`` int.
    Logs ``{stage}/acc`` (pixel accuracy) and ``{stage}/miou``; ``ignore_index`` pixels are skipped."""

    selection = ("val/acc", "max")

    def __init__(
        self,
        model: HoformerModel,
        optim: Optimization | None = Optimization(lr=2e-4, weight_decay=0.1),
        ignore_index: int | None = None,
    ) -> None:
        super().__init__(model, optim)
        self.num_classes = n = self._model_classes()
        self._stage_metrics(lambda p: MetricCollection({
            # validate_args=False: labels are validated by check_labels (torchmetrics' check syncs per step on GPU)
            "acc": MulticlassAccuracy(n, average="micro", ignore_index=ignore_index, validate_args=False),
            "miou": MulticlassJaccardIndex(n, average="macro", ignore_index=ignore_index, validate_args=False),
        }, prefix=p))

    def shared_step(self, batch, stage: str) -> torch.Tensor:
        x, y = _unpack(batch, type(self).__name__)
        y = integer_labels(y, type(self).__name__, "(B, H, W) or (B, 1, H, W)")
        if y.ndim == 4 and y.shape[1] == 1:
            y = y[:, 0]
        ii = self.hparams.ignore_index
        check_labels(y, self.num_classes, type(self).__name__, ii)  # before the forward: fail fast
        logits = self.model(x)
        if logits.shape[-2:] != y.shape[-2:]:
            raise ValueError(f"SegmentationTask: logits {tuple(logits.shape)} do not match masks {tuple(y.shape)}")
        loss = F.cross_entropy(logits, y, ignore_index=-100 if ii is None else ii)
        self.metrics[f"m_{stage}"].update(logits.detach().argmax(1), y)
        self._log_metrics(stage, loss, x.shape[0])
        return loss

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0):
        return self.model(self._predict_input(batch)).argmax(1)
