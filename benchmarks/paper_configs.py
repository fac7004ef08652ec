"""Every paper-reproduction experiment as a ``hoformer fit`` command: a composed config plus command-line overrides.

The committed configs (``configs/``) are a shared trainer (``configs/trainer.yaml``), one protocol file per paper
setting (``configs/hot/ltsf.yaml``, ``configs/weaver/paper.yaml``, ...) and a few named experiments; the parameter
grids of the papers (datasets x horizons x attention variants, ablations, depths, block sizes) live here::

    python benchmarks/paper_configs.py --list                     # every experiment name
    python benchmarks/paper_configs.py hot/ltsf/weather_96_192_full          # its command
    python benchmarks/paper_configs.py hot/ltsf/weather_96_192_full --run    # run it (extra args are appended)

Output goes to ``runs/<name>`` (the one ``--trainer.default_root_dir`` override of each command).
"""
from __future__ import annotations

import argparse
import shlex
import sys

MODEL = "--model.model.init_args"
DATA = "--data.init_args"

# ------------------------------------------------------------------------------------------- HOT (paper 000)
LTSF = {  # name -> (LTSF name, lookback, horizons)
    "etth1": ("ETTh1", 96, (96, 192, 336, 720)), "etth2": ("ETTh2", 96, (96, 192, 336, 720)),
    "ettm1": ("ETTm1", 96, (96, 192, 336, 720)), "ettm2": ("ETTm2", 96, (96, 192, 336, 720)),
    "weather": ("weather", 96, (96, 192, 336, 720)), "electricity": ("electricity", 96, (96, 192, 336, 720)),
    "traffic": ("traffic", 96, (96, 192, 336, 720)), "solar": ("solar", 96, (96, 192, 336, 720)),
    "ili": ("national_illness", 36, (24, 36, 48, 60)),  # the literature's ILI protocol: lookback 36
}
FORECAST_VARIANTS = {"hot_product": "kronecker_product", "hot_sum": "kronecker_sum", "full": "full",
                     "spatial": "spatial", "temporal": "temporal"}
CPU_LTSF = ("etth1", "weather")
MEDMNIST = {"organ": 11, "nodule": 2, "adrenal": 2, "fracture": 3, "vessel": 2, "synapse": 2}
CLS_VARIANTS = {"hot_product": "kronecker_product", "hot_sum": "kronecker_sum", "full": "full"}
SSL4EO = ("nlcd", "cdl")
SEG_VARIANTS = {"hot_product": "kronecker_product", "hot_sum": "kronecker_sum"}


def _hot():
    for prefix, base, datasets in (("ltsf", "configs/hot/ltsf.yaml", LTSF), ("ltsf_cpu", "configs/hot/ltsf_cpu.yaml",
                                                                             CPU_LTSF)):
        for ds in datasets:
            name, lookback, horizons = LTSF[ds]
            for h in horizons:
                for variant, attention in FORECAST_VARIANTS.items():
                    args = [f"{DATA}.name={name}", f"{DATA}.seq_len={lookback}", f"{DATA}.pred_len={h}",
                            f"{MODEL}.attention={attention}"]
                    if variant == "spatial":  # iTransformer: one token per variate
                        args.append(f"{MODEL}.patch_size={lookback}")
                    if ds == "ili":  # ~18 steps per epoch
                        args.append("--trainer.log_every_n_steps=10")
                    yield f"hot/{prefix}/{ds}_{lookback}_{h}_{variant}", base, args
    for ds, (name, lookback, horizons) in LTSF.items():  # the HOT authors' protocol: one model answers every horizon
        for variant, attention in FORECAST_VARIANTS.items():
            args = [f"{DATA}.name={name}", f"{DATA}.seq_len={lookback}", f"{DATA}.pred_len={horizons[-1]}",
                    f"--model.init_args.horizons=[{','.join(map(str, horizons))}]", f"{MODEL}.attention={attention}"]
            if variant == "spatial":
                args.append(f"{MODEL}.patch_size={lookback}")
            yield f"hot/ltsf_hot/{ds}_{lookback}_{variant}", "configs/hot/ltsf_hot.yaml", args
    for flag in MEDMNIST:
        for variant, attention in CLS_VARIANTS.items():
            yield (f"hot/medmnist3d/{flag}_{variant}", "configs/hot/medmnist3d.yaml",
                   [f"{DATA}.flag={flag}mnist3d", f"{MODEL}.attention={attention}"])
        yield (f"hot/medmnist3d/{flag}_cnn3d", "configs/hot/medmnist3d/adrenal_cnn3d.yaml",
               [f"{DATA}.flag={flag}mnist3d"])
    # the CPU-budget volume model with the imbalanced-class recipe of docs/your_data.md (balanced class weights, the
    # best validation balanced accuracy tested)
    yield ("hot/medmnist3d_cpu/adrenal_hot_product", "configs/hot/medmnist3d/adrenal_hot_product_cpu.yaml",
           [f"{DATA}.flag=adrenalmnist3d", "--model.init_args.class_weight=balanced",
            "--model.init_args.select_on=val/bacc"])
    for product in SSL4EO:
        for variant, attention in SEG_VARIANTS.items():
            yield (f"hot/ssl4eo_l/{product}_{variant}", "configs/hot/ssl4eo_l.yaml",
                   [f"{DATA}.product={product}", f"{MODEL}.attention={attention}"])


