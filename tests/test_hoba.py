"""HOBA text stack: model API, tokenizer, readers, datamodule, distillation loss and task."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from hoformer.data import TextDataModule, TextTokenizer, read_text_split
from hoformer.data._utils import SchemaError
from hoformer.models import create_model, from_pretrained
from hoformer.train import TextClassificationTask, kd_loss

ATTS = ["hoba", "triplet_full", "block2d", "full2d"]


# --------------------------------------------------------------------------------------------------- model
@pytest.mark.parametrize("attention", ATTS)
def test_public_api_logits_and_padding_content(attention):
    torch.manual_seed(0)
    m = create_model("hoba_classifier", vocab_size=1000, num_classes=2, max_len=128, attention=attention,
                     dim=32, num_heads=2, depth=2).eval()
    ids = torch.randint(1, 1000, (3, 24))
    mask = torch.ones(3, 24, dtype=torch.bool)
    mask[1, 15:] = False
    with torch.no_grad():
        y = m(ids, mask)
        assert y.shape == (3, 2) and torch.isfinite(y).all()
        assert m(ids).shape == (3, 2)
        ids2 = ids.clone()
        ids2[1, 15:] = torch.randint(1, 1000, (9,))  # content of padded positions is ignored
        torch.testing.assert_close(m(ids2, mask), y)
    with pytest.raises(ValueError, match="max_len"):
        m(torch.randint(1, 1000, (1, 129)))
    with pytest.raises(ValueError, match="mask"):
        m(ids, mask[:, :10])
    with pytest.raises(TypeError, match="ids"):
        m(ids.float())
    with pytest.raises(ValueError, match=r"vocab_size=1000\), got ids in \[0, 1000\]"):
        m(torch.tensor([[0, 5, 1000]]))
    with pytest.raises(ValueError, match="vocab_size"):
        m(torch.tensor([[-1, 5]]))


def test_paper_default_model_and_attention_maps(tmp_path):
    m = create_model("hoba_classifier")
    assert (m.max_len, len(m.layers), m.layers[0].attn.block_size, m.layers[0].attn.overlap) == (64, 3, 16, 0.25)
    assert m.layers[0].attn.cross is not None and m.layers[0].attn.dim_head == 64
    m = create_model("hoba_classifier", vocab_size=100, dim=16, num_heads=2)
    args, kwargs = m.example_inputs(2)
    m.eval()
    m.record_attention = True
    logits = m(*args, **kwargs)
    assert len(m.attention_maps) == 3 and m.attention_maps[0][0].ndim == 6  # triplet cubes + cross-block
    m.record_attention = False
    m.save_pretrained(tmp_path / "m")
    torch.testing.assert_close(from_pretrained(tmp_path / "m").eval()(*args, **kwargs), logits)
    with pytest.raises(ValueError, match="attention"):
        create_model("hoba_classifier", attention="sparse")


def test_student_inherits_teacher_embeddings(tmp_path):
    teacher = create_model("hoba_classifier", vocab_size=50, dim=16, num_heads=2, depth=1, attention="full2d")
    d = teacher.save_pretrained(tmp_path / "t")
    student = create_model("hoba_classifier", vocab_size=50, dim=16, num_heads=2, depth=1, attention="hoba")
    names = student.load_embeddings_from(d)
    assert names and all(n.startswith("embed.") for n in names)
    torch.testing.assert_close(student.embed.tokens.weight, teacher.embed.tokens.weight)
    wide = create_model("hoba_classifier", vocab_size=50, dim=32, num_heads=2, depth=1)
    with pytest.raises(ValueError, match="shape mismatch"):
        wide.load_embeddings_from(teacher)


# ------------------------------------------------------------------------------------------------ KD loss
def test_kd_loss_matches_hand_computation():
    zs = torch.tensor([[1.0, -0.5, 0.2], [0.3, 0.8, -1.0]])
    zt = torch.tensor([[2.0, 0.0, -1.0], [-0.5, 1.5, 0.5]])
    y = torch.tensor([0, 2])
    alpha, tau = 0.3, 2.0

    def softmax(v):
        e = [math.exp(x) for x in v]
        return [x / sum(e) for x in e]

    ce = sum(-math.log(softmax(s)[c]) for s, c in zip(zs.tolist(), y.tolist())) / 2
    kl = 0.0
    for s, t in zip(zs.tolist(), zt.tolist()):
        ps, pt = softmax([x / tau for x in s]), softmax([x / tau for x in t])
        kl += sum(b * (math.log(b) - math.log(a)) for a, b in zip(ps, pt))
    kl /= 2
    total, ce_t, kl_t = kd_loss(zs, y, zt, alpha=alpha, temperature=tau)
    assert ce_t.item() == pytest.approx(ce, rel=1e-6) and kl_t.item() == pytest.approx(kl, rel=1e-6)
    assert total.item() == pytest.approx((1 - alpha) * ce + alpha * tau**2 * kl, rel=1e-6)
    total, ce_t, kl_t = kd_loss(zs, y)
    assert total.item() == pytest.approx(ce, rel=1e-6) and kl_t.item() == 0
    with pytest.raises(ValueError, match="alpha"):
        kd_loss(zs, y, zt, alpha=1.5)
    with pytest.raises(ValueError, match="teacher_logits"):
        kd_loss(zs, y, zt[:, :2])


# ---------------------------------------------------------------------------------------------- tokenizer
CORPUS = ["the movie was not really good", "a very highly unlikely plot", "interest rate policy moves markets",
          "the cat sat on the mat", "what is the capital of france ?", "good good good movie"] * 5


def test_tokenizer_round_trip_and_save_load(tmp_path):
    tok = TextTokenizer.train(CORPUS, vocab_size=200, min_frequency=1)
    ids = tok.encode("The cat sat on the mat")
    assert ids[0] == tok.tok.token_to_id("[CLS]") and ids[-1] == tok.tok.token_to_id("[SEP]")
    assert tok.decode(ids) == "the cat sat on the mat" and tok.pad_id == 0
    short = tok.encode("the movie was not really good", max_len=4)
    assert len(short) == 4 and short[-1] == tok.tok.token_to_id("[SEP]")
    tok.save(tmp_path / "tk")
    back = TextTokenizer.from_pretrained(tmp_path / "tk")
    assert back.encode_batch(CORPUS[:6]) == tok.encode_batch(CORPUS[:6]) and back.vocab_size == tok.vocab_size
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        TextTokenizer.from_pretrained(tmp_path / "missing")


def test_local_hf_style_tokenizer_dirs(tmp_path):
    bert = tmp_path / "bert-uncased"
    bert.mkdir()
    (bert / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat",
                                                "##s"]))
    tok = TextTokenizer.from_pretrained(bert)
    assert tok.encode("The cats sat") == [2, 5, 6, 8, 7, 3] and tok.pad_id == 0
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                            show_progress=False)
    rob = tmp_path / "roberta"
    rob.mkdir()
    bpe.save_model(str(rob))
    tok = TextTokenizer.from_pretrained(rob)
    ids = tok.encode("the cat sat")
    assert ids[0] == 0 and ids[-1] == 2 and tok.pad_id == 1 and tok.decode(ids[1:-1]) == "the cat sat"


# ------------------------------------------------------------------------------------------------ readers
def _write_fake_text_root(root):
    (root / "sst2").mkdir(parents=True)
    rows = "".join(f"{'good fun film' if i % 2 else 'dull boring mess'} {i} \t{i % 2}\n" for i in range(40))
    (root / "sst2" / "train.tsv").write_text("sentence\tlabel\n" + rows)
    (root / "sst2" / "dev.tsv").write_text("sentence\tlabel\r\ngood film\t1\r\nboring\t0\r\n")
    (root / "trec").mkdir()
    lines = [f"{c}:x question {i} caf\xe9 ?" for i, c in enumerate(["HUM", "LOC", "NUM", "DESC", "ENTY", "ABBR"] * 5)]
    (root / "trec" / "train_5500.label").write_bytes("\n".join(lines).encode("iso-8859-1"))
    (root / "trec" / "TREC_10.label").write_bytes("NUM:date When ?\nHUM:ind Who ?\n".encode("iso-8859-1"))
    (root / "ag_news").mkdir()
    (root / "ag_news" / "classes.txt").write_text("World\nSports\nBusiness\nSci/Tech\n")
    (root / "ag_news" / "test.csv").write_text('"3","Stocks up","Markets\\rally ""big"""\n"2","Cup","final"\n')
    (root / "ag_news" / "train_subset_10k.tsv").write_text("a match\tSports\nnew chip\tSci/Tech\n")
    (root / "imdb").mkdir()
    (root / "imdb" / "IMDB Dataset.csv").write_text(
        'review,sentiment\n"great, great<br />film",positive\nawful,negative\nfine,positive\nmeh,negative\n')
    return root


