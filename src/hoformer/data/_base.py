"""Shared base of hoformer's Lightning datamodules: dataset cache and loaders of the ``train`` / ``val`` / ``test``
splits.

A subclass says how its datasets are built, in one of two ways:

* one split at a time: override :meth:`SplitDataModule._make` (``split -> Dataset``); each split is built lazily,
  on first use (the HOT datamodules);
* all splits together (a tokenizer or a scaler fitted on the training split): override
  :meth:`SplitDataModule._make_splits`, which may return more splits than were asked for; everything it returns is
  cached, so it runs once (text, the series datamodules).

Training loaders shuffle; validation, test and predict loaders never shuffle and no loader drops its last batch, so
every evaluation sample is scored. When a multi-process (DDP) ``Trainer`` asks for the validation / test / predict
loaders, each rank gets a disjoint, unpadded share of the split (``UnrepeatedDistributedSampler``, which Lightning
keeps), so every sample is scored exactly once across ranks and summed metrics equal the single-process ones; a loader
built by a direct call (``dm.val_dataloader()``) always covers the whole split.

A training loader starts its iterator (worker processes, sampler indices, the workers' seeds) at the epoch's first
batch, not when Lightning calls ``iter`` on it, which for the first epoch of a run (fresh or resumed) happens before
``on_train_epoch_start`` (:class:`hoformer.compat.DeferredStartLoader`); its workers are not kept between epochs. So the per-epoch reseeding of
:class:`~hoformer.train.base.TaskModule` covers random augmentations too, in the main process and in workers, and a
resumed run is exact. Lightning is an optional dependency (``hoformer[train]``): without it ``import hoformer.data``
still works and only constructing a datamodule raises :class:`ImportError`.
"""
from __future__ import annotations

from typing import Callable, Iterable

from torch.utils.data import DataLoader, Dataset

from hoformer._checks import check_int
from hoformer.compat import DeferredStartLoader, trainer_eval_sampler

__all__ = ["SplitDataModule"]

try:
    from lightning.pytorch import LightningDataModule
except ImportError:  # keep `import hoformer.data` working without the `train` extra
    class LightningDataModule:  # type: ignore[no-redef]
        def __init__(self, *args, **kwargs):
            raise ImportError("hoformer datamodules need lightning: pip install 'hoformer[train]'")

_SPLITS = ("train", "val", "test")
_STAGE_SPLITS = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",)}


class SplitDataModule(LightningDataModule):
    """Datamodule over named splits, cached in :attr:`datasets` (``{"train" | "val" | "test": Dataset}``).

    Args:
        batch_size: training batch size (>= 1).
        num_workers: ``DataLoader`` worker processes (> 0: kept alive between epochs by the validation / test / predict
            loaders; restarted each epoch by the training loader, so they are seeded per epoch).
        pin_memory: pin host memory of the batches.
        eval_batch_size: batch size of the validation / test / predict loaders (``None`` or 0: ``batch_size``).
    """

    def __init__(self, batch_size: int = 32, num_workers: int = 0, pin_memory: bool = False,
                 eval_batch_size: int | None = None) -> None:
        super().__init__()
        fn = type(self).__name__
        check_int(fn, "batch_size", batch_size)
        check_int(fn, "eval_batch_size", eval_batch_size, low=0, optional=True, note=" (None or 0: batch_size)")
        check_int(fn, "num_workers", num_workers, low=0)
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.eval_batch_size = eval_batch_size or batch_size
        self.datasets: dict[str, Dataset] = {}

    # ------------------------------------------------------------------------------------------------- hooks
    def _make(self, split: str) -> Dataset:
        """Build the dataset of one ``split``."""
        raise NotImplementedError(f"{type(self).__name__} must override _make(split) or _make_splits(names)")

    def _make_splits(self, names: tuple[str, ...]) -> dict[str, Dataset]:
        """Build the datasets of the splits ``names`` (default: :meth:`_make` of each). An override that builds all
        splits at once may ignore ``names`` and return every split."""
        return {split: self._make(split) for split in names}

    def collate_fn(self, split: str) -> Callable | None:
        """``collate_fn`` of the loaders of ``split`` (asked after the split is built); ``None``: PyTorch's default."""
        return None

    # ------------------------------------------------------------------------------------------------- cache
    def _ensure(self, names: Iterable[str]) -> None:
        missing = tuple(s for s in names if s not in self.datasets)
        if not missing:
            return
        self.datasets.update(self._make_splits(missing))
        lacking = [s for s in missing if s not in self.datasets]
        if lacking:
            raise KeyError(f"{type(self).__name__}: no split {lacking[0]!r} (has {sorted(self.datasets)})")

    def dataset(self, split: str) -> Dataset:
        """The (cached) dataset of ``split`` ("train" | "val" | "test")."""
        if split not in _SPLITS:
            raise ValueError(f"{type(self).__name__}.dataset: `split` must be one of {_SPLITS}, got {split!r}")
        self._ensure((split,))
        return self.datasets[split]

    #: what one item of a split is, in the words of :meth:`split_summary`
    sample_unit = "samples"

    def _split_sizes(self) -> dict[str, int]:
        """The number of items of each split built so far (``{"train": n, "val": n, "test": n}``)."""
        return {s: len(self.datasets[s]) for s in _SPLITS if s in self.datasets and hasattr(self.datasets[s],
                                                                                              "__len__")}

    def _split_protocol(self) -> str:
        """How the splits were made, in a few words (subclasses say more)."""
        return type(self).__name__

    def _split_note(self) -> str:
        """A remark appended to :meth:`split_summary`'s line ("" for none)."""
        return ""

    def split_summary(self) -> tuple[str, dict[str, int]]:
        """``(line, sizes)``: a one-line description of the data as the run uses it (what was read, how it was split
        and the size of each split built so far, e.g. ``"ETTh2.csv, split 12/4/4 months (ETTh protocol): 8449 / 2785
        / 2785 windows"``) and ``{split: size}``; ``hoformer fit`` prints it when training starts."""
        sizes = self._split_sizes()
        counts = " / ".join(str(sizes[s]) for s in _SPLITS if s in sizes)
        names = "/".join(s for s in _SPLITS if s in sizes)
        note = self._split_note()
        return f"{self._split_protocol()}: {names} {counts} {self.sample_unit}" + (f"; {note}" if note else ""), sizes

    def setup(self, stage: str | None = None) -> None:
        """Build the splits of ``stage`` ("fit": train + val, "validate": val, "test" / "predict": test; ``None``:
        all three) that are not built yet."""
        self._ensure(_STAGE_SPLITS.get(stage, ("train", "val", "test")))

    # ----------------------------------------------------------------------------------------------- loaders
    def _loader(self, split: str, train: bool) -> DataLoader:
        """``train``: shuffled batches of ``batch_size``, started at the first batch, workers restarted each epoch;
        otherwise in order (on a DDP ``Trainer``: this rank's unpadded share), ``eval_batch_size``, persistent
        workers. Never drops the last (partial) batch."""
        self._ensure((split,))  # not `self.dataset(...)`: subclasses may use that name for an attribute
        ds = self.datasets[split]
        common = dict(drop_last=False, num_workers=self.num_workers, pin_memory=self.pin_memory,
                      collate_fn=self.collate_fn(split))
        if train:
            return DeferredStartLoader(ds, batch_size=self.batch_size, shuffle=True, persistent_workers=False, **common)
        return DataLoader(ds, batch_size=self.eval_batch_size, sampler=trainer_eval_sampler(ds, self.trainer),
                          persistent_workers=self.num_workers > 0, **common)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", False)
