"""The scaler of a series and its one inverse: :class:`StandardScaler` (fitted on the training rows) and
:func:`unscale` (a batch's values back on the original scale, with the statistics the batch carries)."""
from __future__ import annotations

import hashlib

import numpy as np
import torch

__all__ = ["StandardScaler", "unscale"]


class StandardScaler:
    """Per-channel standardisation ``(x - mean) / (std + eps)`` over every axis but the last.

    Fitted on the training rows only, on observed entries only when a ``mask`` is given (Weaver eqs 62-63); the
    population standard deviation, with a channel that is constant on the training rows keeping ``std = 1``
    (Time-Series-Library / scikit-learn). ``eps``: 0 for complete LTSF files (TSLib's numbers), ``1e-8`` for traffic
    (DCRNN / torch-spatiotemporal). Statistics are float64 ``(C,)``; :attr:`scale` is ``std + eps``.
    """

    def __init__(self, eps: float = 0.0) -> None:
        self.eps = float(eps)
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None

    def fit(self, values: np.ndarray, mask: np.ndarray | None = None) -> "StandardScaler":
        axes = tuple(range(values.ndim - 1))
        if mask is None:
            self.mean, std = values.mean(axes), values.std(axes)
        else:
            m = mask.astype(np.float64)
            n = m.sum(axes)
            if (n == 0).any():
                raise ValueError("StandardScaler.fit: a channel has no observed value in the training rows")
            self.mean = (values * m).sum(axes) / n
            std = np.sqrt((m * (values - self.mean) ** 2).sum(axes) / n)
        self.std = np.where(std == 0, 1.0, std)
        return self

    @property
    def scale(self) -> np.ndarray:
        return self.std + self.eps

    def channels(self, index) -> "StandardScaler":
        """The scaler of the channels ``index`` (a slice or index list), e.g. ``channels(slice(-1, None))``: the
        target of ``features="MS"``."""
        out = StandardScaler(self.eps)
        out.mean, out.std = np.atleast_1d(self.mean[index]), np.atleast_1d(self.std[index])
        return out

    def _check_width(self, values, what: str) -> None:
        if values.shape[-1] != len(self.mean):
            raise ValueError(f"StandardScaler.{what}: expected a last dimension of {len(self.mean)} (the channels "
                             f"it was fitted on), got shape {tuple(values.shape)}; channels(...) gives the scaler "
                             "of a subset")

    def transform(self, values, mask: np.ndarray | None = None):
        """Standardised ``values`` (numpy: float64; torch: its dtype and device; last dim = channels); entries
        outside ``mask`` are 0."""
        self._check_width(values, "transform")
        if isinstance(values, torch.Tensor):
            kw = dict(dtype=values.dtype, device=values.device)
            return (values - torch.as_tensor(self.mean, **kw)) / torch.as_tensor(self.scale, **kw)
        out = (values - self.mean) / self.scale
        return out if mask is None else out * mask

    def inverse_transform(self, values):
        """The original scale of standardised ``values`` (numpy or torch, last dim = channels; torch: its dtype and
        device): :func:`unscale` with these statistics."""
        self._check_width(values, "inverse_transform")
        return unscale(values[None], self.statistics(values))[0]

    def statistics(self, like=None) -> dict:
        """``{"mean", "std"}`` of shape ``(1, C)``, the scaler statistics of the batch format (``std`` is
        :attr:`scale`, ``eps`` included): float64 arrays, or tensors of ``like``'s dtype and device when ``like`` is
        a tensor. ``unscale(values[None], scaler.statistics(values))[0]`` is :meth:`inverse_transform`."""
        if isinstance(like, torch.Tensor):
            kw = dict(dtype=like.dtype, device=like.device)
            return {"mean": torch.as_tensor(self.mean, **kw)[None], "std": torch.as_tensor(self.scale, **kw)[None]}
        return {"mean": np.asarray(self.mean, np.float64)[None], "std": np.asarray(self.scale, np.float64)[None]}

    def digest(self) -> str:
        """A short digest of the statistics (9 significant digits, so that the same data fitted on another machine
        gives the same digest)."""
        text = ",".join(f"{v:.9g}" for v in np.concatenate([np.ravel(self.mean), np.ravel(self.scale)]))
        return hashlib.sha256(text.encode()).hexdigest()[:16]



def unscale(values, batch):
    """``values`` on the model's scale -> the original scale, ``values * std + mean``, with the scaler statistics a
    batch carries: the one inverse of the scaling, used by every task, metric, plot and ``hoformer forecast``.

    Args:
        values: ``(B, ..., C_y)`` predictions or targets of a batch (``y``, ``x`` when ``C = C_y``, a model's output):
            the batch first, the channels last, any steps / space axes between (LTSF ``(B, Q, C)``, traffic
            ``(B, Q, N, C)``). A tensor or a numpy array.
        batch: a mapping with ``mean`` and ``std``, each ``(B, C_y)`` (the batch format of
            :mod:`hoformer.data.series`: the statistics of the target channels, ``std`` with the scaler's ``eps``
            added; :meth:`StandardScaler.statistics` gives them for one sample); the other keys are not read.

    Each sample's statistics are broadcast over every axis between the batch and the channels. A tensor result is on
    ``values``' device with the dtype of PyTorch's type promotion of ``values`` and the statistics (a batch's float32
    statistics keep float32 predictions float32, and bf16 predictions become float32); a numpy result follows numpy's
    promotion.
    """
    if not hasattr(batch, "get") or batch.get("mean") is None or batch.get("std") is None:
        keys = sorted(batch) if hasattr(batch, "keys") else type(batch).__name__
        raise ValueError(f"unscale: the batch must carry the scaler statistics 'mean' and 'std' (B, C_y) (the batch "
                         f"format of hoformer.data.series), got {keys}")
    mean, std = batch["mean"], batch["std"]
    if isinstance(values, torch.Tensor):
        mean, std = (torch.as_tensor(t, device=values.device) for t in (mean, std))
    else:
        values = np.asarray(values)
        mean, std = (t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in (mean, std))
    expected = (values.shape[0], values.shape[-1]) if values.ndim >= 2 else None
    if expected is None or tuple(mean.shape) != expected or tuple(std.shape) != expected:
        raise ValueError(f"unscale: `values` must be (B, ..., C_y) and the batch's 'mean' / 'std' (B, C_y) of the same "
                         f"B and C_y, got values {tuple(values.shape)}, mean {tuple(mean.shape)}, std "
                         f"{tuple(std.shape)}")
    shape = (values.shape[0],) + (1,) * (values.ndim - 2) + (values.shape[-1],)
    return values * std.reshape(shape) + mean.reshape(shape)