# CPU-budget variants of a forecasting experiment (docs/results_hot.md: the ETTh1 seed tables, one model for every
# horizon, the q/k biases, Weather uncapped): override lists on top of an experiment's own arguments. The campaign's
# `cpu_variants` plan runs `NAME+VARIANT` (with `+sSEED` for another seed) as the experiment NAME plus these.
def _set(key: str, value) -> str:
    """A ``--key=value`` override (non-strings as JSON, which the CLI reads as YAML)."""
    import json

    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def _ema(decay: float) -> list[str]:
    """Lightning's EMAWeightAveraging added to the config's callbacks (validation, the best checkpoint and the test
    see the averaged weights)."""
    return ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", _set("--trainer.callbacks.decay", decay)]


def _official() -> list[str]:
    """The model arguments of the ``hot_forecaster_official`` preset (the reference implementation's forecaster)."""
    from hoformer.models.registry import model_entry

    return [_set(f"{MODEL}.{k}", v) for k, v in model_entry("hot_forecaster_official").preset.items()]


_REG = [_set(f"{MODEL}.dropout", 0.3), _set("--model.init_args.optim.weight_decay", 0.5)]
_JOINT = [_set("--model.init_args.horizons", [96, 192, 336, 720])]
VARIANTS = {  # name -> overrides (a callable: built when asked, the preset's arguments)
    "ema": _ema(0.99),  # decay 0.99: a horizon of ~100 steps, under half an ETTh1 epoch (the best epoch is 0-2)
    "ema998": _ema(0.998),
    "reg": _REG,  # the paper grid's strongest regularisation
    "patch16": [*_REG, _set(f"{MODEL}.patch_size", 16)],
    "small": [*_REG, _set(f"{MODEL}.dim", 32)],
    "lr3e-4": [*_REG, _set("--model.init_args.optim.lr", 3e-4)],
    "depth1": [*_REG, _set(f"{MODEL}.depth", 1)],
    # the run to its own end (10 epochs or early stopping) instead of a wall-time cap
    "uncapped": ["--trainer.max_time=null"],
    # q/k biases added before the sum-pooling, as the reference HOT implementation does
    "ema+qk_bias": [*_ema(0.99), _set(f"{MODEL}.qk_bias", True)],
    # joint-horizon training: one 720-step model on the mean of the prefix losses (run it on a 720 experiment)
    "ema_joint": [*_ema(0.99), *_JOINT],
    # the same with the reference implementation's forecaster (the hot_forecaster_official preset)
    "ema_official": lambda: [*_ema(0.99), *_JOINT, *_official()],
}


