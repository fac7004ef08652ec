"""The bad-input corpus: each entry is bad input (or a fault) for one public entry point, the error type it must
raise and substrings its message must hold (the argument or file it names, and what was expected or found).

Entries are data: ``(id, call, exception type, required substrings)`` where ``call(tmp_path)`` makes the bad call
(files it needs are written under ``tmp_path``). Add a case by adding a row.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import pickle
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest
import torch

import hoformer.functional as HF
import hoformer.layers as HL
from hoformer.data import LTSFDataModule, MedMNIST3D, read_text_split
from hoformer.data._utils import ChecksumError, download_url, require_file, verify_file
from hoformer.models import create_model, from_pretrained


class Case(NamedTuple):
    id: str
    call: Callable[[Path], Any]
    exc: type[BaseException]
    needles: tuple[str, ...]


class CLIError(Exception):
    """A hoformer command that ended with a non-zero exit code; the message is what it printed on stderr."""


# ------------------------------------------------------------------------------------------------ helpers
TINY_FC = dict(seq_len=16, pred_len=8, num_variates=3, dim=16, num_heads=2, depth=1, patch_size=8)


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _step_past_max(name: str) -> None:
    """Two decoding steps into a cache made for one."""
    layer = HL.build_attention(name, 16, 2, causal_mode=0)
    cache = layer.init_cache(max_steps=1)
    for _ in range(2):
        layer.step(t(1, 1, 3, 16), cache)


def qkv(b=2, h=2, sizes=(3, 4), d=5):
    """Per-mode q / k and a value tensor of the Kronecker functions."""
    q = [t(b, h, n, d) for n in sizes]
    k = [t(b, h, n, d) for n in sizes]
    return q, k, t(b, h, *sizes, d)


def trip(L=8, d=4):
    return [t(1, 2, L, d) for _ in range(5)]


def kron_linear_nan_input(_):
    q, k, v = qkv()
    q[1][0, 0, 2, 1] = float("nan")
    return HF.kronecker_attention(q, k, v, kernel="linear", feature_map=torch.exp)


def write(path: Path, content: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def truncated_ckpt(tmp: Path, name: str = "trunc.ckpt") -> Path:
    good = tmp / "good.ckpt"
    torch.save({"state_dict": {"w": torch.arange(4096.0)}, "epoch": 0}, good)
    data = good.read_bytes()
    return write(tmp / name, data[: len(data) // 3])


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def evil_ckpt(tmp: Path) -> Path:
    p = tmp / "evil.ckpt"
    torch.save({"state_dict": {}, "x": _Payload(tmp / "marker")}, p)
    return p


def pretrained_dir(tmp: Path) -> Path:
    m = create_model("hot_forecaster", **TINY_FC)
    return m.save_pretrained(tmp / "pre")


def _tiny_forecaster():
    return create_model("hot_forecaster", **TINY_FC)


def _missing_device() -> str:
    """A device this machine does not have (CUDA on a CPU machine, else an index past the last GPU)."""
    return "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"


def _edited_config(tmp: Path) -> Path:
    """A saved directory whose config.json was edited afterwards so that the weights still fit (product -> sum)."""
    import json

    d = pretrained_dir(tmp)
    cfg = json.loads((d / "config.json").read_text())
    cfg["kwargs"]["attention"] = "kronecker_sum"
    write(d / "config.json", json.dumps(cfg))
    return d


def cli(argv: list[str]) -> None:
    """Run ``hoformer argv``; a non-zero exit (or argparse's SystemExit) becomes :class:`CLIError` with stderr."""
    from hoformer.cli import main

    err, threads = io.StringIO(), torch.get_num_threads()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        finally:
            torch.set_num_threads(threads)  # `hoformer demo` sets the thread count of the process
    if rc:
        raise CLIError(err.getvalue())


def lightning_cli(tmp: Path, *extra: str) -> None:
    """``hoformer <sub> ...`` for a tiny synthetic forecasting run (LightningCLI raises the task's errors)."""
    from hoformer.cli import main

    sub, *rest = extra
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main([sub, "--model=hoformer.train.ForecastingTask", "--model.model=hoformer.models.HOTForecaster",
              "--model.model.dim=16", "--model.model.num_heads=2", "--model.model.depth=1",
              "--model.model.patch_size=8", "--data=hoformer.data.LTSFDataModule", "--data.synthetic=true",
              "--data.seq_len=16", "--data.pred_len=8", "--trainer.max_epochs=1", "--trainer.logger=false",
              "--trainer.enable_checkpointing=false", "--trainer.limit_train_batches=1",
              "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1", "--trainer.accelerator=cpu",
              f"--trainer.default_root_dir={tmp}", "--trainer.enable_progress_bar=false", *rest])


def text_csv(tmp: Path, name: str, rows: list[str]) -> Path:
    return write(tmp / name, "\n".join(rows) + "\n")


# ------------------------------------------------------------------------------------------------ corpus
F_KRON = [
    Case("kron_apply/factors-a-tensor", lambda _: HF.kron_apply(t(2, 2, 3, 3), t(2, 2, 3, 4, 5)), TypeError,
         ("kron_apply", "`factors`", "list of tensors")),
    Case("kron_apply/too-few-factors", lambda _: HF.kron_apply([t(2, 2, 3, 3)], t(2, 2, 3, 4, 5)), ValueError,
         ("kron_apply", "2 modes", "1 factors")),
    Case("kron_apply/factor-shape", lambda _: HF.kron_apply([t(2, 2, 3, 3), t(2, 2, 5, 5)], t(2, 2, 3, 4, 5)),
         ValueError, ("`factors[1]`", "(B, H, 4, 4)", "(2, 2, 5, 5)")),
    Case("kron_apply/v-int", lambda _: HF.kron_apply([t(1, 1, 3, 3)], torch.ones(1, 1, 3, 2, dtype=torch.long)),
         TypeError, ("`v`", "floating-point", "torch.int64")),
    Case("kron_apply/v-3d", lambda _: HF.kron_apply([t(1, 1, 3, 3)], t(1, 3, 2)), ValueError,
         ("`v`", "at least 4 dims", "(1, 3, 2)")),
    Case("kron_apply/v-empty", lambda _: HF.kron_apply([t(1, 1, 3, 3)], t(1, 0, 3, 2)), ValueError,
         ("`v`", "empty")),
    Case("kron_apply/v-not-tensor", lambda _: HF.kron_apply([t(1, 1, 3, 3)], [[1.0]]), TypeError,
         ("`v`", "torch.Tensor", "list")),
    Case("kron_sum_apply/factor-shape", lambda _: HF.kron_sum_apply([t(1, 1, 2, 2)], t(1, 1, 3, 4)), ValueError,
         ("kron_sum_apply", "`factors[0]`", "(B, H, 3, 3)")),
    Case("kronecker_attention/combine", lambda _: HF.kronecker_attention(*qkv(), combine="prod"), ValueError,
         ("`combine`", "'product' or 'sum'", "'prod'")),
    Case("kronecker_attention/kernel", lambda _: HF.kronecker_attention(*qkv(), kernel="relu"), ValueError,
         ("`kernel`", "'softmax' or 'linear'", "'relu'")),
    Case("kronecker_attention/scale-str", lambda _: HF.kronecker_attention(*qkv(), scale="x"), TypeError,
         ("kronecker_attention", "`scale`", "finite float", "'x'")),
    Case("kronecker_attention/scale-nan", lambda _: HF.kronecker_attention(*qkv(), scale=float("nan")), ValueError,
         ("kronecker_attention", "`scale`", "nan")),
    Case("kronecker_attention/scale-bool", lambda _: HF.kronecker_attention(*qkv(), scale=True), TypeError,
         ("`scale`", "bool")),
    Case("kronecker_attention/dropout", lambda _: HF.kronecker_attention(*qkv(), dropout_p=1.5), ValueError,
         ("`dropout_p`", "[0, 1)", "1.5")),
    Case("kronecker_attention/q-a-tensor", lambda _: HF.kronecker_attention(t(2, 2, 3, 5), qkv()[1], qkv()[2]),
         TypeError, ("`q`", "list of 2 per-mode tensors")),
    Case("kronecker_attention/q-count", lambda _: HF.kronecker_attention(qkv()[0][:1], qkv()[1], qkv()[2]),
         ValueError, ("`q` has 1 tensors", "2 modes")),
    Case("kronecker_attention/q-mode-size", lambda _: HF.kronecker_attention([t(2, 2, 3, 5), t(2, 2, 6, 5)],
                                                                             qkv()[1], qkv()[2]),
         ValueError, ("`q[1]`", "(B, H, 4, Dqk)", "(2, 2, 6, 5)")),
    Case("kronecker_attention/qk-dim", lambda _: HF.kronecker_attention(qkv(d=5)[0], qkv(d=6)[1], qkv()[2]),
         ValueError, ("`q[0]`", "`k[0]`", "differ in Dqk")),
    Case("kronecker_attention/mask-dtype", lambda _: HF.kronecker_attention(*qkv(), masks=[torch.ones(3, 3), None]),
         TypeError, ("`masks[0]`", "bool tensor", "torch.float32")),
    Case("kronecker_attention/mask-shape",
         lambda _: HF.kronecker_attention(*qkv(), masks=[torch.ones(4, 4, dtype=torch.bool), None]),
         ValueError, ("`masks[0]`", "(..., 3, 3)", "(4, 4)")),
    Case("kronecker_attention/mask-count",
         lambda _: HF.kronecker_attention(*qkv(), masks=[None]), ValueError, ("`masks`", "list of 2 entries")),
    Case("kronecker_attention/linear-scale", lambda _: HF.kronecker_attention(*qkv(), kernel="linear", scale=0.5),
         ValueError, ("`scale`", "softmax factors only", "scale=0.5")),
    Case("kronecker_attention/linear-score-fn",
         lambda _: HF.kronecker_attention(*qkv(), kernel="linear", score_fn=HF.tanimoto_scores),
         ValueError, ("`score_fn`", "kernel='softmax'")),
    Case("kronecker_attention/score-fn-with-scale",
         lambda _: HF.kronecker_attention(*qkv(), score_fn=HF.tanimoto_scores, scale=0.3),
         ValueError, ("`scale`", "`score_fn`")),
    Case("kronecker_attention/negative-features",
         lambda _: HF.kronecker_attention(*qkv(), kernel="linear", feature_map=lambda x: x),
         ValueError, ("`feature_map`", "non-negative features", "minimum of -")),
    Case("kronecker_attention/nan-input-linear", kron_linear_nan_input, ValueError,
         ("non-finite input `q[1]`", "1 NaN")),
    Case("kronecker_attention/qk-dtype", lambda _: HF.kronecker_attention(qkv()[0], [x.double() for x in qkv()[1]],
                                                                          qkv()[2]),
         TypeError, ("`q[0]`", "`k[0]`", "share a dtype")),
    Case("mode_attention_factors/q-tensor", lambda _: HF.mode_attention_factors(t(1, 1, 3, 2), [t(1, 1, 3, 2)]),
         TypeError, ("mode_attention_factors", "`q`", "list of per-mode tensors")),
    Case("mode_attention_factors/scale-str", lambda _: HF.mode_attention_factors([t(1, 1, 3, 2)], [t(1, 1, 3, 2)],
                                                                                 scale="x"),
         TypeError, ("mode_attention_factors", "`scale`", "'x'")),
    Case("full_attention/shapes", lambda _: HF.full_attention(t(1, 1, 3, 4, 2), t(1, 1, 3, 5, 2), t(1, 1, 3, 4, 2)),
         ValueError, ("full_attention", "`q`, `k`, `v` must share", "(1, 1, 3, 5, 2)")),
    Case("full_attention/mask", lambda _: HF.full_attention(t(1, 1, 3, 2), t(1, 1, 3, 2), t(1, 1, 3, 2),
                                                            mask=torch.ones(3, 3)),
         ValueError, ("`mask`", "bool (..., 3, 3)", "torch.float32")),
    Case("full_attention/scale-str", lambda _: HF.full_attention(t(1, 1, 3, 2), t(1, 1, 3, 2), t(1, 1, 3, 2),
                                                                 scale="x"),
         TypeError, ("full_attention", "`scale`")),
    Case("full_attention/3d", lambda _: HF.full_attention(t(1, 3, 2), t(1, 3, 2), t(1, 3, 2)), ValueError,
         ("`q`", "at least 4 dims")),
]

F_SCORES = [
    Case("dot_scores/dims", lambda _: HF.dot_scores(t(3, 4), t(3, 5)), ValueError,
         ("dot_scores", "feature sizes differ", "(3, 5)")),
    Case("dot_scores/scale-str", lambda _: HF.dot_scores(t(3, 4), t(3, 4), scale="x"), TypeError,
         ("dot_scores", "`scale`", "'x'")),
    Case("dot_scores/int", lambda _: HF.dot_scores(torch.ones(3, 4, dtype=torch.long), t(3, 4)), TypeError,
         ("`q`", "floating point", "torch.int64")),
    Case("tanimoto_scores/1d", lambda _: HF.tanimoto_scores(t(4), t(3, 4)), ValueError,
         ("tanimoto_scores", "`q`", "(..., N, D)")),
    Case("cosine_scores/not-tensor", lambda _: HF.cosine_scores([1.0], t(3, 4)), TypeError,
         ("cosine_scores", "`q`", "torch.Tensor")),
    Case("get_score_fn/unknown", lambda _: HF.get_score_fn("dot"), ValueError, ("'dot'", "tanimoto")),
    Case("valence_attention/kernel", lambda _: HF.valence_attention(t(1, 1, 3, 2), t(1, 1, 3, 2), kernel="x"),
         ValueError, ("valence_attention", "`kernel`", "'x'")),
    Case("valence_attention/scale-signed", lambda _: HF.valence_attention(t(1, 1, 3, 2), t(1, 1, 3, 2), scale=0.5),
         ValueError, ("valence_attention", "`scale`", "kernel='sdpa' only")),
    Case("valence_attention/scale-str", lambda _: HF.valence_attention(t(1, 1, 3, 2), t(1, 1, 3, 2), kernel="sdpa",
                                                                       scale="x"),
         TypeError, ("valence_attention", "`scale`", "'x'")),
]

F_TRIPLET = [
    Case("triplet_attention/block-size-0", lambda _: HF.triplet_attention(*trip(), block_size=0), ValueError,
         ("triplet_attention", "`block_size`", "got 0")),
    Case("triplet_attention/block-size-float", lambda _: HF.triplet_attention(*trip(), block_size=2.5), ValueError,
         ("`block_size`", "2.5")),
    Case("triplet_attention/overlap", lambda _: HF.triplet_attention(*trip(), block_size=4, overlap=1.0), ValueError,
         ("`overlap`", "[0, 1)", "1.0")),
    Case("triplet_attention/scale-str", lambda _: HF.triplet_attention(*trip(), block_size=4, scale="x"), TypeError,
         ("triplet_attention", "`scale`", "'x'")),
    Case("triplet_attention/scale-inf", lambda _: HF.triplet_attention(*trip(), block_size=4, scale=float("inf")),
         ValueError, ("triplet_attention", "`scale`", "inf")),
    Case("triplet_attention/int-input", lambda _: HF.triplet_attention(torch.ones(1, 2, 8, 4, dtype=torch.long),
                                                                       *trip()[1:], block_size=4),
         TypeError, ("`q`", "floating-point")),
    Case("triplet_attention/chunk", lambda _: HF.triplet_attention(*trip(), block_size=4, chunk_elements=0),
         ValueError, ("`chunk_elements`", "got 0")),
    Case("triplet_windows/seq-len", lambda _: HF.triplet_windows(0, 4), ValueError, ("triplet_windows", "seq_len")),
    Case("block_attention/scale-str", lambda _: HF.block_attention(*trip()[:3], block_size=4, scale="x"), TypeError,
         ("block_attention", "`scale`")),
    Case("cross_block_attention/scale-str", lambda _: HF.cross_block_attention(t(1, 2, 8, 4), block_size=4,
                                                                               scale="x"),
         TypeError, ("cross_block_attention", "`scale`")),
    Case("triplet_attention_naive/scale-str", lambda _: HF.triplet_attention_naive(*trip(), block_size=4,
                                                                                   scale="x"),
         TypeError, ("triplet_attention_naive", "`scale`")),
]

LAYERS = [
    Case("KroneckerAttention/heads", lambda _: HL.KroneckerAttention(30, num_heads=4), ValueError,
         ("num_heads", "30")),
    Case("KroneckerAttention/combine", lambda _: HL.KroneckerAttention(32, num_heads=4, combine="mul"), ValueError,
         ("combine", "'mul'")),
    Case("KroneckerAttention/kernel", lambda _: HL.KroneckerAttention(32, num_heads=4, kernel="x"), ValueError,
         ("kernel", "'x'")),
    Case("KroneckerAttention/pool", lambda _: HL.KroneckerAttention(32, num_heads=4, pool="avg"), ValueError,
         ("pool", "'avg'")),
    Case("KroneckerAttention/input-dim", lambda _: HL.KroneckerAttention(32, num_heads=4)(t(2, 3, 4, 16)),
         ValueError, ("32", "16")),
    Case("FullAttention.step/slice-shape",
         lambda _: HL.FullAttention(16, 2, causal_mode=1).step(t(1, 3, 2, 16), HL.FullAttention(16, 2, causal_mode=1)
                                                               .init_cache()),
         ValueError, ("FullAttention.step", "`x`", "causal mode 1", "size 1 along it", "(1, 3, 2, 16)")),
    Case("AxialAttention.step/cache-full", lambda _: _step_past_max("axial"), ValueError,
         ("AxialAttention.step", "cache is full", "max_steps=1")),
    Case("DividedAttention.init_cache/max-steps", lambda _: HL.DividedAttention(16, 2, causal_mode=0).init_cache(0),
         ValueError, ("DividedAttention.init_cache", "`max_steps`", "int >= 1", "got 0")),
    Case("Encoder.init_cache/not-causal", lambda _: HL.Encoder(16, 1, 2, attention="axial_sequential").init_cache(),
         ValueError, ("AxialAttention.init_cache", "causal_mode")),
    Case("build_attention/unknown", lambda _: HL.build_attention("kronecker_prod", 32, num_heads=4), ValueError,
         ("kronecker_prod", "kronecker_product")),
    Case("Block/mlp", lambda _: HL.Block(32, num_heads=4, mlp="relu6"), ValueError, ("mlp", "'relu6'")),
    Case("Block/norm", lambda _: HL.Block(32, num_heads=4, norm="batch"), ValueError, ("norm", "'batch'")),
    Case("PatchEmbed/ndim", lambda _: HL.PatchEmbed(1, 16, 4, ndim=4), ValueError, ("ndim", "4")),
    Case("PatchEmbed/indivisible", lambda _: HL.PatchEmbed(1, 16, 4, ndim=2)(t(1, 1, 10, 8)), ValueError,
         ("patch", "10")),
    Case("TripletAttention/heads", lambda _: HL.TripletAttention(30, num_heads=4), ValueError, ("num_heads", "30")),
    Case("RotaryEmbedding/odd", lambda _: HL.RotaryEmbedding(7), ValueError, ("dim", "7")),
    Case("DropPath/p", lambda _: HL.DropPath(1.5), ValueError, ("p", "1.5")),
    Case("AbsolutePositionalEncoding/kind", lambda _: HL.AbsolutePositionalEncoding((4, 4), 8, kind="rope"),
         ValueError, ("kind", "'rope'")),
]

MODELS = [
    Case("create_model/unknown", lambda _: create_model("hot_forcaster"), (KeyError, ValueError),
         ("hot_forcaster", "hot_forecaster")),
    Case("create_model/bad-kwarg", lambda _: create_model("hot_forecaster", num_variate=7), TypeError,
         ("num_variate",)),
    Case("hot_forecaster/attention", lambda _: create_model("hot_forecaster", attention="kron"), ValueError,
         ("attention", "'kron'")),
    Case("hot_forecaster/seq-len-patch", lambda _: create_model("hot_forecaster", seq_len=90, patch_size=8),
         ValueError, ("seq_len", "patch_size")),
    Case("hot_forecaster/input-shape", lambda _: create_model("hot_forecaster", seq_len=96, pred_len=24,
                                                              num_variates=7, dim=16, num_heads=2, depth=1)(
        t(2, 96, 5)), ValueError, ("hot_forecaster", "7", "5")),
    Case("hot_volume_classifier/classes", lambda _: create_model("hot_volume_classifier", num_classes=0),
         ValueError, ("num_classes", "0")),
    Case("from_pretrained/missing-dir", lambda tmp: from_pretrained(tmp / "nope"), FileNotFoundError,
         ("from_pretrained", "nope")),
    Case("from_pretrained/bad-json", lambda tmp: from_pretrained(
        write(pretrained_dir(tmp) / "config.json", "{nope").parent), ValueError, ("config.json", "not valid JSON")),
    Case("from_pretrained/truncated-weights", lambda tmp: from_pretrained(
        write(pretrained_dir(tmp) / "model.safetensors", b"\x00\x01").parent), ValueError,
         ("from_pretrained", "model.safetensors")),
    Case("from_pretrained/map-location", lambda tmp: from_pretrained(pretrained_dir(tmp), map_location=3.5),
         ValueError, ("`map_location`", "3.5")),
    Case("hot_forecaster/float64-input-to-float32-model",
         lambda _: _tiny_forecaster()(t(2, 16, 3, dtype=torch.float64)),
         TypeError, ("hot_forecaster", "`x`", "torch.float64", "weights are torch.float32", "model.to(")),
    Case("hot_forecaster/float16-input-to-float32-model", lambda _: _tiny_forecaster()(t(2, 16, 3).half()),
         TypeError, ("hot_forecaster", "`x`", "torch.float16", "torch.float32", "x.to(torch.float32)")),
    Case("hot_volume_classifier/float64-input", lambda _: create_model(
        "hot_volume_classifier", input_size=8, dim=8, num_heads=2, depth=1)(t(1, 1, 8, 8, 8, dtype=torch.float64)),
         TypeError, ("hot_volume_classifier", "`x`", "torch.float64", "torch.float32")),
    Case("weaver/float64-input", lambda _: create_model("weaver", num_nodes=5, window=6, horizon=4, dim=8,
                                                        num_heads=2)(t(2, 6, 5, 1, dtype=torch.float64)),
         TypeError, ("Weaver", "`x`", "torch.float64", "torch.float32")),
    Case("hot_forecaster/empty-batch", lambda _: _tiny_forecaster()(t(0, 16, 3)),
         ValueError, ("hot_forecaster", "`x`", "empty batch (B = 0)", "at least one sample", "(0, 16, 3)")),
    Case("hot_segmenter/empty-batch", lambda _: create_model("hot_segmenter", in_channels=2, num_classes=3,
                                                             input_size=16, dim=8, num_heads=2, depth=1)(
        t(0, 2, 16, 16)), ValueError, ("hot_segmenter", "`x`", "empty batch (B = 0)", "(0, 2, 16, 16)")),
    Case("traffic_hot/empty-batch", lambda _: create_model("traffic_hot", num_nodes=5, window=6, horizon=4, dim=8,
                                                           num_heads=2)(t(0, 6, 5, 1)),
         ValueError, ("TrafficTransformer", "`x`", "empty batch (B = 0)", "(0, 6, 5, 1)")),
    Case("hoba_classifier/empty-batch", lambda _: create_model("hoba_classifier", vocab_size=50, max_len=16, dim=8,
                                                               num_heads=2, depth=1)(
        torch.zeros(0, 8, dtype=torch.long)),
         ValueError, ("hoba_classifier", "`ids`", "empty batch (B = 0)", "(0, 8)")),
    Case("from_pretrained/map-location-device-not-available",
         lambda tmp: from_pretrained(pretrained_dir(tmp), map_location=_missing_device()),
         ValueError, ("from_pretrained", "`map_location`", _missing_device(), "map_location='cpu'")),
    Case("from_pretrained/map-location-not-a-device",
         lambda tmp: from_pretrained(pretrained_dir(tmp), map_location="gpu0"),
         ValueError, ("from_pretrained", "`map_location`", "device string or torch.device", "'gpu0'")),
    Case("from_pretrained/directory-is-a-file", lambda tmp: from_pretrained(write(tmp / "weights.bin", b"x")),
         FileNotFoundError, ("from_pretrained", "`directory`", "config.json", "weights.bin", "a file")),
    Case("from_pretrained/edited-config", lambda tmp: from_pretrained(_edited_config(tmp)),
         ValueError, ("from_pretrained", "config.json", "not the configuration model.safetensors was saved with",
                      "trust_edited_config=True")),
    Case("save_pretrained/onto-an-existing-file",
         lambda tmp: _tiny_forecaster().save_pretrained(write(tmp / "out.safetensors", b"x")),
         FileExistsError, ("save_pretrained", "`directory`", "must be a directory", "existing file",
                           "out.safetensors")),
    Case("create_model/preset-changed", lambda _: create_model("traffic_hot", layout="full"),
         ValueError, ("create_model", "'traffic_hot'", "'layout': 'kronecker'", "'layout': 'full'")),
    Case("register_model/factory-function", lambda _: __import__("hoformer.models", fromlist=["x"]).register_model(
        lambda **kw: None, name="a_factory"), TypeError, ("register_model", "HoformerModel subclass")),
]

DATA = [
    Case("LTSFDataModule/unknown-name", lambda tmp: LTSFDataModule(str(tmp), "ETTh9").setup(),
         (ValueError, FileNotFoundError), ("ETTh9",)),
    Case("LTSFDataModule/missing-file", lambda tmp: LTSFDataModule(str(tmp), "ETTh1").setup(), FileNotFoundError,
         ("ETTh1", "ETTh1.csv", "download=True")),
    Case("LTSFDataModule/directory", lambda tmp: LTSFDataModule(
        str((tmp / "ETT-small" / "ETTh1.csv").mkdir(parents=True) or tmp), "ETTh1").setup(), FileNotFoundError,
         ("LTSF file for 'ETTh1'", "ETTh1.csv", "is a directory")),
    Case("LTSFDataModule/directory-download", lambda tmp: LTSFDataModule(
        str((tmp / "ETT-small" / "ETTh1.csv").mkdir(parents=True) or tmp), "ETTh1", download=True).setup(),
         FileNotFoundError, ("ETTh1.csv", "is a directory")),
    Case("LTSFDataModule/split", lambda tmp: LTSFDataModule(synthetic=True).dataset("dev"), ValueError,
         ("split", "'dev'")),
    Case("LTSFDataModule/features", lambda tmp: LTSFDataModule(synthetic=True, features="X"), ValueError,
         ("features", "'X'")),
    Case("LTSFDataModule/seq-len", lambda tmp: LTSFDataModule(synthetic=True, seq_len=0), ValueError,
         ("seq_len", "0")),
    Case("LTSFDataModule/no-date-column", lambda tmp: LTSFDataModule(str(tmp), text_csv(tmp, "x.csv", ["a,b,OT"] + [
        f"{i},{i},{i}" for i in range(300)]).name, seq_len=8, pred_len=4).setup(), ValueError, ("x.csv", "date")),
    Case("LTSFDataModule/non-numeric", lambda tmp: LTSFDataModule(str(tmp), text_csv(tmp, "y.csv", ["date,a,OT"] + [
        f"2020-01-{1 + i // 24:02d} {i % 24:02d}:00:00,{'abc' if i == 5 else i},{i}" for i in range(300)]).name,
        seq_len=8,
        pred_len=4).setup(), ValueError, ("y.csv", "a")),
    Case("LTSFDataModule/empty-csv", lambda tmp: LTSFDataModule(str(tmp), text_csv(tmp, "e.csv", ["date,a,OT"]).name)
         .setup(), ValueError, ("e.csv",)),
    Case("read_text_split/unknown", lambda tmp: read_text_split("imdbb", "train", tmp), ValueError,
         ("imdbb", "sst2")),
    Case("read_text_split/split", lambda tmp: read_text_split("sst2", "valid", tmp), ValueError,
         ("`split`", "'valid'")),
    Case("read_text_split/sst2-missing", lambda tmp: read_text_split("sst2", "train", tmp), FileNotFoundError,
         ("SST-2", "train.tsv")),
    Case("read_text_split/sst2-header", lambda tmp: read_text_split("sst2", "train", write(
        tmp / "sst2" / "train.tsv", "text\tlabel\nhi\t1\n").parent.parent, verify=False), ValueError,
         ("train.tsv", "sentence<TAB>label")),
    Case("read_text_split/sst2-label", lambda tmp: read_text_split("sst2", "train", write(
        tmp / "sst2" / "train.tsv", "sentence\tlabel\nhi\t7\n").parent.parent, verify=False), ValueError,
         ("train.tsv", "line 2", "'7'")),
    Case("read_text_split/sst2-directory", lambda tmp: read_text_split("sst2", "train", (
        tmp / "sst2" / "train.tsv").mkdir(parents=True) or tmp), IsADirectoryError,
         ("train.tsv", "found a directory")),
    Case("read_text_split/imdb-columns", lambda tmp: read_text_split("imdb", "train", write(
        tmp / "imdb" / "train.csv", "body,stars\nok,5\n").parent.parent), ValueError,
         ("train.csv", "no label column", "'sentiment'", "['body', 'stars']")),
    Case("read_text_split/imdb-labels", lambda tmp: read_text_split("imdb", "train", write(
        tmp / "imdb" / "train.csv", "review,sentiment\nok,great\n").parent.parent), ValueError,
         ("train.csv", "great")),
    Case("MedMNIST3D/flag", lambda tmp: MedMNIST3D(tmp, "organx", "train"), ValueError, ("organx",)),
    Case("MedMNIST3D/missing", lambda tmp: MedMNIST3D(tmp, "organmnist3d", "train"), FileNotFoundError,
         ("organmnist3d", "download=True")),
    Case("MedMNIST3D/directory", lambda tmp: MedMNIST3D((tmp / "organmnist3d.npz").mkdir() or tmp, "organmnist3d",
                                                        "train"), IsADirectoryError,
         ("organmnist3d.npz", "found a directory")),
    Case("MedMNIST3D/corrupt", lambda tmp: MedMNIST3D(write(tmp / "organmnist3d.npz", b"junk").parent,
                                                      "organmnist3d", "train"), ChecksumError,
         ("organmnist3d.npz", "md5", "mismatch")),
    Case("verify_file/directory", lambda tmp: verify_file(tmp), IsADirectoryError, (str(Path("/")), "directory")),
    Case("verify_file/checksum", lambda tmp: verify_file(write(tmp / "f.bin", b"abc"), sha256="00"), ChecksumError,
         ("f.bin", "sha256", "expected 00")),
    Case("require_file/missing", lambda tmp: require_file(tmp / "gone.csv", "reader", "fix it"), FileNotFoundError,
         ("reader", "gone.csv", "fix it")),
    Case("download_url/bad-url", lambda tmp: download_url(f"file://{tmp}/absent.csv", tmp / "out.csv", timeout=2),
         OSError, ("absent.csv", "out.csv")),
    Case("download_url/checksum", lambda tmp: download_url(f"file://{write(tmp / 'src.csv', 'a,b')}",
                                                           tmp / "d" / "out.csv", sha256="00" * 32),
         ChecksumError, ("src.csv", "sha256", "nothing was written")),
]


def _read_ckpt(path):
    from hoformer.checkpoint import read_checkpoint

    return read_checkpoint(path)


def _io_load(path, **kw):
    from hoformer.train.tasks import AtomicCheckpointIO

    return AtomicCheckpointIO().load_checkpoint(path, **kw)


def _analysis_load(path):
    from hoformer.checkpoint import load_checkpoint

    return load_checkpoint(path)


CHECKPOINTS = [
    Case("read_checkpoint/truncated", lambda tmp: _read_ckpt(truncated_ckpt(tmp)), ValueError,
         ("trunc.ckpt", "truncated")),
    Case("read_checkpoint/empty", lambda tmp: _read_ckpt(write(tmp / "empty.ckpt", b"")), ValueError,
         ("empty.ckpt", "0 bytes")),
    Case("read_checkpoint/missing", lambda tmp: _read_ckpt(tmp / "none.ckpt"), FileNotFoundError, ("none.ckpt",)),
    Case("read_checkpoint/directory", lambda tmp: _read_ckpt(tmp), IsADirectoryError, ("is a directory",)),
    Case("read_checkpoint/pickle-payload", lambda tmp: _read_ckpt(evil_ckpt(tmp)), pickle.UnpicklingError,
         ("evil.ckpt", "refused")),
    Case("AtomicCheckpointIO/truncated", lambda tmp: _io_load(truncated_ckpt(tmp)), ValueError,
         ("load_checkpoint", "trunc.ckpt", "truncated")),
    Case("AtomicCheckpointIO/weights-only-false", lambda tmp: _io_load(truncated_ckpt(tmp), weights_only=False),
         ValueError, ("`weights_only`", "False")),
    Case("AtomicCheckpointIO/pickle-payload", lambda tmp: _io_load(evil_ckpt(tmp)), pickle.UnpicklingError,
         ("evil.ckpt",)),
    Case("AtomicCheckpointIO/storage-options", lambda tmp: __import__("hoformer.train.tasks", fromlist=["x"])
         .AtomicCheckpointIO().save_checkpoint({}, tmp / "a.ckpt", storage_options={"x": 1}), TypeError,
         ("`storage_options`",)),
    Case("analysis.load_checkpoint/truncated", lambda tmp: _analysis_load(truncated_ckpt(tmp)), ValueError,
         ("trunc.ckpt",)),
    Case("analysis.load_checkpoint/missing", lambda tmp: _analysis_load(tmp / "x.ckpt"), FileNotFoundError,
         ("x.ckpt",)),
    Case("analysis.load_checkpoint/not-lightning", lambda tmp: _analysis_load(
        (torch.save({"w": torch.ones(1)}, tmp / "w.ckpt"), tmp / "w.ckpt")[1]), ValueError,
         ("w.ckpt", "state_dict")),
]

CLI = [
    Case("cli/unknown-command", lambda _: cli(["fitt"]), CLIError, ("unknown command", "'fitt'")),
    Case("cli/config-before-subcommand", lambda tmp: cli(["--config", str(write(tmp / "c.yaml", "trainer: {}\n")),
                                                          "fit"]), CLIError, ("c.yaml", "put it after")),
    Case("cli/forecast-missing-checkpoint", lambda tmp: cli(["forecast", "--checkpoint", str(tmp / "no.ckpt"),
                                                             "--output", str(tmp / "f.csv")]), CLIError,
         ("no.ckpt",)),
    Case("cli/analyze-missing-checkpoint", lambda tmp: cli(["analyze", "--checkpoint", str(tmp / "gone.ckpt")]),
         CLIError, ("gone.ckpt",)),
    Case("cli/demo-unknown-dataset", lambda tmp: cli(["demo", "--dataset", "ETTh7", "--output", str(tmp)]),
         CLIError, ("ETTh7",)),
    Case("cli/fit-truncated-ckpt", lambda tmp: lightning_cli(tmp, "fit", f"--ckpt_path={truncated_ckpt(tmp)}"),
         ValueError, ("trunc.ckpt", "truncated")),
    Case("cli/test-truncated-ckpt", lambda tmp: lightning_cli(tmp, "test", f"--ckpt_path={truncated_ckpt(tmp)}"),
         ValueError, ("trunc.ckpt", "truncated")),
    Case("cli/fit-pickle-ckpt", lambda tmp: lightning_cli(tmp, "fit", f"--ckpt_path={evil_ckpt(tmp)}"),
         pickle.UnpicklingError, ("evil.ckpt",)),
]

def _task(**kw):
    from hoformer.train import ClassificationTask

    return ClassificationTask(create_model("hot_volume_classifier", **dict(num_classes=3, input_size=8, patch_size=4, dim=16,
                                                            num_heads=2, depth=1)), **kw)


def _table(tmp: Path, content: str | bytes, name: str = "t.csv", **kw):
    from hoformer.data.text_csv import read_text_table

    return read_text_table(write(tmp / name, content), **kw)


TASKS_AND_TABLES = [
    Case("ClassificationTask/class-weight-str", lambda _: _task(class_weight="balance"), ValueError,
         ("`class_weight`", "'balanced'", "'balance'")),
    Case("ClassificationTask/class-weight-length", lambda _: _task(class_weight=[1.0, 2.0]), ValueError,
         ("`class_weight`", "3 numbers", "[1.0, 2.0]")),
    Case("ClassificationTask/class-weight-negative", lambda _: _task(class_weight=[1.0, -1.0, 1.0]), ValueError,
         ("`class_weight`", ">= 0", "-1.0")),
    Case("ClassificationTask/class-weight-nan", lambda _: _task(class_weight=[1.0, float("nan"), 1.0]), ValueError,
         ("`class_weight`", "finite")),
    Case("ClassificationTask/balanced-without-data", lambda _: _task(class_weight="balanced").class_weights(),
         ValueError, ("class_weight='balanced'", "no training data")),
    Case("read_text_table/missing", lambda tmp: __import__("hoformer.data.text_csv", fromlist=["x"])
         .read_text_table(tmp / "absent.tsv"), FileNotFoundError, ("absent.tsv",)),
    Case("read_text_table/directory", lambda tmp: __import__("hoformer.data.text_csv", fromlist=["x"])
         .read_text_table(tmp), IsADirectoryError, ("found a directory",)),
    Case("read_text_table/no-text-column", lambda tmp: _table(tmp, "a,label\nx,1\n"), ValueError,
         ("t.csv", "no text column", "['a', 'label']")),
    Case("read_text_table/unknown-column", lambda tmp: _table(tmp, "text,label\nx,1\n", text_column="body"),
         ValueError, ("t.csv", "`text_column`='body'", "['text', 'label']")),
    Case("read_text_table/column-index", lambda tmp: _table(tmp, "text,label\nx,1\n", label_column=5), ValueError,
         ("`label_column`=5", "out of range")),
    Case("read_text_table/column-type", lambda tmp: _table(tmp, "text,label\nx,1\n", label_column=1.0), TypeError,
         ("`label_column`", "float")),
    Case("read_text_table/empty-label", lambda tmp: _table(tmp, "text,label\nx,1\ny,\n"), ValueError,
         ("t.csv line 3", "empty label")),
    Case("read_text_table/short-row", lambda tmp: _table(tmp, "text,label\nx\n"), ValueError,
         ("t.csv line 2", "1 field(s)")),
    Case("read_text_table/unknown-label", lambda tmp: _table(tmp, "text,label\nx,maybe\n", labels=["no", "yes"]),
         ValueError, ("t.csv line 2", "'maybe'", "['no', 'yes']")),
    Case("read_text_table/encoding", lambda tmp: _table(tmp, b"text,label\ncaf\xe9,1\n"), ValueError,
         ("t.csv line 2", "utf-8", "encoding=")),
    Case("read_text_table/bad-gzip", lambda tmp: _table(tmp, b"not gzip", name="t.csv.gz"), ValueError,
         ("t.csv.gz",)),
    Case("read_text_table/empty", lambda tmp: _table(tmp, ""), ValueError, ("t.csv", "empty")),
    Case("read_text_table/header-only", lambda tmp: _table(tmp, "text,label\n"), ValueError, ("t.csv", "no rows")),
    Case("read_text_table/same-column", lambda tmp: _table(tmp, "text,label\nx,1\n", text_column=0,
                                                           label_column="text"),
         ValueError, ("same", "'text'")),
    Case("read_text_table/delimiter", lambda tmp: _table(tmp, "text,label\nx,1\n", delimiter=";;"), ValueError,
         ("`delimiter`", "';;'")),
    Case("read_text_split/imdb-missing-lists-paths", lambda tmp: read_text_split("imdb", "train", tmp),
         FileNotFoundError,
         ("train.csv.gz", "IMDB Dataset.csv", "dataset='csv'")),
    Case("TextDataModule/csv-without-files", lambda tmp: __import__("hoformer.data", fromlist=["x"])
         .TextDataModule("csv", train_file="a.csv"), ValueError, ("`train_file` and `test_file`", "None")),
]

CASES: list[Case] = F_KRON + F_SCORES + F_TRIPLET + LAYERS + MODELS + DATA + TASKS_AND_TABLES + CHECKPOINTS + CLI


def test_corpus_size_and_unique_ids():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(CASES) >= 80


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path):
    with pytest.raises(case.exc) as info:
        case.call(tmp_path)
    msg = str(info.value)
    missing = [n for n in case.needles if n not in msg]
    assert not missing, f"{case.id}: message lacks {missing}: {msg!r}"
    assert not (tmp_path / "marker").exists(), f"{case.id}: a checkpoint's pickle payload ran"


