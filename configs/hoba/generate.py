"""Write the HOBA LightningCLI configs: ``python configs/hoba/generate.py`` (re-generates the committed YAML files
beside this script; ``tests/test_hoba.py`` checks they are up to date).

* ``{sst2,trec,ag_news,imdb}_teacher`` and ``..._{variant}_{3,6}l[_b{16,32,64}]``: paper 004 section 4.1 (RoBERTa-base
  width, AdamW 1e-5, weight decay 0.01, batch 8, 5 epochs, 10% warm-up, distillation alpha 0.3 / tau 2).
* ``cpu_{sst2,trec}_*``: the CPU-budget teachers and students actually run for docs/results_text.md.
"""
from __future__ import annotations

import math
from pathlib import Path

import yaml

from hoformer.train.tasks import checkpoint_callbacks

DATA = {  # name: (max_len, default block size, training examples after the validation hold-out, classes)
    "sst2": (64, 16, 60614, 2), "trec": (64, 16, 4907, 6), "ag_news": (128, 32, 9001, 4), "imdb": (512, 64, 22500, 2),
}
VARIANTS = {  # name: (attention, cross_block)
    "hoba": ("hoba", True), "hoba_nocb": ("hoba", False), "block2d": ("block2d", True),
    "block2d_nocb": ("block2d", False), "full2d": ("full2d", False), "triplet_full": ("triplet_full", False),
}

