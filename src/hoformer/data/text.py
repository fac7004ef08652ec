"""Text classification data for HOBA (paper 004, Table 8): readers, WordPiece tokenizer, datasets, datamodule.

Files are read from ``$HOFORMER_DATA/text/<name>/`` (or ``root=``), never downloaded here, and checked against the
reference SHA-256 (:data:`TEXT_SHA256`) before parsing where one is known (``verify=False`` for another copy):

* ``sst2``: GLUE SST-2 ``train.tsv`` / ``dev.tsv`` (``sentence<TAB>label`` with a header); split ``test`` is
  ``test_labeled_nonglue.tsv`` (a labelled copy from outside GLUE) and raises ``FileNotFoundError`` when that file
  is absent: GLUE's own ``test.tsv`` has no labels, and dev is never substituted silently.
* ``trec`` / ``trec_fine``: UIUC ``train_5500.label`` / ``TREC_10.label`` (ISO-8859-1, ``COARSE:fine question``);
  6 coarse or 50 fine classes.
* ``ag_news``: ``train.csv`` / ``test.csv`` (``"class(1-4)","title","description"``), or the 10k
  ``train_subset_10k.tsv`` (``text<TAB>label-name``, no header) when ``train.csv`` is absent; class names from
  ``classes.txt``.
* ``imdb``: IMDB-style csv with a header: a text column (``review`` | ``text`` | ``sentence`` | ...) and a label
  column (``sentiment`` | ``label`` | ...) holding positive/negative or 1/0; ``train.csv`` / ``test.csv``
  (``.gz`` accepted), or one ``IMDB Dataset.csv`` (first half train, second half test).
* ``csv``: any CSV / TSV table (``.gz`` accepted) with a header, read by
  :func:`~hoformer.data.text_csv.read_text_table`: ``TextDataModule(dataset="csv", train_file=..., test_file=...,
  text_column=..., label_column=..., labels=...)``; the label mapping is printed when the data is set up.

Validation is always a seeded ``val_fraction`` held out of the training file, by groups (``holdout="grouped"``):
identical texts stay on one side, and SST-2's phrases (GLUE ``train.tsv`` holds every sub-phrase of each sentence's
parse tree) stay with their sentence, so no validation text is a sub-phrase of a training text (a random phrase
split, ``holdout="random"``, put 87 % of validation phrases inside training phrases); ``test`` is the reported set: the
official test file, and for SST-2 (whose GLUE test labels are not public) ``dev.tsv``, the set the HOBA paper reports.
SST-2's dev set is therefore never also the validation set, so checkpoint selection / early stopping on ``val/*``
never sees the reported examples (``sst2_test="nonglue"`` reports ``test_labeled_nonglue.tsv`` instead).

Tokenisation: :class:`TextTokenizer` wraps the ``tokenizers`` package: a BERT-style WordPiece vocabulary trained on
the training split only, ``[CLS] text [SEP]``, saved as ``tokenizer.json`` next to the model; or any local Hugging
Face tokenizer directory / file (``tokenizer.json``, BERT ``vocab.txt``, RoBERTa ``vocab.json`` + ``merges.txt``).
No network access anywhere.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import warnings
from functools import partial
from pathlib import Path
from typing import Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from hoformer._checks import check_int, is_int
from hoformer._io import atomic_write

from ._base import SplitDataModule
from ._utils import VERIFY_HINT, SchemaError, require_file, resolve_root, verify_file
from .text_csv import find_table, label_report, read_text_table

__all__ = [
    "TEXT_DATASETS",
    "TEXT_SHA256",
    "TREC_COARSE",
    "read_text_split",
    "TextTokenizer",
    "TextClassificationDataset",
    "collate_text",
    "TextDataModule",
]

TREC_COARSE = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
TEXT_DATASETS = ("sst2", "trec", "trec_fine", "ag_news", "imdb")
_SUBDIR = {"sst2": "sst2", "trec": "trec", "trec_fine": "trec", "ag_news": "ag_news", "imdb": "imdb"}
_DISPLAY = {"sst2": "SST-2", "trec": "TREC", "ag_news": "AG News", "imdb": "IMDB"}

# SHA-256 of the reference copies (shared/data/SHA256SUMS: GLUE SST-2, UIUC TREC, the AG News test set and its 10k
# training subset), keyed "<dataset folder>/<file>", checked before a file is parsed (``verify=False`` for another
# copy). Files with no reference copy here (AG News' full train.csv, IMDB) are read unverified; every file's layout
# is checked either way.
TEXT_SHA256: dict[str, str] = {
    "sst2/train.tsv": "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1",
    "sst2/dev.tsv": "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0",
    "sst2/test_labeled_nonglue.tsv": "c0efc56ade6e0598d0f8daca1976e232aee0bcabca8e599341cad290d9d10b3c",
    "trec/train_5500.label": "9e4c8bdcaffb96ed61041bd64b564183d52793a8e91d84fc3a8646885f466ec3",
    "trec/TREC_10.label": "033f22c028c2bbba9ca682f68ffe204dc1aa6e1cf35dd6207f2d4ca67f0d0e8e",
    "ag_news/classes.txt": "612dbfa932f07a6ed837295a7d5746ce7412e7bb4bc32ba919fdb3cda3a1b9b5",
    "ag_news/test.csv": "521465c2428ed7f02f8d6db6ffdd4b5447c1c701962353eb2c40d548c3c85699",
    "ag_news/train_subset_10k.tsv": "7a0811e0006080bf4de17752c5466450ff3db778be71bc5bcf3c4e99b5f0803d",
}


# ------------------------------------------------------------------------------------------------- readers
def _need(path: Path, folder: str, verify: bool) -> Path:
    """``path`` if it exists, after checking it against the reference SHA-256 (:data:`TEXT_SHA256`) when ``verify``
    and its digest is known; ``folder`` is the dataset's folder name ("sst2", "trec", "ag_news", "imdb")."""
    what = _DISPLAY[folder]
    require_file(path, what, "Set HOFORMER_DATA or pass root=...")
    want = TEXT_SHA256.get(f"{folder}/{path.name}") if verify else None
    if want is not None:
        verify_file(path, sha256=want, hint=f"Expected the reference {folder}/{path.name} of {what}. {VERIFY_HINT}")
    return path


