"""The checkpoint IO of every hoformer run: :class:`AtomicCheckpointIO` (saves renamed into place, so an interrupted
save never leaves a torn ``.ckpt``; loads weights-only whatever the environment says) and
:func:`install_checkpoint_io`, which every task calls from ``setup``, before Lightning restores any ``ckpt_path``."""
from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from hoformer._io import atomic_write

__all__ = ["AtomicCheckpointIO", "install_checkpoint_io"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves go to a temporary file renamed onto the target (POSIX-atomic), so a crash
    or kill during a save leaves the previous checkpoint intact and never a truncated one. Loads are
    ``weights_only=True`` whatever the environment says."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO.save_checkpoint: `storage_options` unsupported, got {storage_options!r}")
        atomic_write(path, lambda tmp: torch.save(checkpoint, tmp))

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Always ``weights_only=True`` (no environment setting turns it off); a missing, truncated or unreadable
        file, or one that is not a Lightning checkpoint, raises an error naming it
        (:func:`hoformer.checkpoint.read_lightning_checkpoint`)."""
        if weights_only is False:
            raise ValueError("AtomicCheckpointIO.load_checkpoint: `weights_only` must be True or None (hoformer "
                             "checkpoints hold only tensors and plain containers), got False; load a trusted "
                             "pickled checkpoint with a plain TorchCheckpointIO")
        from hoformer.checkpoint import read_lightning_checkpoint

        return read_lightning_checkpoint(path, map_location, fn="load_checkpoint", restore=True)


def install_checkpoint_io(trainer: pl.Trainer) -> None:
    """Make ``trainer`` load checkpoints weights-only and save them atomically (:class:`AtomicCheckpointIO` in place of
    Lightning's default IO; a user's own IO keeps its saves and loads weights-only):
    :func:`hoformer.compat.install_checkpoint_io`. Every task calls it from ``setup``, before any restore."""
    from hoformer.compat import install_checkpoint_io as install

    install(trainer, AtomicCheckpointIO, lambda io: isinstance(io, AtomicCheckpointIO))
