"""The generic text-classification table reader and ``TextDataModule(dataset="csv")``."""
from __future__ import annotations

import gzip

import pytest

from hoformer.data import TextDataModule, read_text_split
from hoformer.data import SchemaError
from hoformer.data.text_csv import find_table, label_report, read_text_table


def _write(path, text: str, gz: bool = False):
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_csv_and_gz_tsv_read_alike_with_named_or_indexed_columns(tmp_path):
    rows = [("good film", "pos"), ("bad, very bad", "neg"), ('say "hi"', "pos")]
    csv_text = "id,body,verdict\n" + "".join(f'{i},"{t.replace(chr(34), chr(34) * 2)}",{lab}\n'
                                             for i, (t, lab) in enumerate(rows))
    tsv_text = "id\tbody\tverdict\n" + "".join(f"{i}\t{t}\t{lab}\n" for i, (t, lab) in enumerate(rows)).replace(
        '"hi"', "hi")
    a = read_text_table(_write(tmp_path / "a.csv", csv_text), text_column="body", label_column="verdict")
    b = read_text_table(_write(tmp_path / "b.tsv.gz", tsv_text, gz=True), text_column=1, label_column=2)
    assert a.texts == ["good film", "bad, very bad", 'say "hi"'] and b.texts[:2] == a.texts[:2]
    assert a.class_names == b.class_names == ["neg", "pos"] and a.labels == b.labels == [1, 0, 1]
    assert label_report(a) == "neg=0 (1), pos=1 (2)"


def test_default_columns_numeric_label_order_and_explicit_classes(tmp_path):
    p = _write(tmp_path / "t.csv", "Text,Label\na,10\nb,2\nc,2\n")
    t = read_text_table(p)
    assert t.class_names == ["2", "10"] and t.labels == [1, 0, 0]  # numeric order, not "10" < "2"
    t = read_text_table(p, labels=["10", "2", "5"])
    assert t.labels == [0, 1, 1] and t.class_names == ["10", "2", "5"]
    with pytest.raises(SchemaError, match=r"t.csv line 3: label '2' .* not one of the classes \['10'\]"):
        read_text_table(p, labels=["10"])


def test_errors_name_file_line_and_what_was_looked_for(tmp_path):
    with pytest.raises(SchemaError, match=r"no text column found; looked for a header named one of \['text'.*"
                                          r"the header is \['a', 'b'\]"):
        read_text_table(_write(tmp_path / "x.csv", "a,b\n1,2\n"))
    with pytest.raises(SchemaError, match=r"x.csv line 3: empty label in column 'label'"):
        read_text_table(_write(tmp_path / "x.csv", "text,label\nok,1\nno,\n"))
    with pytest.raises(ValueError, match=r"l1.csv line 2: .* not valid utf-8.*encoding="):
        read_text_table(_write(tmp_path / "l1.csv", "x") and (tmp_path / "l1.csv").write_bytes(
            b"text,label\ncaf\xe9,1\n") and tmp_path / "l1.csv")
    assert read_text_table(tmp_path / "l1.csv", encoding="latin-1").texts == ["café"]
    with pytest.raises(FileNotFoundError) as e:
        find_table(tmp_path / "imdb", ["train.csv", "IMDB Dataset.csv"], "IMDB")
    for name in ("train.csv", "train.csv.gz", "IMDB Dataset.csv", "IMDB Dataset.csv.gz"):
        assert str(tmp_path / "imdb" / name) in str(e.value)


def test_imdb_reader_accepts_gz_and_other_column_names(tmp_path):
    _write(tmp_path / "imdb" / "train.csv.gz", "text,label\ngreat<br />movie,1\nawful,0\n", gz=True)
    texts, labels, classes = read_text_split("imdb", "train", tmp_path)
    assert texts == ["great movie", "awful"] and labels == [1, 0] and classes == ["negative", "positive"]


def test_text_datamodule_trains_on_any_table(tmp_path, caplog):
    words = ["alpha", "beta", "gamma", "delta"]
    train = "".join(f"{words[i % 4]} {words[(i * 3) % 4]} text {i},{['spam', 'ham', 'eggs'][i % 3]}\n"
                    for i in range(60))
    _write(tmp_path / "tr.csv", "sentence,category\n" + train)
    _write(tmp_path / "te.csv", "sentence,category\nalpha beta,ham\ngamma,eggs\n")
    dm = TextDataModule("csv", root=str(tmp_path), train_file="tr.csv", test_file="te.csv", max_len=8,
                        batch_size=4, vocab_size=60)
    with caplog.at_level("INFO"):
        dm.setup("fit")
    assert dm.class_names == ["eggs", "ham", "spam"] and dm.num_classes == 3
    assert "labels eggs=0 (20), ham=1 (20), spam=2 (20)" in caplog.text
    assert len(dm.dataset("train")) + len(dm.dataset("val")) == 60 and len(dm.dataset("test")) == 2
    assert next(iter(dm.train_dataloader()))["ids"].shape[0] == 4
    with pytest.raises(ValueError, match="needs `train_file` and `test_file`"):
        TextDataModule("csv", train_file="tr.csv")
    with pytest.raises(ValueError, match=r"\['text_column'\] apply to dataset='csv' only"):
        TextDataModule("sst2", text_column="x")
