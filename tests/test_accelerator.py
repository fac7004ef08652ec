"""Accelerator checks: the same code on CUDA gives the CPU float64 numbers (functional core) and the CPU float32
numbers (every registered model), also under bf16 autocast, and a Lightning bf16-mixed fit runs on the device.

The device-specific code paths (e.g. ``kron_apply``'s one-chunk accelerator path, SDPA's CUDA kernels, entmax in
float32 under autocast) are only exercised here. Every test skips without CUDA; ``HOFORMER_TEST_DEVICE=cpu`` runs the
same checks on the CPU (to check the tests themselves on a machine without a GPU):

    pytest tests/test_accelerator.py                              # on a CUDA machine
    HOFORMER_TEST_DEVICE=cpu pytest tests/test_accelerator.py     # the tests' own logic, on CPU
"""
from __future__ import annotations

import os

import pytest
import torch

from hoformer.train import Optimization
from hoformer.functional import (
    kron_apply,
    kron_dense,
    kron_sum_apply,
    kron_sum_dense,
    kronecker_attention,
    p2_kmv,
    triplet_attention,
    triplet_attention_naive,
    valence_attention,
)
from hoformer.models import create_model, list_models

from _outputs import float_outputs

DEVICE = torch.device(os.environ.get("HOFORMER_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(),
                                reason="needs CUDA (or HOFORMER_TEST_DEVICE=cpu to check the tests on CPU)")
F64 = torch.float64


@pytest.fixture(autouse=True)
def _exact_fp32():
    """No TF32 in the float32 comparisons (Ampere+ matmuls would otherwise round inputs to 10 mantissa bits)."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _to(obj, device, dtype=None):
    if isinstance(obj, torch.Tensor):
        return obj.to(device, dtype) if (dtype is not None and obj.is_floating_point()) else obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device, dtype) for k, v in obj.items()}
    return obj


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str) -> None:
    """Max-abs error relative to the reference's max magnitude (robust to entries near zero)."""
    got, want = got.detach().to("cpu", F64), want.detach().to("cpu", F64)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values on {DEVICE}"
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
    assert err < rtol, f"{what}: relative error {err:.2e} on {DEVICE} (tolerance {rtol:.0e})"


def _grads_vs_reference(fn, inputs: list[torch.Tensor], rtol: float, what: str) -> None:
    """``fn`` on DEVICE in float32 vs on the CPU in float64: values and the gradients of every input."""
    g = torch.Generator().manual_seed(1)
    ref_in = [t.detach().to(F64).requires_grad_() for t in inputs]
    dev_in = [t.detach().to(DEVICE, torch.float32).requires_grad_() for t in inputs]
    ref, out = fn(*ref_in), fn(*dev_in)
    up = torch.randn(ref.shape, generator=g, dtype=F64)
    ref.backward(up)
    out.backward(up.to(DEVICE, torch.float32))
    _close(out, ref, rtol, what)
    for i, (a, b) in enumerate(zip(dev_in, ref_in)):
        _close(a.grad, b.grad, rtol, f"{what}: grad of input {i}")


# ------------------------------------------------------------------------------------------ functional core
@pytest.mark.parametrize("sizes", [(5,), (4, 6), (3, 4, 5), (2, 3, 2, 3), (3, 13), (2, 3, 13)])  # 13 > 2d: unfolded
def test_kron_apply_and_sum_on_device(sizes):
    g = torch.Generator().manual_seed(0)
    b, h, d = 2, 3, 4
    v = torch.randn(b, h, *sizes, d, generator=g)
    factors = [torch.randn(b if i % 2 else 1, h, n, n, generator=g) for i, n in enumerate(sizes)]  # broadcast batch
    _grads_vs_reference(lambda v, *f: kron_apply(list(f), v), [v, *factors], 1e-5, f"kron_apply {sizes}")
    _grads_vs_reference(lambda v, *f: kron_sum_apply(list(f), v), [v, *factors], 1e-5, f"kron_sum_apply {sizes}")
    # the dense Kronecker matrices, on the device, agree with the factored products
    flat = v.to(DEVICE).flatten(2, -2)
    dense = kron_dense([f.expand(b, -1, -1, -1).to(DEVICE) for f in factors])
    _close((dense @ flat).view_as(v), kron_apply([f.to(F64) for f in factors], v.to(F64)), 1e-5, "kron_dense")
    dsum = kron_sum_dense([f.expand(b, -1, -1, -1).to(DEVICE) for f in factors]) / len(sizes)
    _close((dsum @ flat).view_as(v), kron_sum_apply([f.to(F64) for f in factors], v.to(F64)), 1e-5, "kron_sum_dense")


def test_kron_apply_in_chunks_on_device(monkeypatch):
    """A value larger than one accelerator chunk (here: a 1 KiB chunk, so every (batch, head) pair is its own chunk)
    gives the same values and gradients as the CPU float64 reference."""
    from hoformer.functional import products as products_module

    monkeypatch.setattr(products_module, "_ACCELERATOR_CHUNK_BYTES", 1 << 10)
    g = torch.Generator().manual_seed(0)
    for sizes in [(4, 6), (2, 3, 13)]:
        v = torch.randn(3, 2, *sizes, 8, generator=g)
        factors = [torch.randn(3 if i % 2 else 1, 2, n, n, generator=g) for i, n in enumerate(sizes)]
        _grads_vs_reference(lambda v, *f: kron_apply(list(f), v), [v, *factors], 1e-5, f"chunked kron_apply {sizes}")
        _grads_vs_reference(lambda v, *f: kron_sum_apply(list(f), v), [v, *factors], 1e-5,
                            f"chunked kron_sum_apply {sizes}")


@pytest.mark.parametrize("combine", ["product", "sum"])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_kronecker_attention_on_device(combine, kernel):
    g = torch.Generator().manual_seed(0)
    sizes, b, h, e = (4, 6, 3), 2, 2, 8
    q = [torch.randn(b, h, n, e, generator=g) for n in sizes]
    k = [torch.randn(b, h, n, e, generator=g) for n in sizes]
    v = torch.randn(b, h, *sizes, e, generator=g)
    masks = None
    if kernel == "softmax":  # a causal mask on mode 1 and a fully masked row on mode 0 (must give zeros, not NaN)
        m0 = torch.ones(4, 4, dtype=torch.bool)
        m0[2] = False
        masks = [m0.to(DEVICE), torch.ones(6, 6, dtype=torch.bool).tril().to(DEVICE), None]

    def fn(v, *qk):
        mm = None if masks is None else [None if m is None else m.to(v.device) for m in masks]
        return kronecker_attention(list(qk[:3]), list(qk[3:]), v, combine=combine, kernel=kernel, masks=mm)

    _grads_vs_reference(fn, [v, *q, *k], 1e-4, f"kronecker_attention {combine}/{kernel}")


@pytest.mark.parametrize("length, block, overlap", [(20, 8, 0.25), (7, 8, 0.0), (33, 6, 0.5)])
def test_triplet_attention_on_device(length, block, overlap):
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(2, 2, length, 8, generator=g) for _ in range(5)]
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, length - 3:] = False  # padded tail
    fast = lambda *t: triplet_attention(*t, block_size=block, overlap=overlap, mask=mask.to(t[0].device))  # noqa: E731
    _grads_vs_reference(fast, qkv, 1e-4, f"triplet_attention L={length}")
    # the naive algorithm of the paper, on the device, gives the same numbers
    want = triplet_attention_naive(*[t.to(F64) for t in qkv], block_size=block, overlap=overlap, mask=mask)
    got = triplet_attention_naive(*[t.to(DEVICE) for t in qkv], block_size=block, overlap=overlap,
                                  mask=mask.to(DEVICE))
    _close(got, want, 1e-4, "triplet_attention_naive")


