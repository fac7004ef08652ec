"""hoformer's dropout (hoformer.functional.dropout, hoformer.layers.Dropout): the distribution of F.dropout from a
counter-based stream (SplitMix64) fused with its use, the C kernel equal to the stream written out (in torch and in
NumPy), reproducible under a seed, the same without a C compiler and under torch.compile, the identity in eval mode,
and used by every registered model."""
from __future__ import annotations

import math
import warnings

import numpy as np

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hoformer.functional import dropout, keep_mask, keep_mask_reference
from hoformer.functional import dropout_bits
from hoformer.layers import Dropout
from hoformer.models import create_model, list_models

from _small import SMALL, small_model


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_rate_within_four_standard_errors_over_a_million_draws(p):
    torch.manual_seed(0)
    n = 1_000_000
    mask = keep_mask((n,), p)
    kept = mask > 0
    rate = kept.double().mean().item()
    se = math.sqrt(p * (1 - p) / n)
    assert abs(rate - (1 - p)) < 4 * se, (rate, 1 - p, se)
    torch.testing.assert_close(mask[kept], torch.full_like(mask[kept], 1 / (1 - p)))  # the kept entries' scale
    assert (mask[~kept] == 0).all()


def test_masks_are_independent_within_and_across_draws():
    """No correlation between neighbouring entries (the two 32-bit halves of one 64-bit word), between consecutive
    masks, or between the same entry of masks drawn at different steps; a different mask every step."""
    torch.manual_seed(1)
    n, p = 1_000_000, 0.3
    a, b = (keep_mask((n,), p) > 0).double(), (keep_mask((n,), p) > 0).double()
    bound = 4 / math.sqrt(n)  # 4 standard errors of a correlation coefficient near 0

    def corr(u, v):
        return torch.corrcoef(torch.stack([u, v]))[0, 1].item()

    h = n // 2
    assert abs(corr(a[:h], a[h:])) < 4 / math.sqrt(h)  # element j and h + j: the halves of one word
    assert abs(corr(a[:-1], a[1:])) < bound  # neighbours
    assert abs(corr(a, b)) < bound  # consecutive masks
    assert not torch.equal(a, b)


def test_reproducible_under_a_seed_and_resumable_from_the_generator_state():
    torch.manual_seed(7)
    first = keep_mask((4096,), 0.2)
    state = torch.get_rng_state()
    second = keep_mask((4096,), 0.2)
    torch.manual_seed(7)
    assert torch.equal(keep_mask((4096,), 0.2), first)
    torch.set_rng_state(state)  # what a resumed run restores: the masks continue as they would have
    assert torch.equal(keep_mask((4096,), 0.2), second)
    g = torch.Generator().manual_seed(3)
    assert torch.equal(keep_mask((64,), 0.5, generator=g), keep_mask((64,), 0.5, generator=torch.Generator().manual_seed(3)))


def test_output_and_gradient_are_those_of_its_mask():
    """y = x * m and dy/dx = m for the mask m drawn: a dropout, not an approximation of one (float64, odd size)."""
    x = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    y = dropout(x, 0.25)
    torch.manual_seed(5)
    m = keep_mask(x.shape, 0.25, dtype=torch.float64)
    torch.testing.assert_close(y, x.detach() * m, rtol=0, atol=0)
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, g * m, rtol=0, atol=0)
    assert set(m.unique().tolist()) <= {0.0, 1 / 0.75}
    assert torch.autograd.gradcheck(lambda t: t * m, (x.detach().clone().requires_grad_(),))


def test_eval_mode_and_zero_rate_are_the_identity_and_other_paths_are_f_dropout():
    x = torch.randn(4, 8)
    assert dropout(x, 0.5, training=False) is x and dropout(x, 0.0) is x
    layer = Dropout(0.3).eval()
    assert layer(x) is x
    torch.manual_seed(0)
    ref = F.dropout(x.to(torch.int64).float(), 1.0)
    assert torch.equal(dropout(x, 1.0), ref)  # p = 1: F.dropout (all zeros)
    assert isinstance(layer, nn.Dropout) and layer.p == 0.3 and not list(layer.state_dict())
    with pytest.raises(ValueError, match="probability"):
        Dropout(1.5)  # nn.Dropout's own check of p


