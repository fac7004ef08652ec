"""Hugging Face checkpoints as HOBA teachers: read a local model directory's ``config.json`` and its embedding
(and RoBERTa classification-head) weights under :class:`~hoformer.models.HOBAClassifier`'s parameter names."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .base import CONFIG_NAME

__all__ = ["hf_config", "hf_position_offset", "hf_as_student"]


def hf_config(directory: str | os.PathLike) -> dict | None:
    """The ``config.json`` of a Hugging Face model directory (it has a ``model_type``; a :meth:`save_pretrained`
    one has ``name`` / ``kwargs`` instead), or ``None`` for anything else."""
    try:
        cfg = json.loads((Path(directory) / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) and "model_type" in cfg and "kwargs" not in cfg else None


#: Hugging Face model types whose learned positions start at ``pad_token_id + 1`` (RoBERTa's embeddings)
_PAD_OFFSET_TYPES = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "roberta-prelayernorm", "camembert",
                               "longformer", "data2vec-text", "ibert", "mpnet", "luke", "markuplm", "xmod", "lilt"})
#: Hugging Face model types whose positions start at a fixed row
_FIXED_OFFSET_TYPES = {"nystromformer": 2, "yoso": 2, "mra": 2}


def hf_position_offset(cfg: dict) -> int:
    """First row of a Hugging Face config's learned position table that position 0 uses: ``pad_token_id + 1`` for
    the RoBERTa family (:data:`_PAD_OFFSET_TYPES`, ``pad_token_id`` 1 when unset), a fixed row for a few others
    (:data:`_FIXED_OFFSET_TYPES`), 0 for BERT and the rest."""
    kind = cfg.get("model_type")
    if kind in _FIXED_OFFSET_TYPES:
        return _FIXED_OFFSET_TYPES[kind]
    if kind not in _PAD_OFFSET_TYPES:
        return 0
    pad = cfg.get("pad_token_id")
    return (1 if pad is None else int(pad)) + 1


def hf_as_student(directory: Path, cfg: dict, head: bool) -> dict[str, torch.Tensor]:
    """A Hugging Face checkpoint's (config ``cfg``) embedding (and RoBERTa head) weights under
    :class:`~hoformer.models.HOBAClassifier`'s names."""
    from safetensors.torch import load_file

    from hoformer._io import read_checkpoint

    state: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin")):  # shards too
        state.update(load_file(str(f)) if f.suffix == ".safetensors" else
                     read_checkpoint(f, fn="load_embeddings_from", what="Hugging Face weights"))
    if not state:
        raise FileNotFoundError(f"load_embeddings_from: no *.safetensors or pytorch_model*.bin in {str(directory)!r}")
    word = [k for k in state if k.endswith("embeddings.word_embeddings.weight")]
    if len(word) != 1:
        raise ValueError(f"load_embeddings_from: {str(directory)!r} ({cfg['model_type']}) has no single BERT-style "
                         f"'embeddings.word_embeddings.weight' (found {word})")
    pre = word[0][: -len("word_embeddings.weight")]  # e.g. "roberta.embeddings."
    if pre + "position_embeddings.weight" not in state:
        raise ValueError(f"load_embeddings_from: {str(directory)!r} ({cfg['model_type']}) has no learned absolute "
                         f"positions ('{pre}position_embeddings.weight'); the student's position table needs them")
    pos = state[pre + "position_embeddings.weight"][hf_position_offset(cfg):]  # RoBERTa: from pad + 1
    if pre + "token_type_embeddings.weight" in state:  # every token has type 0: a constant added to each position
        pos = pos + state[pre + "token_type_embeddings.weight"][0]
    if pre + "LayerNorm.weight" not in state:  # e.g. xlm-roberta-xl normalises inside its layers instead
        raise ValueError(f"load_embeddings_from: {str(directory)!r} ({cfg['model_type']}) has no embedding LayerNorm "
                         f"('{pre}LayerNorm.weight'), which the student's embeddings apply")
    out = {"embed.tokens.weight": state[word[0]], "embed.positions.weight": pos,
           "embed.norm.weight": state[pre + "LayerNorm.weight"], "embed.norm.bias": state[pre + "LayerNorm.bias"]}
    if head:
        names = {"head.1.weight": "classifier.dense.weight", "head.1.bias": "classifier.dense.bias",
                 "head.4.weight": "classifier.out_proj.weight", "head.4.bias": "classifier.out_proj.bias"}
        if not all(v in state for v in names.values()):
            raise ValueError(f"load_embeddings_from: head=True needs a RoBERTa-style classification head "
                             f"(classifier.dense / classifier.out_proj), which {str(directory)!r} "
                             f"({cfg['model_type']}) does not have")
        out.update({k: state[v] for k, v in names.items()})
    return out
