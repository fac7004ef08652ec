"""Text data (HOBA paper 004): SST-2 splits (the reported set, GLUE dev as in the paper, is never also the
validation set; a missing labelled test file is an error, not a silent fall-back to dev), every reader against
hand-written files with known rows and labels plus its malformed-file errors, tokenizer, collation, datasets."""
from __future__ import annotations

import pytest
import torch

from hoformer.data import TREC_COARSE, TextDataModule, TextTokenizer, read_text_split
from hoformer.data import ChecksumError, SchemaError, sha256sum
from hoformer.data.text import TEXT_SHA256, TextClassificationDataset, collate_text


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
        read_text_split("sst2", "test", root, verify=False)
    assert read_text_split("sst2", "dev", root, verify=False)[0] == ["good film", "boring", "fine"]
    (root / "sst2" / "test_labeled_nonglue.tsv").write_text("sentence\tlabel\nawful\t0\n")
    assert read_text_split("sst2", "test", root, verify=False)[:2] == (["awful"], [0])


@pytest.mark.parametrize("nonglue", [False, True])
def test_sst2_datamodule_never_validates_on_the_reported_set(tmp_path, nonglue):
    root = _sst2_root(tmp_path / "data", nonglue=nonglue)
    dm = TextDataModule("sst2", root=str(root), verify=False, max_len=16, batch_size=8, vocab_size=100, val_fraction=0.1)
    dm.setup()
    raw, _ = dm._raw_splits()
    train_texts = set(read_text_split("sst2", "train", root, verify=False)[0])
    dev = read_text_split("sst2", "dev", root, verify=False)[:2]
    assert raw["test"] == dev  # the reported set: GLUE dev, whether or not a non-GLUE test file exists
    assert set(raw["val"][0]) <= train_texts and not set(raw["val"][0]) & set(dev[0])  # held out of train.tsv
    assert not set(raw["val"][0]) & set(raw["train"][0])
    assert {k: len(v) for k, v in dm.datasets.items()} == {"train": 36, "val": 4, "test": 3}
    if nonglue:
        other = TextDataModule("sst2", root=str(root), verify=False, max_len=16, vocab_size=100, sst2_test="nonglue")
        assert other._raw_splits()[0]["test"] == (["awful", "great"], [0, 1])
    else:
        with pytest.raises(FileNotFoundError, match="no labelled test file"):
            TextDataModule("sst2", root=str(root), verify=False, max_len=16, vocab_size=100, sst2_test="nonglue").setup()
    with pytest.raises(ValueError, match="sst2_test"):
        TextDataModule("sst2", root=str(root), verify=False, sst2_test="test")
    for bad in (2, 16.5, None):  # a float length used to pass the check and fail at padding time
        with pytest.raises(ValueError, match=rf"TextDataModule: `max_len` must be an int >= 3 .*got {bad}"):
            TextDataModule("sst2", root=str(root), verify=False, max_len=bad)


# ------------------------------------------------------------------------------ readers on hand-written files


def test_sst2_rows_labels_and_malformed_lines(tmp_path):
    d = tmp_path / "sst2"
    d.mkdir()
    (d / "dev.tsv").write_bytes(b"sentence\tlabel\r\n  a gripping , funny film \t1\r\n\r\nit 's dull\t0\r\n")
    assert read_text_split("sst2", "dev", tmp_path, verify=False) == (["a gripping , funny film", "it 's dull"], [1, 0],
                                                        ["negative", "positive"])
    (d / "dev.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t2\n")
    with pytest.raises(SchemaError, match=r"dev.tsv line 3: label must be 0 or 1, got '2'"):
        read_text_split("sst2", "dev", tmp_path, verify=False)
    (d / "dev.tsv").write_text("sentence\tlabel\ngood\t1\n1\n")  # a row without its sentence column
    with pytest.raises(SchemaError, match=r"dev.tsv line 3: expected 'sentence<TAB>label'"):
        read_text_split("sst2", "dev", tmp_path, verify=False)
    (d / "dev.tsv").write_text("sentence\tlabel\tidx\ngood\t1\t7\n")  # the label is not the last column
    with pytest.raises(SchemaError, match="header"):
        read_text_split("sst2", "dev", tmp_path, verify=False)
    with pytest.raises(FileNotFoundError, match=r"train.tsv"):
        read_text_split("sst2", "train", tmp_path, verify=False)