@pytest.mark.parametrize("kernel", ["tanimoto", "cosine", "sdpa"])
def test_weaver_kernels_and_p2kmv_on_device(kernel):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 7, 4, generator=g), torch.randn(2, 3, 7, 4, generator=g)
    _grads_vs_reference(lambda q, k: valence_attention(q, k, kernel), [q, k], 1e-5, f"valence_attention {kernel}")
    tt, ts, u = (torch.randn(2, 3, 5, 5, generator=g), torch.randn(2, 3, 7, 7, generator=g),
                 torch.randn(2, 3, 5, 7, 4, generator=g))
    _grads_vs_reference(p2_kmv, [tt, ts, u], 1e-5, "p2_kmv")


# ------------------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("name", list_models())
def test_every_model_matches_cpu_on_device(name):
    """float32 on the device = float32 on the CPU (same weights, eval mode); a training step is finite; under bf16
    autocast the outputs are finite and within 10% (of the max) of float32."""
    torch.manual_seed(0)
    model = create_model(name).eval()
    args, kwargs = model.example_inputs(batch_size=2)
    with torch.no_grad():
        ref_t = float_outputs(model, args, kwargs)
    dev = create_model(name).eval()
    dev.load_state_dict(model.state_dict())
    dev = dev.to(DEVICE)
    dargs, dkwargs = _to(args, DEVICE), _to(kwargs, DEVICE)
    with torch.no_grad():
        out_t = float_outputs(dev, dargs, dkwargs)
    assert len(out_t) == len(ref_t)
    for i, (o, r) in enumerate(zip(out_t, ref_t)):
        assert o.device.type == DEVICE.type
        _close(o, r, 1e-3, f"{name} output {i}")
    with torch.no_grad(), torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        low_t = float_outputs(dev, dargs, dkwargs)
    for i, (o, r) in enumerate(zip(low_t, ref_t)):
        _close(o, r, 0.1, f"{name} bf16 autocast output {i}")
    params = [p for p in dev.parameters() if p.requires_grad]
    if params:
        dev.train()
        loss = sum(t.float().square().mean() for t in float_outputs(dev, dargs, dkwargs) if t.requires_grad)
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in params), f"{name}: non-finite grads"