# ------------------------------------------------------------------------------ repeated and empty table cells
def _dated_rows(header: str, n: int = 300) -> list[str]:
    width = header.count(",")
    return [header] + [f"2020-01-{1 + i // 24:02d} {i % 24:02d}:00:00," + ",".join(str(i + j) for j in range(width))
                       for i in range(n)]


@pytest.mark.parametrize("header, name, where", [("date,a,b,a", "a", "#2 and #4"), ("date,OT,OT", "OT", "#2 and #3"),
                                                 ("date,a, a,b", "a", "#2 and #3")])
def test_series_csv_with_a_repeated_column_name_is_refused(tmp_path, header, name, where):
    """A repeated series name was renamed ``a.1`` by pandas and trained on; the reader names the file, the name and
    both columns, for the datamodule and for a forecast history alike."""
    from hoformer.data import LTSFDataModule, SchemaError, read_series_table

    path = text_csv(tmp_path, "rep.csv", _dated_rows(header))
    want = rf"rep\.csv: column name '{name}' is repeated in the header \(columns {where}\); expected one distinct name"
    with pytest.raises(SchemaError, match=want):
        LTSFDataModule(str(tmp_path), "rep.csv", seq_len=8, pred_len=4).setup()
    with pytest.raises(SchemaError, match=want):
        read_series_table(path)