def test_readers_on_synthetic_files(tmp_path):
    root = _write_fake_text_root(tmp_path)
    t, y, c = read_text_split("sst2", "dev", root)
    assert t == ["good film", "boring"] and y == [1, 0] and c == ["negative", "positive"]
    t, y, c = read_text_split("trec", "train", root)
    assert len(c) == 6 and "caf\xe9" in t[0] and c[y[0]] == "HUM"
    t, y, c = read_text_split("trec", "test", root)
    assert t == ["When ?", "Who ?"] and [c[i] for i in y] == ["NUM", "HUM"]
    assert read_text_split("trec_fine", "train", root)[2] == ["ABBR:x", "DESC:x", "ENTY:x", "HUM:x", "LOC:x", "NUM:x"]
    t, y, c = read_text_split("ag_news", "test", root)
    assert y == [2, 1] and t[0].startswith("Stocks up . Markets rally") and c[3] == "Sci/Tech"
    assert read_text_split("ag_news", "train", root)[1] == [1, 3]
    t, y, _ = read_text_split("imdb", "train", root)
    assert t == ["great, great film", "awful"] and y == [1, 0]
    assert read_text_split("imdb", "test", root)[1] == [1, 0]
    (tmp_path / "sst2" / "train.tsv").write_text("text\tlabel\nx\t1\n")
    with pytest.raises(SchemaError, match="header"):
        read_text_split("sst2", "train", root)
    with pytest.raises(ValueError, match="unknown dataset"):
        read_text_split("mnli", "train", root)