def _read_sst2(root: Path, split: str, verify: bool):
    if split == "test" and not (root / "test_labeled_nonglue.tsv").is_file():
        raise FileNotFoundError(
            f"SST-2: no labelled test file ({root / 'test_labeled_nonglue.tsv'} not found; GLUE's test.tsv has no "
            "labels). The reported SST-2 set is dev: read split='dev' (TextDataModule uses dev.tsv as its test split "
            "and holds validation out of train.tsv); dev is not substituted for test silently.")
    name = {"train": "train.tsv", "dev": "dev.tsv", "test": "test_labeled_nonglue.tsv"}[split]
    path = _need(root / name, "sst2", verify)
    texts, labels = [], []
    with open(path, encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        if header != ["sentence", "label"]:  # the label is read from the last column
            raise SchemaError(f"SST-2: {path} must start with the header 'sentence<TAB>label', got {header}")
        for n, line in enumerate(f, 2):
            line = line.rstrip("\r\n")
            if not line:
                continue
            text, tab, lab = line.rpartition("\t")
            if not tab:
                raise SchemaError(f"SST-2: {path} line {n}: expected 'sentence<TAB>label', got {line[:40]!r}")
            if lab.strip() not in ("0", "1"):
                raise SchemaError(f"SST-2: {path} line {n}: label must be 0 or 1, got {lab!r}")
            texts.append(text.strip())
            labels.append(int(lab))
    return texts, labels, ["negative", "positive"]


def _read_trec(root: Path, split: str, fine: bool, verify: bool):
    train_path = _need(root / "train_5500.label", "trec", verify)

    def read(path):
        texts, labs = [], []
        with open(path, encoding="iso-8859-1") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                lab, _, text = line.partition(" ")
                if ":" not in lab:
                    raise SchemaError(f"TREC: {path} line {n}: expected 'COARSE:fine question', got {line[:40]!r}")
                texts.append(text)
                labs.append(lab if fine else lab.split(":")[0])
        return texts, labs

    classes = sorted(set(read(train_path)[1])) if fine else list(TREC_COARSE)
    path = train_path if split == "train" else _need(root / "TREC_10.label", "trec", verify)
    texts, labs = read(path)
    unknown = sorted(set(labs) - set(classes))
    if unknown:
        raise SchemaError(f"TREC: {path} has labels outside the {len(classes)} known classes: {unknown[:5]}")
    return texts, [classes.index(x) for x in labs], classes


def _read_ag_news(root: Path, split: str, verify: bool):
    classes = ["World", "Sports", "Business", "Sci/Tech"]
    if (root / "classes.txt").is_file():
        path = _need(root / "classes.txt", "ag_news", verify)
        classes = [c.strip() for c in path.read_text().splitlines() if c.strip()]
    csv_path = root / f"{split}.csv"
    texts, labels = [], []
    # the 10k training subset holds descriptions only: then every split is read as the description only, so the
    # model is tested on the input format it was trained on (else "title . description", as in the full csv)
    desc_only = not (root / "train.csv").is_file() and (root / "train_subset_10k.tsv").is_file()
    if csv_path.is_file():
        with open(_need(csv_path, "ag_news", verify), encoding="utf-8", newline="") as f:
            for n, row in enumerate(csv.reader(f), 1):
                if len(row) < 3 or not row[0].strip().isdigit():
                    raise SchemaError(f"AG News: {csv_path} row {n}: expected \"class\",\"title\",\"description\"")
                text = row[2] if desc_only else f"{row[1]} . {row[2]}"
                texts.append(text.replace("\\n", " ").replace("\\", " "))
                labels.append(int(row[0]) - 1)
    elif split == "train" and (root / "train_subset_10k.tsv").is_file():
        path = _need(root / "train_subset_10k.tsv", "ag_news", verify)
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                text, _, lab = line.rstrip("\r\n").rpartition("\t")
                if lab not in classes:
                    raise SchemaError(f"AG News: {path} line {n}: label {lab!r} not in {classes}")
                texts.append(text.replace("\\", " "))
                labels.append(classes.index(lab))
    else:
        _need(csv_path, "ag_news", verify)
    bad = [x for x in labels if not 0 <= x < len(classes)]
    if bad:
        raise SchemaError(f"AG News: class ids must be in 1..{len(classes)}, got {bad[0] + 1}")
    return texts, labels, classes


_IMDB_LABELS = {"negative": 0, "positive": 1, "neg": 0, "pos": 1, "0": 0, "1": 1}  # compared in lower case


def _read_imdb(root: Path, split: str, verify: bool, encoding: str = "utf-8"):
    """IMDB through :func:`~hoformer.data.text_csv.read_text_table`: ``<split>.csv`` (or ``.csv.gz``), else one
    ``IMDB Dataset.csv`` (or ``.csv.gz``; first half train, second half test); any text / label column names it
    knows. A folder without them is an error listing every name looked for and the tables the folder holds."""
    path = find_table(root, [f"{split}.csv", "IMDB Dataset.csv"], "IMDB")
    table = read_text_table(path, encoding=encoding)
    raw = [table.class_names[i].lower() for i in table.labels]
    bad = sorted({x for x in raw if x not in _IMDB_LABELS})
    if bad:
        raise SchemaError(f"IMDB: {path} labels must be positive/negative or 0/1, got {bad[:5]}")
    texts, labels = table.texts, [_IMDB_LABELS[x] for x in raw]
    if not path.name.startswith(f"{split}.csv"):
        mid = len(texts) // 2
        sl = slice(None, mid) if split == "train" else slice(mid, None)
        texts, labels = texts[sl], labels[sl]
    return [x.replace("<br />", " ") for x in texts], labels, ["negative", "positive"]


def read_text_split(name: str, split: str, root: str | os.PathLike | None = None, verify: bool = True,
                    encoding: str | None = None):
    """``(texts, labels, class_names)`` of ``split`` ("train" | "test"; SST-2 also "dev") of dataset ``name``.

    ``verify`` checks each file against the reference SHA-256 (:data:`TEXT_SHA256`) before it is parsed, where the
    digest is known; ``verify=False`` reads another copy (its layout is still checked). ``encoding``: the text
    encoding of an ``imdb`` table (default UTF-8); the reference files of the other datasets have theirs fixed."""
    if encoding is not None and name != "imdb":
        raise ValueError(f"read_text_split: `encoding` applies to 'imdb' (and TextDataModule's 'csv') tables; the "
                         f"{name} files are read in their own fixed encoding, got encoding={encoding!r}")
    if name not in TEXT_DATASETS:
        raise ValueError(f"read_text_split: unknown dataset {name!r}; expected one of {TEXT_DATASETS}")
    if split not in ("train", "test", "dev"):
        raise ValueError(f"read_text_split: `split` must be 'train', 'dev' or 'test', got {split!r}")
    base = Path(root).expanduser() if root is not None else resolve_root(None, "text", "text datasets")
    d = base / _SUBDIR[name] if (base / _SUBDIR[name]).is_dir() else base
    if split == "dev" and name != "sst2":
        raise ValueError(f"read_text_split: only sst2 has a 'dev' file; {name} uses a held-out part of train")
    if name == "sst2":
        return _read_sst2(d, split, verify)
    if name in ("trec", "trec_fine"):
        return _read_trec(d, split, name == "trec_fine", verify)
    if name == "ag_news":
        return _read_ag_news(d, split, verify)
    return _read_imdb(d, split, verify, encoding or "utf-8")


# ----------------------------------------------------------------------------------------------- tokenizer
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


# ------------------------------------------------------------------------------------------------- dataset
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


# ---------------------------------------------------------------------------------------------- datamodule
def _grouped_holdout(texts: Sequence[str], n_val: int, rng: random.Random, phrases: bool) -> list[int]:
    """Indices of about ``n_val`` held-out examples, taken group by group in a seeded order (at least ``n_val``).

    Groups: identical texts; with ``phrases`` (SST-2) a phrase joins the sentence that contains it (its *root*: the
    longest text it is a contiguous token span of, found from the longest text down with a span dictionary), and a
    phrase that is a span of two or more roots (common short phrases such as "the film") always stays in training,
    so no held-out text is a span of a training text."""
    toks = [t.split() for t in texts]
    group = [-1] * len(texts)
    if phrases:
        span_root: dict[str, int] = {}
        shared: set[str] = set()
        for i in sorted(range(len(texts)), key=lambda i: -len(toks[i])):
            key = " ".join(toks[i])
            root = span_root.get(key)
            if root is None:  # not inside a longer text: a new root, register all its spans
                root, n = i, len(toks[i])
                for a in range(n):
                    for b in range(a + 1, n + 1):
                        span = " ".join(toks[i][a:b])
                        if span_root.setdefault(span, root) != root:
                            shared.add(span)
            group[i] = -1 if key in shared else root
    else:
        first: dict[str, int] = {}
        group = [first.setdefault(" ".join(t), i) for i, t in enumerate(toks)]
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group):
        if g >= 0:
            members.setdefault(g, []).append(i)
    keys = sorted(members)
    rng.shuffle(keys)
    held: list[int] = []
    for g in keys:
        if len(held) >= n_val:
            break
        held += members[g]
    return sorted(held)