def test_traffic_table_with_a_repeated_sensor_is_refused(tmp_path):
    from hoformer.data import SchemaError, load_los_loop

    text_csv(tmp_path, "los_speed.csv", ["1,2,1"] + [f"{i},{i + 1},{i + 2}" for i in range(50)])
    text_csv(tmp_path, "los_adj.csv", ["1,0,0", "0,1,0", "0,0,1"])
    with pytest.raises(SchemaError, match=r"los_speed\.csv: column name '1' is repeated in the header \(columns #1 "
                                          r"and #3\)"):
        load_los_loop(tmp_path, verify=False)


@pytest.mark.parametrize("content, line", [("text,label\nfine,1\n,0\n", 3), ("text,label\nfine,1\n   ,0\n", 3),
                                           ('text,label\nfine,1\nok,0\n"",1\n', 4)])
def test_text_csv_row_with_an_empty_text_is_refused(tmp_path, content, line):
    with pytest.raises(ValueError, match=rf"t\.csv line {line}: empty text in column 'text'; expected a text"):
        _table(tmp_path, content)


@pytest.mark.parametrize("content, kind, name, cols", [
    ("text,label,label\nx,1,0\n", "label", "label", "#2, #3"),
    ("Text,text,label\nx,y,0\n", "text", "text", "#1, #2"),
    ("review,sentiment,sentiment\nx,1,0\n", "label", "sentiment", "#2, #3")])
