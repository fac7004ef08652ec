"""Write one LightningCLI YAML per HOT paper experiment (paper 000, Tables 1-3; hyper-parameters appendix B.4 /
Table 6). Run from anywhere: ``python configs/hot/generate.py`` (re-generates the committed files).

Common protocol (appendix B.4): Adam(W) with lr 2e-4, batch 32, 100 epochs, width 128; blocks 2 (forecasting) /
6 (3D classification, segmentation); patch size 4 (from {2, 4}); 8 heads (from {1..32}); dropout 0.1 (from
{0, .1, .2, .3}); weight decay 0.1 (from {.01, .1, .3, .5}); mean pooling (3D classification; forecasting uses a
flattened per-variate head, see hoformer.models.hot.HOTForecaster); model selection on the validation set
(lowest MAE / highest AUC / highest ACC) after the full 100 epochs, without early stopping (B.4: "the number of
training epochs is fixed to 100"; only the CPU-budget grid stops early). The paper tuned dropout / weight decay / heads / patch per dataset but does
not publish the chosen values, so every config uses the same middle-of-the-grid values and a fixed seed.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from hoformer.train.tasks import checkpoint_callbacks

HERE = Path(__file__).resolve().parent
SEED = 2024
LR, BATCH, EPOCHS, DIM = 2e-4, 32, 100, 128

# forecasting datasets: config name -> (LTSF name, variates, lookback, horizons)
LTSF = {
    "etth1": ("ETTh1", 7, 96, (96, 192, 336, 720)),
    "etth2": ("ETTh2", 7, 96, (96, 192, 336, 720)),
    "ettm1": ("ETTm1", 7, 96, (96, 192, 336, 720)),
    "ettm2": ("ETTm2", 7, 96, (96, 192, 336, 720)),
    "weather": ("weather", 21, 96, (96, 192, 336, 720)),
    "electricity": ("electricity", 321, 96, (96, 192, 336, 720)),
    "traffic": ("traffic", 862, 96, (96, 192, 336, 720)),
    "solar": ("solar", 137, 96, (96, 192, 336, 720)),
    "ili": ("national_illness", 7, 36, (24, 36, 48, 60)),  # literature protocol for ILI: lookback 36
}
# Table 1 rows: variant -> (attention, extra model kwargs)
FORECAST_VARIANTS = {
    "hot_product": ("kronecker_product", {}),
    "hot_sum": ("kronecker_sum", {}),
    "full": ("full", {}),  # Transformer (non-factorized)
    "spatial": ("spatial", {"patch_size": "seq_len"}),  # Transformer (spatial) = iTransformer: one token / variate
    "temporal": ("temporal", {}),  # Transformer (temporal): attention over time patches, variates independent
}
MEDMNIST = {  # Table 2 / Table 5: flag -> classes
    "organ": 11, "nodule": 2, "adrenal": 2, "fracture": 3, "vessel": 2, "synapse": 2,
}
CLS_VARIANTS = {"hot_product": "kronecker_product", "hot_sum": "kronecker_sum", "full": "full"}
SSL4EO = {"nlcd": 17, "cdl": 134}  # Table 3
SEG_VARIANTS = {"hot_product": "kronecker_product", "hot_sum": "kronecker_sum"}


def trainer(run: str, monitor: str, mode: str, patience: int | None, log_every: int = 50) -> dict:
    """``patience=None``: no early stopping (the paper's protocol: a fixed number of epochs, the best-validation
    checkpoint is tested). ``log_every``: training-step logging interval, below the steps per epoch (Lightning warns
    and logs no step of an epoch shorter than it)."""
    root = f"runs/hot/{run}"
    cfg = {
        "max_epochs": EPOCHS,
        "accelerator": "auto",
        "devices": 1,
        "default_root_dir": root,
        "log_every_n_steps": log_every,
        "logger": [
            {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": root, "name": "logs"}},
            {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
             "init_args": {"save_dir": root, "name": "tb"}},
        ],
        "callbacks": [
            *checkpoint_callbacks(f"{root}/checkpoints", monitor, mode),
            {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor",
             "init_args": {"logging_interval": "epoch"}},
            {"class_path": "hoformer.train.tasks.ExportPretrained"},
            {"class_path": "hoformer.train.tasks.SavePredictions"},
        ],
        "plugins": [{"class_path": "hoformer.train.tasks.AtomicCheckpointIO"}],
    }
    if patience is not None:
        cfg["callbacks"].insert(2, {"class_path": "lightning.pytorch.callbacks.EarlyStopping",
                                    "init_args": {"monitor": monitor, "mode": mode, "patience": patience}})
    return cfg


def task(cls: str, model: str, kwargs: dict, **extra) -> dict:
    return {"class_path": f"hoformer.train.{cls}",
            "init_args": {"model_name": model, "model_kwargs": kwargs, "lr": LR, "weight_decay": 0.1,
                          "warmup_steps": 0, "scheduler": "cosine", **extra}}


def _forecasting(prefix: str, datasets, model_kw: dict, title: str, patience: int | None, epochs: int, num_workers: int,
                 **task_kw):
    """One LTSF config per dataset x horizon x Table 1 variant under ``configs/hot/<prefix>/``."""
    for ds in datasets:
        name, c, seq_len, horizons = LTSF[ds]
        for h in horizons:
            for variant, (attn, extra) in FORECAST_VARIANTS.items():
                kw = {"seq_len": seq_len, "pred_len": h, "num_variates": c, "attention": attn, **model_kw,
                      "pool": "flatten"}
                kw.update({k: (seq_len if v == "seq_len" else v) for k, v in extra.items()})
                run = f"{prefix}/{ds}_{seq_len}_{h}_{variant}"
                tr = trainer(run, "val/mae", "min", patience, log_every=10 if ds == "ili" else 50)  # ILI: ~18 steps
                tr["max_epochs"] = epochs
                t = task("ForecastingTask", "hot_forecaster", kw)
                t["init_args"].update(task_kw)
                yield run, f"{title}: {name}, lookback {seq_len}, horizon {h}, {variant} ({attn} attention).", {
                    "seed_everything": SEED,
                    "trainer": tr,
                    "model": t,
                    "data": {"class_path": "hoformer.data.LTSFDataModule",
                             "init_args": {"root": None, "name": name, "seq_len": seq_len, "pred_len": h,
                                           "batch_size": BATCH, "num_workers": num_workers}},
                }


def forecasting():
    kw = {"dim": DIM, "depth": 2, "num_heads": 8, "patch_size": 4, "dropout": 0.1}
    yield from _forecasting("ltsf", LTSF, kw, "HOT paper Table 1 protocol", patience=None, epochs=EPOCHS,
                            num_workers=2)


# CPU-budget forecasting grid (docs/results_hot.md): the demo's small model (width 64, 4 heads, patch 8, lr 1e-3 with
# warm-up) trained for at most 10 epochs with early stopping, so that a whole horizon sweep fits on 2 CPU cores.
CPU_LTSF = ("etth1", "weather")
CPU_KW = {"dim": 64, "depth": 2, "num_heads": 4, "patch_size": 8, "dropout": 0.2}


def forecasting_cpu():
    yield from _forecasting("ltsf_cpu", CPU_LTSF, CPU_KW, "CPU-budget variant of the Table 1 protocol", patience=3,
                            epochs=10, num_workers=0, lr=1e-3, warmup_steps=100)


def classification():
    for flag, n in MEDMNIST.items():
        data = {"class_path": "hoformer.data.MedMNIST3DDataModule",
                "init_args": {"root": None, "flag": f"{flag}mnist3d", "size": 28, "batch_size": BATCH, "num_workers": 2}}
        for variant, attn in CLS_VARIANTS.items():
            kw = {"in_channels": 1, "input_size": 28, "num_classes": n, "attention": attn, "dim": DIM, "depth": 6,
                  "num_heads": 8, "patch_size": 4, "dropout": 0.1, "pos_embed": "rope"}
            run = f"medmnist3d/{flag}_{variant}"
            yield run, f"HOT paper Table 2 protocol: {flag.capitalize()}MNIST3D 28^3, {variant} ({attn}).", {
                "seed_everything": SEED,
                "trainer": trainer(run, "val/auc", "max", None, log_every=10),  # 31-42 steps per epoch
                "model": task("ClassificationTask", "hot_volume_classifier", kw),
                "data": data,
            }
        # the convolutional reference (not a Table 2 row): same data, epochs, batch and checkpoint selection; AdamW at
        # the usual CNN settings (lr 1e-3, weight decay 1e-4) instead of the transformers' lr 2e-4 / 0.1
        run = f"medmnist3d/{flag}_cnn3d"
        kw = {"in_channels": 1, "input_size": 28, "num_classes": n, "widths": [16, 32, 64], "dropout": 0.0,
              "norm": "group"}
        model = task("ClassificationTask", "cnn3d_classifier", kw)
        model["init_args"].update(lr=1e-3, weight_decay=1e-4)
        yield run, f"Table 2 protocol: {flag.capitalize()}MNIST3D 28^3, small 3D CNN reference (cnn3d_classifier).", {
            "seed_everything": SEED,
            "trainer": trainer(run, "val/auc", "max", None, log_every=10),  # 31-42 steps per epoch
            "model": model,
            "data": data,
        }


def segmentation():
    for name, n in SSL4EO.items():
        for variant, attn in SEG_VARIANTS.items():
            kw = {"in_channels": 7, "num_classes": n, "input_size": 264, "attention": attn, "dim": DIM, "depth": 6,
                  "num_heads": 8, "patch_size": 4, "dropout": 0.1, "pos_embed": "rope"}
            run = f"ssl4eo_l/{name}_{variant}"
            yield run, f"HOT paper Table 3 protocol: SSL4EO-L OLI/TIRS {name.upper()} ({n} classes), {variant}.", {
                "seed_everything": SEED,
                "trainer": trainer(run, "val/acc", "max", None),
                "model": task("SegmentationTask", "hot_segmenter", kw),
                "data": {"class_path": "hoformer.data.MultispectralDataModule",
                         "init_args": {"root": None, "product": name, "sensor": "oli_sr", "crop_size": None,
                                       "batch_size": BATCH, "num_workers": 4}},
            }


def main(out_dir: Path = HERE) -> list[Path]:
    written = []
    for gen in (forecasting, forecasting_cpu, classification, segmentation):
        for run, title, cfg in gen():
            path = Path(out_dir) / f"{run}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            hp = ("CPU budget" if run.startswith("ltsf_cpu") else
                  "B.4 protocol, CNN optimiser settings" if run.endswith("_cnn3d") else "HOT paper appendix B.4 / Table 6")
            head = (f"# {title}\n# Hyper-parameters: {hp} (see configs/hot/generate.py).\n"
                    f"# hoformer fit --config configs/hot/{run}.yaml\n"
                    f"# hoformer test --config configs/hot/{run}.yaml --ckpt_path best\n")
            path.write_text(head + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False))
            written.append(path)
    return written


if __name__ == "__main__":
    print(f"wrote {len(main())} configs under {HERE}")
