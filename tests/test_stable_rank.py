"""Stable ranks (HOT eqs 10-12) against dense SVD."""
from __future__ import annotations

import pytest
import torch

from hoformer.analysis import (
    kron_product_stable_rank,
    kron_sum_fro_sq,
    kron_sum_spectral_norm,
    kron_sum_stable_rank,
    stable_rank,
)
from hoformer.functional import kron_dense, kron_sum_dense


def _factors(sizes, temp, b=2, h=3):
    return [(torch.randn(b, h, n, n, dtype=torch.float64) * temp).softmax(-1) for n in sizes]


def test_stable_rank_definition():
    a = torch.randn(4, 6, 5, dtype=torch.float64)
    s = torch.linalg.svdvals(a)
    torch.testing.assert_close(stable_rank(a), s.pow(2).sum(-1) / s[..., 0] ** 2)
    assert torch.allclose(stable_rank(torch.eye(7, dtype=torch.float64)), torch.tensor(7.0, dtype=torch.float64))


@pytest.mark.parametrize("sizes", [(4, 5), (3, 4, 2), (2, 3, 2, 2)])
def test_product_stable_rank_exact(sizes):
    fs = _factors(sizes, 3.0)
    torch.testing.assert_close(kron_product_stable_rank(fs), stable_rank(kron_dense(fs)), rtol=1e-9, atol=0)


@pytest.mark.parametrize("sizes,temp", [((4, 5), 1.0), ((3, 4, 2), 4.0), ((8, 9), 10.0), ((20, 24), 25.0)])
def test_sum_stable_rank_matches_dense_and_eq12_is_lower_bound(sizes, temp):
    fs = _factors(sizes, temp)
    dense = kron_sum_dense(fs, normalize=True)
    ref = stable_rank(dense)
    torch.testing.assert_close(kron_sum_fro_sq(fs) / len(sizes) ** 2, dense.pow(2).sum((-1, -2)))
    exact = kron_sum_stable_rank(fs)
    assert ((exact - ref).abs() / ref).max() < 1e-6
    bound = kron_sum_stable_rank(fs, method="bound")
    assert (bound <= ref * (1 + 1e-9)).all()


def test_peaked_factors_bound_is_loose():
    fs = _factors((16, 16), 30.0)
    ref = stable_rank(kron_sum_dense(fs))
    gap = (1 - kron_sum_stable_rank(fs, method="bound") / ref).max()
    assert gap > 0.05  # eq 12 is strictly below the stable rank for peaked softmax factors


def test_bad_input():
    with pytest.raises(ValueError, match="square"):
        kron_sum_stable_rank([torch.rand(3, 4)])
    with pytest.raises(ValueError, match="method"):
        kron_sum_stable_rank([torch.rand(3, 3)], method="approx")
    with pytest.raises(ValueError, match="leading dims"):
        kron_product_stable_rank([torch.rand(2, 3, 3), torch.rand(3, 3, 3)])


def test_kron_sum_spectral_norm_is_differentiable():
    from hoformer.analysis.ranks import kron_sum_spectral_norm

    fs = [torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True), torch.randn(2, 4, 4, dtype=torch.float64)]
    kron_sum_spectral_norm(fs).sum().backward()
    assert fs[0].grad is not None and torch.isfinite(fs[0].grad).all()
    # the gradient of the largest singular value u^T M v is u v^T pooled onto the factor: check against dense SVD
    g_dense = torch.autograd.grad(torch.linalg.matrix_norm(
        torch.kron(fs[0][0], torch.eye(4, dtype=torch.float64)) + torch.kron(torch.eye(3, dtype=torch.float64),
                                                                            fs[1][0]), ord=2), fs[0])[0]
    torch.testing.assert_close(fs[0].grad[0], g_dense[0], rtol=1e-5, atol=1e-6)


def _dense_sr(m):
    s = torch.linalg.svdvals(m.double())
    return s.pow(2).sum(-1) / s[..., 0] ** 2