def test_text_csv_with_a_repeated_text_or_label_column_is_refused(tmp_path, content, kind, name, cols):
    """``text,label,label`` used the first label silently; which column is meant is now asked for, and a 0-based
    index still picks one."""
    with pytest.raises(ValueError, match=rf"t\.csv: the {kind} column '{name}' appears 2 times in the header .*"
                                         rf"\(columns {cols}\); expected one column of that name.*{kind}_column="):
        _table(tmp_path, content)
    if kind == "label":
        with pytest.raises(ValueError, match="appears 2 times"):
            _table(tmp_path, content, label_column=name)
        assert _table(tmp_path, content, label_column=2).labels == [0]
def test_a_misspelled_top_level_config_key_gets_a_suggestion(tmp_path, capsys):
    from hoformer import cli as hcli

    typo = write(tmp_path / "typo.yaml", "trainr:\n  max_epochs: 1\n")
    cfg = str(Path(__file__).resolve().parents[1] / "configs/hot/ltsf/etth1_96_96_hot_product.yaml")
    with pytest.raises(SystemExit):
        hcli.main(["fit", "--config", cfg, "--config", str(typo)])
    err = capsys.readouterr().err
    assert "'trainr.max_epochs'" in err and "did you mean 'trainer.max_epochs'" in err