def test_trec_fine_rejects_unknown_test_labels(tmp_path):
    root = _write_fake_text_root(tmp_path)
    with pytest.raises(SchemaError, match="labels outside"):
        read_text_split("trec_fine", "test", root)


def test_real_trec_and_sst2(data_root):
    t, y, c = read_text_split("trec", "train", data_root / "text")
    assert len(t) == 5452 and len(c) == 6
    assert len(read_text_split("trec", "test", data_root / "text")[0]) == 500
    assert len(read_text_split("trec_fine", "train", data_root / "text")[2]) == 50
    t, y, _ = read_text_split("sst2", "dev", data_root / "text")
    assert len(t) == 872 and set(y) == {0, 1}


# ------------------------------------------------------------------------------------------ datamodule/task
def test_datamodule_splits_and_tokenizer_saved(tmp_path):
    root = _write_fake_text_root(tmp_path / "data")
    dm = TextDataModule("trec", root=str(root), max_len=8, batch_size=4, vocab_size=100,
                        tokenizer_dir=str(tmp_path / "tok"), val_fraction=0.2)
    dm.setup()
    assert {k: len(v) for k, v in dm.datasets.items()} == {"train": 24, "val": 6, "test": 2} and dm.num_classes == 6
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    b = next(iter(dm.train_dataloader()))
    assert b["ids"].shape == b["mask"].shape and b["ids"].shape[1] <= 8 and b["ids"].dtype == torch.long
    assert (b["ids"][~b["mask"]] == dm.tokenizer.pad_id).all()
    again = TextDataModule("trec", root=str(root), max_len=8, batch_size=4, vocab_size=100,
                           tokenizer_dir=str(tmp_path / "tok"), val_fraction=0.2)
    again.setup()  # reuses the saved vocabulary (WordPiece training is not bit-reproducible across processes)
    assert again.tokenizer.tok.to_str() == dm.tokenizer.tok.to_str()
    other = TextDataModule("trec", root=str(root), max_len=8, vocab_size=90, tokenizer_dir=str(tmp_path / "tok"),
                           val_fraction=0.2)
    other.setup()  # different settings: retrained, not reused
    assert json.loads((tmp_path / "tok" / "tokenizer_meta.json").read_text())["vocab_size"] == 90


def test_task_distills_with_cached_teacher_logits(tmp_path):
    import lightning.pytorch as pl

    root = _write_fake_text_root(tmp_path / "data")
    dm = TextDataModule("sst2", root=str(root), max_len=16, batch_size=8, vocab_size=100,
                        tokenizer_dir=str(tmp_path / "teacher"))
    dm.setup()
    mk = dict(vocab_size=dm.tokenizer.vocab_size, num_classes=2, max_len=16, dim=16, num_heads=2, depth=1)
    teacher = create_model("hoba_classifier", attention="full2d", **mk)
    teacher.save_pretrained(tmp_path / "teacher")
    cache = tmp_path / "teacher" / "logits.pt"

    def fit():
        task = TextClassificationTask(model_kwargs=dict(mk, attention="hoba", block_size=4),
                                      teacher=str(tmp_path / "teacher"), teacher_logits=str(cache),
                                      init_embeddings_from=str(tmp_path / "teacher"),
                                      export_dir=str(tmp_path / "student"))
        dm2 = TextDataModule("sst2", root=str(root), max_len=16, batch_size=8, tokenizer=str(tmp_path / "teacher"))
        tr = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_train_batches=2, limit_val_batches=1)
        tr.fit(task, dm2)
        return task, tr

    task, tr = fit()
    assert "train/kl" in tr.callback_metrics and "val/acc" in tr.callback_metrics
    saved = torch.load(cache, weights_only=True)
    assert saved["train"].shape == (36, 2) and "fingerprint" in saved  # 40 train rows, 10% held out for val
    with torch.no_grad():
        b = next(iter(dm.ordered_train_dataloader()))
        torch.testing.assert_close(saved["train"][b["index"]], teacher.eval()(b["ids"], b["mask"]))
    mtime = os.path.getmtime(cache)
    fit()
    assert os.path.getmtime(cache) == mtime  # reused, teacher not re-run
    assert sorted(p.name for p in (tmp_path / "student").iterdir()) == ["config.json", "model.safetensors",
                                                                       "tokenizer.json"]
    assert json.loads((tmp_path / "student" / "config.json").read_text())["kwargs"]["attention"] == "hoba"

    # the cache is keyed by the teacher's config too: same weights, other config -> recomputed
    cfg_path = tmp_path / "teacher" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["kwargs"]["pooling"] = "cls" if cfg["kwargs"].get("pooling") != "cls" else "mean"
    cfg_path.write_text(json.dumps(cfg))
    fit()
    assert os.path.getmtime(cache) != mtime

    # read without the teacher: a cache computed on other data (here another max_len) is refused, not reused
    task = TextClassificationTask(model_kwargs=dict(mk, attention="hoba", block_size=4), teacher_logits=str(cache))
    dm3 = TextDataModule("sst2", root=str(root), max_len=12, batch_size=8, tokenizer=str(tmp_path / "teacher"))
    tr = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, limit_train_batches=1, limit_val_batches=1)
    with pytest.raises(ValueError, match="other data"):
        tr.fit(task, dm3)