def config(out: Path, name, ds, model_kwargs, *, lr, epochs, batch, n_train, seed, teacher=None, export=True,
           train_limit=None, header="", monitor=True, vocab=16000, tokenizer=None, max_len=64,
           init_head=False) -> Path:
    """Write ``out/<name>.yaml`` and return its path."""
    steps = epochs * math.ceil(n_train / batch)
    run = f"runs/hoba/{name}"
    cfg = {
        "seed_everything": seed,
        "trainer": {
            "max_epochs": epochs, "accelerator": "auto", "devices": 1, "default_root_dir": run,
            "log_every_n_steps": 50, "enable_progress_bar": False,
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": run, "name": "logs"}},
            # without a monitor the CPU runs test last.ckpt
            "callbacks": checkpoint_callbacks(f"{run}/checkpoints" if monitor else None, "val/acc" if monitor else None,
                                              "max", "best-{epoch:02d}")
            + ([{"class_path": "lightning.pytorch.callbacks.EarlyStopping",
                   "init_args": {"monitor": "val/acc", "mode": "max", "patience": 3}}] if monitor else []),
            "plugins": [{"class_path": "hoformer.train.tasks.AtomicCheckpointIO"}],
        },
        "model": {"class_path": "hoformer.train.TextClassificationTask", "init_args": {
            "model_name": "hoba_classifier", "model_kwargs": model_kwargs, "lr": lr, "weight_decay": 0.01,
            "warmup_steps": max(1, steps // 10), "scheduler": "cosine", "kd_alpha": 0.3, "kd_temperature": 2.0,
            "teacher": teacher, "teacher_logits": f"{teacher}/teacher_logits.pt" if teacher else None,
            "init_embeddings_from": teacher, "init_head_from_teacher": init_head,
            "export_dir": f"{run}/pretrained" if export else None}},
        "data": {"class_path": "hoformer.data.TextDataModule", "init_args": {
            "dataset": ds, "root": None, "max_len": max_len, "batch_size": batch, "tokenizer": tokenizer,
            "tokenizer_dir": None, "vocab_size": vocab, "val_fraction": 0.1, "train_limit": train_limit, "seed": 0,
            "num_workers": 0}},
    }
    tok_override = f" --data.init_args.tokenizer {run}/pretrained" if tokenizer is None else ""
    cmd = f"# hoformer fit --config configs/hoba/{name}.yaml\n# hoformer test --config configs/hoba/{name}.yaml --ckpt_path {'best' if monitor else run + '/logs/version_0/checkpoints/last.ckpt'}{tok_override}\n"
    if tokenizer is None and not name.startswith("cpu_"):
        cfg["data"]["init_args"]["tokenizer_dir"] = f"{run}/tokenizer"
    path = Path(out) / f"{name}.yaml"
    path.write_text(header + cmd + yaml.safe_dump(cfg, sort_keys=False, width=120))
    return path

PAPER_TEACHER_HEADER = (
    "# HOBA teacher ({ds}): a 12-layer 2D (RoBERTa-base sized) encoder trained by the project from scratch\n"
    "# (the paper fine-tunes a pretrained RoBERTa-base; with a local checkpoint, pass its logits as\n"
    "# model.teacher_logits of the students instead). Exports model + tokenizer to runs/hoba/{tname}/pretrained.\n")
PAPER_STUDENT_HEADER = (
    "# HOBA paper section 4.1 student ({ds}, {depth} layers, attention={att}, block {bs}, overlap 0.25, "
    "cross-block={cb}),\n# distilled (alpha 0.3, tau 2) from configs/hoba/{ds}_teacher.yaml (run it first), embeddings "
    "and classifier head\n# initialised from the teacher. Seeds 42/43/44: one config copy (own run directory) per seed, "
    "e.g.\n# sed -E 's#runs/hoba/{name}\\b#runs/hoba/{name}/s43#g; s/^seed_everything: .*/seed_everything: 43/' "
    "\\\n#   configs/hoba/{name}.yaml > {name}_s43.yaml\n")
CPU_TEACHER_HEADER = ("# CPU-budget teacher for docs/results_text.md ({ds}): 2D encoder, width 64, 4 layers "
                      "(students: 2 layers).\n")
CPU_STUDENT_HEADER = (
    "# CPU-budget student for docs/results_text.md ({ds}, attention={att}, cross-block={cb}); seeds\n"
    "# 0/1/2 via --seed_everything and --trainer.default_root_dir / logger / export dirs per seed (see the doc).\n")
CPU = {  # CPU-budget runs of docs/results_text.md: training subset sizes and teacher epochs
    "sst2": dict(train_limit=5000, teacher_limit=20000, n=5000, tn=20000, te=3),
    "trec": dict(train_limit=None, teacher_limit=None, n=4907, tn=4907, te=8),
}


def _model(C, L, *, vocab, dim, depth, heads, attention, pooling, block=None, cross_block=None):
    mk = {"vocab_size": vocab, "num_classes": C, "max_len": L, "dim": dim, "depth": depth, "num_heads": heads,
          "attention": attention, "dropout": 0.1, "pooling": pooling}
    if attention in ("hoba", "block2d"):
        mk.update(block_size=block, overlap=0.25, cross_block=cross_block)
    return mk


def main(out: str | Path = Path(__file__).resolve().parent) -> list[Path]:
    """Write every HOBA config into ``out``; returns the written paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    # ---- paper-scale configs (section 4.1): RoBERTa-base width, AdamW 1e-5, wd 0.01, batch 8, 5 epochs, 10% warm-up
    for ds, (L, b, n, C) in DATA.items():
        tname = f"{ds}_teacher"
        written.append(config(
            out, tname, ds, _model(C, max(L, 128), vocab=16000, dim=768, depth=12, heads=12, attention="full2d",
                                   pooling="cls"),  # positions for the 6-layer students' 128 tokens
            lr=1e-4, epochs=5, batch=8, n_train=n, seed=42, max_len=L,
            header=PAPER_TEACHER_HEADER.format(ds=ds, tname=tname)))
        teacher = f"runs/hoba/{tname}/pretrained"
        for depth in (3, 6):
            for v, (att, cb) in VARIANTS.items():
                if v == "triplet_full" and ds not in ("sst2", "trec"):
                    continue  # Table 1 only (cubic cost)
                blocks = (16, 32, 64) if v == "hoba" and depth == 3 else (b,)
                # section 4.1: 64 tokens for 3-layer, 128 for 6-layer students (longer datasets keep their length)
                Ls = L if depth == 3 else max(L, 128)
                for bs in blocks:
                    name = f"{ds}_{v}_{depth}l" + (f"_b{bs}" if len(blocks) > 1 else "")
                    mk = _model(C, Ls, vocab=16000, dim=768, depth=depth, heads=12, attention=att, pooling="cls",
                                block=bs, cross_block=cb)
                    written.append(config(
                        out, name, ds, mk, lr=1e-5, epochs=5, batch=8, n_train=n, seed=42, teacher=teacher,
                        max_len=Ls, tokenizer=teacher, init_head=True,
                        header=PAPER_STUDENT_HEADER.format(ds=ds, depth=depth, att=att, bs=bs, cb=cb, name=name)))

    # ---- CPU-budget configs actually run for docs/results_text.md (small widths, subsets, fixed epochs)
    for ds, c in CPU.items():
        L, b, _, C = DATA[ds]
        tname = f"cpu_{ds}_teacher"
        written.append(config(
            out, tname, ds, _model(C, L, vocab=8000, dim=64, depth=4, heads=2, attention="full2d", pooling="mean"),
            lr=1e-3, epochs=c["te"], batch=32, n_train=c["tn"], seed=0, train_limit=c["teacher_limit"],
            monitor=False, vocab=8000, max_len=L, header=CPU_TEACHER_HEADER.format(ds=ds)))
        teacher = f"runs/hoba/{tname}/pretrained"
        for v in ("hoba", "hoba_nocb", "block2d", "full2d") + (("triplet_full",) if ds == "trec" else ()):
            att, cb = VARIANTS[v]
            mk = _model(C, L, vocab=8000, dim=64, depth=2, heads=2, attention=att, pooling="mean", block=b,
                        cross_block=cb)
            written.append(config(
                out, f"cpu_{ds}_{v}", ds, mk, lr=1e-3, epochs=4, batch=32, n_train=c["n"], seed=0, teacher=teacher,
                train_limit=c["train_limit"], monitor=False, vocab=8000, tokenizer=teacher, max_len=L,
                header=CPU_STUDENT_HEADER.format(ds=ds, att=att, cb=cb)))
    return written


if __name__ == "__main__":
    print(f"wrote {len(main())} configs")