# --------------------------------------------------------------- configs, checkpoints and outputs at the CLI
def _cli_err(argv) -> str:
    with pytest.raises(CLIError) as e:
        cli(argv)
    return str(e.value)


def test_a_config_that_is_not_yaml_is_named(tmp_path):
    noise = write(tmp_path / "noise.yaml", bytes(range(128, 256)) * 3)
    broken = write(tmp_path / "broken.yaml", "trainer:\n  max_epochs: [1\n")
    assert all(s in _cli_err(["fit", "--config", str(noise)]) for s in ("noise.yaml", "not a text file"))
    err = _cli_err(["fit", "--config", str(broken)])
    assert all(s in err for s in ("broken.yaml", "not valid YAML", "line 3"))


def test_ckpt_path_of_random_bytes_or_of_a_torch_file_without_lightning_keys(tmp_path):
    from hoformer.checkpoint import CheckpointError

    rand = write(tmp_path / "rand.ckpt", bytes(range(256)) * 8)
    with pytest.raises(CheckpointError, match=r"rand.ckpt.*not a PyTorch file") as e:
        lightning_cli(tmp_path, "test", f"--ckpt_path={rand}")
    assert "refused" not in str(e.value)  # random bytes are not a refused pickle payload
    bare = tmp_path / "weights.ckpt"
    torch.save(_tiny_forecaster().state_dict(), bare)
    with pytest.raises(CheckpointError, match=r"weights.ckpt.*not a Lightning checkpoint.*pytorch-lightning_version"
                                              r".*bare state_dict"):
        lightning_cli(tmp_path, "fit", f"--ckpt_path={bare}")


