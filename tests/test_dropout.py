"""hoformer's dropout (hoformer.functional.dropout, hoformer.layers.Dropout): the distribution of F.dropout from
cheaper random bits, reproducible under a seed, the identity in eval mode, and used by every registered model."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hoformer.functional import dropout, keep_mask
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

    assert abs(corr(a[0::2], a[1::2])) < 4 / math.sqrt(n // 2)  # the halves of one word
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
