"""Convolutional reference baseline for the 3D classification task (not a model of the three papers).

* ``cnn3d_classifier`` ``x (B, C_in, D, H, W) -> logits (B, num_classes)``: ``len(widths)`` stages of two
  ``3x3x3`` convolutions (GroupNorm or BatchNorm, ReLU), a ``2x2x2`` max-pool between stages, global average pooling
  and a linear classifier (0.2M parameters at the defaults).

It runs through the same datamodule, task, metrics and checkpoint selection as ``hot_volume_classifier``
(``configs/hot/medmnist3d/adrenal_cnn3d.yaml``), so it separates what the MedMNIST3D pipeline supports (reader,
splits, augmentation, AUC / ACC) from what the attention models reach on it; the HOT paper's Table 2 lists ResNet
CNNs for the same reason.

Axis legend: ``b`` batch, ``c`` channels, ``d h w`` voxels.
"""
from __future__ import annotations

import math
from typing import Literal, Sequence

import torch
from torch import nn

from hoformer._checks import is_int
from hoformer.layers import Dropout

from .hot import _ImageModel
from .registry import register_model

__all__ = ["CNN3DClassifier"]


def _stage(c_in: int, c_out: int, norm: str) -> nn.Sequential:
    def conv(i: int) -> list[nn.Module]:
        layer = nn.BatchNorm3d(c_out) if norm == "batch" else nn.GroupNorm(math.gcd(8, c_out), c_out)
        return [nn.Conv3d(i, c_out, 3, padding=1, bias=False), layer, nn.ReLU()]

    return nn.Sequential(*conv(c_in), *conv(c_out))


@register_model(name="cnn3d_classifier")
class CNN3DClassifier(_ImageModel):
    """Small 3D CNN classifier ``(B, C_in, D, H, W) -> logits (B, num_classes)`` (see the module docstring).

    Args:
        in_channels: input channels.
        input_size: volume size ``D = H = W`` or ``(D, H, W)``.
        num_classes: classes (>= 2).
        widths: channels of each stage; every stage but the first halves the resolution, so ``input_size`` must be
            divisible by ``2 ** (len(widths) - 1)``.
        dropout: dropout before the classifier.
        norm: ``"group"`` (GroupNorm with ``gcd(8, width)`` groups: the same function in training and evaluation)
            or ``"batch"`` (BatchNorm; its running statistics lag the weights at lr 1e-3, and on AdrenalMNIST3D
            the evaluation-mode accuracy then swung between 22 % and 85 % from epoch to epoch, docs/results_hot.md).
    """

    _name, _legend = "cnn3d_classifier", "(B, C_in, D, H, W)"

    def __init__(
        self,
        in_channels: int = 1,
        input_size: int | Sequence[int] = 28,
        num_classes: int = 2,
        widths: Sequence[int] = (16, 32, 64),
        dropout: float = 0.0,
        norm: Literal["group", "batch"] = "group",
    ) -> None:
        super().__init__()
        self.record_config(locals())
        fn = self._name
        if norm not in ("group", "batch"):
            raise ValueError(f"{fn}: `norm` must be 'group' or 'batch', got {norm!r}")
        widths = tuple(widths)
        if not widths or not all(is_int(w) and w > 0 for w in widths):
            raise ValueError(f"{fn}: `widths` must be a non-empty sequence of positive ints, got {widths!r}")
        self._set_io(3, in_channels, input_size, num_classes)
        step = 2 ** (len(widths) - 1)
        if any(s % step for s in self.input_size):
            raise ValueError(f"{fn}: `input_size` {self.input_size} must be divisible by 2 ** (len(widths) - 1) = "
                             f"{step} ({len(widths)} stages, a 2x2x2 max-pool between stages)")
        layers: list[nn.Module] = []
        for i, (c_in, c_out) in enumerate(zip((in_channels, *widths[:-1]), widths)):
            if i:
                layers.append(nn.MaxPool3d(2))
            layers.append(_stage(c_in, c_out, norm))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(Dropout(dropout), nn.Linear(widths[-1], num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        return self.head(self.features(x).mean(dim=(2, 3, 4)))  # b c d h w -> b c -> b classes