def test_a_run_folder_that_is_a_file_and_outputs_that_are_directories(tmp_path):
    from hoformer.train.guards import RunFolderError

    with pytest.raises(RunFolderError, match=r"default_root_dir.*root.*is a file"):
        lightning_cli(tmp_path, "test", f"--trainer.default_root_dir={write(tmp_path / 'root', 'x')}")
    from hoformer._io import atomic_write

    with pytest.raises(IsADirectoryError, match=r"cannot write .*: it is a directory; expected a file path"):
        atomic_write(tmp_path, lambda tmp: None)
    pre = pretrained_dir(tmp_path)
    err = _cli_err(["forecast", "--checkpoint", str(pre), "--data", "hoformer.data.LTSFDataModule", "--data-args",
                    '{"synthetic": true, "seq_len": 16, "pred_len": 8, "num_variates": 3}', "--output", str(tmp_path)])
    assert "--output" in err and "is a directory" in err


def test_a_device_this_machine_lacks_is_blamed_not_the_file(tmp_path):
    from hoformer.checkpoint import load_checkpoint

    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    pre = pretrained_dir(tmp_path)
    with pytest.raises(ValueError, match=r"device 'cuda:7' does not exist on this machine"):
        load_checkpoint(pre, map_location="cuda:7")
    err = _cli_err(["forecast", "--checkpoint", str(pre), "--device", "cuda:7", "--output", str(tmp_path / "f.csv")])
    assert "cuda:7" in err and "does not exist" in err


