"""hoformer._checks.check_values: descriptive errors on CPU, asynchronous device-side asserts elsewhere."""
from __future__ import annotations

import re

import pytest
import torch

from hoformer._checks import check_fraction, check_int, check_values, is_int


def test_cpu_raises_with_detail_only_on_failure():
    calls = []

    def detail():
        calls.append(1)
        return ", got 7"

    check_values(torch.tensor(True), "x must be < 5{detail}", detail)
    assert not calls  # detail (which may sync) runs only on failure
    with pytest.raises(ValueError, match=r"^x must be < 5, got 7$"):
        check_values(torch.tensor(False), "x must be < 5{detail}", detail)
    with pytest.raises(TypeError, match=r"^x must be < 5$"):
        check_values(torch.tensor(False), "x must be < 5{detail}", exc=TypeError)


def test_accelerator_tensors_get_an_async_assert_without_a_host_read(monkeypatch):
    """Off the CPU (a meta tensor stands in for a GPU one here) nothing is read back: the condition and the static
    message go to torch._assert_async, and ``detail`` is never called."""
    seen = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: seen.append((ok.device.type, msg)))
    ok = torch.empty((), dtype=torch.bool, device="meta")
    check_values(ok, "labels must lie in [0, 3){detail}; check", lambda: pytest.fail("detail read the device"))
    assert seen == [("meta", "labels must lie in [0, 3); check")]


def test_call_sites_take_the_async_path_off_the_cpu(monkeypatch):
    """Labels, token ids and time features on a non-CPU device: no bool() of a device tensor (which would be a
    host sync), one async assert each."""
    from hoformer.functional.weaver import check_time_features
    from hoformer.train.base import check_labels

    seen = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg: seen.append(msg))
    check_labels(torch.zeros(4, dtype=torch.long, device="meta"), 3, "t")
    check_time_features(torch.zeros(2, 5, 2, device="meta"), "w")
    assert len(seen) == 4 and "labels must lie" in seen[0] and "minute of day" in seen[1]
    assert "day of week" in seen[2] and "fraction" in seen[3]


def test_check_int_refuses_bools_floats_and_small_values_and_names_the_argument():
    import numpy as np

    assert is_int(3) and is_int(np.int64(3)) and not is_int(True) and not is_int(3.0) and not is_int("3")
    check_int("f", "n", 1)
    check_int("f", "n", np.int32(5))
    check_int("f", "n", 0, low=0)
    check_int("f", "n", None, optional=True)
    for bad in (0, -1, True, 2.0, "2", None):
        with pytest.raises(ValueError, match=rf"^f: `n` must be an int >= 1, got {bad!r}$"):
            check_int("f", "n", bad)
    with pytest.raises(ValueError, match=r"^f: `n` must be an int >= 2 or None \(why\), got 1$"):
        check_int("f", "n", 1, low=2, optional=True, note=" (why)")


def test_compiled_code_checks_without_a_graph_break():
    """Under torch.compile the CPU check is the asynchronous assert too (a host read of `ok` broke the graph at every
    check); bad values still raise, with the message."""
    import torch._dynamo

    def f(x):
        check_values((x >= 0).all(), "f: `x` must be >= 0{detail}", lambda: "")
        return x * 2

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(torch.ones(3)).graph_break_count == 0
    g = torch.compile(f, backend="aot_eager")
    torch.testing.assert_close(g(torch.ones(3)), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="f: `x` must be >= 0"):
        g(-torch.ones(3))


def test_check_fraction_is_the_one_rate_check():
    """Rates and overlaps (dropout, drop-path, HOBA overlap) share one check and one message."""
    for ok in (0, 0.0, 0.5, 0.999):
        check_fraction("f", "p", ok)
    check_fraction("f", "p", None, optional=True)
    for bad in (1.0, -0.1, True, "0.1", None):
        with pytest.raises(ValueError, match=rf"^f: `p` must be a float in \[0, 1\), got {re.escape(repr(bad))}$"):
            check_fraction("f", "p", bad)