def variant_overrides(variant: str, seed: int | None = None) -> list[str]:
    """The overrides of variant ``variant`` (and ``--seed_everything`` for ``seed``)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; the variants: {sorted(VARIANTS)}")
    extra = VARIANTS[variant]() if callable(VARIANTS[variant]) else VARIANTS[variant]
    return [*extra, *([_set("--seed_everything", seed)] if seed is not None else [])]


# ------------------------------------------------------------------------------------------ Weaver (paper 003)
TRAFFIC = {"metr_la": "tsl", "pems_bay": "tsl", "los_loop": "dcrnn"}
CPU_TRAFFIC = {  # Los-loop CPU variant (campaign plan `losloop`) -> (model class, init args)
    "weaver_t": ("Weaver", {}), "weaver_nt": ("Weaver", {"use_time": False}),
    "weaver_t_sdpa": ("Weaver", {"kernel": "sdpa"}), "weaver_t_cosine": ("Weaver", {"kernel": "cosine"}),
    "weaver_nt_sdpa": ("Weaver", {"use_time": False, "kernel": "sdpa"}),
    "weaver_nt_cosine": ("Weaver", {"use_time": False, "kernel": "cosine"}),
    "full_attention": ("TrafficTransformer", {"layout": "full"}),
    "alternating": ("TrafficTransformer", {"layout": "alternating"}),
    "hot": ("TrafficTransformer", {"layout": "kronecker"}),
}


def _weaver():
    paper = "configs/weaver/paper.yaml"
    for ds, split in TRAFFIC.items():
        data = [f"{DATA}.dataset={ds}", f"{DATA}.split_protocol={split}"]
        yield f"weaver/{ds}_t", paper, data
        yield f"weaver/{ds}_nt", paper, data + [f"{MODEL}.use_time=false", "--model.init_args.use_time=false"]
    pems = [f"{DATA}.dataset=pems_bay"]
    for e, h in ((32, 8), (64, 4), (80, 8), (96, 6)):  # section 7.1 / Table 6
        yield f"weaver/ablation_pems_bay_e{e}_h{h}", paper, pems + [f"{MODEL}.dim={e}", f"{MODEL}.num_heads={h}"]
    for kernel, widths in (("tanimoto", (32, 80)), ("sdpa", (32, 80, 128)), ("cosine", (32, 80, 128))):  # Table 9
        for e in widths:
            yield (f"weaver/ablation_pems_bay_{kernel}_e{e}", paper,
                   pems + [f"{MODEL}.dim={e}", f"{MODEL}.kernel={kernel}"])
    for m, k in ((4, 32), (8, 32), (16, 32), (64, 4), (64, 8), (64, 16), (8, 4), (128, 64)):  # Table 7
        yield (f"weaver/ablation_pems_bay_dict_m{m}_k{k}", paper,
               pems + [f"{MODEL}.num_landmarks={m}", f"{MODEL}.dict_width={k}"])
    for variant, (cls, kw) in CPU_TRAFFIC.items():
        args = [f"--model.model=hoformer.models.{cls}"] if cls != "Weaver" else []
        if cls != "Weaver":  # the small baselines of docs/results_traffic.md
            kw = {**kw, "dim": 32, "num_heads": 4, "num_layers": 1}
        args += [f"{MODEL}.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in kw.items()]
        yield f"weaver/los_loop_cpu_{variant}", "configs/weaver/los_loop_cpu.yaml", args


# --------------------------------------------------------------------------------------------- HOBA (paper 004)
TEXT = {  # name: (max_len, default block size, training examples after the validation hold-out)
    "sst2": (64, 16, 60614), "trec": (64, 16, 4907), "ag_news": (128, 32, 9001), "imdb": (512, 64, 22500),
}
TEXT_VARIANTS = {"hoba": ("hoba", True), "hoba_nocb": ("hoba", False), "block2d": ("block2d", True),
                 "block2d_nocb": ("block2d", False), "full2d": ("full2d", False),
                 "triplet_full": ("triplet_full", False)}
CPU_TEXT = {"sst2": dict(train_limit=5000, n=5000), "trec": dict(train_limit=None, n=4907)}


WARMUP = "--model.init_args.optim.warmup_ratio=0.1"  # 10 % of the run's optimiser steps, whatever the data size


def _teacher_args(teacher_run: str) -> list[str]:
    """A student's teacher: its run folder (hoformer.config.TEACHER_RUN_LINKS: teacher, logits, embeddings, tokenizer)."""
    return [f"--teacher_run={teacher_run}"]