def test_a_write_that_runs_out_of_space_names_the_file_and_the_cause(tmp_path, monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    from hoformer._io import atomic_write

    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"cannot write .*a.ckpt.*no space left.*intact"):
        atomic_write(tmp_path / "a.ckpt", full)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10, 10, 0))

    def short(tmp):  # what torch.save reports when its writer runs out of space
        raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed; unexpected pos 1152 vs 1088")

    with pytest.raises(OSError, match=r"cannot write .*b.ckpt.*no space left.*0.0 MiB free"):
        atomic_write(tmp_path / "b.ckpt", short)
    assert not list(tmp_path.iterdir())  # no torn file, no temporary left


def test_a_generated_forecast_far_beyond_the_trained_horizon_is_warned_about():
    from hoformer.inference import HORIZON_WARN_FACTOR, _horizon

    model = create_model("hot_causal_forecaster", seq_len=32, num_variates=3, dim=16, num_heads=2, depth=1,
                         patch_size=8)
    data = 8  # the trained horizon (pred_len)
    with pytest.warns(UserWarning, match=r"`horizon`=100000 is 12500x the horizon the model was trained for"):
        assert _horizon(model, data, 100000)[0] == 100000
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _horizon(model, data, HORIZON_WARN_FACTOR * 8)  # up to the documented multiple: no warning


