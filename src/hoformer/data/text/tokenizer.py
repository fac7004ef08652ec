"""The tokenizer of the text data (:class:`TextTokenizer`: a WordPiece vocabulary trained on the training split, or a
local Hugging Face tokenizer)."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Sequence


from hoformer._checks import check_int
from hoformer._io import atomic_write


__all__ = ["TextTokenizer"]


class TextTokenizer:
    """Thin wrapper of a ``tokenizers.Tokenizer`` with ``[CLS] ... [SEP]`` (or ``<s> ... </s>``) framing.

    ``TextTokenizer.train(texts, vocab_size)`` learns a BERT-style WordPiece vocabulary (lower-cased);
    ``TextTokenizer.from_pretrained(path)`` loads our ``save`` output or a local Hugging Face tokenizer
    (``tokenizer.json``; BERT ``vocab.txt``; RoBERTa/GPT-2 ``vocab.json`` + ``merges.txt``).
    """

    FILE = "tokenizer.json"
    SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.tok.no_padding()
        self.tok.no_truncation()
        vocab = self.tok.get_vocab()
        pad = next((t for t in ("[PAD]", "<pad>") if t in vocab), None)
        if pad is None:  # e.g. GPT-2's vocab.json: id 0 is "!", a real token, which padding_idx would freeze
            self.tok.add_special_tokens(["<pad>"])
            pad = "<pad>"
            warnings.warn(f"TextTokenizer: the vocabulary has no pad token ([PAD] or <pad>); added '<pad>' as id "
                          f"{self.tok.token_to_id(pad)} (vocab_size is now {self.tok.get_vocab_size()})", stacklevel=2)
        self.pad_id = self.tok.token_to_id(pad)

    @classmethod
    def train(cls, texts: Sequence[str], vocab_size: int = 8000, min_frequency: int = 2,
              lowercase: bool = True) -> "TextTokenizer":
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

        if not texts:
            raise ValueError("TextTokenizer.train: no training texts")
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=list(cls.SPECIALS), show_progress=False)
        tok.train_from_iterator(list(texts), trainer=trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")),
                                                     ("[SEP]", tok.token_to_id("[SEP]"))])
        return cls(tok)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "TextTokenizer":
        from tokenizers import Tokenizer

        p = Path(path).expanduser()
        if p.is_file():
            return cls(Tokenizer.from_file(str(p)))
        if not p.is_dir():
            raise FileNotFoundError(f"TextTokenizer.from_pretrained: {p} is neither a tokenizer file nor a directory")
        if (p / cls.FILE).is_file():
            return cls(Tokenizer.from_file(str(p / cls.FILE)))
        if (p / "vocab.txt").is_file():
            from tokenizers import BertWordPieceTokenizer

            return cls(BertWordPieceTokenizer(str(p / "vocab.txt"), lowercase=_bert_lowercase(p))._tokenizer)
        if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
            from tokenizers import ByteLevelBPETokenizer, processors

            bpe = ByteLevelBPETokenizer(str(p / "vocab.json"), str(p / "merges.txt"))
            tok = bpe._tokenizer
            v = tok.get_vocab()
            if "<s>" in v and "</s>" in v:
                tok.post_processor = processors.RobertaProcessing(("</s>", v["</s>"]), ("<s>", v["<s>"]))
            return cls(tok)
        raise FileNotFoundError(f"TextTokenizer.from_pretrained: no tokenizer.json, vocab.txt or vocab.json+merges.txt"
                                f" in {p}")

    def save(self, directory: str | os.PathLike) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(d / self.FILE, lambda tmp: self.tok.save(tmp))
        return d / self.FILE

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        _check_max_len(max_len)
        return _truncate(self.tok.encode(text).ids, max_len)

    def encode_batch(self, texts: Sequence[str], max_len: int | None = None) -> list[list[int]]:
        _check_max_len(max_len)
        return [_truncate(e.ids, max_len) for e in self.tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids if int(i) != self.pad_id])


def _bert_lowercase(d: Path) -> bool:
    """Whether a BERT ``vocab.txt`` directory is uncased: ``tokenizer_config.json``'s ``do_lower_case`` when given,
    else True iff no vocabulary entry other than the bracketed specials ([PAD], [CLS], ...) has an ASCII capital."""
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        try:
            flag = json.loads(cfg.read_text(encoding="utf-8")).get("do_lower_case")
        except (ValueError, AttributeError) as e:
            raise ValueError(f"TextTokenizer.from_pretrained: {cfg} is not a JSON object: {e}") from e
        if isinstance(flag, bool):
            return flag
    words = (t for t in (d / "vocab.txt").read_text(encoding="utf-8").splitlines()
             if not (t.startswith("[") and t.endswith("]")))
    return not any("A" <= c <= "Z" for t in words for c in t)


def _check_max_len(max_len: int | None) -> None:
    check_int("TextTokenizer", "max_len", max_len, low=2, optional=True, note=" (the closing [SEP] / </s> is kept)")


def _truncate(ids: list[int], max_len: int | None) -> list[int]:
    if max_len is None or len(ids) <= max_len:
        return ids
    return ids[: max_len - 1] + ids[-1:]  # keep the closing [SEP] / </s>

