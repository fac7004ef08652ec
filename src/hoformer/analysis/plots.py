"""Headless matplotlib figures of the analysis (HOT Figs 3-12, HOBA Figs 2-4, Weaver Fig 6/17).

Every function writes one PNG to ``path`` (parent folders created) and returns it as a ``Path``; figures use the Agg
backend, a colorbar per panel and labelled axes. Non-negative maps use ``viridis``; signed maps (Weaver's Tanimoto /
cosine valence maps) use the diverging ``RdBu_r`` centred on zero.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from hoformer._plot import as_numpy, plot_forecast_vs_truth, pyplot, save_figure

__all__ = [
    "plot_mode_maps",
    "plot_stable_rank_curves",
    "plot_forecast_vs_truth",
    "plot_triplet_slice",
    "plot_signed_maps",
    "plot_scaling",
    "fit_exponent",
    "plot_sweep",
]


def require_matplotlib(parser) -> None:
    """``parser.error`` naming the extra to install when matplotlib is missing: for the figure-writing commands,
    before they do any work (``bench`` would otherwise run its whole sweep first)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        parser.error("needs matplotlib for its figures: pip install 'hoformer[plots]' (or `make install`)")


def _heat(ax, fig, a: np.ndarray, title: str, xlabel: str, ylabel: str, signed: bool = False):
    if signed:
        lim = float(np.abs(a).max()) or 1.0
        im = ax.imshow(a, cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest", aspect="auto")
    else:
        im = ax.imshow(a, cmap="viridis", interpolation="nearest", aspect="auto")
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03).ax.tick_params(labelsize=6)


