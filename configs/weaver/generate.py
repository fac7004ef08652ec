"""Write the Weaver / traffic-baseline LightningCLI configs: ``python configs/weaver/generate.py`` (re-generates the
committed YAML files beside this script; ``tests/test_weaver.py`` checks they are up to date).

* ``{metr_la,pems_bay,los_loop}_{t,nt}``: paper 003, Table 3 defaults (E=128, H=8, Adam 1e-3, exponential decay
  0.9 per epoch, batch 32, <= 50 epochs, early stopping on the validation loss with patience 10 / min delta 1e-3).
* ``ablation_pems_bay_*``: section 7 ablations (Table 6: embedding size / heads; Table 9: Tanimoto vs SDPA vs cosine
  at several widths; Table 7: dictionary size M x K), Default(T) otherwise.
* ``los_loop_cpu_*``: the CPU-budget Los-loop schedule of docs/results_traffic.md, the same protocol as
  ``benchmarks/weaver_losloop.py`` (E=32, 8 epochs, Adam 1e-3, decay 0.9 per epoch, batch 32, the epoch with the
  best validation MAE is tested): Weaver T / NT with Tanimoto, SDPA and cosine maps, and the trained baselines.

METR-LA / PEMS-BAY use torch-spatiotemporal's ``TemporalSplitter`` (``split_protocol: tsl``) as the paper did;
Los-loop keeps the contiguous DCRNN split of docs/results_traffic.md.

Every run writes under ``runs/weaver/<name>/`` (CSV + TensorBoard logs, ``checkpoints/best-*.ckpt`` and ``last.ckpt``
written atomically), so ``hoformer test --config <cfg> --ckpt_path best`` finds the checkpoint in a fresh process.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from hoformer.train.tasks import checkpoint_callbacks

HERE = Path(__file__).resolve().parent
NODES = {"metr_la": 207, "pems_bay": 325, "los_loop": 207}
TITLE = {"metr_la": "METR-LA", "pems_bay": "PEMS-BAY", "los_loop": "Los-loop"}
WEAVER_DEFAULT = {  # Table 3
    "window": 12, "horizon": 12, "in_channels": 1, "dim": 128, "num_heads": 8, "use_time": True, "dropout": 0.1,
    "num_landmarks": 64, "dict_width": 32, "num_scorers": 5, "ratio_space": 0.6, "ratio_time": 0.6, "kern_dim": 32,
    "kern_layers": 3, "kernel": "tanimoto",
}


def trainer(name: str, epochs: int, monitor: str, early_stopping: dict | None) -> dict:
    root = f"runs/weaver/{name}"
    callbacks = []
    if early_stopping is not None:
        callbacks.append({"class_path": "lightning.pytorch.callbacks.EarlyStopping",
                          "init_args": {"monitor": monitor, "mode": "min", **early_stopping}})
    callbacks += [
        *checkpoint_callbacks(f"{root}/checkpoints", monitor, "min", save_top_k=1),
        {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "epoch"}},
    ]
    return {
        "max_epochs": epochs, "accelerator": "auto", "devices": 1, "default_root_dir": root,
        "gradient_clip_val": None, "log_every_n_steps": 50,
        "logger": [
            {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": root, "name": "logs"}},
            {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": root, "name": "tb"}},
        ],
        "callbacks": callbacks,
        "plugins": [{"class_path": "hoformer.train.tasks.AtomicCheckpointIO"}],
    }


def config(name: str, dataset: str, model_name: str, model_kwargs: dict, *, epochs: int, lr: float, batch: int,
           monitor: str, early_stopping: dict | None, use_time: bool, num_workers: int) -> dict:
    return {
        "seed_everything": 0,
        "trainer": trainer(name, epochs, monitor, early_stopping),
        "model": {"class_path": "hoformer.train.traffic.TrafficForecastingTask", "init_args": {
            "model_name": model_name, "model_kwargs": {"num_nodes": NODES[dataset], **model_kwargs}, "lr": lr,
            "weight_decay": 0.0, "exp_gamma": 0.9, "use_time": use_time, "horizons": [3, 6, 12]}},
        "data": {"class_path": "hoformer.data.traffic.TrafficDataModule", "init_args": {
            "dataset": dataset, "window": 12, "horizon": 12, "val_ratio": 0.1, "test_ratio": 0.2, "batch_size": batch,
            "eval_batch_size": 64, "num_workers": num_workers, "num_nodes": NODES[dataset],
            # the paper's datasets with its TSL splitter; Los-loop (not in the paper) keeps the DCRNN split its
            # committed CPU results were measured with
            "split_protocol": "dcrnn" if dataset == "los_loop" else "tsl"}},
    }


def paper(name: str, dataset: str, **overrides) -> dict:
    kw = {**WEAVER_DEFAULT, **overrides}
    return config(name, dataset, "weaver", kw, epochs=50, lr=1e-3, batch=32, monitor="val/loss",
                  early_stopping={"patience": 10, "min_delta": 1e-3}, use_time=kw["use_time"], num_workers=2)


def experiments():
    for ds in NODES:
        yield f"{ds}_t", f"Weaver Default(T) on {TITLE[ds]} (paper 003, Table 3 / Table 5).", paper(f"{ds}_t", ds)
        yield (f"{ds}_nt", f"Weaver Default(NT) (no time metadata) on {TITLE[ds]} (Table 3 / Table 5).",
               paper(f"{ds}_nt", ds, use_time=False))
    for e, h in ((32, 8), (64, 4), (80, 8), (96, 6)):
        n = f"ablation_pems_bay_e{e}_h{h}"
        yield n, f"Section 7.1 / Table 6 ablation: E={e}, H={h} (Default(T) otherwise).", \
            paper(n, "pems_bay", dim=e, num_heads=h)
    for kernel, widths in (("tanimoto", (32, 80)), ("sdpa", (32, 80, 128)), ("cosine", (32, 80, 128))):
        for e in widths:
            n = f"ablation_pems_bay_{kernel}_e{e}"
            what = "Tanimoto reference" if kernel == "tanimoto" else f"{kernel} instead of Tanimoto"
            yield n, f"Section 7.2 / Table 9 ablation: {what}, E={e}.", paper(n, "pems_bay", dim=e, kernel=kernel)
    for m, k in ((4, 32), (8, 32), (16, 32), (64, 4), (64, 8), (64, 16), (8, 4), (128, 64)):
        n = f"ablation_pems_bay_dict_m{m}_k{k}"
        yield n, f"Section 7.3 / Table 7 ablation: dictionary M={m}, K={k}.", \
            paper(n, "pems_bay", num_landmarks=m, dict_width=k)
    cpu = {  # benchmarks/weaver_losloop.py variant -> (model, kwargs)
        "weaver_t": ("weaver", {"dim": 32, "num_heads": 8, "use_time": True}),
        "weaver_nt": ("weaver", {"dim": 32, "num_heads": 8, "use_time": False}),
        "weaver_t_sdpa": ("weaver", {"dim": 32, "num_heads": 8, "use_time": True, "kernel": "sdpa"}),
        "weaver_t_cosine": ("weaver", {"dim": 32, "num_heads": 8, "use_time": True, "kernel": "cosine"}),
        "weaver_nt_sdpa": ("weaver", {"dim": 32, "num_heads": 8, "use_time": False, "kernel": "sdpa"}),
        "weaver_nt_cosine": ("weaver", {"dim": 32, "num_heads": 8, "use_time": False, "kernel": "cosine"}),
        "full_attention": ("traffic_full_attention", {"dim": 32, "num_heads": 4, "num_layers": 1}),
        "alternating": ("traffic_alternating", {"dim": 32, "num_heads": 4, "num_layers": 1}),
        "hot": ("traffic_hot", {"dim": 32, "num_heads": 4, "num_layers": 1}),
    }
    for variant, (model, kw) in cpu.items():
        n = f"los_loop_cpu_{variant}"
        title = (f"Los-loop CPU-budget schedule of docs/results_traffic.md (benchmarks/weaver_losloop.py variant "
                 f"{variant.replace('weaver_t', 'weaver_T').replace('weaver_nt', 'weaver_NT')}):\n# E=32, 8 epochs, "
                 f"Adam lr 1e-3, decay 0.9/epoch, batch 32, the epoch with the best val/mae is tested.")
        yield n, title, config(n, "los_loop", model, kw, epochs=8, lr=1e-3, batch=32, monitor="val/mae",
                               early_stopping=None, use_time=True, num_workers=0)


def main(out_dir: Path = HERE) -> list[Path]:
    written = []
    for name, title, cfg in experiments():
        path = Path(out_dir) / f"{name}.yaml"
        head = (f"# {title}\n# hoformer fit --config configs/weaver/{name}.yaml  (data from $HOFORMER_DATA/traffic)\n"
                f"# hoformer test --config configs/weaver/{name}.yaml --ckpt_path best\n")
        path.write_text(head + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False))
        written.append(path)
    return written


if __name__ == "__main__":
    print(f"wrote {len(main())} configs under {HERE}")