def test_bf16_input_keeps_its_dtype():
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    y = dropout(x, 0.2)
    assert y.dtype == torch.bfloat16 and ((y == 0) | (y != 0)).all()


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_uses_hoformer_dropout_and_eval_is_unaffected(name):
    """No plain nn.Dropout is left in a registered model, and an eval forward equals the forward with every dropout
    removed (nn.Identity): eval outputs do not depend on the dropout implementation."""
    model = small_model(name)
    plain = [n for n, m in model.named_modules() if isinstance(m, nn.Dropout) and not isinstance(m, Dropout)]
    assert not plain, plain
    model.eval()
    args, kwargs = model.example_inputs(batch_size=2)
    with torch.no_grad():
        out = model(*args, **kwargs)
        for parent in list(model.modules()):
            for child_name, child in list(parent.named_children()):
                if isinstance(child, Dropout):
                    setattr(parent, child_name, nn.Identity())
        ref = model(*args, **kwargs)
    for a, b in zip(out if isinstance(out, (tuple, list)) else [out], ref if isinstance(ref, (tuple, list)) else [ref]):
        assert torch.equal(a, b)


def test_training_forward_draws_from_the_global_generator():
    """Two training forwards from the same seed are equal, from different seeds differ (the masks are the
    generator's, so seed_everything and hoformer's per-epoch reseeding govern them)."""
    model = create_model("hot_forecaster", **{**SMALL["hot_forecaster"], "dropout": 0.3}).train()
    x = torch.randn(2, 16, 3)
    outs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        outs.append(model(x))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def _splitmix_mask(n: int, p: float, seed: int) -> np.ndarray:
    """The keep decisions of the module doc written out with NumPy's uint64 (wrapping) arithmetic: word j is
    SplitMix64's mix(seed + (j + 1) * GAMMA); element j < h = ceil(n / 2) takes its low 32 bits, h + j its high."""
    h = (n + 1) // 2
    with np.errstate(over="ignore"):
        z = np.uint64(seed % 2**64) + np.arange(1, h + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    bits = np.concatenate([z & np.uint64(0xFFFFFFFF), z >> np.uint64(32)])[:n]
    return bits >= np.uint64(round(p * 2**32))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 7, 1000, 1001, 300_001])
def test_kernel_is_the_stream_written_out(n, dtype, threads):
    """The C kernel's output equals x times the mask of the NumPy transcription and of keep_mask_reference, bit for
    bit, for odd and even sizes, on one thread and split over two (a range of the stream is computed alone)."""
    if dropout_bits._library() is None:
        pytest.skip("no C compiler here: the kernel was not built (the torch path is tested on its own)")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(n, dtype=dtype)
        seed = torch.tensor(-(2**62) - 12345, dtype=torch.int64)
        y = dropout_bits._apply(x, seed, 0.3)
    finally:
        torch.set_num_threads(old)
    kept = torch.from_numpy(_splitmix_mask(n, 0.3, int(seed)))
    scale = torch.tensor(1 / 0.7, dtype=dtype)
    torch.testing.assert_close(y, torch.where(kept, x * scale, torch.zeros((), dtype=dtype)), rtol=0, atol=0)
    torch.testing.assert_close(y, x * keep_mask_reference((n,), 0.3, seed, dtype=dtype), rtol=0, atol=0)


def test_bf16_kernel_rounds_every_value_as_torch_does():
    """On all 65,536 bfloat16 bit patterns (subnormals, the largest finite values that overflow when scaled, infinities,
    NaNs) the kept elements are torch's bfloat16 product ``x * bf16(1 / (1 - p))`` bit for bit (NaN stays NaN) and
    the dropped ones are zero (as in the float32 kernel, also for a dropped NaN): the kernel's round-to-nearest-even
    is torch's."""
    if dropout_bits._library() is None:
        pytest.skip("no C compiler here: the kernel was not built (the torch path is tested on its own)")
    x = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    seed = torch.tensor(987654321, dtype=torch.int64)
    for p in (0.1, 0.3):
        y = dropout_bits._apply(x, seed, p)
        ref = x * keep_mask_reference(x.shape, p, seed, dtype=torch.bfloat16)
        kept = torch.from_numpy(_splitmix_mask(x.numel(), p, int(seed)))
        assert (y[~kept] == 0).all() and 0.5 < kept.float().mean() < 0.95
        nan = ref.isnan()
        assert torch.equal(y[kept].isnan(), nan[kept])
        assert torch.equal(y[~nan & kept].view(torch.int16), ref[~nan & kept].view(torch.int16))


