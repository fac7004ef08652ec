"""``hoformer analyze``: figures of a trained model on a dataset split (HOT paper 000 Figs 3-4 and 8-12, HOBA 004
Figs 2-4, Weaver 003 Fig 6).

From a checkpoint (a Lightning ``.ckpt`` of a :class:`~hoformer.train.TaskModule` or a ``save_pretrained`` folder)
and a datamodule split, :func:`analyze_checkpoint` writes into ``output``:

* ``attention_<i>_<layer>.png``  mode-wise attention maps of layer ``i`` averaged over the analysed batches, one row
  per mode (variates / time patches, depth / height / width, ...) and one column per head (HOT Figs 8-12);
* ``weaver_<mode>_<i>.png``      signed valence maps ``Theta_T`` / ``Theta_S`` with a diverging colormap (Weaver);
* ``hoba_slice_<i>.png``         key1 x key2 triplet slice of one query token of one sample (HOBA);
* ``forecast.png``               lookback, truth and forecast of the first sample (forecasting models);
* ``stable_rank.png``            stable-rank curves from the run's ``metrics.csv`` when it has ``sr/`` columns
  (logged by :class:`~hoformer.analysis.StableRankCallback`; HOT Figs 3-4).

The data come from ``--config`` (a LightningCLI YAML: its ``data`` section), ``--data`` (a datamodule class path,
with ``--data-args`` JSON), or, by default, the datamodule hyper-parameters stored in the Lightning checkpoint
(``_class_path``) or the ``config.yaml`` that LightningCLI saved in the checkpoint's run folder.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Sequence

import torch

from hoformer.functional.triplet import triplet_windows

from hoformer.checkpoint import load_checkpoint
from hoformer.data import unscale
from hoformer.inference import checkpoint_datamodule, find_run_file

from .maps import AttentionRecord, batch_mean_maps, recording, split_batch
from .plots import (
    plot_forecast_vs_truth,
    plot_mode_maps,
    plot_signed_maps,
    plot_stable_rank_curves,
    plot_triplet_slice,
    require_matplotlib,
)

__all__ = ["analyze_checkpoint", "analyze_main", "MODE_NAMES"]

#: axis names of each model family's modes (figure labels)
MODE_NAMES = {
    "hot_forecaster": ("variate", "time patch"),
    "hot_volume_classifier": ("depth", "height", "width"),
    "hot_segmenter": ("row", "column"),
    "weaver": ("time step", "sensor"),
    "traffic_hot": ("time step", "sensor"),
}


def _batches(dm, split: str, n: int) -> list:
    if split not in ("train", "val", "test"):
        raise ValueError(f"analyze: `split` must be 'train', 'val' or 'test', got {split!r}")
    stage = {"train": "fit", "val": "validate", "test": "test"}[split]
    if hasattr(dm, "setup"):
        dm.setup(stage)
    loader = getattr(dm, f"{split}_dataloader")()
    out = []
    for b in loader:
        out.append(b)
        if len(out) >= n:
            break
    if not out:
        raise ValueError(f"analyze: the {split!r} split is empty")
    return out


def _shapes(obj) -> str:
    if isinstance(obj, torch.Tensor):
        return str(tuple(obj.shape))
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in obj.items() if isinstance(v, torch.Tensor)) + "}"
    if isinstance(obj, (list, tuple)):
        return "(" + ", ".join(_shapes(v) for v in obj) + ")"
    return type(obj).__name__


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "layer"


# ------------------------------------------------------------------------------------------------- analysis
def analyze_checkpoint(checkpoint, output, *, config=None, data: str | None = None, data_args: dict | None = None,
                       split: str = "test", num_batches: int = 1, metrics=None, token: int = 0, sample: int = 0,
                       max_heads: int = 8, device: str = "cpu", model_args: dict | None = None) -> list[Path]:
    """Write the figures of the module docstring for ``checkpoint`` on ``split``; returns the PNG paths."""
    model, info = load_checkpoint(checkpoint, map_location=device, model_args=model_args)
    model.eval().to(device)
    name = (getattr(model, "config", None) or {}).get("name", type(model).__name__)
    dm = checkpoint_datamodule(info, config=config, data=data, data_args=data_args)
    batches = _batches(dm, split, num_batches)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sums: list[AttentionRecord] | None = None
    counts: list[int] = []
    ragged: set[str] = set()
    first = first_pred = None
    for bi, batch in enumerate(batches):
        args, kwargs, target = split_batch(model, batch)
        mv = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        args, kwargs = tuple(mv(a) for a in args), {k: mv(v) for k, v in kwargs.items()}
        try:
            with torch.no_grad(), recording(model) as recs:
                pred = model(*args, **kwargs)
        except (ValueError, TypeError, RuntimeError, IndexError) as e:
            raise ValueError(f"analyze: model {name!r} does not match the {split!r} data: batch {_shapes(batch)} -> "
                             f"{type(e).__name__}: {e}") from e
        if not recs:
            raise ValueError(f"analyze: model {name!r} recorded no attention maps")
        bm = batch_mean_maps(recs)
        if sums is None:
            sums, counts = bm, [1] * len(bm)
        else:  # text batches are padded to their own longest sample: maps of another size are not averaged in
            for j, (r, m) in enumerate(zip(sums, bm)):
                if [a.shape for a in r.maps] == [b.shape for b in m.maps]:
                    sums[j], counts[j] = r._replace(maps=[a + b for a, b in zip(r.maps, m.maps)]), counts[j] + 1
                else:
                    ragged.add(r.name)
        if bi == 0:
            first, first_pred = (args, kwargs, target, batch, recs), pred
    if ragged:
        warnings.warn(f"analyze: the maps of {sorted(ragged)} change shape between batches (padded sequence "
                      "lengths); each is averaged over the batches of the first batch's shape only", stacklevel=2)
    mean = [r._replace(maps=[m / c for m in r.maps]) for r, c in zip(sums, counts)]
    modes = MODE_NAMES.get(name)
    for i, r in enumerate(mean):
        tag = f"{i:02d}_{_safe(r.name)}"
        signed = any(bool((m < 0).any()) for m in r.maps)
        if r.kind in ("kronecker", "axial"):
            idx = r.mode_indices()
            fits = bool(modes) and (len(modes) == len(r.maps) if r.modes is None else max(idx) < len(modes))
            names = [modes[j] for j in idx] if fits else None
            written.append(plot_mode_maps(r.maps, out / f"attention_{tag}.png", mode_names=names, max_heads=max_heads,
                                          title=f"{name}: {r.name} ({r.kind}{', ' + r.combine if r.combine else ''}), "
                                                f"{split} mean over {counts[i]} batch(es)"))
            if signed:  # Weaver valence maps: signed messages
                for m, mname in zip(r.maps, names or [f"mode{j}" for j in range(len(r.maps))]):
                    written.append(plot_signed_maps(m, out / f"weaver_{_safe(mname)}_{i:02d}.png",
                                                    xlabel=f"key {mname}", ylabel=f"query {mname}",
                                                    max_heads=max_heads,
                                                    title=f"{name}: signed {mname} attention, {split} mean"))
        elif r.kind == "full" and r.maps[0].shape[-1] <= 1024:
            written.append(plot_mode_maps(r.maps, out / f"attention_{tag}.png", mode_names=["tokens"],
                                          max_heads=max_heads, title=f"{name}: {r.name} (full), {split} mean"))
        elif r.kind == "block":  # HOBA's 2D baselines: (H, L, L) full, or (H, W, s, s) per window (mean over them)
            local = r.maps[0] if r.maps[0].ndim == 3 else r.maps[0].mean(1)
            what = "tokens" if r.maps[0].ndim == 3 else "position in window"
            written.append(plot_mode_maps([local], out / f"attention_{tag}.png", mode_names=[what],
                                          max_heads=max_heads, title=f"{name}: {r.name} (2D "
                                          f"{'full' if r.maps[0].ndim == 3 else 'block-local, mean over windows'}), "
                                          f"{split} mean over {counts[i]} batch(es)"))
        if r.kind in ("triplet", "block") and len(r.maps) > 1:  # cross-block routing (eqs 5-7) over block means
            written.append(plot_mode_maps([r.maps[1]], out / f"cross_block_{tag}.png", mode_names=["block"],
                                          max_heads=max_heads, title=f"{name}: {r.name} cross-block attention, "
                                          f"{split} mean over {counts[i]} batch(es)"))
    # HOBA: a key1 x key2 slice of one query token of one sample (no batch averaging: positions are sample-specific)
    args, kwargs, target, batch, recs = first
    for i, r in enumerate(recs):
        if r.kind != "triplet" or not r.maps:
            continue
        cube = r.maps[0]  # (B, H, W, s, s, s)
        mod = model.get_submodule(r.name)
        L = args[0].shape[1]
        if hasattr(mod, "window_starts"):  # the layers' fixed window grid (padded to it)
            starts = mod.window_starts(L)
        else:
            bs = getattr(mod, "block_size", None) or L
            starts = triplet_windows(L, bs, getattr(mod, "overlap", 0.0) if bs < L else 0.0)
        t = min(max(token, 0), L - 1)
        w = max(j for j, s0 in enumerate(starts) if s0 <= t)
        s = cube.shape[-1]  # window size
        written.append(plot_triplet_slice(cube[min(sample, cube.shape[0] - 1), :, w], out / f"hoba_slice_{i:02d}.png",
                                          token=t - starts[w], max_heads=max_heads,
                                          title=f"{name}: {r.name}, sample {sample}, token {t} (window {w}, "
                                                f"positions {starts[w]}..{starts[w] + s - 1})"))
    # LTSF column names for the forecast panels (TrafficDataModule.dataset is the dataset name, not the accessor)
    columns = getattr(dm.dataset(split), "columns", None) if callable(getattr(dm, "dataset", None)) else None
    written += _forecast(first_pred, args, target, batch, out, name, sample, columns)
    mpath = Path(metrics) if metrics is not None else find_run_file(info["run_dir"], "metrics.csv", _has_sr)
    if mpath is not None:
        try:
            written.append(plot_stable_rank_curves(mpath, out / "stable_rank.png"))
        except ValueError:
            if metrics is not None:  # explicitly requested: report; auto-found: skip quietly
                raise
    return written


def _forecast(pred, args, target, batch, out: Path, name: str, sample: int, columns=None) -> list[Path]:
    """The forecast PNG of ``sample``; LTSF panels are labelled with the data's ``columns`` when known."""
    if not isinstance(pred, torch.Tensor) or not isinstance(target, torch.Tensor) or not pred.is_floating_point():
        return []
    x = args[0]
    if pred.ndim == 3 and target.ndim == 3 and x.ndim == 3 and target.shape[-1] == pred.shape[-1]:
        y = target[:, -pred.shape[1]:]  # LTSF targets may carry label_len extra steps
        if y.shape != pred.shape:
            return []
        s = min(sample, x.shape[0] - 1)
        names = list(columns)[-x.shape[-1]:] if columns is not None and len(columns) >= x.shape[-1] else None
        return [plot_forecast_vs_truth(x[s], y[s], pred[s], out / "forecast.png", names=names,
                                       title=f"{name}: sample {s}", scale="standardised")]
    if pred.ndim == 4 and target.shape == pred.shape and x.ndim == 4:  # traffic (B, Q, N, C)
        if isinstance(batch, dict) and "mean" in batch and "std" in batch:  # the original scale
            pred, x, target = (unscale(t, batch) for t in (pred, x, target))
        s = min(sample, x.shape[0] - 1)
        return [plot_forecast_vs_truth(x[s, :, :3, 0], target[s, :, :3, 0], pred[s, :, :3, 0], out / "forecast.png",
                                       channels=range(min(3, x.shape[2])),
                                       names=[f"sensor {j}" for j in range(3)], title=f"{name}: sample {s}",
                                       scale="original scale" if isinstance(batch, dict) and "mean" in batch
                                       else None)]
    return []


