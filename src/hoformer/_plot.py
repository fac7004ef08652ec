"""The figure primitives shared by training (the forecast PNG of a test run) and :mod:`hoformer.analysis.plots`:
matplotlib on the Agg backend, atomic PNG writes, and :func:`plot_forecast_vs_truth`. matplotlib is imported only
when a figure is drawn (the ``plots`` extra)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from hoformer._io import atomic_write

__all__ = ["plot_forecast_vs_truth", "pyplot", "as_numpy", "save_figure"]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def as_numpy(a) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().float().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def save_figure(fig, path) -> Path:
    """Atomic PNG write (a crash never leaves a truncated figure), then the figure is closed."""
    path = Path(path)
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format=path.suffix.lstrip(".") or "png"))
    finally:
        pyplot().close(fig)
    return path


def plot_forecast_vs_truth(x, y, pred, path, *, channels: Sequence[int] | None = None, names=None,
                           title: str = "", scale: str | None = None) -> Path:
    """Lookback ``x (L, C)``, truth ``y (S, C)`` and forecast ``pred (S, C)`` of selected channels (default: the
    last three, ``OT`` first in LTSF files); ``scale`` (e.g. ``"standardised"``, ``"original scale"``) is written
    under each panel's name on its y axis."""
    x, y, pred = as_numpy(x), as_numpy(y), as_numpy(pred)
    if y.shape != pred.shape or x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"plot_forecast_vs_truth: need x (L, C), y and pred (S, C), got {x.shape}, {y.shape}, "
                         f"{pred.shape}")
    c = x.shape[1]
    channels = list(channels) if channels is not None else [c - 1 - i for i in range(min(3, c))]
    plt = pyplot()
    fig, axes = plt.subplots(len(channels), 1, figsize=(8, 2.2 * len(channels)), squeeze=False)
    tl, tf = np.arange(len(x)), np.arange(len(x), len(x) + len(y))
    for ax, j in zip(axes[:, 0], channels):
        ax.plot(tl, x[:, j], color="0.45", lw=1, label="lookback")
        ax.plot(tf, y[:, j], color="C0", lw=1.2, label="truth")
        ax.plot(tf, pred[:, j], color="C3", lw=1.2, label="forecast")
        label = names[j] if names is not None else f"channel {j}"
        ax.set_ylabel(f"{label}\n({scale})" if scale else label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper left", fontsize=7)
    axes[-1, 0].set_xlabel("time step")
    if title:
        axes[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