def test_lightning_bf16_mixed_fit_on_device(tmp_path):
    import lightning.pytorch as pl

    from hoformer.data import LTSFDataModule
    from hoformer.train import ForecastingTask

    task = ForecastingTask(create_model("hot_forecaster", **dict(seq_len=32, pred_len=8, num_variates=7, dim=16, num_heads=2,
                                                  depth=1, patch_size=8)),
                           optim=Optimization(lr=1e-3, weight_decay=0.1), plot_variates=0)
    dm = LTSFDataModule(synthetic=True, synthetic_length=400, seq_len=32, pred_len=8, batch_size=8)
    trainer = pl.Trainer(default_root_dir=tmp_path, accelerator="gpu" if DEVICE.type == "cuda" else "cpu",
                         devices=1, precision="bf16-mixed", max_steps=3, limit_val_batches=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, dm)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    (res,) = trainer.test(task, dm, verbose=False)
    assert all(torch.isfinite(torch.tensor(v)) for v in res.values()), res


def test_window_batches_on_the_device_equal_the_host_loader_s():
    """``on_device=True``: the series lives on the device and each batch is gathered there; the batches equal the
    DataLoader's (on the host) for the same sampler seed, and a fit on the device trains from them."""
    from hoformer.data import LTSFDataModule

    def dm(**kw):
        d = LTSFDataModule(synthetic=True, synthetic_length=400, seq_len=24, pred_len=8, batch_size=16, **kw)
        d.setup()
        return d

    host, dev = dm(), dm(on_device=True)
    a = host._loader("train", True)
    w = dev.dataset("train").to(DEVICE)
    from hoformer.data.series import WindowBatches

    b = WindowBatches(w, 16, shuffle=True)
    a.sampler.generator = torch.Generator().manual_seed(3)
    b.sampler.generator = torch.Generator().manual_seed(3)
    for x, y in zip(a, b, strict=True):
        for k in x:
            assert y[k].device.type == DEVICE.type
            assert torch.equal(x[k], y[k].cpu()), k