def test_no_mask_is_kept_for_the_backward_pass_and_the_gradient_is_the_mask():
    """Autograd keeps the 0-d seed only (F.dropout keeps a mask of x's size); the gradient is g times the same
    mask, and second derivatives exist (gradcheck, gradgradcheck in float64)."""
    saved = []
    x = torch.randn(64, 33, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        torch.manual_seed(2)
        y = dropout(x, 0.2)
    assert saved == [1], saved
    g = torch.randn_like(y)
    y.backward(g)
    torch.manual_seed(2)
    torch.testing.assert_close(x.grad, g * keep_mask(x.shape, 0.2), rtol=0, atol=0)
    seed = torch.tensor(99)
    xd = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: dropout_bits._Dropout.apply(t, seed, 0.4), (xd,))
    assert torch.autograd.gradgradcheck(lambda t: dropout_bits._Dropout.apply(t, seed, 0.4), (xd,))


def test_non_contiguous_input_and_inplace():
    """A transposed input gets the mask of its contiguous copy; ``inplace`` is F.dropout's in-place dropout."""
    x = torch.randn(40, 30)
    torch.manual_seed(4)
    y = dropout(x.t(), 0.5)
    torch.manual_seed(4)
    torch.testing.assert_close(y, x.t().contiguous() * keep_mask((30, 40), 0.5), rtol=0, atol=0)
    z = x.clone()
    out = dropout(z, 0.5, inplace=True)
    assert out is z and set((z[z != 0] / x[z != 0]).round(decimals=4).tolist()) == {2.0}


def test_without_a_c_compiler_the_masks_are_the_same(monkeypatch, tmp_path):
    """No kernel (HOFORMER_DROPOUT_KERNEL=0: silently; a compiler that fails: one warning naming it) gives the
    kernel's masks from the torch transcription."""
    x = torch.randn(3, 1001)
    torch.manual_seed(8)
    want = dropout(x, 0.25)
    for env, warns in ({"HOFORMER_DROPOUT_KERNEL": "0"}, False), ({"CC": "false", "HOFORMER_CACHE": str(tmp_path)}, True):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        dropout_bits._library.cache_clear()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.manual_seed(8)
                got = dropout(x, 0.25)
            assert torch.equal(got, want)
            messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            assert (len(messages) == 1 and "'false'" in messages[0] and "HOFORMER_DROPOUT_KERNEL=0" in messages[0]
                    if warns else not messages), messages
        finally:
            for k in env:
                monkeypatch.delenv(k)
            dropout_bits._library.cache_clear()


def test_traced_dropout_draws_the_eager_masks():
    """Under torch.compile the kernel runs as the opaque op hoformer::dropout_bits (aot_eager here: the same graph
    Inductor gets, without its C++ build; make test-slow compiles registered models with Inductor): output and
    gradient equal eager's from the same seed."""
    import torch._dynamo as dynamo

    def f(t):
        return dropout(t * 2.0, 0.3).sum(-1)

    x = torch.randn(8, 257, requires_grad=True)
    torch.manual_seed(6)
    want = f(x)
    (gx,) = torch.autograd.grad(want.sum(), x)
    dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    torch.manual_seed(6)
    got = compiled(x)
    (gc,) = torch.autograd.grad(got.sum(), x)
    dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(gc, gx, rtol=0, atol=0)


