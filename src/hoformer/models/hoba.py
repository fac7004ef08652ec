"""HOBA text models (paper 004 section 3, Figure 1b): a RoBERTa-like encoder whose self-attention is HOBA
(block-diagonal triplet attention + cross-block routing) or one of the baselines.

``create_model("hoba_classifier", vocab_size=1000, num_classes=2, max_len=128)`` maps token ids ``(B, L)`` (``L <=
max_len``) and an optional bool attention mask ``(B, L)`` (True = real token) to logits ``(B, num_classes)``.

Defaults follow the paper's student (3 layers, head dim 64, FFN 4x, block 16, overlap 0.25, cross-block on,
dropout 0.1, max length 64) at a CPU-friendly width (256, 4 heads); the paper's RoBERTa-base width is
``dim=768, num_heads=12`` (see ``configs/hoba``). Per-layer attention maps: :func:`hoformer.layers.record_attention`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from hoformer._checks import check_values, check_int
from hoformer.layers import CheckedMasks, Dropout
from hoformer.layers.triplet import TEXT_ATTENTIONS, HOBABlock

from .base import WEIGHTS_NAME, HoformerModel
from .hf import hf_as_student, hf_config
from .registry import register_model

__all__ = ["HOBAClassifier"]


class TextEmbeddings(nn.Module):
    """Token + learned absolute position embeddings, LayerNorm, dropout (RoBERTa-style)."""

    def __init__(self, vocab_size: int, dim: int, max_len: int, pad_id: int, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        self.positions = nn.Embedding(max_len, dim)
        self.norm = nn.LayerNorm(dim)
        self.drop = Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.norm(self.tokens(ids) + self.positions(pos)))


@register_model(name="hoba_classifier")
class HOBAClassifier(HoformerModel):
    """Embeddings -> ``depth`` x :class:`~hoformer.layers.HOBABlock` -> pooled head (``[CLS]`` token or masked mean)
    -> ``Linear-tanh-Linear`` classifier (RoBERTa classification head).

    Args:
        vocab_size: vocabulary size (token ids lie in ``[0, vocab_size)``).
        num_classes: classes.
        max_len: longest sequence (position table size).
        dim: model width.
        depth: number of layers.
        num_heads: attention heads.
        mlp_ratio: FFN hidden width / ``dim``.
        attention: ``"hoba"`` (blocked triplet attention + cross-block routing), ``"triplet_full"`` (triplet
            attention over the whole sequence), ``"block2d"`` (blocked pairwise attention) or ``"full2d"`` (standard
            pairwise attention).
        block_size: tokens per block of the blocked variants (eqs 3-7).
        overlap: fraction of a block shared with the next one.
        cross_block: route information between blocks (blocked variants).
        dropout: dropout on embeddings, attention outputs, FFNs and the head.
        pooling: ``"cls"`` (first token) or ``"mean"`` (mean over real tokens).
        norm_first: pre-norm layers (stable from scratch) or RoBERTa's post-norm.
        pad_id: padding token id (its embedding is zero and gets no gradient).
    """

    def __init__(
        self,
        vocab_size: int = 8000,
        num_classes: int = 2,
        max_len: int = 64,
        dim: int = 256,
        depth: int = 3,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        attention: Literal["hoba", "triplet_full", "block2d", "full2d"] = "hoba",
        block_size: int = 16,
        overlap: float = 0.25,
        cross_block: bool = True,
        dropout: float = 0.1,
        pooling: Literal["cls", "mean"] = "cls",
        norm_first: bool = True,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.record_config(locals())
        for name, v in (("vocab_size", vocab_size), ("num_classes", num_classes), ("max_len", max_len)):
            check_int("hoba_classifier", name, v)
        if attention not in TEXT_ATTENTIONS:
            raise ValueError(f"hoba_classifier: unknown attention {attention!r}; expected one of {TEXT_ATTENTIONS}")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"hoba_classifier: `pooling` must be 'cls' or 'mean', got {pooling!r}")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"hoba_classifier: `pad_id` must be in [0, vocab_size={vocab_size}), got {pad_id}")
        self.vocab_size, self.num_classes, self.max_len = vocab_size, num_classes, max_len
        self.pooling, self.pad_id = pooling, pad_id
        self.embed = TextEmbeddings(vocab_size, dim, max_len, pad_id, dropout)
        self.layers = nn.ModuleList(
            HOBABlock(dim, num_heads, attention=attention, mlp_ratio=mlp_ratio, dropout=dropout,
                      norm_first=norm_first, **({} if attention in ("full2d", "triplet_full") else
                                                 dict(block_size=block_size, overlap=overlap, cross_block=cross_block)))
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim) if norm_first else nn.Identity()
        self.head = nn.Sequential(Dropout(dropout), nn.Linear(dim, dim), nn.Tanh(), Dropout(dropout),
                                  nn.Linear(dim, num_classes))

    def _check(self, ids, mask):
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.long, torch.int, torch.int16, torch.uint8):
            got = getattr(ids, "dtype", type(ids).__name__)
            raise TypeError(f"hoba_classifier: `ids` must be an integer tensor (B, L), got {got}")
        if ids.ndim != 2 or ids.shape[1] < 1:
            raise ValueError(f"hoba_classifier: `ids` must have shape (B, L) with L >= 1, got {tuple(ids.shape)}")
        if ids.shape[0] == 0:
            raise ValueError(f"hoba_classifier: `ids` has an empty batch (B = 0); expected at least one sequence, "
                             f"got shape {tuple(ids.shape)}")
        if ids.shape[1] > self.max_len:
            raise ValueError(f"hoba_classifier: sequence length {ids.shape[1]} exceeds max_len={self.max_len}")
        if ids.numel():
            lo, hi = ids.min(), ids.max()  # min / max: ONNX has no translation of aminmax over all dims
            check_values((lo >= 0) & (hi < self.vocab_size), f"hoba_classifier: token ids must lie in [0, vocab_size="
                         f"{self.vocab_size}){{detail}} (tokenizer and model vocabularies differ?)",
                         lambda: f", got ids in [{int(lo)}, {int(hi)}]")
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
                raise ValueError(f"hoba_classifier: `mask` must have the shape of `ids` {tuple(ids.shape)}, got "
                                 f"{tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
            if mask.dtype != torch.bool:
                raise TypeError(f"hoba_classifier: `mask` must be a bool tensor (True = real token), got {mask.dtype}")

    def encode(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token states ``(B, L, dim)``."""
        self._check(ids, mask)
        x = self.embed(ids.long())
        if mask is not None:
            x = x * mask[..., None]
        checked = CheckedMasks(mask)  # checked above, once for every layer
        for layer in self.layers:
            x = layer(x, mask=checked)
        return self.norm(x)

    def pool(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.pooling == "cls":
            return x[:, 0]
        if mask is None:
            return x.mean(1)
        w = mask[..., None].to(x.dtype)
        return (x * w).sum(1) / w.sum(1).clamp_min(1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.pool(self.encode(ids, mask), mask))

    def example_inputs(self, batch_size: int = 2) -> tuple[tuple, dict]:
        L = min(self.max_len, 24)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, self.vocab_size, (batch_size, L), generator=g)
        mask = torch.ones(batch_size, L, dtype=torch.bool)
        mask[-1, L - L // 3:] = False  # padded tail on the last sample
        ids = ids.masked_fill(~mask, self.pad_id)
        return (ids,), {"mask": mask}

    @torch.no_grad()
    def load_embeddings_from(self, source: "HOBAClassifier | str | os.PathLike", head: bool = False) -> list[str]:
        """Copy the embedding weights (and the classifier head when ``head=True``) from a teacher model, a
        ``save_pretrained`` directory or a local Hugging Face checkpoint directory (BERT / RoBERTa family: word,
        position and LayerNorm weights; BERT's token-type 0 row folded into the positions; the RoBERTa family's
        positions read from row ``pad_token_id + 1`` on (``hf_position_offset``); ``head``: RoBERTa's
        ``classifier.dense`` / ``out_proj``, the same Linear-tanh-Linear on the first token), as the paper's students
        inherit the teacher's embeddings and head.
        Returns the copied parameter names; shapes must match (same vocabulary, i.e. the teacher's tokenizer, and
        width), except that a longer position table gives its first ``max_len`` positions (a RoBERTa teacher has 514,
        its students 64 or 128)."""
        if isinstance(source, (str, os.PathLike)):
            cfg = hf_config(source)
            state = hf_as_student(Path(source), cfg, head) if cfg else _load_safetensors(source)
        else:
            state = source.state_dict()
        prefixes = ("embed.",) + (("head.",) if head else ())
        own = self.state_dict()
        copied = []
        for k, v in state.items():
            if k.startswith(prefixes) and k in own:
                if k == "embed.positions.weight" and v.shape[0] > own[k].shape[0] and v.shape[1:] == own[k].shape[1:]:
                    v = v[: own[k].shape[0]]
                if own[k].shape != v.shape:
                    raise ValueError(f"load_embeddings_from: shape mismatch for {k}: teacher {tuple(v.shape)} vs "
                                     f"student {tuple(own[k].shape)} (same tokenizer and width required)")
                own[k].copy_(v)
                copied.append(k)
        if not copied:
            raise ValueError("load_embeddings_from: the source has no 'embed.*' weights")
        return copied


def _load_safetensors(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / WEIGHTS_NAME))