def test_task_rejects_class_mismatch(tmp_path):
    import lightning.pytorch as pl

    root = _write_fake_text_root(tmp_path / "data")
    task = TextClassificationTask(model_kwargs=dict(vocab_size=200, num_classes=3, max_len=16, dim=16, num_heads=2,
                                                    depth=1))
    dm = TextDataModule("sst2", root=str(root), max_len=16, batch_size=8, vocab_size=100)
    tr = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
    with pytest.raises(ValueError, match="classes"):
        tr.fit(task, dm)


@pytest.mark.slow
def test_hoba_student_learns_trec(data_root):
    """Real data: a small HOBA model trained 2 epochs on TREC beats the majority class by a wide margin."""
    import lightning.pytorch as pl

    pl.seed_everything(0)
    dm = TextDataModule("trec", root=str(data_root / "text"), max_len=64, batch_size=32, vocab_size=4000)
    task = TextClassificationTask(model_kwargs=dict(vocab_size=4000, num_classes=6, dim=64, num_heads=2, depth=2,
                                                    pooling="mean"), lr=1e-3)
    tr = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    tr.fit(task, dm)
    tr.test(task, dm)
    assert tr.callback_metrics["test/acc"] > 0.5  # majority class (ENTY / DESC) < 0.3


HOBA_DIR = Path(__file__).resolve().parents[1] / "configs" / "hoba"
HOBA_CONFIGS = sorted(HOBA_DIR.glob("*.yaml"))


def test_hoba_configs_match_generator(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("hoba_generate", HOBA_DIR / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)  # importing writes nothing
    assert not list(tmp_path.iterdir())
    written = gen.main(tmp_path)
    assert sorted(p.name for p in written) == [p.name for p in HOBA_CONFIGS] and len(HOBA_CONFIGS) >= 60
    for p in written:
        assert (HOBA_DIR / p.name).read_text() == p.read_text(), f"{p.name} is stale: re-run configs/hoba/generate.py"


@pytest.mark.parametrize("cfg", HOBA_CONFIGS, ids=[c.stem for c in HOBA_CONFIGS])
def test_hoba_configs_are_valid_and_checkpoint_atomically(cfg):
    import inspect

    import yaml

    from hoformer.data import TextDataModule as DM

    c = yaml.safe_load(cfg.read_text())
    for section, cls in (("model", TextClassificationTask), ("data", DM)):
        assert c[section]["class_path"].rsplit(".", 1)[1] == cls.__name__
        unknown = set(c[section]["init_args"]) - set(inspect.signature(cls).parameters)
        assert not unknown, f"{cfg.name}: unknown {section} init_args {unknown}"
    create_model("hoba_classifier", **c["model"]["init_args"]["model_kwargs"])
    t = c["trainer"]
    assert [p["class_path"] for p in t["plugins"]] == ["hoformer.train.tasks.AtomicCheckpointIO"]
    (ckpt,) = [x["init_args"] for x in t["callbacks"] if x["class_path"].endswith("ModelCheckpoint")]
    if ckpt.get("monitor"):  # `hoformer test --ckpt_path best` globs best-*.ckpt in this dirpath
        assert ckpt["dirpath"] == f"runs/hoba/{cfg.stem}/checkpoints" and ckpt["filename"].startswith("best-")
