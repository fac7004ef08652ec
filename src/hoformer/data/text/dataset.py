"""Tokenised examples (:class:`TextClassificationDataset`) and their batches (:func:`collate_text`)."""
from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import Dataset

from hoformer._checks import is_int


__all__ = ["TextClassificationDataset", "collate_text"]


class TextClassificationDataset(Dataset):
    """Pre-tokenised examples; ``ds[i] = {"ids": LongTensor (n,), "label": int, "index": i}``."""

    def __init__(self, ids: list[list[int]], labels: Sequence[int], num_classes: int) -> None:
        if len(ids) != len(labels):
            raise ValueError(f"TextClassificationDataset: {len(ids)} texts but {len(labels)} labels")
        bad = [y for y in labels if not is_int(y) or not 0 <= y < num_classes]
        if bad:
            raise ValueError(f"TextClassificationDataset: labels must be ints in [0, {num_classes}), got {bad[0]!r}")
        self.ids, self.labels, self.num_classes = ids, list(labels), num_classes

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"ids": torch.tensor(self.ids[i], dtype=torch.long), "label": self.labels[i], "index": i}


def collate_text(items: list[dict], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence of the batch: ``ids (B, L)``, ``mask (B, L)`` bool, ``label (B,)``, ``index``."""
    if not items:
        raise ValueError("collate_text: empty batch (no items)")
    n = max(len(it["ids"]) for it in items)
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    mask = torch.zeros(len(items), n, dtype=torch.bool)
    for r, it in enumerate(items):
        ids[r, : len(it["ids"])] = it["ids"]
        mask[r, : len(it["ids"])] = True
    return {"ids": ids, "mask": mask, "label": torch.tensor([it["label"] for it in items]),
            "index": torch.tensor([it["index"] for it in items])}

