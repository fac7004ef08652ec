"""Windows of a scaled series (:class:`SeriesWindows`, one gatherer for items and batches) and the on-device loader
(:class:`WindowBatches`)."""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch.utils.data import Dataset, RandomSampler, SequentialSampler

__all__ = ["SeriesWindows", "WindowBatches"]


class SeriesWindows(Dataset):
    """Windows of a scaled series ``(T, *space, C)``: item ``i`` reads input rows ``[s, s + window)`` and target rows
    ``[s + window, s + window + horizon)`` of ``s = starts[i]``, as a dict in the batch format of the module doc.

    Args:
        data: scaled series (float32 tensor or array).
        starts: window start rows (absolute rows of ``data``).
        window, horizon: ``P`` and ``Q``.
        mean, std: scaler statistics ``(C,)`` (``std`` with the scaler's ``eps`` added), carried by every item for the
            target channels in ``data``'s dtype (:func:`~hoformer.data.unscale` undoes the scaling with them).
        mask: observed entries of ``data`` (bool), or ``None`` (complete).
        time: time features ``(T, F)`` of the rows, or ``None``.
        label_len: known steps before the horizon returned as ``y_known``.
        target_last: the target is the last channel only (``y (Q, *space, 1)``).
        columns: names of the series (LTSF: the variates, the channel mode; traffic: the sensors).
    """

    def __init__(self, data, starts, window: int, horizon: int, mean, std, *, mask=None, time=None,
                 label_len: int = 0, target_last: bool = False, columns=()) -> None:
        self.data = torch.as_tensor(data)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.start_rows = torch.from_numpy(self.starts)  # the starts as a tensor, on the series' device after .to()
        self.window, self.horizon, self.label_len, self.target_last = window, horizon, label_len, target_last
        dtype = self.data.dtype if self.data.is_floating_point() else torch.float32  # float32 from the datamodule
        mean, std = (torch.as_tensor(np.asarray(t), dtype=dtype) for t in (mean, std))
        self.target_mean, self.target_std = (mean[-1:], std[-1:]) if target_last else (mean, std)
        self.mask = None if mask is None else torch.as_tensor(mask)
        self.time = None if time is None else torch.as_tensor(time)
        self.columns = list(columns)

    @property
    def num_variates(self) -> int:
        """Channels ``C`` of ``x``."""
        return self.data.shape[-1]

    def __len__(self) -> int:
        return len(self.starts)

    def to(self, device) -> "SeriesWindows":
        """A copy whose tensors (series, mask, time features, statistics, window starts) are on ``device``; the
        windows of :meth:`batch` are then gathered there."""
        out = copy.copy(self)
        for name in ("data", "start_rows", "mask", "time", "target_mean", "target_std"):
            value = getattr(self, name)
            setattr(out, name, None if value is None else value.to(device))
        return out

    def batch(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Items ``index`` (a 1-D integer tensor) as one batch dict, gathered on the series' device with one indexing
        operation per key: equal to PyTorch's default collate of ``[self[i] for i in index]``."""
        return self._gather(self.start_rows[index.to(self.start_rows.device)])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        return {key: value[0] for key, value in self._gather(self.start_rows[index].reshape(1)).items()}

    def _gather(self, s: torch.Tensor) -> dict[str, torch.Tensor]:
        """The one gatherer: the windows starting at rows ``s`` (``(B,)`` on the series' device) as a batch dict."""
        device = self.data.device
        steps_p = s[:, None] + torch.arange(self.window, device=device)  # (B, P) rows of the inputs
        steps_q = s[:, None] + self.window + torch.arange(self.horizon, device=device)  # (B, Q) rows of the targets
        c = slice(-1, None) if self.target_last else slice(None)
        b = len(s)
        out = {"x": self.data[steps_p], "y": self.data[steps_q][..., c],
               "mean": self.target_mean.expand(b, -1).clone(), "std": self.target_std.expand(b, -1).clone()}
        if self.mask is not None:
            out["mask"], out["y_mask"] = self.mask[steps_p], self.mask[steps_q][..., c]
        if self.time is not None:
            out["time"], out["y_time"] = self.time[steps_p], self.time[steps_q]
        if self.label_len:
            out["y_known"] = self.data[s[:, None] + self.window - self.label_len
                                       + torch.arange(self.label_len, device=device)][..., c]
        return out


class WindowBatches:
    """Batches of :class:`SeriesWindows` gathered where the windows are (:meth:`SeriesWindows.batch`): a loader for
    series that fit in the accelerator's memory, without DataLoader workers or a host-to-device copy per batch.

    The order comes from ``sampler`` (a ``RandomSampler`` over the windows when ``shuffle``, drawn when the first
    batch is asked for, so a task's per-epoch reseeding of ``sampler.generator`` makes it exact on resume; else the
    given sampler or the windows in order), in batches of ``batch_size``, the last one partial: the batches of a
    ``DataLoader`` with the same sampler and PyTorch's default collate.
    """

    def __init__(self, windows: SeriesWindows, batch_size: int, *, shuffle: bool = False, sampler=None) -> None:
        self.dataset, self.batch_size = windows, batch_size
        self.sampler = RandomSampler(windows) if shuffle else (sampler or SequentialSampler(windows))
        self.batch_sampler = None  # the DataLoader attributes Lightning reads to tell a shuffled loader

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        order = torch.as_tensor(list(self.sampler), dtype=torch.long)
        for i in range(0, len(order), self.batch_size):
            yield self.dataset.batch(order[i:i + self.batch_size])