# ------------------------------------------------------------------------------------------------ check once
def _count_checks(monkeypatch):
    """Wrap every module-level check helper of the package (``check_*`` / ``_check*`` functions, wherever imported)
    so that each call is counted; returns the counter (keys: the helper's qualified name)."""
    import collections
    import sys
    import types

    import hoformer.models  # noqa: F401  (every module a model forward can reach)

    counts = collections.Counter()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("hoformer") or mod is None:
            continue
        for attr, f in list(vars(mod).items()):
            if isinstance(f, types.FunctionType) and attr.startswith(("check_", "_check")):
                def counted(*args, _f=f, **kwargs):
                    counts[f"{_f.__module__}.{_f.__name__}"] += 1
                    return _f(*args, **kwargs)

                monkeypatch.setattr(mod, attr, counted)
    return counts


_FC = {"dim": 16, "num_heads": 2, "seq_len": 32, "pred_len": 16}
_TRAFFIC = {"dim": 16, "num_heads": 2, "num_nodes": 6, "window": 4, "horizon": 2}
_GRID = {"dim": 16, "num_heads": 2, "input_size": 8}
#: every registered model with a depth: (name, its depth argument, small sizes)
_DEPTH_MODELS = [("hot_forecaster", "depth", _FC), ("hot_forecaster_official", "depth", _FC),
                 ("hot_causal_forecaster", "depth", _FC), ("hot_volume_classifier", "depth", _GRID),
                 ("hot_segmenter", "depth", _GRID), ("hoba_classifier", "depth", {"dim": 16, "num_heads": 2}),
                 ("traffic_hot", "num_layers", _TRAFFIC), ("traffic_alternating", "num_layers", _TRAFFIC),
                 ("traffic_full_attention", "num_layers", _TRAFFIC)]


@pytest.mark.parametrize("name,depth_arg,kw", _DEPTH_MODELS, ids=[m[0] for m in _DEPTH_MODELS])
def test_a_model_forward_runs_as_many_checks_at_any_depth(name, depth_arg, kw, monkeypatch):
    """Inputs are checked once, at the public entry: a model's forward (training mode, and eval mode without
    gradients, where the causal forecaster decodes step by step) runs the same check calls at depth 1 and 6, and
    no layer repeats the checks of its arguments that are constant (mode indices in range) after the first call."""
    from hoformer.models import create_model

    counts = _count_checks(monkeypatch)
    seen = {}
    for depth in (1, 6):
        torch.manual_seed(0)
        model = create_model(name, **{depth_arg: depth}, **kw)
        args, kwargs = model.example_inputs()
        model(*args, **kwargs)  # lazily built layers and the once-per-module checks
        for mode in ("train", "eval"):
            model.train(mode == "train")
            counts.clear()
            with torch.set_grad_enabled(mode == "train"):
                model(*args, **kwargs)
            seen[depth, mode] = dict(counts)
    for mode in ("train", "eval"):
        assert seen[1, mode], f"{mode}: no check ran"  # an empty count would make the comparison vacuous
        assert seen[1, mode] == seen[6, mode], (mode, seen[1, mode], seen[6, mode])
        assert not {k for k in seen[6, mode] if k.endswith(("_check_rope_modes", "_check_causal_range"))}


def test_masks_are_checked_once_per_layer_call(monkeypatch):
    """A Kronecker layer with a mask per mode checks ``x``, the masks and its output once (the softmax of each factor
    does not check its mask again), and an encoder of six such layers checks them once for all."""
    from hoformer.layers import Encoder, KroneckerAttention

    x = torch.randn(2, 3, 4, 16)
    masks = [torch.ones(3, 3, dtype=torch.bool).tril(), torch.ones(2, 4, 4, dtype=torch.bool)]
    layer = KroneckerAttention(16, 2, num_modes=2, rope_modes=(0, 1))
    enc = Encoder(16, depth=6, num_heads=2, attention="kronecker_product", num_modes=2, rope_modes=(0, 1))
    counts = _count_checks(monkeypatch)
    for module in (layer, enc):
        counts.clear()
        module(x, masks=masks)
        assert dict(counts) == {"hoformer.layers._common._check_x": 1, "hoformer.layers._common._check_dtype": 1,
                                "hoformer.layers._common._check_masks": 1, "hoformer._checks.check_finite_output": 1}
