"""Workarounds for Lightning behaviour, in one place. Each names the upstream report (or the behaviour, where none
was filed) and the Lightning versions it was checked against; remove one when the supported versions no longer need
it. Lightning is optional (``hoformer[train]``): nothing here imports it at module level.

* :func:`sync_dist_batch_size` - epoch means of ``self.log(..., sync_dist=True, batch_size=n)`` under DDP with uneven
  per-rank shares: Lightning averages the int64 per-rank batch-size totals in integer arithmetic, flooring the mean
  (https://github.com/Lightning-AI/pytorch-lightning/issues/21838; lightning 2.5-2.6).
* :class:`DeferredStartLoader` - Lightning creates the training iterator of a run's first epoch (fresh or resumed)
  *before* ``on_train_epoch_start`` and of later epochs after it (``_FitLoop`` in lightning 2.0-2.6; no upstream
  report), so per-epoch reseeding in that hook would miss the first epoch's shuffle and worker seeds.
* :func:`trainer_eval_sampler` - validation / test loaders built by a DDP ``Trainer`` get a padded
  ``DistributedSampler`` (samples repeated, metrics biased) unless the loader brings an unpadded one; Lightning's own
  ``UnrepeatedDistributedSampler`` is used, detected while Lightning re-instantiates loaders
  (``_replace_dunder_methods``; lightning 2.0-2.6; https://github.com/Lightning-AI/pytorch-lightning/issues/5060).
* :func:`install_checkpoint_io` - ``Trainer.fit / validate / test / predict(ckpt_path=...)`` loads through the
  strategy's ``CheckpointIO`` with ``weights_only`` left unset unless the caller passes it, so
  ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns unpickling on (``TorchCheckpointIO.load_checkpoint`` -> ``pl_load``;
  lightning 2.4-2.6, no upstream report). Every hoformer task installs a weights-only IO from its ``setup`` hook,
  which Lightning runs before the restore, whoever built the trainer.
* :func:`separate_last_checkpoint` - Lightning >= 2.6 writes ``ModelCheckpoint(save_last=True)``'s ``last.ckpt``
  only together with a new top-k checkpoint (and with ``save_top_k=0`` only when training ends), so the file a
  resume needs is written by a second ``ModelCheckpoint`` (``filename="last"``) every epoch.
* :func:`quiet_lightning` - Lightning 2.6 logs an advertisement (``💡 Tip: ... litlogger / litmodels``) on every
  run, and its ``_pytree`` builds ``torch.utils._pytree.LeafSpec``, which torch >= 2.10 deprecates with a
  ``FutureWarning`` on every run (lightning 2.6, torch 2.10-2.13); both are filtered (nothing else is).
* :func:`load_train_data_early` - a task that needs its training labels before the first epoch (balanced class
  weights counted during the sanity check) loads the training data as Lightning's own
  ``Trainer.estimated_stepping_batches`` does (``fit_loop.setup_data()``; lightning 2.0-2.6).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

__all__ = ["sync_dist_batch_size", "DeferredStartLoader", "trainer_eval_sampler", "install_checkpoint_io",
           "separate_last_checkpoint", "load_train_data_early", "quiet_lightning"]


def sync_dist_batch_size(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``LightningModule.log`` keyword arguments with a ``sync_dist`` ``batch_size`` multiplied by the world size.

    Scaling every count by the world size keeps Lightning's integer average of the per-rank totals an integer (the
    total count); the weighted mean itself is unchanged, and exact. No effect on one process."""
    if kwargs.get("sync_dist") and kwargs.get("sync_dist_group") is None and kwargs.get("batch_size") \
            and dist.is_available() and dist.is_initialized():
        kwargs = {**kwargs, "batch_size": kwargs["batch_size"] * dist.get_world_size()}
    return kwargs


class _DeferredIterator:
    """Iterator that calls ``start()`` (``DataLoader.__iter__``) at the first ``next``."""

    def __init__(self, start: Callable[[], Iterator]) -> None:
        self._start, self._it = start, None

    def __iter__(self) -> "_DeferredIterator":
        return self

    def __next__(self):
        if self._it is None:
            self._it = self._start()
        return next(self._it)


class DeferredStartLoader(DataLoader):
    """``DataLoader`` whose iterator starts at the first batch: every epoch's workers (seeded from ``generator``, else
    the global torch RNG), sampler indices and main-process augmentations follow the reseeding done in
    ``on_train_epoch_start``, the first epoch of a run included."""

    def __iter__(self) -> Iterator:
        return _DeferredIterator(super().__iter__)


