"""Training-time stable-rank logging (HOT paper 000 section 5.4, eqs 10-12, Figs 3-4).

:func:`attention_stable_ranks` turns one forward's :class:`~hoformer.analysis.AttentionRecord` list into mean stable
ranks; :class:`StableRankCallback` records the maps of the task's *own* forward passes (no extra forward) on the first
``num_batches`` validation batches of every ``every_n_epochs``-th epoch and every ``train_every_n_steps``-th training
step, and logs (to every logger of the run: CSV, TensorBoard, ...)

* ``{stage}/sr/mode{i}``  mean stable rank of the mode-wise factors ``S_i`` (over batch, heads and layers);
* ``{stage}/sr/product`` and ``{stage}/sr/sum``  of ``S_1 (x) .. (x) S_k`` and ``S_1 (+) .. (+) S_k`` built from the
  same factors, with the exact matrix-free :func:`~hoformer.analysis.kron_product_stable_rank` (eq 11) and
  :func:`~hoformer.analysis.kron_sum_stable_rank` (Lanczos, never the dense matrix);
* ``{stage}/sr/full``  of dense attention matrices (full-attention baselines) with at most ``full_max_tokens`` rows;
* with ``per_layer=True`` also ``{stage}/sr/<layer name>/<key>``.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict

import torch

from hoformer._checks import check_int

from .maps import AttentionRecord, recording
from .ranks import kron_product_stable_rank, kron_sum_stable_rank, stable_rank

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - lightning is the `train` extra
    Callback = object  # type: ignore[misc,assignment]

__all__ = ["attention_stable_ranks", "StableRankCallback"]


def _f(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def _mean(t: torch.Tensor) -> float:
    t = _f(t)
    t = t[torch.isfinite(t)]
    return float(t.mean()) if t.numel() else float("nan")


@torch.no_grad()
def attention_stable_ranks(records: list[AttentionRecord], *, full_max_tokens: int = 1024, iters: int = 64,
                           per_layer: bool = False) -> dict[str, float]:
    """Mean stable ranks (eq 10) of one forward's maps: ``mode{i}``, ``product``, ``sum`` for Kronecker layers
    (factors ``(B, H, Ni, Ni)``), ``mode{i}`` for axial layers (averaged over fibers) and ``full`` for dense maps with
    ``N <= full_max_tokens``; averaged over layers (and over batch and heads). HOBA triplet / block maps are skipped."""
    per: dict[str, list[float]] = defaultdict(list)
    out: dict[str, float] = {}
    for r in records:
        vals: dict[str, float] = {}
        if r.kind == "kronecker":
            fs = [_f(m) for m in r.maps]
            lead = torch.broadcast_shapes(*(f.shape[:-2] for f in fs))
            fs = [f.expand(*lead, *f.shape[-2:]) for f in fs]
            for i, f in enumerate(fs):
                vals[f"mode{i}"] = _mean(stable_rank(f))
            if len(fs) > 1:
                vals["product"] = _mean(kron_product_stable_rank(fs))
                vals["sum"] = _mean(kron_sum_stable_rank(fs, method="exact", iters=iters))
        elif r.kind == "axial":
            for i, m in zip(r.mode_indices(), r.maps):  # the attended modes (a 1-mode baseline: just that one)
                vals[f"mode{i}"] = _mean(stable_rank(_f(m)))
        elif r.kind == "full":
            a = r.maps[0]
            if a.shape[-1] <= full_max_tokens:
                vals["full"] = _mean(stable_rank(_f(a)))
        for key, v in vals.items():
            per[key].append(v)
            if per_layer:
                out[f"{r.name}/{key}"] = v
    out.update({k: sum(v) / len(v) for k, v in per.items()})
    return out


def _inner_model(pl_module):
    return getattr(pl_module, "model", pl_module)


class StableRankCallback(Callback):
    """Log mean attention stable ranks during training (HOT Figs 3-4); see the module docstring for the keys.

    Args:
        every_n_epochs: validation epochs between measurements (1 = every epoch).
        num_batches: validation batches recorded per measured epoch.
        train_every_n_steps: also record every n-th training step (the training forward itself; the recorded maps
            are the attention weights before attention dropout); 0 disables.
        full_max_tokens: dense maps larger than this are skipped (their SVD costs ``O(N^3)``).
        iters: Lanczos iterations of the Kronecker-sum spectral norm.
        per_layer: also log every layer's values.
    """

    def __init__(self, every_n_epochs: int = 1, num_batches: int = 2, train_every_n_steps: int = 50,
                 full_max_tokens: int = 1024, iters: int = 64, per_layer: bool = False) -> None:
        super().__init__()
        for name, v in (("every_n_epochs", every_n_epochs), ("num_batches", num_batches)):
            check_int("StableRankCallback", name, v)
        check_int("StableRankCallback", "train_every_n_steps", train_every_n_steps, low=0)
        self.every_n_epochs, self.num_batches = every_n_epochs, num_batches
        self.train_every_n_steps = train_every_n_steps
        self.kw = dict(full_max_tokens=full_max_tokens, iters=iters, per_layer=per_layer)
        self._stack: contextlib.ExitStack | None = None
        self._records: list | None = None
        self._val: dict[str, list[float]] = defaultdict(list)
        self._step = -1  # global step of the last training measurement

    # ---------------------------------------------------------------------------------------------- helpers
    def _start(self, pl_module) -> None:
        self._stop()
        self._stack = contextlib.ExitStack()
        self._records = self._stack.enter_context(recording(_inner_model(pl_module)))

    def _stop(self) -> dict[str, float]:
        if self._stack is None:
            return {}
        self._stack.close()
        self._stack = None
        records, self._records = self._records or [], None
        return attention_stable_ranks(records, **self.kw) if records else {}

    def _val_active(self, trainer, batch_idx: int) -> bool:
        return (not trainer.sanity_checking and batch_idx < self.num_batches
                and trainer.current_epoch % self.every_n_epochs == 0)

    # ------------------------------------------------------------------------------------------------ train
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.train_every_n_steps and step % self.train_every_n_steps == 0 and step != self._step:
            self._step = step  # the step's first micro-batch only (gradient accumulation keeps global_step)
            self._start(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        vals = self._stop()
        if vals and trainer.is_global_zero:  # straight to the loggers: not throttled by log_every_n_steps
            for logger in trainer.loggers:  # at the step that was measured (global_step has moved on by now)
                logger.log_metrics({f"train/sr/{k}": v for k, v in vals.items()}, step=self._step)

    # ------------------------------------------------------------------------------------------- validation
    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._val = defaultdict(list)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx: int = 0) -> None:
        if self._val_active(trainer, batch_idx):
            self._start(pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx: int = 0) -> None:
        for k, v in self._stop().items():
            self._val[k].append(v)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if self._val:
            pl_module.log_dict({f"val/sr/{k}": sum(v) / len(v) for k, v in self._val.items()}, on_step=False,
                               on_epoch=True, batch_size=1)
        self._val = defaultdict(list)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._stop()