# ------------------------------------------------------------------------------------ bias + GELU + dropout, fused
def _gelu_reference(h, b, mask):
    """``mask * gelu(h + b)`` in float64 (the erf form) and its inputs as float64 leaves."""
    hd, bd = h.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    return hd, bd, F.gelu(hd + bd) * mask


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 33), (700, 384)])
def test_fused_bias_gelu_dropout_is_the_float64_equation(shape, p, threads):
    """Forward, input and bias gradients of the fused kernel against ``mask * gelu(h + b)`` in float64 with the mask
    of the same seed (:func:`keep_mask_reference`), on 1 and 2 threads (700 x 384 is past the size that splits the
    work); the zeros are exactly the mask's."""
    torch.manual_seed(0)
    h, b = (3 * torch.randn(shape)).requires_grad_(), torch.randn(shape[-1]).requires_grad_()
    seed = torch.tensor(-1234567891011, dtype=torch.int64)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = dropout_bits._BiasGeluDropout.apply(h, b, seed, p)
        g = torch.randn(shape)
        y.backward(g)
    finally:
        torch.set_num_threads(old)
    mask = keep_mask_reference(shape, p, seed, dtype=torch.float64)
    hd, bd, ref = _gelu_reference(h, b, mask)
    ref.backward(g.double())
    assert (y[mask == 0] == 0).all()  # dropped where the mask drops (and tiny tails may underflow elsewhere)
    # the error budget per element: erf's 1.5e-7 (A&S 7.1.26) times |v| / 2, and float32 rounding of v and y
    bound = 4e-7 * (1 + (hd + bd).detach().abs()) * mask
    assert ((y.double() - ref).abs() <= bound + 1e-30).all()
    assert ((h.grad.double() - hd.grad).abs() <= bound * g.double().abs() + 1e-30).all()
    sums = (bound * g.double().abs()).reshape(-1, shape[-1]).sum(0)
    assert ((b.grad.double() - bd.grad).abs() <= sums + 1e-6 * bd.grad.abs() + 1e-30).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(3, 7), (700, 384)])
def test_fused_bias_gelu_dropout_in_bf16_is_the_float64_equation_rounded_once(shape, threads):
    """bfloat16 ``h`` (what a linear map gives under CPU autocast) with a float32 bias: the output and the input
    gradient are the float64 equation rounded to bfloat16 once (within one bf16 unit, 2^-8 relative, plus the float32
    budget), the saved derivative is bfloat16 (the gradient is ``g * d`` rounded), the bias gradient float32, and the
    zeros are the mask's."""
    torch.manual_seed(0)
    h = (3 * torch.randn(shape)).bfloat16().requires_grad_()
    b = torch.randn(shape[-1]).requires_grad_()
    seed, p = torch.tensor(-1234567891011, dtype=torch.int64), 0.1
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = dropout_bits._BiasGeluDropout.apply(h, b, seed, p)
        g = torch.randn(shape).bfloat16()
        y.backward(g)
    finally:
        torch.set_num_threads(old)
    assert y.dtype == h.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.float32
    mask = keep_mask_reference(shape, p, seed, dtype=torch.float64)
    hd, bd, ref = _gelu_reference(h, b, mask)
    ref.backward(g.double())
    assert (y[mask == 0] == 0).all()
    ulp = 2.0 ** -8
    bound = (ulp * ref.detach().abs() + 4e-7 * (1 + (hd + bd).detach().abs()) * mask) + 1e-30
    assert ((y.double() - ref).abs() <= bound).all()
    # gh = bf16(g * bf16(d)): two roundings of d's and the product's
    gbound = (3 * ulp * hd.grad.abs() + 4e-7 * (1 + (hd + bd).detach().abs()) * mask * g.double().abs()) + 1e-30
    assert ((h.grad.double() - hd.grad).abs() <= gbound).all()
    sums = gbound.reshape(-1, shape[-1]).sum(0)
    assert ((b.grad.double() - bd.grad).abs() <= sums + 1e-6 * bd.grad.abs() + 1e-30).all()


def test_fused_gelu_agrees_with_torch_and_keeps_one_tensor():
    """Against ``F.gelu`` in float32 over a wide range (float rounding only, also in the tails), and autograd keeps
    one tensor of ``h``'s size (the masked derivative), where the unfused path keeps the GELU's input and more."""
    h = torch.linspace(-30, 30, 600_000).reshape(-1, 3)
    b = torch.zeros(3)
    y = dropout_bits.bias_gelu_dropout(h, b, 0.0)
    # float rounding at the input's scale (in the far negative tail torch's 1 + erf cancels, the kernel's erfc not)
    assert ((y - F.gelu(h)).abs() <= 4e-7 * (1 + h.abs())).all()
    saved = []
    hr, br = h.clone().requires_grad_(), b.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        dropout_bits.bias_gelu_dropout(hr, br, 0.2)
    assert saved == [h.numel()], saved