class TextDataModule(SplitDataModule):
    """SST-2 / TREC / AG News / IMDB classification batches ``{"ids", "mask", "label", "index"}``.

    Args:
        dataset: one of :data:`TEXT_DATASETS`.
        root: directory holding ``<dataset>/`` (default ``$HOFORMER_DATA/text``).
        max_len: truncation length in tokens, ``[CLS]``/``[SEP]`` included.
        tokenizer: a tokenizer file/directory (ours or a local Hugging Face one); ``None`` trains a WordPiece
            vocabulary of ``vocab_size`` on the training split (after the validation hold-out).
        tokenizer_dir: where to save the trained tokenizer; a tokenizer trained there before for the same data is
            reused (``fit`` and a later ``test`` process then tokenise identically).
        val_fraction: held-out share of the training file used for validation (every dataset, SST-2 included:
            SST-2's ``dev.tsv`` is its reported test split, so it must not also select checkpoints).
        holdout: ``"grouped"`` (default: whole groups are held out, see the module docstring: duplicates together,
            SST-2 phrases with their sentence) or ``"random"`` (examples independently; kept to reproduce results measured
            with it, see CHANGELOG.md).
        sst2_test: SST-2 only: the reported ``test`` split, ``"dev"`` (GLUE ``dev.tsv``, as in the HOBA paper) or
            ``"nonglue"`` (``test_labeled_nonglue.tsv``; an error if absent).
        train_limit: keep only the first ``train_limit`` shuffled training examples (compute budgets).
        seed: seed of the validation hold-out and ``train_limit`` subsampling.
        verify: check each file against the reference SHA-256 (:data:`TEXT_SHA256`) before parsing it, where the
            digest is known; ``False`` reads another copy (its layout is still checked).
        train_file, test_file: ``dataset="csv"`` only: the training table (validation is held out of it) and the
            reported test table, CSV / TSV with a header, ``.gz`` accepted (relative paths: under ``root`` when given).
        text_column, label_column, labels: ``dataset="csv"`` only: the columns (header name or 0-based index; None:
            the first of :data:`~hoformer.data.text_csv.TEXT_COLUMNS` / ``LABEL_COLUMNS`` present) and the class
            names in id order (None: the training file's sorted distinct labels); see
            :func:`~hoformer.data.text_csv.read_text_table`.
        encoding: ``dataset="csv"`` / ``"imdb"``: the tables' text encoding (None: UTF-8), e.g. ``"latin-1"``.
    """

    def __init__(
        self,
        dataset: str = "sst2",
        root: str | None = None,
        max_len: int = 64,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        tokenizer: str | None = None,
        tokenizer_dir: str | None = None,
        vocab_size: int = 8000,
        val_fraction: float = 0.1,
        train_limit: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
        sst2_test: str = "dev",
        holdout: str = "grouped",
        verify: bool = True,
        train_file: str | None = None,
        test_file: str | None = None,
        text_column: str | int | None = None,
        label_column: str | int | None = None,
        labels: list[str] | None = None,
        encoding: str | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_workers=num_workers, eval_batch_size=eval_batch_size)
        if encoding is not None:
            if not isinstance(encoding, str):
                raise TypeError(f"TextDataModule: `encoding` must be a codec name such as 'utf-8' or 'latin-1', got "
                                f"{encoding!r}")
            try:
                import codecs

                codecs.lookup(encoding)
            except LookupError:
                raise ValueError(f"TextDataModule: `encoding` {encoding!r} is not a known text encoding (e.g. "
                                 "'utf-8', 'latin-1', 'cp1252')") from None
            if dataset not in ("csv", "imdb"):
                raise ValueError(f"TextDataModule: `encoding` applies to dataset='csv' and 'imdb' (your own tables); "
                                 f"the {dataset} reference files are read in their own encoding, got "
                                 f"encoding={encoding!r}")
        if dataset not in (*TEXT_DATASETS, "csv"):
            raise ValueError(f"TextDataModule: unknown dataset {dataset!r}; expected one of {TEXT_DATASETS} or "
                             "'csv' (with train_file= and test_file=)")
        table_args = dict(train_file=train_file, test_file=test_file, text_column=text_column,
                          label_column=label_column, labels=labels)
        if dataset == "csv" and (train_file is None or test_file is None):
            raise ValueError(f"TextDataModule(dataset='csv') needs `train_file` and `test_file` (CSV / TSV tables "
                             f"with a header), got train_file={train_file!r}, test_file={test_file!r}")
        if dataset != "csv" and any(v is not None for v in table_args.values()):
            given = sorted(k for k, v in table_args.items() if v is not None)
            raise ValueError(f"TextDataModule: {given} apply to dataset='csv' only, got dataset={dataset!r}")
        check_int("TextDataModule", "max_len", max_len, low=3, note=" ([CLS] x [SEP])")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"TextDataModule: val_fraction must be in (0, 1), got {val_fraction}")
        if holdout not in ("grouped", "random"):
            raise ValueError(f"TextDataModule: holdout must be 'grouped' or 'random', got {holdout!r}")
        if sst2_test not in ("dev", "nonglue"):
            raise ValueError(f"TextDataModule: sst2_test must be 'dev' or 'nonglue', got {sst2_test!r}")
        check_int("TextDataModule", "train_limit", train_limit, optional=True)  # -100 dropped the last 100 examples
        self.dataset_name, self.root, self.max_len = dataset, root, max_len
        self.tokenizer_path, self.tokenizer_dir, self.vocab_size = tokenizer, tokenizer_dir, vocab_size
        self.val_fraction, self.train_limit, self.seed = val_fraction, train_limit, seed
        self.sst2_test, self.holdout, self.verify = sst2_test, holdout, verify
        self.table_args = table_args
        self.encoding = encoding
        self.tokenizer: TextTokenizer | None = None
        self.class_names: list[str] = []
        self._texts: dict[str, list[str]] = {}

    sample_unit = "texts"

    def _split_protocol(self) -> str:
        what = self.table_args["train_file"] if self.dataset_name == "csv" else _DISPLAY.get(self.dataset_name,
                                                                                             self.dataset_name)
        return (f"{what}, validation {self.holdout} {100 * self.val_fraction:g} % held out of the training file"
                + (f" (then the first {self.train_limit} training texts)" if self.train_limit is not None else ""))

    @property
    def num_classes(self) -> int:
        self.setup()
        return len(self.class_names)

    @property
    def pad_id(self) -> int:
        """The tokenizer's padding id (builds the splits: the tokenizer may be trained on the training split)."""
        self.setup()
        return self.tokenizer.pad_id

    def _table(self, key: str, labels) -> tuple[list[str], list[int], list[str]]:
        """``dataset="csv"``: the table ``train_file`` / ``test_file``, its label mapping printed once."""
        a = self.table_args
        path = Path(a[key]).expanduser()
        if self.root is not None and not path.is_absolute():
            path = Path(self.root).expanduser() / path
        table = read_text_table(path, text_column=a["text_column"], label_column=a["label_column"], labels=labels,
                                encoding=self.encoding or "utf-8")
        from lightning.pytorch.utilities import rank_zero_info  # a datamodule needs lightning anyway

        rank_zero_info(f"TextDataModule: {label_report(table, str(path))}")
        return table

    def _raw_splits(self):
        if self.dataset_name == "csv":
            texts, labels, classes = self._table("train_file", self.table_args["labels"])
        else:
            texts, labels, classes = read_text_split(self.dataset_name, "train", self.root, self.verify,
                                                     self.encoding)
        order = list(range(len(texts)))
        rng = random.Random(self.seed)
        rng.shuffle(order)
        n_val = max(1, int(round(self.val_fraction * len(texts))))
        if self.holdout == "random":
            val_idx, train_idx = order[:n_val], order[n_val:]
        else:
            val_idx = _grouped_holdout(texts, n_val, rng, phrases=self.dataset_name == "sst2")
            held = set(val_idx)
            train_idx = [i for i in order if i not in held]
        val = ([texts[i] for i in val_idx], [labels[i] for i in val_idx])
        if self.train_limit is not None:
            train_idx = train_idx[: self.train_limit]
        train = ([texts[i] for i in train_idx], [labels[i] for i in train_idx])
        # SST-2: the reported set (dev, as in the paper) is the test split, never the validation split
        test_split = "dev" if self.dataset_name == "sst2" and self.sst2_test == "dev" else "test"
        if self.dataset_name == "csv":
            test = tuple(self._table("test_file", classes)[:2])
        else:
            test = read_text_split(self.dataset_name, test_split, self.root, self.verify, self.encoding)[:2]
        return {"train": train, "val": val, "test": test}, classes

    def _make_splits(self, names) -> dict[str, TextClassificationDataset]:
        """All three splits at once, whichever ``names`` were asked for: the tokenizer is trained on the training
        split."""
        raw, self.class_names = self._raw_splits()
        self._texts = {split: texts for split, (texts, _) in raw.items()}
        if self.tokenizer is None:
            self.tokenizer = self._make_tokenizer(raw["train"][0])
        return {split: TextClassificationDataset(self.tokenizer.encode_batch(texts, self.max_len), labels,
                                                 len(self.class_names))
                for split, (texts, labels) in raw.items()}

    def _make_tokenizer(self, train_texts) -> TextTokenizer:
        """The tokenizer of :meth:`_local_tokenizer`; under multi-process training (an initialised
        ``torch.distributed`` group) rank 0 makes it and broadcasts it, since every rank training its own WordPiece
        vocabulary would give different token ids (training is not bit-reproducible across processes), and ranks
        racing on ``tokenizer_dir`` could read a half-written file."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return self._local_tokenizer(train_texts)
        from tokenizers import Tokenizer

        obj = [self._local_tokenizer(train_texts).tok.to_str() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(obj, src=0)
        return TextTokenizer(Tokenizer.from_str(obj[0]))

    def _local_tokenizer(self, train_texts) -> TextTokenizer:
        """Load ``tokenizer``; else reuse the one trained earlier for the same data in ``tokenizer_dir`` (WordPiece
        training is not bit-reproducible across processes, so ``fit`` and a later ``test`` must share the file);
        else train on the training split and save it to ``tokenizer_dir``."""
        if self.tokenizer_path:
            return TextTokenizer.from_pretrained(self.tokenizer_path)
        digest = hashlib.sha256()
        for text in train_texts:  # the vocabulary is a function of the training texts, not only of their number
            digest.update(text.encode("utf-8") + b"\0")
        meta = {"dataset": self.dataset_name, **({"table": self.table_args} if self.dataset_name == "csv" else {}),
                "vocab_size": self.vocab_size, "train_limit": self.train_limit,
                "seed": self.seed, "val_fraction": self.val_fraction, "n_train": len(train_texts),
                "train_sha256": digest.hexdigest()}
        if self.dataset_name == "sst2":  # a vocabulary saved when SST-2 validated on dev saw other training texts
            meta["val"] = "train_holdout"
        if self.holdout != "random":
            meta["holdout"] = self.holdout
        d = Path(self.tokenizer_dir) if self.tokenizer_dir else None
        if d is not None and (d / TextTokenizer.FILE).is_file() and (d / "tokenizer_meta.json").is_file():
            if json.loads((d / "tokenizer_meta.json").read_text()) == meta:
                return TextTokenizer.from_pretrained(d)
        tok = TextTokenizer.train(train_texts, vocab_size=self.vocab_size)
        if d is not None:
            tok.save(d)
            atomic_write(d / "tokenizer_meta.json", lambda tmp: Path(tmp).write_text(json.dumps(meta)))
        return tok

    def collate_fn(self, split: str):
        return partial(collate_text, pad_id=self.tokenizer.pad_id)

    # Lightning saves this in every checkpoint and restores it before the loaders of ``fit`` (resume), ``validate``,
    # ``test`` and ``predict`` are built: a later process tokenises exactly as the run that wrote the checkpoint did,
    # also when the vocabulary was trained (not bit-reproducible across processes) and saved nowhere else.
    def state_dict(self) -> dict:
        return {"tokenizer": self.tokenizer.tok.to_str()} if self.tokenizer is not None else {}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("tokenizer")
        if saved is None or (self.tokenizer is not None and self.tokenizer.tok.to_str() == saved):
            return
        from tokenizers import Tokenizer

        if self.tokenizer_path:
            warnings.warn(f"TextDataModule: the checkpoint's tokenizer differs from tokenizer={self.tokenizer_path!r}; "
                          "using the checkpoint's (the one the model was trained with)", stacklevel=2)
        self.tokenizer = TextTokenizer(Tokenizer.from_str(saved))
        self.datasets = {}  # re-encoded with the checkpoint's tokenizer when next asked for

    def texts(self, split: str) -> list[str]:
        """The raw texts of ``split`` ("train" | "val" | "test"), in the order of its dataset (what a teacher with a
        tokenizer of its own reads, e.g. a local Hugging Face checkpoint)."""
        if split not in ("train", "val", "test"):
            raise ValueError(f"TextDataModule.texts: `split` must be 'train', 'val' or 'test', got {split!r}")
        if not self._texts:
            self.setup()
        return self._texts[split]

    def ordered_train_dataloader(self) -> DataLoader:
        """The training split in index order, no shuffling (teacher logits for distillation)."""
        return self._loader("train", False)