def _has_sr(path: Path) -> bool:
    """A ``metrics.csv`` whose header has stable-rank columns (``hoformer test`` / ``predict`` add version folders
    whose metrics have none, and must not hide the fit's)."""
    try:
        with open(path) as f:
            return "sr/" in f.readline()
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------------ CLI
def analyze_main(argv: Sequence[str] | None = None) -> int:
    """``hoformer analyze``: attention-map, stable-rank and forecast figures of a checkpoint on a dataset split."""
    p = argparse.ArgumentParser(prog="hoformer analyze", description=analyze_main.__doc__)
    p.add_argument("--checkpoint", "--ckpt", required=True, help="Lightning .ckpt or save_pretrained folder")
    p.add_argument("--config", help="LightningCLI YAML whose `data` section gives the datamodule")
    p.add_argument("--data", help="datamodule class path, e.g. hoformer.data.LTSFDataModule")
    p.add_argument("--data-args", default="{}", help="JSON init args of --data (or overrides of --config's data)")
    p.add_argument("--model-args", default="{}", help="JSON overrides of the checkpoint's model_kwargs")
    p.add_argument("--split", default="test", choices=["train", "val", "test"])
    p.add_argument("--num-batches", type=int, default=1, help="batches averaged in the attention maps")
    p.add_argument("--metrics", help="metrics.csv with stable-rank columns (default: searched in the run folder)")
    p.add_argument("--token", type=int, default=0, help="query token of the HOBA triplet slice")
    p.add_argument("--sample", type=int, default=0, help="sample of the batch for per-sample figures")
    p.add_argument("--max-heads", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--output", default="runs/analysis", help="folder of the PNGs (default runs/analysis)")
    a = p.parse_args(argv)
    if a.num_batches < 1:
        p.error(f"--num-batches must be >= 1, got {a.num_batches}")
    require_matplotlib(p)
    parsed = {}
    for opt in ("data_args", "model_args"):
        try:
            parsed[opt] = json.loads(getattr(a, opt))
        except json.JSONDecodeError as e:
            p.error(f"--{opt.replace('_', '-')} must be a JSON object: {e}")
        if not isinstance(parsed[opt], dict):
            p.error(f"--{opt.replace('_', '-')} must be a JSON object")
    try:
        files = analyze_checkpoint(a.checkpoint, a.output, config=a.config, data=a.data,
                                   data_args=parsed["data_args"], split=a.split, num_batches=a.num_batches,
                                   metrics=a.metrics, token=a.token, sample=a.sample, max_heads=a.max_heads,
                                   device=a.device, model_args=parsed["model_args"])
    except (FileNotFoundError, ValueError) as e:  # the documented input errors: one line, not a traceback
        print(f"hoformer analyze: error: {e}", file=sys.stderr)
        return 2
    for f in files:
        print(f)
    print(f"hoformer analyze: wrote {len(files)} figure(s) to {a.output}")
    if not files:
        print("hoformer analyze: warning: nothing to draw for this model", file=sys.stderr)
        return 1
    return 0
