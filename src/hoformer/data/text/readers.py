"""The readers of the text datasets (SST-2, TREC, AG News, IMDB) behind :func:`read_text_split`, with the reference
checksums of their files (:data:`TEXT_SHA256`)."""
from __future__ import annotations

import csv
import os
from pathlib import Path



from .._utils import VERIFY_HINT, SchemaError, require_file, resolve_root, verify_file
from ..text_csv import find_table, read_text_table

__all__ = ["TEXT_DATASETS", "TEXT_SHA256", "TREC_COARSE", "read_text_split"]

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

