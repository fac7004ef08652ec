"""Callbacks and checkpoint settings of a run, used by the CLI and the configs.

* :class:`ExportPretrained` - the best checkpoint's model as ``save_pretrained`` safetensors + JSON (with the data
  configuration and scaler) at the end of ``fit``.
* :class:`SavePredictions` - the outputs of ``hoformer predict`` as one tensor file.
* :class:`CompileModel` - ``torch.compile`` the task's model in place.
* :func:`checkpoint_callbacks` - the best and ``last.ckpt`` checkpoint callbacks of every run.

Checkpoints are written atomically by :class:`~hoformer.train.checkpoint_io.AtomicCheckpointIO`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from hoformer._io import atomic_write

__all__ = ["checkpoint_callbacks", "ExportPretrained", "SavePredictions", "CompileModel"]


def checkpoint_callbacks(dirpath, monitor: str | None = None, mode: str = "min", filename: str = "best-{epoch:03d}",
                         **best_kwargs) -> list[dict]:
    """The checkpoint callbacks every hoformer run uses, as LightningCLI ``class_path`` dicts (the config
    generators write them into YAML; ``[ModelCheckpoint(**c["init_args"]) for c in ...]`` builds them in Python):
    the best checkpoint by ``monitor`` (``filename``, extra ``best_kwargs`` such as ``save_top_k``; left out when
    ``monitor`` is None) and ``last.ckpt`` rewritten every epoch for resuming
    (:func:`hoformer.compat.separate_last_checkpoint`); ``hoformer ... --ckpt_path best`` reads the best path
    recorded in ``last.ckpt``."""
    from hoformer.compat import separate_last_checkpoint

    mc = "lightning.pytorch.callbacks.ModelCheckpoint"
    best = [{"class_path": mc, "init_args": {"dirpath": dirpath, "monitor": monitor, "mode": mode,
                                             **best_kwargs, "filename": filename}}] if monitor else []
    return separate_last_checkpoint(dirpath, best)


class ExportPretrained(pl.Callback):
    """At the end of ``fit``, load the best checkpoint's weights (or the current ones when no checkpoint was written)
    into a fresh model and ``save_pretrained`` it to ``dirpath`` (default ``<default_root_dir>/pretrained``), with the
    datamodule's tokenizer when it has one (text) and its configuration and scaler (``data.json``,
    :func:`hoformer.checkpoint.save_data_config`), so that ``hoformer forecast --checkpoint <dirpath>`` needs nothing
    else."""

    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath
        self.path: str | None = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if trainer.global_step == 0:  # not one optimiser step in this attempt or any resumed one
            raise ValueError(
                f"ExportPretrained: the fit ran no training step (max_epochs={trainer.max_epochs}, "
                f"limit_train_batches={trainer.limit_train_batches}, {trainer.num_training_batches} training "
                "batch(es) per epoch): the weights are untrained, so no save_pretrained folder was written")
        from hoformer.models import model_from_config

        model = pl_module.model
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
        if best and os.path.isfile(best):
            from hoformer.checkpoint import model_state, read_lightning_checkpoint

            model = model_from_config(model.config)
            model.load_state_dict(model_state(read_lightning_checkpoint(best, fn="ExportPretrained")))
        root = self.dirpath or os.path.join(trainer.default_root_dir, "pretrained")
        self.path = str(model.save_pretrained(root))
        dm = getattr(trainer, "datamodule", None)
        tokenizer = getattr(dm, "tokenizer", None)
        if tokenizer is not None and callable(getattr(tokenizer, "save", None)):
            tokenizer.save(root)
        if dm is not None:  # the data configuration and scaler: `hoformer forecast --checkpoint <root>` needs them
            from hoformer.checkpoint import save_data_config

            save_data_config(root, dm)


class CompileModel(pl.Callback):
    """``torch.compile`` the task's model for fit / validate / test / predict, from a config or the command line::

        hoformer fit --config C.yaml --trainer.callbacks+=hoformer.train.CompileModel [--trainer.callbacks.mode=max-autotune]

    Compiles in place (``nn.Module.compile``), so the state-dict keys, checkpoints, resumes, EMA and
    ``save_pretrained`` are those of the uncompiled model. The softmax Kronecker and the triplet kernels are custom
    ops in the graph (their hand-written forward and backward run; the linear Kronecker kernel is traced); the
    compiler fuses the projections, norms, MLPs and softmaxes around them.

    Args: ``backend``, ``mode``, ``fullgraph``, ``dynamic``, ``options`` as in :func:`torch.compile`
    (``backend="aot_eager"`` needs no C++ toolchain); ``fullgraph=None`` (default) is ``True`` for a registered
    hoformer model (every one compiles to one graph, so a graph break is an error, not a silent slowdown) and
    ``False`` for any other module. ``fallback_random``: Inductor draws dropout masks with ATen's
    random ops instead of its own generated ones (Inductor's ``fallback_random`` option); ``None`` (default) turns it
    on when the model trains on CPU, where Inductor's generated random numbers made a dropout training step 1.1-2x
    slower than eager (``benchmarks/compile.py``, docs/results.md). With it, compiled dropout draws the same masks as
    eager from the same seed. On GPUs Inductor's fused Philox dropout is the faster one, so it stays off there.

    Measured on CPU (``benchmarks/compile.py``, docs/results.md): 0.92-1.03x the eager step time, so compiling is
    meant for accelerators.
    """

    def __init__(self, backend: str = "inductor", mode: str | None = None, fullgraph: bool | None = None,
                 dynamic: bool | None = None, options: dict[str, Any] | None = None,
                 fallback_random: bool | None = None) -> None:
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"CompileModel: `backend` must be one of {sorted(known)}, got {backend!r}")
        if fallback_random is not None and not isinstance(fallback_random, bool):
            raise TypeError(f"CompileModel: `fallback_random` must be a bool or None, got {fallback_random!r}")
        self.kwargs = dict(backend=backend, mode=mode, fullgraph=fullgraph, dynamic=dynamic, options=options)
        self.fallback_random = fallback_random
        self.compile_kwargs("cpu", **self.kwargs)  # a bad combination fails here, not at setup

    @staticmethod
    def compile_kwargs(device: torch.device | str, backend: str = "inductor", mode: str | None = None,
                       fullgraph: bool | None = False, dynamic: bool | None = None, options: dict[str, Any] | None = None,
                       fallback_random: bool | None = None) -> dict[str, Any]:
        """The :func:`torch.compile` keyword arguments for a model on ``device``: with Inductor and
        ``fallback_random`` (``None``: on CPU only), ``mode`` is spelled out as its options
        (``torch._inductor.list_mode_options``, what torch.compile does with it) plus ``fallback_random=True``."""
        if mode is not None and options is not None:
            raise ValueError("CompileModel: give `mode` or `options`, not both (torch.compile refuses the pair)")
        kwargs = dict(backend=backend, mode=mode, fullgraph=fullgraph, dynamic=dynamic, options=options)
        if fallback_random is None:
            fallback_random = torch.device(device).type == "cpu"
        if backend != "inductor" or not fallback_random or "fallback_random" in (options or {}):
            return kwargs
        from torch._inductor import list_mode_options

        merged = {**(list_mode_options(mode, dynamic) if mode else {}), **(options or {}), "fallback_random": True}
        return {**kwargs, "mode": None, "options": merged}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        model = getattr(pl_module, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"CompileModel: {type(pl_module).__name__} has no `model` module to compile")
        from hoformer.models import HoformerModel

        kwargs = dict(self.kwargs)
        if kwargs["fullgraph"] is None:
            kwargs["fullgraph"] = isinstance(model, HoformerModel)
        model.compile(**self.compile_kwargs(trainer.strategy.root_device, **kwargs,
                                            fallback_random=self.fallback_random))
        # Lightning's model summary would run the one-sample example through the compiled model: an extra batch-1
        # eval graph to compile, and a batch-size change that turns on dynamic shapes for the training graphs
        pl_module.example_input_array = None


class SavePredictions(BasePredictionWriter):
    """Write the outputs of ``hoformer predict`` to ``<dirpath or log_dir>/predictions.pt``: one tensor concatenated
    over batches in dataset order (forecasts ``(N, pred_len, C)``, class probabilities ``(N, K)`` or label maps
    ``(N, H, W)``), loadable with ``torch.load(..., weights_only=True)``. Under DDP every rank scores its share of the
    samples; global rank 0 gathers them with their dataset indices and writes the one file, in order, each sample once
    (a padded sampler's repeats dropped)."""

    def __init__(self, dirpath: str | None = None) -> None:
        super().__init__("epoch")
        self.dirpath = dirpath
        self.path: str | None = None

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        if predictions and isinstance(predictions[0], list):  # several predict dataloaders: keep the first
            predictions = predictions[0]
        if batch_indices and batch_indices[0] and isinstance(batch_indices[0][0], list):  # per dataloader
            batch_indices = batch_indices[0]
        out = torch.cat([p.detach().cpu() for p in predictions]) if predictions else torch.empty(0)
        if trainer.world_size > 1:
            idx = torch.tensor([i for b in batch_indices for i in b], dtype=torch.long)
            if len(idx) != len(out):
                raise RuntimeError(f"SavePredictions: {len(out)} predictions but {len(idx)} sample indices on rank "
                                   f"{trainer.global_rank}; predict_step must return one row per sample")
            shares = [None] * trainer.world_size
            torch.distributed.all_gather_object(shares, (idx, out))
            if not trainer.is_global_zero:
                return
            idx = torch.cat([i for i, _ in shares])
            outs = [o for _, o in shares if len(o)]
            out = torch.cat(outs) if outs else torch.empty(0)
            order = torch.argsort(idx, stable=True)
            idx, out = idx[order], out[order]
            first = torch.ones_like(idx, dtype=torch.bool)
            first[1:] = idx[1:] != idx[:-1]
            out = out[first]
        root = Path(self.dirpath or trainer.log_dir or trainer.default_root_dir)
        atomic_write(root / "predictions.pt", lambda tmp: torch.save(out, tmp))
        self.path = str(root / "predictions.pt")
