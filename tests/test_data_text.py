"""SST-2 splits: the reported set (GLUE dev, as in the HOBA paper) is never also the validation set, and a missing
labelled test file is an error, not a silent fall-back to dev."""
from __future__ import annotations

import pytest

from hoformer.data import TextDataModule, read_text_split


def _sst2_root(root, nonglue: bool = False):
    d = root / "sst2"
    d.mkdir(parents=True)
    rows = "".join(f"{'good fun film' if i % 2 else 'dull boring mess'} {i}\t{i % 2}\n" for i in range(40))
    (d / "train.tsv").write_text("sentence\tlabel\n" + rows)
    (d / "dev.tsv").write_text("sentence\tlabel\ngood film\t1\nboring\t0\nfine\t1\n")
    (d / "test.tsv").write_text("index\tsentence\n0\tunlabelled one\n")  # GLUE's test file: no labels
    if nonglue:
        (d / "test_labeled_nonglue.tsv").write_text("sentence\tlabel\nawful\t0\ngreat\t1\n")
    return root


def test_sst2_test_split_needs_a_labelled_file(tmp_path):
    root = _sst2_root(tmp_path)
    with pytest.raises(FileNotFoundError, match="no labelled test file.*split='dev'"):
        read_text_split("sst2", "test", root)
    assert read_text_split("sst2", "dev", root)[0] == ["good film", "boring", "fine"]
    (root / "sst2" / "test_labeled_nonglue.tsv").write_text("sentence\tlabel\nawful\t0\n")
    assert read_text_split("sst2", "test", root)[:2] == (["awful"], [0])


@pytest.mark.parametrize("nonglue", [False, True])
def test_sst2_datamodule_never_validates_on_the_reported_set(tmp_path, nonglue):
    root = _sst2_root(tmp_path / "data", nonglue=nonglue)
    dm = TextDataModule("sst2", root=str(root), max_len=16, batch_size=8, vocab_size=100, val_fraction=0.1)
    dm.setup()
    raw, _ = dm._raw_splits()
    train_texts = set(read_text_split("sst2", "train", root)[0])
    dev = read_text_split("sst2", "dev", root)[:2]
    assert raw["test"] == dev  # the reported set: GLUE dev, whether or not a non-GLUE test file exists
    assert set(raw["val"][0]) <= train_texts and not set(raw["val"][0]) & set(dev[0])  # held out of train.tsv
    assert not set(raw["val"][0]) & set(raw["train"][0])
    assert {k: len(v) for k, v in dm.datasets.items()} == {"train": 36, "val": 4, "test": 3}
    if nonglue:
        other = TextDataModule("sst2", root=str(root), max_len=16, vocab_size=100, sst2_test="nonglue")
        assert other._raw_splits()[0]["test"] == (["awful", "great"], [0, 1])
    else:
        with pytest.raises(FileNotFoundError, match="no labelled test file"):
            TextDataModule("sst2", root=str(root), max_len=16, vocab_size=100, sst2_test="nonglue").setup()
    with pytest.raises(ValueError, match="sst2_test"):
        TextDataModule("sst2", root=str(root), sst2_test="test")