def _hoba():
    for ds, (length, block, n) in TEXT.items():
        yield (f"hoba/{ds}_teacher", "configs/hoba/paper_teacher.yaml",
               [f"{DATA}.dataset={ds}", f"{DATA}.max_len={max(length, 128)}",
                WARMUP])
        teacher = f"runs/hoba/{ds}_teacher"
        for depth in (3, 6):
            for v, (attention, cross_block) in TEXT_VARIANTS.items():
                if v == "triplet_full" and ds not in ("sst2", "trec"):
                    continue  # Table 1 only (cubic cost)
                blocks = (16, 32, 64) if v == "hoba" and depth == 3 else (block,)
                # section 4.1: 64 tokens for 3 layers, 128 for 6; AG News and IMDB keep their own 128 / 512 of
                # the Table 4 comparison (section 4.2) at both depths
                tokens = length if depth == 3 else max(length, 128)
                for bs in blocks:
                    name = f"hoba/{ds}_{v}_{depth}l" + (f"_b{bs}" if len(blocks) > 1 else "")
                    yield name, "configs/hoba/paper_student.yaml", [
                        f"{DATA}.dataset={ds}", f"{DATA}.max_len={tokens}",
                        f"{MODEL}.depth={depth}", f"{MODEL}.attention={attention}", f"{MODEL}.block_size={bs}",
                        f"{MODEL}.cross_block={str(cross_block).lower()}",
                        WARMUP, *_teacher_args(teacher)]
    for ds, c in CPU_TEXT.items():
        teacher_cfg = f"configs/hoba/cpu_{ds}_teacher.yaml"
        yield f"hoba/cpu_{ds}_teacher", teacher_cfg, []
        teacher = f"runs/hoba/cpu_{ds}_teacher"
        for v in ("hoba", "hoba_nocb", "block2d", "full2d") + (("triplet_full",) if ds == "trec" else ()):
            attention, cross_block = TEXT_VARIANTS[v]
            yield f"hoba/cpu_{ds}_{v}", "configs/hoba/cpu_student.yaml", [
                f"{DATA}.dataset={ds}", f"{DATA}.train_limit={c['train_limit']}".replace("None", "null"),
                f"{MODEL}.attention={attention}", f"{MODEL}.cross_block={str(cross_block).lower()}",
                WARMUP, *_teacher_args(teacher)]


def experiments() -> dict[str, list[str]]:
    """``{name: hoformer fit arguments}`` of every paper experiment."""
    out = {}
    for name, config, args in (*_hot(), *_weaver(), *_hoba()):
        out[name] = ["--config", config, *args, f"--trainer.default_root_dir=runs/{name}"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="experiment (see --list)")
    p.add_argument("--list", action="store_true", help="print every experiment name")
    p.add_argument("--run", action="store_true", help="run `hoformer fit` for it (remaining args are appended)")
    a, extra = p.parse_known_args(argv)
    exps = experiments()
    if a.list or a.name is None:
        print("\n".join(exps))
        return 0
    if a.name not in exps:
        p.error(f"unknown experiment {a.name!r} (see --list)")
    args = exps[a.name] + extra
    if not a.run:
        print("hoformer fit " + " ".join(shlex.quote(x) for x in args))
        return 0
    from hoformer.cli import main as hoformer

    return hoformer(["fit", *args])


if __name__ == "__main__":
    sys.exit(main())