def _head_panels(heads: int, panel: tuple[float, float], draw, title: str, path) -> Path:
    """Up to 4 panels per row, one per head; ``draw(ax, fig, i)`` fills panel ``i``; spare axes are hidden."""
    cols = min(heads, 4)
    rows = math.ceil(heads / cols)
    plt = pyplot()
    fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= heads:
            ax.axis("off")
            continue
        draw(ax, fig, i)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_mode_maps(maps: Sequence, path, *, mode_names: Sequence[str] | None = None, title: str = "",
                   max_heads: int = 8, signed: bool | None = None) -> Path:
    """Grid of mode-wise attention maps of one layer (HOT Figs 8-12): one row per mode, one column per head.

    ``maps``: per mode ``(H, Ni, Ni)`` (already averaged over the batch) or ``(Ni, Ni)``. ``signed=None`` picks the
    diverging colormap when a map has negative entries.
    """
    maps = [as_numpy(m) for m in maps]
    maps = [m[None] if m.ndim == 2 else m for m in maps]
    if any(m.ndim != 3 for m in maps):
        raise ValueError(f"plot_mode_maps: maps must be (H, Ni, Ni) or (Ni, Ni), got {[m.shape for m in maps]}")
    heads = min(max(m.shape[0] for m in maps), max_heads)
    names = list(mode_names or [f"mode {i}" for i in range(len(maps))])
    plt = pyplot()
    fig, axes = plt.subplots(len(maps), heads, figsize=(max(2.3 * heads, 6.5), 2.1 * len(maps)), squeeze=False)
    for r, m in enumerate(maps):
        sg = bool((m < 0).any()) if signed is None else signed
        for c in range(heads):
            ax = axes[r, c]
            if c >= m.shape[0]:
                ax.axis("off")
                continue
            _heat(ax, fig, m[c], f"{names[r]}, head {c}", "key", "query", sg)
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_stable_rank_curves(metrics_csv, path, *, prefix: str = "sr/", keys: Sequence[str] | None = None) -> Path:
    """Stable-rank curves (HOT Figs 3-4) from CSVLogger ``metrics.csv`` files: every column containing ``prefix``
    (``train/sr/mode0``, ``val/sr/sum``, ...; only those ending in one of ``keys`` when given) against the training
    step, one panel per stage. ``metrics_csv`` is one path or ``{label: path}`` to compare runs on the same axes
    (e.g. HOT product vs sum vs full attention, Fig 4)."""
    import pandas as pd

    runs = dict(metrics_csv) if isinstance(metrics_csv, dict) else {"": metrics_csv}
    frames = {}
    for label, f in runs.items():
        f = Path(f)
        if not f.is_file():
            raise FileNotFoundError(f"plot_stable_rank_curves: metrics file {f} not found")
        df = pd.read_csv(f)
        cols = [c for c in df.columns if prefix in c and c.count("/") <= 2
                and (keys is None or c.rsplit("/", 1)[-1] in keys)]
        if cols:
            frames[label] = (df, cols)
        elif len(runs) == 1:
            which = f" for {keys}" if keys else ""
            raise ValueError(f"plot_stable_rank_curves: {f} has no '{prefix}' columns{which}"
                             f" (train with hoformer.analysis.StableRankCallback); columns: {list(df.columns)[:12]}")
    if not frames:
        raise ValueError(f"plot_stable_rank_curves: none of {list(runs.values())} has '{prefix}' columns for {keys}")
    stages = sorted({c.split("/")[0] for _, cols in frames.values() for c in cols})
    plt = pyplot()
    fig, axes = plt.subplots(1, len(stages), figsize=(5 * len(stages), 3.4), squeeze=False)
    for ax, st in zip(axes[0], stages):
        lo, hi = np.inf, 0.0
        for label, (df, cols) in frames.items():
            for c in sorted(c for c in cols if c.startswith(st + "/")):
                x = "step" if "step" in df.columns else None
                d = df[[x, c]].dropna() if x else df[[c]].dropna()
                name = c[len(st) + 1 + len(prefix):]
                ax.plot(d[x] if x else np.arange(len(d)), d[c], marker="o" if len(d) < 30 else None, ms=3,
                        label=f"{label}: {name}" if label else name)
                if len(d):
                    lo, hi = min(lo, float(d[c].min())), max(hi, float(d[c].max()))
        ax.set_xlabel("training step")
        ax.set_ylabel("mean stable rank")
        if lo > 0 and hi / lo > 3:  # log scale only when the curves span several factors
            ax.set_yscale("log")
        ax.set_title(f"{st} stable ranks", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_triplet_slice(cube, path, *, token: int = 0, title: str = "", max_heads: int = 8) -> Path:
    """HOBA key1 x key2 attention slice ``A[token, :, :]`` of triplet cubes ``(H, s, s, s)`` (or ``(s, s, s)``),
    one panel per head (HOBA Figs 2-4)."""
    a = as_numpy(cube)
    a = a[None] if a.ndim == 3 else a
    if a.ndim != 4 or not (a.shape[1] == a.shape[2] == a.shape[3]):
        raise ValueError(f"plot_triplet_slice: `cube` must be (H, s, s, s) or (s, s, s), got {a.shape}")
    if not 0 <= token < a.shape[1]:
        raise ValueError(f"plot_triplet_slice: `token` must be in [0, {a.shape[1]}), got {token}")
    return _head_panels(min(a.shape[0], max_heads), (2.8, 2.5), lambda ax, fig, i: _heat(
        ax, fig, a[i, token], f"query {token}, head {i}", "key 2 position", "key 1 position"), title, path)


def plot_signed_maps(maps, path, *, xlabel: str = "key node", ylabel: str = "query node", title: str = "",
                     max_heads: int = 8) -> Path:
    """Signed attention maps ``(H, N, N)`` (Weaver's Tanimoto ``Theta_S``: negative = inhibitory messages) with a
    diverging colormap symmetric around 0, one panel per head."""
    a = as_numpy(maps)
    a = a[None] if a.ndim == 2 else a
    if a.ndim != 3:
        raise ValueError(f"plot_signed_maps: `maps` must be (H, N, N) or (N, N), got {a.shape}")
    return _head_panels(min(a.shape[0], max_heads), (3.0, 2.7), lambda ax, fig, i: _heat(
        ax, fig, a[i], f"head {i}", xlabel, ylabel, signed=True), title, path)


def fit_exponent(x, y, tail: float | None = None) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (the growth exponent); with ``tail`` in ``(0, 1]`` only
    the largest ``ceil(tail * n)`` points (at least 2) are used, where fixed per-call overheads no longer dominate."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    x, y = x[ok], y[ok]
    if len(x) < 2:
        return float("nan")
    if tail is not None:
        order = np.argsort(x)
        keep = order[-max(2, math.ceil(tail * len(x))):]
        x, y = x[keep], y[keep]
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def plot_scaling(df, path, *, x: str = "tokens", y: str = "time_fwd_ms", group: str = "attention",
                 ylabel: str | None = None, title: str = "", tail: float | None = None) -> Path:
    """Log-log plot of ``y`` against ``x`` for every ``group`` of a benchmark table, with the fitted growth exponent
    (:func:`fit_exponent` with ``tail``) in the legend (HOT Figs 6-7)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, d in df.groupby(group, sort=True):
        d = d[[x, y]].dropna().sort_values(x)
        d = d[d[y] > 0]
        if d.empty:
            continue
        p = fit_exponent(d[x], d[y], tail)
        ax.plot(d[x], d[y], marker="o", ms=3, label=f"{name} (slope {p:.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or y)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_sweep(df, path, *, x: str, y: str, group: str, ylabel: str | None = None, title: str = "",
               logx: bool = True) -> Path:
    """A metric against a hyper-parameter for every ``group`` (HOT Fig 5: error vs number of heads for Kronecker
    product / sum / full attention), from a table with columns ``x``, ``y``, ``group``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, d in df.groupby(group, sort=True):
        d = d[[x, y]].dropna().sort_values(x)
        ax.plot(d[x], d[y], marker="o", ms=4, label=str(name))
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(df[x].unique()))
    from matplotlib.ticker import ScalarFormatter

    ax.get_xaxis().set_major_formatter(ScalarFormatter())
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or y)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