def test_trec_coarse_and_fine_labels(tmp_path):
    d = tmp_path / "trec"
    d.mkdir()
    train = ["DESC:manner How did serfdom develop ?", "ENTY:cremat What films featured Daf\xe9 ?",
             "HUM:ind Who killed Gandhi ?", "LOC:city What is the capital of Peru ?", "NUM:date When ?",
             "ABBR:exp What does AIDS stand for ?", "HUM:gr What team won ?", ""]
    (d / "train_5500.label").write_bytes("\n".join(train).encode("iso-8859-1"))
    (d / "TREC_10.label").write_bytes(b"LOC:city Where is Rome ?\nHUM:gr Which band ?\nABBR:exp What is NASA ?\n")
    t, y, c = read_text_split("trec", "train", tmp_path, verify=False)
    assert c == list(TREC_COARSE) == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    assert t[1] == "What films featured Daf\xe9 ?" and len(t) == 7
    assert y == [1, 2, 3, 4, 5, 0, 3]
    t, y, c = read_text_split("trec", "test", tmp_path, verify=False)
    assert t == ["Where is Rome ?", "Which band ?", "What is NASA ?"] and y == [4, 3, 0]
    t, y, c = read_text_split("trec_fine", "train", tmp_path, verify=False)
    assert c == ["ABBR:exp", "DESC:manner", "ENTY:cremat", "HUM:gr", "HUM:ind", "LOC:city", "NUM:date"]
    assert y == [1, 2, 4, 5, 6, 0, 3]
    assert read_text_split("trec_fine", "test", tmp_path, verify=False)[1] == [5, 3, 0]
    (d / "TREC_10.label").write_bytes(b"LOC:city Where ?\nWhere is Paris ?\n")
    with pytest.raises(SchemaError, match=r"TREC_10.label line 2: expected 'COARSE:fine question'"):
        read_text_split("trec", "test", tmp_path, verify=False)
    (d / "TREC_10.label").write_bytes(b"XYZ:foo Huh ?\n")
    with pytest.raises(SchemaError, match=r"labels outside the 6 known classes: \['XYZ'\]"):
        read_text_split("trec", "test", tmp_path, verify=False)
    with pytest.raises(ValueError, match="only sst2 has a 'dev' file"):
        read_text_split("trec", "dev", tmp_path, verify=False)


