"""The text datamodule (:class:`TextDataModule`) and its grouped validation hold-out."""
from __future__ import annotations

import hashlib
import json
import random
import warnings
from functools import partial
from pathlib import Path
from typing import Sequence

from torch.utils.data import DataLoader

from hoformer._checks import check_int
from hoformer._io import atomic_write

from .._base import SplitDataModule
from ..text_csv import label_report, read_text_table

from .dataset import TextClassificationDataset, collate_text
from .readers import _DISPLAY, TEXT_DATASETS, read_text_split
from .tokenizer import TextTokenizer

__all__ = ["TextDataModule"]


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