def trainer_eval_sampler(dataset: Dataset, trainer) -> Sampler | None:
    """Unpadded share of ``dataset`` for this rank when a DDP ``Trainer`` is building its loaders, else ``None``
    (in order). A split smaller than the world size gets ``None`` too, which Lightning pads with its own
    ``DistributedSampler``: an unpadded share would leave a rank without a batch.

    Lightning builds a ``Trainer``'s loaders inside ``_replace_dunder_methods(DataLoader, ...)``, which keeps the
    original ``DataLoader.__init__`` as ``__old__init__`` meanwhile; a direct call (e.g. teacher logits over a whole
    split) keeps the plain in-order loader. Lightning does not replace a ``DistributedSampler`` (subclass). Only the
    attached ``Trainer``'s world size counts: a process group left over from an earlier DDP fit does not shard the
    loaders of a later single-device ``Trainer``."""
    if trainer is None or getattr(trainer, "world_size", 1) <= 1:
        return None
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    if "__old__init__" not in vars(DataLoader) or isinstance(dataset, IterableDataset) \
            or len(dataset) < dist.get_world_size():
        return None
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler

    return UnrepeatedDistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(),
                                        shuffle=False)


def install_checkpoint_io(trainer, make_io: Callable[[], Any], is_safe: Callable[[Any], bool]) -> None:
    """Make every checkpoint load of ``trainer`` weights-only: a plain ``TorchCheckpointIO`` (Lightning's default, also
    inside a wrapping IO such as ``AsyncCheckpointIO``) is replaced by ``make_io()``; any other IO that
    ``is_safe`` does not accept is wrapped so that its loads pass ``weights_only=True`` (its saves are untouched).
    Idempotent."""
    from lightning.fabric.plugins import TorchCheckpointIO
    from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

    strategy = trainer.strategy
    io = strategy.checkpoint_io  # Lightning creates its default here when none was given
    if is_safe(io) or isinstance(io, _WeightsOnlyLoads):
        return
    if type(io) is TorchCheckpointIO:
        strategy.checkpoint_io = make_io()
        return
    inner = getattr(io, "checkpoint_io", None) if isinstance(io, _WrappingCheckpointIO) else None
    if type(inner) is TorchCheckpointIO:
        io._checkpoint_io = make_io()  # the setter refuses to replace a configured base IO
        return
    strategy.checkpoint_io = _WeightsOnlyLoads(io)


class _WeightsOnlyLoads:
    """A user's ``CheckpointIO`` whose loads are forced to ``weights_only=True``; everything else is delegated (a
    duck-typed ``CheckpointIO``: this module does not import Lightning at import time)."""

    def __init__(self, io) -> None:
        self.io = io

    def save_checkpoint(self, *args, **kwargs):
        return self.io.save_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, *args, **kwargs):
        return self.io.remove_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        self.io.teardown()

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None):
        if weights_only is False:
            raise ValueError(f"load_checkpoint: a hoformer task loads checkpoints weights_only=True (they hold only "
                             f"tensors and plain containers), got weights_only=False for {str(path)!r}")
        return self.io.load_checkpoint(path, map_location=map_location, weights_only=True)


def separate_last_checkpoint(dirpath, best: list[dict]) -> list[dict]:
    """``best`` (ModelCheckpoint ``class_path`` dicts) plus the ``last.ckpt`` one, rewritten every epoch."""
    return best + [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"dirpath": dirpath, "filename": "last", "enable_version_counter": False}}]


def load_train_data_early(trainer) -> None:
    """Load ``trainer``'s training data during ``fit`` when Lightning has not yet (a sanity check before the first
    epoch)."""
    if trainer.train_dataloader is None and trainer.state.fn == "fit":
        trainer.fit_loop.setup_data()


class _DropAdvertisement:
    """``logging.Filter`` dropping Lightning's advertising tips (``💡 Tip: ...``)."""

    def filter(self, record) -> bool:
        return not str(record.getMessage()).startswith("💡 Tip:")


def quiet_lightning() -> None:
    """Filter Lightning's advertising tips and the ``LeafSpec`` deprecation warning of its ``_pytree``. Idempotent."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning_utilities.core.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdvertisement) for f in logger.filters):
            logger.addFilter(_DropAdvertisement())