def test_ag_news_csv_and_10k_tsv(tmp_path):
    d = tmp_path / "ag_news"
    d.mkdir()
    (d / "test.csv").write_text('"3","Oil hits $50","Prices rose\\on Monday"\n"1","Vote, then talks","A "" quote"""\n'
                                '"4","Chip","Intel\\\\n news"\n')
    t, y, c = read_text_split("ag_news", "test", tmp_path, verify=False)
    assert c == ["World", "Sports", "Business", "Sci/Tech"]  # default names without classes.txt
    assert t == ["Oil hits $50 . Prices rose on Monday", 'Vote, then talks . A " quote"', "Chip . Intel   news"]
    assert y == [2, 0, 3]
    (d / "classes.txt").write_text("W\nS\nB\nT\n\n")
    (d / "train_subset_10k.tsv").write_text("Goal in the\\final minute\tS\nNew GPU\tT\nPeace talks\tW\n")
    t, y, c = read_text_split("ag_news", "train", tmp_path, verify=False)
    assert (t, y, c) == (["Goal in the final minute", "New GPU", "Peace talks"], [1, 3, 0], ["W", "S", "B", "T"])
    # trained on the descriptions-only subset: the test csv is read the same way (descriptions only)
    assert read_text_split("ag_news", "test", tmp_path, verify=False)[0] == ["Prices rose on Monday", 'A " quote"', "Intel   news"]
    (d / "train_subset_10k.tsv").write_text("Goal\tS\nNo label here\n")
    with pytest.raises(SchemaError, match=r"line 2: label 'No label here' not in"):
        read_text_split("ag_news", "train", tmp_path, verify=False)
    for bad, match in (('"5","t","d"\n', r"class ids must be in 1..4, got 5"),
                       ('"0","t","d"\n', r"class ids must be in 1..4, got 0"),
                       ('"2","only title"\n', r"row 1: expected"),
                       ('"Class Index","Title","Description"\n"2","t","d"\n', r"row 1: expected")):
        (d / "test.csv").write_text(bad)
        with pytest.raises(SchemaError, match=match):
            read_text_split("ag_news", "test", tmp_path, verify=False)
    (d / "train_subset_10k.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"train.csv"):
        read_text_split("ag_news", "train", tmp_path, verify=False)


def test_imdb_split_files_single_file_and_errors(tmp_path):
    d = tmp_path / "imdb"
    d.mkdir()
    (d / "train.csv").write_text('text,label\n"loved it<br />really",1\nboring,0\n"so, so bad",0\n')
    (d / "test.csv").write_text("sentence,sentiment\nfine,Positive\nugh,NEG\n")
    assert read_text_split("imdb", "train", tmp_path, verify=False) == (["loved it really", "boring", "so, so bad"], [1, 0, 0],
                                                          ["negative", "positive"])
    assert read_text_split("imdb", "test", tmp_path, verify=False)[:2] == (["fine", "ugh"], [1, 0])
    (d / "train.csv").unlink()
    (d / "test.csv").unlink()
    (d / "IMDB Dataset.csv").write_text("review,sentiment\na,positive\nb,negative\nc,negative\nd,positive\ne,neg\n")
    assert read_text_split("imdb", "train", tmp_path, verify=False)[:2] == (["a", "b"], [1, 0])  # first half
    assert read_text_split("imdb", "test", tmp_path, verify=False)[:2] == (["c", "d", "e"], [0, 1, 0])  # second half
    (d / "IMDB Dataset.csv").write_text("review,sentiment\na,positive\nb,meh\n")
    with pytest.raises(SchemaError, match=r"labels must be positive/negative or 0/1, got \['meh'\]"):
        read_text_split("imdb", "test", tmp_path, verify=False)
    (d / "IMDB Dataset.csv").write_text("body,stars\na,5\n")
    with pytest.raises(SchemaError, match=r"no label column found.*the header is \['body', 'stars'\]"):
        read_text_split("imdb", "train", tmp_path, verify=False)
    (d / "IMDB Dataset.csv").write_text("review,sentiment\n")
    with pytest.raises(SchemaError, match="has a header but no rows"):
        read_text_split("imdb", "train", tmp_path, verify=False)
    with pytest.raises(ValueError, match=r"`split` must be 'train', 'dev' or 'test', got 'val'"):
        read_text_split("imdb", "val", tmp_path, verify=False)


# ------------------------------------------------------------------------------------ tokenizer / batching
def _tok():
    corpus = ["the movie was not really good", "a very highly unlikely plot", "the cat sat on the mat"] * 4
    return TextTokenizer.train(corpus, vocab_size=120, min_frequency=1)


def test_tokenizer_unknown_tokens_truncation_and_batch():
    tok = _tok()
    unk, cls, sep = (tok.tok.token_to_id(t) for t in ("[UNK]", "[CLS]", "[SEP]"))
    ids = tok.encode("the \u2603 cat")  # a character never seen in training
    assert ids[0] == cls and ids[-1] == sep and unk in ids and tok.decode(ids).split() == ["the", "cat"]
    texts = ["the movie was not really good at all", "the cat", ""]
    full = [tok.encode(t) for t in texts]
    assert full[2] == [cls, sep]
    batch = tok.encode_batch(texts, max_len=5)
    assert batch == [full[0][:4] + [sep], full[1][:5] if len(full[1]) <= 5 else full[1][:4] + [sep], [cls, sep]]
    assert all(len(b) <= 5 and b[-1] == sep for b in batch)
    assert tok.encode_batch(texts) == full
    for bad in (0, 1, -3):
        with pytest.raises(ValueError, match=rf"`max_len` must be an int >= 2.*got {bad}"):
            tok.encode("the cat", max_len=bad)
        with pytest.raises(ValueError, match="`max_len`"):
            tok.encode_batch(texts, max_len=bad)


def test_bert_vocab_dir_lowercasing(tmp_path):
    """A BERT ``vocab.txt`` directory lowercases when the vocabulary is uncased, whatever the directory is called
    (its special tokens are upper case), follows ``tokenizer_config.json``'s ``do_lower_case`` when present, and
    keeps case for a cased vocabulary."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    unc = tmp_path / "my-bert"
    unc.mkdir()
    (unc / "vocab.txt").write_text("\n".join(specials + ["the", "cat", "sat", "##s"]))
    assert TextTokenizer.from_pretrained(unc).encode("The Cats sat") == [2, 5, 6, 8, 7, 3]
    cased = tmp_path / "bert-cased"
    cased.mkdir()
    (cased / "vocab.txt").write_text("\n".join(specials + ["The", "the", "cat"]))
    assert TextTokenizer.from_pretrained(cased).encode("The the cat") == [2, 5, 6, 7, 3]
    (unc / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    assert TextTokenizer.from_pretrained(unc).encode("The cat") == [2, 1, 6, 3]


def test_collate_pads_masks_and_keeps_order():
    items = [{"ids": torch.tensor([2, 7, 3]), "label": 1, "index": 4},
             {"ids": torch.tensor([2, 3]), "label": 0, "index": 0},
             {"ids": torch.tensor([2, 9, 9, 8, 3]), "label": 2, "index": 9}]
    b = collate_text(items, pad_id=5)
    assert b["ids"].tolist() == [[2, 7, 3, 5, 5], [2, 3, 5, 5, 5], [2, 9, 9, 8, 3]]
    assert b["mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert b["mask"].dtype == torch.bool and b["label"].tolist() == [1, 0, 2] and b["index"].tolist() == [4, 0, 9]
    with pytest.raises(ValueError, match="empty batch"):
        collate_text([])


def test_dataset_items_and_label_checks():
    ds = TextClassificationDataset([[2, 5, 3], [2, 3]], [1, 0], num_classes=2)
    assert len(ds) == 2 and ds[0]["ids"].tolist() == [2, 5, 3] and ds[0]["ids"].dtype == torch.long
    assert (ds[1]["label"], ds[1]["index"]) == (0, 1)
    with pytest.raises(ValueError, match="2 texts but 1 labels"):
        TextClassificationDataset([[2], [3]], [1], num_classes=2)
    with pytest.raises(ValueError, match=r"labels must be ints in \[0, 2\), got 2"):
        TextClassificationDataset([[2], [3]], [1, 2], num_classes=2)


def test_validation_holdout_is_seeded(tmp_path):
    root = _sst2_root(tmp_path / "data")

    def val(seed, **kw):
        dm = TextDataModule("sst2", root=str(root), verify=False, max_len=16, vocab_size=100, val_fraction=0.25, seed=seed, **kw)
        return dm._raw_splits()[0]

    a, b, c = val(1), val(1), val(2)
    assert a == b and a["val"] != c["val"] and len(a["val"][0]) == 10 and len(a["train"][0]) == 30
    assert sorted(a["val"][0] + a["train"][0]) == sorted(read_text_split("sst2", "train", root, verify=False)[0])
    lim = val(1, train_limit=7)
    assert lim["train"] == (a["train"][0][:7], a["train"][1][:7]) and lim["val"] == a["val"]


def _is_span(a: str, b: str) -> bool:
    """``a`` is a contiguous token span of ``b``."""
    return f" {a} " in f" {b} "


@pytest.mark.parametrize("holdout", ["grouped", "random"])
def test_sst2_phrases_are_held_out_with_their_sentence(tmp_path, holdout):
    """GLUE SST-2's train.tsv holds every sub-phrase of each sentence's parse tree. The grouped hold-out keeps a
    sentence and its phrases on one side (phrases shared by several sentences stay in training), so no validation
    text is a span of a training text; a random phrase split leaks (the test is not vacuous)."""
    d = tmp_path / "sst2"
    d.mkdir()
    rows = []
    for s in range(30):
        words = [f"w{s}a", f"w{s}b", "the", "film", f"w{s}c"]
        for a in range(len(words)):
            for b in range(a + 1, len(words) + 1):
                rows.append((" ".join(words[a:b]), s % 2))
    rows.append(("w3a w3b", 1))  # a duplicate text: stays with its sentence
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    (d / "dev.tsv").write_text("sentence\tlabel\ngood film\t1\n")
    dm = TextDataModule("sst2", root=str(tmp_path), verify=False, max_len=16, vocab_size=100, val_fraction=0.2, holdout=holdout)
    raw = dm._raw_splits()[0]
    train, val = raw["train"][0], raw["val"][0]
    assert sorted(train + val) == sorted(t for t, _ in rows) and len(val) >= round(0.2 * len(rows))
    leaks = [v for v in val if any(_is_span(v, t) for t in train)]
    if holdout == "grouped":
        assert not leaks and {"the", "film", "the film"} <= set(train)
        assert len({t.split()[0][1:-1] for t in val if t.startswith("w")}) < 30  # whole sentences, not all of them
    else:
        assert len(leaks) > len(val) // 2
    with pytest.raises(ValueError, match="holdout"):
        TextDataModule("sst2", root=str(tmp_path), verify=False, holdout="phrases")


def test_duplicate_texts_stay_on_one_side(tmp_path):
    d = tmp_path / "trec"
    d.mkdir()
    lines = [f"DESC:def what is thing {i % 10} ?" for i in range(40)]  # every text 4 times
    (d / "train_5500.label").write_text("\n".join(lines) + "\n")
    (d / "TREC_10.label").write_text("DESC:def what is x ?\n")
    raw = TextDataModule("trec", root=str(tmp_path), verify=False, max_len=16, vocab_size=100, val_fraction=0.25)._raw_splits()[0]
    assert len(raw["val"][0]) == 12 and not set(raw["val"][0]) & set(raw["train"][0])


@pytest.mark.parametrize("rank", [0, 1])
def test_ddp_ranks_share_rank_zeros_tokenizer(tmp_path, monkeypatch, rank):
    """Under DDP only rank 0 trains / loads the vocabulary and broadcasts it: another rank never trains its own
    (WordPiece training differs between processes, so ranks would disagree on token ids)."""
    import torch.distributed as dist

    root = _sst2_root(tmp_path / "data")
    reference = TextTokenizer.train(["good fun film", "dull boring mess"], vocab_size=60)
    sent = []

    def broadcast(obj, src):
        assert src == 0
        if rank == 0:
            sent.append(obj[0])
        else:
            obj[0] = reference.tok.to_str()

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)
    if rank:
        monkeypatch.setattr(TextTokenizer, "train", classmethod(lambda *a, **k: pytest.fail("rank 1 trained")))
    dm = TextDataModule("sst2", root=str(root), verify=False, max_len=16, vocab_size=100)
    dm.setup()
    if rank == 0:
        assert sent == [dm.tokenizer.tok.to_str()]
    else:
        assert dm.tokenizer.tok.to_str() == reference.tok.to_str()


def test_reference_files_are_verified_before_parsing(tmp_path):
    # a copy that parses fine but is not the reference file: refused by default, naming the file and the way out
    root = _sst2_root(tmp_path)
    with pytest.raises(ChecksumError, match=r"sst2/dev.tsv: sha256 checksum mismatch.*verify=False"):
        read_text_split("sst2", "dev", root)
    with pytest.raises(ChecksumError, match=r"sst2/train.tsv: sha256 checksum mismatch"):
        TextDataModule("sst2", root=str(root), max_len=16, vocab_size=100).setup()
    assert read_text_split("sst2", "dev", root, verify=False)[1] == [1, 0, 1]
    (tmp_path / "trec").mkdir()
    (tmp_path / "trec" / "train_5500.label").write_text("NUM:date When was it ?\n")
    with pytest.raises(ChecksumError, match="train_5500.label"):
        read_text_split("trec", "train", tmp_path)
    # AG News: classes.txt and the csv are both checked; a file without a reference copy (train.csv) is not
    d = tmp_path / "ag_news"
    d.mkdir()
    (d / "train.csv").write_text('"1","t","d"\n"2","t","d"\n')
    assert read_text_split("ag_news", "train", tmp_path)[1] == [0, 1]
    (d / "test.csv").write_text('"1","t","d"\n')
    with pytest.raises(ChecksumError, match="ag_news/test.csv"):
        read_text_split("ag_news", "test", tmp_path)
    (d / "classes.txt").write_text("World\nSports\nBusiness\nScience\n")
    with pytest.raises(ChecksumError, match="ag_news/classes.txt"):
        read_text_split("ag_news", "train", tmp_path)


def test_reference_digests_match_the_shared_checksum_list(data_root):
    listed = {}
    for line in (data_root / "SHA256SUMS").read_text().splitlines():
        digest, _, name = line.partition("  ")
        if name.startswith("./text/"):
            listed[name[len("./text/"):]] = digest
    assert TEXT_SHA256 == {k: v for k, v in listed.items() if k in TEXT_SHA256}
    for key, digest in TEXT_SHA256.items():  # and the files on disk are the listed ones
        assert sha256sum(data_root / "text" / key) == digest, key
    # every listed data file the readers open has a digest (readme.txt and GLUE's unlabelled test.tsv are not read)
    assert set(listed) - set(TEXT_SHA256) == {"ag_news/readme.txt", "sst2/test.tsv"}


def test_tokenizer_trained_on_training_split_only(tmp_path, monkeypatch):
    """The WordPiece vocabulary sees the training split only (after the validation hold-out), never val / test."""
    d = tmp_path / "sst2"
    d.mkdir()
    rows = "".join(f"{'good fun film' if i % 2 else 'dull boring mess'} w{i}\t{i % 2}\n" for i in range(40))
    (d / "train.tsv").write_text("sentence\tlabel\n" + rows)
    (d / "dev.tsv").write_text("sentence\tlabel\nzyzzyva film\t1\n")
    seen, real = [], TextTokenizer.train.__func__
    monkeypatch.setattr(TextTokenizer, "train",
                        classmethod(lambda cls, texts, **kw: (seen.append(list(texts)), real(cls, texts, **kw))[1]))
    dm = TextDataModule("sst2", root=str(tmp_path), verify=False, max_len=16, vocab_size=100, val_fraction=0.25)
    dm.setup()
    assert seen == [dm._raw_splits()[0]["train"][0]]


def test_grouped_holdout_keeps_shared_phrases_in_training_for_every_seed():
    """Phrases shared by several sentences stay in training whatever the seed (one seed passed by luck)."""
    import random

    from hoformer.data.text import _grouped_holdout

    rows = []
    for s in range(30):
        w = [f"w{s}a", f"w{s}b", "the", "film", f"w{s}c"]
        rows += [" ".join(w[a:b]) for a in range(5) for b in range(a + 1, 6)]
    for seed in range(20):
        held = set(_grouped_holdout(rows, round(0.2 * len(rows)), random.Random(seed), phrases=True))
        train = [rows[i] for i in range(len(rows)) if i not in held]
        assert {"the", "film", "the film"} <= set(train), seed
        assert not [rows[i] for i in held if any(f" {rows[i]} " in f" {t} " for t in train)], seed