def test_fused_bias_gelu_dropout_draws_the_masks_of_dropout():
    """The fused op draws one seed from the global generator, as ``dropout(gelu(h + b))`` does, so the same masks
    and the same generator state follow; ``p = 0`` draws nothing; fallbacks (float64, eval) are the unfused ops."""
    h, b = torch.randn(64, 48), torch.randn(48)
    torch.manual_seed(5)
    fused, after = dropout_bits.bias_gelu_dropout(h, b, 0.3), torch.rand(3)
    torch.manual_seed(5)
    plain, after_plain = dropout(F.gelu(h + b), 0.3), torch.rand(3)
    assert torch.equal(fused == 0, plain == 0) and torch.equal(after, after_plain)
    assert ((fused - plain).abs() <= 4e-7 * (1 + (h + b).abs()) / 0.7).all()
    torch.manual_seed(5)
    dropout_bits.bias_gelu_dropout(h, b, 0.0)
    state = torch.get_rng_state()
    dropout_bits.bias_gelu_dropout(h, b, 0.0)
    assert torch.equal(torch.get_rng_state(), state)
    hd, bd = h.double(), b.double()
    torch.manual_seed(5)
    got = dropout_bits.bias_gelu_dropout(hd, bd, 0.3)
    torch.manual_seed(5)
    assert torch.equal(got, dropout(F.gelu(hd + bd), 0.3))
    assert torch.equal(dropout_bits.bias_gelu_dropout(h, b, 0.3, training=False), F.gelu(h + b))


def test_fused_bias_gelu_dropout_refuses_bad_arguments():
    h = torch.randn(4, 6)
    with pytest.raises(ValueError, match=r"`p` must be a probability in \[0, 1\], got 1.5"):
        dropout_bits.bias_gelu_dropout(h, torch.zeros(6), 1.5)
    with pytest.raises(ValueError, match=r"`bias` must have shape \(6,\).*got \(5,\)"):
        dropout_bits.bias_gelu_dropout(h, torch.zeros(5), 0.1)


def test_mlp_training_uses_the_fused_pass_and_matches_the_modules():
    """A training ``Mlp`` on float32 CPU input runs the fused op; its output and gradients equal those of its modules
    run one by one (a forward hook on the GELU forces that path) from the same seed, to float rounding; eval and
    autocast run the modules themselves."""
    from hoformer.layers import Mlp

    torch.manual_seed(0)
    mlp, x = Mlp(16, 64, dropout=0.25).train(), torch.randn(3, 5, 16)
    calls = []
    orig = dropout_bits._BiasGeluDropout.apply

    def counting(*a):
        calls.append(1)
        return orig(*a)

    dropout_bits._BiasGeluDropout.apply = counting
    try:
        torch.manual_seed(1)
        fused = mlp(x)
        fused.sum().backward()
    finally:
        dropout_bits._BiasGeluDropout.apply = orig
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    handle = mlp.net[1].register_forward_hook(lambda *a: None)
    try:
        torch.manual_seed(1)
        plain = mlp(x)
        plain.sum().backward()
    finally:
        handle.remove()
    assert calls == [1]
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    for a, p in zip(grads, mlp.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-5)
    mlp.eval()
    with torch.no_grad():
        assert torch.equal(mlp(x), mlp.net(x))
    mlp.train()  # under bf16 autocast the fused pass runs on the linear map's bf16 output, the same masks
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert dropout_bits.fuses_bias_gelu(x)
        torch.manual_seed(2)
        got = mlp(x)
        torch.manual_seed(2)
        ref = mlp.net(x)
    assert got.dtype == ref.dtype == torch.bfloat16 and torch.equal(got == 0, ref == 0)
    torch.testing.assert_close(got, ref, rtol=3e-2, atol=3e-2)  # bf16 rounding (the modules round three times)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):  # float16: the modules as they are
        assert not dropout_bits.fuses_bias_gelu(x)
        torch.manual_seed(2)
        got = mlp(x)
        torch.manual_seed(2)
        assert torch.equal(got, mlp.net(x))