def test_export_output_that_is_a_directory_is_one_line(tmp_path):
    err = _cli_err(["export", "--checkpoint", str(pretrained_dir(tmp_path)), "--output", str(tmp_path)])
    assert "--output" in err and "is a directory" in err
# ---------------------------------------------------------------------- overflow inside a layer, dtype mismatch
@pytest.mark.parametrize("where", ["kronecker_product", "kronecker_linear", "hot_forecaster",
                                   "hot_causal_forecaster"])
def test_finite_input_too_large_for_float32_is_named(where):
    """``x * 1e30`` is finite but overflows float32 inside (norms, softmax): the layer or forecaster raises naming its
    input instead of returning NaN; the same input at a sane scale passes."""
    torch.manual_seed(0)
    if where.startswith("hot"):
        module = create_model(where, seq_len=16, pred_len=8, num_variates=3, dim=16, num_heads=2, depth=1,
                              patch_size=8).eval()
        x = torch.randn(2, 16, 3)
    else:
        module = HL.build_attention(where, 16, 2, num_modes=2)
        x = torch.randn(2, 3, 4, 16)
    with torch.no_grad():
        assert torch.isfinite(module(x)).all()
        with pytest.raises(FloatingPointError, match=r"the output is not finite .* the input `x` is finite: its "
                                                     r"largest magnitude .*e\+30 overflows torch.float32"):
            module(x * 1e30)


def test_a_float16_input_into_a_float32_layer_names_both_dtypes():
    """As ``nn.Linear`` does, a layer refuses an input of another dtype than its weights (outside autocast), with an
    error naming the argument and both dtypes instead of torch's matmul dtype error."""
    x = torch.randn(2, 3, 4, 16, dtype=torch.float16)
    for name in ("kronecker_product", "kronecker_linear", "full", "axial", "divided"):
        with pytest.raises(TypeError, match=rf"{name.split('_')[0].capitalize()}\w*Attention: `x` must have the "
                                            r"dtype of the layer's weights, torch.float32, got torch.float16"):
            HL.build_attention(name, 16, 2)(x)
    with pytest.raises(TypeError, match=r"TripletAttention: `x` must have the dtype of the layer's weights, "
                                        r"torch.float32, got torch.float16"):
        HL.TripletAttention(16, 2, block_size=4)(torch.randn(2, 8, 16, dtype=torch.float16))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts per operation: accepted
        HL.build_attention("full", 16, 2)(x.float())
def _nan_weight(directory: Path, key: str) -> None:
    """Overwrite one entry of ``key`` in ``directory/model.safetensors`` with NaN, keeping the file's metadata."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = directory / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta, state = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    state[key].view(-1)[0] = float("nan")
    save_file(state, str(path), metadata=meta)


def test_a_nan_weight_in_model_safetensors_is_refused_naming_file_and_tensor(tmp_path):
    """One NaN in a saved weight would make every output NaN: ``from_pretrained`` refuses the file, naming it and the
    tensor; ``allow_nonfinite=True`` loads it (and the NaN is there)."""
    directory = pretrained_dir(tmp_path)
    key = next(k for k, v in create_model("hot_forecaster", **TINY_FC).state_dict().items()
               if k.endswith("weight") and v.is_floating_point())
    _nan_weight(directory, key)
    with pytest.raises(ValueError) as info:
        from_pretrained(directory)
    msg = str(info.value)
    for needle in ("from_pretrained", str(directory / "model.safetensors"), repr(key), "1 NaN", "allow_nonfinite=True"):
        assert needle in msg, (needle, msg)
    loaded = from_pretrained(directory, allow_nonfinite=True, verify_weights=False)  # (rewritten: another SHA-256)
    assert torch.isnan(loaded.state_dict()[key]).sum() == 1
