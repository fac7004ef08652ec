"""The fast training path: a compiled training step (``hoformer.train.CompileModel``'s arguments, Inductor, one graph)
equals the eager one for every registered model, and the fused optimiser step equals the default one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hoformer.models import create_model, list_models
from hoformer.train import CompileModel, Optimization
from hoformer.train.optim import configure_optimization
from _small import SMALL

FAST: list[str] = []  # Inductor compiles take 30-120 s per model here: `make test-slow` runs them all


def _loss(out):
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().pow(2).mean()


def _step(model, args, kwargs, seed):
    """One training step's forward (train mode, dropout on), loss and backward: the loss and each parameter's
    gradient (None where it gets none)."""
    torch.manual_seed(seed)
    loss = _loss(model(*args, **kwargs))
    loss.backward()
    return loss.detach(), [(k, p.grad) for k, p in model.named_parameters() if p.requires_grad]


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in list_models()])
def test_compiled_training_step_matches_eager(name):
    """Inductor (C++ on CPU), ``fullgraph=True`` and the same dropout masks as eager (``fallback_random``, what
    CompileModel sets on CPU): loss and every gradient equal eager's. (Not the weights after an AdamW step: its first
    step is about ``lr * sign(grad)``, so a gradient that is zero up to rounding, e.g. a softmax key bias's, moves a
    weight by a random ``+-lr`` and a wrong gradient magnitude goes unseen.)"""
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    eager = create_model(name, **SMALL.get(name, {})).train()
    compiled = create_model(name, **SMALL.get(name, {})).train()
    compiled.load_state_dict(eager.state_dict())
    torch.manual_seed(1)
    args, kwargs = eager.example_inputs(batch_size=2)
    dynamo.reset()
    compiled.compile(**CompileModel.compile_kwargs("cpu", fullgraph=True, fallback_random=True))
    if not any(p.requires_grad for p in eager.parameters()):  # a parameter-free baseline: its forward, no gradient
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args, **kwargs), eager(*args, **kwargs), rtol=1e-5, atol=1e-6)
        dynamo.reset()
        return
    want, want_grads = _step(eager, args, kwargs, seed=3)
    got, got_grads = _step(compiled, args, kwargs, seed=3)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert [k for k, _ in got_grads] == [k for k, _ in want_grads]
    for (k, a), (_, b) in zip(got_grads, want_grads):
        assert (a is None) == (b is None), f"{name}.{k}: gradient {a is not None} compiled, {b is not None} eager"
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}.{k}.grad: {m}")
    dynamo.reset()


def test_fused_adamw_step_equals_the_default_one():
    """``Optimization(fused=True)`` (PyTorch's one-kernel step, the default on the CPU and on CUDA) updates the weights
    as the default implementation does; ``fused=None`` picks it when every parameter is on the CPU (or every one on
    a CUDA device) unless the task says it may not (mixed precision with clipping), ``fused=False`` never."""
    torch.manual_seed(0)
    a = create_model("hot_forecaster", **SMALL["hot_forecaster"]).double()
    b = create_model("hot_forecaster", **SMALL["hot_forecaster"]).double()
    b.load_state_dict(a.state_dict())
    plain = configure_optimization(Optimization(lr=1e-2, weight_decay=0.1, schedule="constant", fused=False), a, 10)
    assert not plain.defaults["fused"]
    auto = configure_optimization(Optimization(lr=1e-2, weight_decay=0.1, schedule="constant"), b, 10)
    assert auto.defaults["fused"] is True  # CPU parameters: fused
    refused = configure_optimization(Optimization(schedule="constant"), b, 10, may_fuse=False)
    assert not refused.defaults["fused"]
    auto, fused = plain, auto
    args, _ = a.example_inputs(batch_size=2)
    args = [x.double() for x in args]
    for step in range(3):
        for model, opt in ((a, auto), (b, fused)):
            torch.manual_seed(step)  # the same dropout masks for both models
            opt.zero_grad()
            F.mse_loss(model(*args), torch.zeros(())).backward()
            opt.step()
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12, msg=lambda m: f"{k}: {m}")
    with pytest.raises(TypeError, match=r"Optimization: `fused` must be True, False or None"):
        Optimization(fused="yes")
