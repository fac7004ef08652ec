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

Modules: ``readers`` (the datasets' files, :func:`read_text_split`), ``tokenizer`` (:class:`TextTokenizer`),
``dataset`` (:class:`TextClassificationDataset`, :func:`collate_text`), ``datamodule`` (:class:`TextDataModule`).
"""
from .datamodule import TextDataModule, _grouped_holdout  # noqa: F401 (_grouped_holdout: tested directly)
from .dataset import TextClassificationDataset, collate_text
from .readers import TEXT_DATASETS, TEXT_SHA256, TREC_COARSE, read_text_split
from .tokenizer import TextTokenizer

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