@pytest.mark.parametrize("sizes", [(3, 4), (2, 3, 4)])
def test_lanczos_exact_with_full_krylov_space_and_iters_is_used(sizes):
    """Gaussian (non-softmax) factors: clustered singular values. With iters = prod(N) Lanczos is exact; with one
    iteration the Rayleigh quotient underestimates |M|_2, so the stable rank is overestimated."""
    import math

    from hoformer.analysis.ranks import kron_sum_spectral_norm

    g = torch.Generator().manual_seed(0)
    fs = [torch.randn(2, n, n, generator=g, dtype=torch.float64) for n in sizes]
    dense = kron_sum_dense(fs, normalize=False)
    n = math.prod(sizes)
    torch.testing.assert_close(kron_sum_spectral_norm(fs, iters=n), torch.linalg.matrix_norm(dense, ord=2),
                               rtol=1e-10, atol=0)
    torch.testing.assert_close(kron_sum_stable_rank(fs, iters=n), _dense_sr(dense), rtol=1e-10, atol=0)
    one = kron_sum_stable_rank(fs, iters=1)
    assert (one > _dense_sr(dense) * (1 + 1e-3)).all()


def test_lanczos_breakdown_on_degenerate_spectra():
    """Identity and rank-one factors: the Krylov space is exhausted after one or two steps (breakdown); the norm is
    still exact: |I (+) I (+) I|_2 = 3 and |J/3 (+) J/4|_2 = 2 (J = all-ones)."""
    from hoformer.analysis.ranks import kron_sum_spectral_norm

    eye = [torch.eye(n, dtype=torch.float64).expand(2, n, n) for n in (2, 3, 4)]
    torch.testing.assert_close(kron_sum_spectral_norm(eye), torch.full((2,), 3.0, dtype=torch.float64))
    torch.testing.assert_close(kron_sum_stable_rank(eye), torch.full((2,), 24.0, dtype=torch.float64))
    ones = [torch.full((n, n), 1.0 / n, dtype=torch.float64) for n in (3, 4)]
    torch.testing.assert_close(kron_sum_spectral_norm(ones), torch.tensor(2.0, dtype=torch.float64))
    torch.testing.assert_close(kron_sum_stable_rank(ones), _dense_sr(kron_sum_dense(ones, normalize=False)),
                               rtol=1e-10, atol=0)


def test_eq12_bound_closed_form():
    fs = _factors((3, 5, 4), 2.0)
    dense = kron_sum_dense(fs, normalize=False)
    spec = sum(torch.linalg.svdvals(f)[..., 0] for f in fs)
    torch.testing.assert_close(kron_sum_stable_rank(fs, method="bound"), dense.pow(2).sum((-1, -2)) / spec ** 2,
                               rtol=1e-12, atol=0)
    torch.testing.assert_close(kron_sum_fro_sq(fs), dense.pow(2).sum((-1, -2)), rtol=1e-12, atol=0)


def test_stable_rank_rejects_bad_input():
    with pytest.raises(ValueError, match="floating tensor"):
        stable_rank(torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="floating tensor"):
        stable_rank(torch.ones(3))
    with pytest.raises(TypeError, match="non-empty list"):
        kron_product_stable_rank(torch.rand(2, 3, 3))
    with pytest.raises(TypeError, match="floating-point"):
        kron_sum_fro_sq([torch.ones(3, 3, dtype=torch.long)])


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_low_precision_maps_are_ranked_in_float32(low):
    """Maps recorded under bf16 / fp16 autocast: every stable-rank function computes (and returns) float32 values
    equal to those of the float32 maps (torch.linalg refuses low precision; a bf16 result has 2-3 digits)."""
    g = torch.Generator().manual_seed(0)
    fs = [torch.softmax(torch.randn(2, 3, n, n, generator=g) * 3, -1).to(low) for n in (4, 5)]
    ref = [f.float() for f in fs]
    for fn, args in ((stable_rank, (fs[0],)), (kron_product_stable_rank, (fs,)),
                     (lambda f: kron_sum_stable_rank(f, method="bound"), (fs,)),
                     (kron_sum_stable_rank, (fs,)), (kron_sum_spectral_norm, (fs,)), (kron_sum_fro_sq, (fs,))):
        out = fn(*args)
        want = fn(*((ref[0],) if args[0] is fs[0] else (ref,)))
        assert out.dtype == torch.float32 and out.shape == (2, 3)
        torch.testing.assert_close(out, want)
    mixed = kron_sum_stable_rank([ref[0].double(), fs[1]])  # mixed precisions promote to the widest
    assert mixed.dtype == torch.float64
