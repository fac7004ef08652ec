"""Registry-wide model checks (every registered model, every family) and the HOT models' public API."""
from __future__ import annotations

import inspect
import json
import os
import re
import stat
import sys
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hoformer import __version__ as hoformer_version_str
from hoformer.layers import ATTENTION_TYPES, record_attention
from hoformer.models import HoformerModel, create_model, from_pretrained, list_models
from hoformer.models.hot import FORECAST_ATTENTIONS

from _outputs import float_outputs, tensors
from _pretrained import restamp_config
from _small import small_model

ALL_MODELS = list_models()
D64 = torch.float64
HOT_ATTENTIONS = ["kronecker_product", "kronecker_sum", "kronecker_linear", "full", "axial", "divided"]
FORECAST_ALL = HOT_ATTENTIONS + sorted(FORECAST_ATTENTIONS)




def test_registry_has_hot_models():
    for name in ("hot_forecaster", "hot_volume_classifier", "hot_segmenter"):
        assert name in ALL_MODELS


@pytest.fixture
def registry(monkeypatch):
    """The registry module with a private copy of the table: registrations made by a test do not leak."""
    from hoformer.models import registry as reg

    monkeypatch.setattr(reg, "_REGISTRY", dict(reg._REGISTRY))
    return reg


class _Tiny(HoformerModel):
    """A minimal model class for registry tests.

    Args:
        width: hidden width.
        kind: a string choice.
    """

    def __init__(self, width: int = 3, kind: str = "a") -> None:
        super().__init__()
        self.record_config(locals())
        self.lin = torch.nn.Linear(width, 1)
        self.kind = kind

    def forward(self, x):
        return self.lin(x)

    def example_inputs(self, batch_size: int = 2):
        return (torch.randn(batch_size, self.lin.in_features),), {}


def test_register_model_names_and_duplicates(registry):
    class TinyModelA(_Tiny):
        pass

    assert registry.register_model(TinyModelA) is TinyModelA  # default name: the class name
    assert registry.is_model("TinyModelA") and registry._REGISTRY["TinyModelA"] == (TinyModelA, {})
    assert registry.register_model(TinyModelA) is TinyModelA  # the same class and preset again: a no-op

    class Other(_Tiny):
        pass

    with pytest.raises(ValueError, match="a model named 'TinyModelA' is already registered"):
        registry.register_model(name="TinyModelA")(Other)
    with pytest.raises(ValueError, match="already registered"):  # same class, another preset: still taken
        registry.register_model(TinyModelA, name="TinyModelA", preset={"width": 4})
    assert registry._REGISTRY["TinyModelA"] == (TinyModelA, {})  # the first registration is kept
    with pytest.raises(ValueError, match="already registered"):
        registry.register_model(name="hot_forecaster")(Other)  # a built-in name is protected too
    assert registry.register_model(name="tiny_model_b")(Other) is Other  # decorator with a name returns the class
    assert registry.is_model("tiny_model_b") and not registry.is_model("Other")
    with pytest.raises(TypeError, match="`name` must be a str"):
        registry.register_model(name=3)
    with pytest.raises(ValueError, match="`name` must be a non-empty str"):
        registry.register_model(name="")
    with pytest.raises(TypeError, match="expected a HoformerModel subclass"):
        registry.register_model(name="not_a_class")(42)

    def factory(width: int = 3):  # a factory function is not a registrable model: the class is
        return _Tiny(width)

    with pytest.raises(TypeError, match="expected a HoformerModel subclass"):
        registry.register_model(name="a_factory")(factory)
    with pytest.raises(TypeError, match="expected a HoformerModel subclass"):
        registry.register_model(torch.nn.Linear, name="a_module")
    with pytest.raises(ValueError, match=r"`preset` names \['depth'\], which Other does not take"):
        registry.register_model(Other, name="tiny_bad_preset", preset={"depth": 2})
    with pytest.raises(TypeError, match="`preset` must be a dict"):
        registry.register_model(Other, name="tiny_bad_preset", preset=[("width", 2)])
    assert not any(registry.is_model(n) for n in ("not_a_class", "a_factory", "a_module", "tiny_bad_preset"))


def test_is_model_list_models_create_model(registry):
    class TinyX(_Tiny):
        pass

    registry.register_model(TinyX, name="tiny_x_1")
    registry.register_model(TinyX, name="tiny_x_2", preset={"width": 5})

    assert registry.is_model("hot_forecaster") and not registry.is_model("hot_forecasterr")
    assert not registry.is_model(None) and not registry.is_model(["hot_forecaster"])
    everything = registry.list_models()
    assert everything == sorted(everything) and {"tiny_x_1", "tiny_x_2", "hot_forecaster"} <= set(everything)
    assert registry.list_models("tiny_x_*") == ["tiny_x_1", "tiny_x_2"]
    assert registry.list_models("tiny_x_[2]") == ["tiny_x_2"]
    assert registry.list_models("hot_*") == sorted(n for n in everything if n.startswith("hot_"))
    assert registry.list_models("TINY_X_*") == []  # case-sensitive on every platform
    assert registry.list_models("no_such_*") == []
    with pytest.raises(TypeError, match="`pattern` must be a str"):
        registry.list_models(None)
    with pytest.raises(ValueError, match=r"create_model: unknown model name 'tiny_x_3' \(did you mean 'tiny_x_2' or "
                                         r"'tiny_x_1'\?\); available: \[.*'tiny_x_1'"):
        registry.create_model("tiny_x_3")
    with pytest.raises(ValueError, match="unknown model name 3"):
        registry.create_model(3)
    m = registry.create_model("hot_forecaster", dim=16, num_heads=2, depth=1)
    assert m.config["name"] == "hot_forecaster" and m.config["kwargs"]["dim"] == 16
    # a preset: the class with those arguments fixed; a saved config may repeat them, not change them
    m = registry.create_model("tiny_x_2", kind="b")
    assert type(m) is TinyX and m.config == {"name": "tiny_x_2", "kwargs": {"width": 5, "kind": "b"}}
    repeated = registry.create_model("tiny_x_2", width=5).config
    assert repeated == {"name": "tiny_x_2", "kwargs": {"width": 5, "kind": "a"}}
    with pytest.raises(ValueError, match=r"'tiny_x_2' is TinyX with \{'width': 5\}; it cannot take \{'width': 6\}"):
        registry.create_model("tiny_x_2", width=6)
    # built from the class directly: the most specific registration whose preset matches names it
    assert TinyX(width=5).config["name"] == "tiny_x_2" and TinyX(width=4).config["name"] == "tiny_x_1"


def test_direct_construction_records_the_same_config_as_create_model():
    """However a model is built (create_model, its class, a subclass nobody registered), ``config`` holds its name
    (registered, else the class path) and every constructor argument with defaults applied."""
    from hoformer.models import HOTForecaster, TrafficTransformer

    direct = HOTForecaster(dim=16, num_heads=2)
    assert direct.config == create_model("hot_forecaster", dim=16, num_heads=2).config
    assert direct.config["kwargs"]["seq_len"] == 96 and direct.config["kwargs"]["head"] == "flatten"
    pos = HOTForecaster(48, 24, 3, "kronecker_sum", dim=16, num_heads=2)  # positional arguments bind by name
    assert pos.config["kwargs"]["seq_len"] == 48 and pos.config["kwargs"]["attention"] == "kronecker_sum"
    with pytest.raises(TypeError, match="positional"):  # the options are keyword-only
        HOTForecaster(48, 24, 3, "kronecker_sum", 16)
    assert TrafficTransformer(layout="kronecker", num_nodes=5).config == create_model("traffic_hot", num_nodes=5).config
    assert TrafficTransformer(layout="alternating").config["name"] == "traffic_alternating"
    odd = TrafficTransformer(layout="temporal", num_nodes=5)  # a layout no registered name fixes: the class path
    assert odd.config["name"] == "hoformer.models.weaver.TrafficTransformer"

    class MyForecaster(HOTForecaster):  # a subclass is not its parent's registered name
        pass

    sub = MyForecaster(dim=16, num_heads=2)
    assert sub.config["name"].endswith("MyForecaster") and sub.config["kwargs"] == direct.config["kwargs"]


def test_a_model_records_its_own_constructor_arguments_only(registry):
    """``record_config(locals())`` in a parent's constructor that a subclass's runs records nothing the subclass does
    not replace: the configuration is that of ``type(self)``'s constructor; a constructor that records nothing is
    refused by ``create_model`` and ``save_pretrained`` with the call to add. No metaclass: the class's signature is
    its constructor's."""
    class Wider(_Tiny):
        """Args:
            depth: layers.
            width: hidden width.
        """

        def __init__(self, depth: int = 2, width: int = 4) -> None:
            super().__init__(width=width * 2)
            self.record_config(locals())

    assert Wider(depth=3).config["kwargs"] == {"depth": 3, "width": 4}
    assert type(Wider) is type(torch.nn.Module)
    assert list(inspect.signature(Wider).parameters) == ["depth", "width"]

    class Silent(HoformerModel):
        def __init__(self, depth: int = 2) -> None:
            super().__init__()

    registry.register_model(Silent, name="silent_model")
    with pytest.raises(TypeError, match=r"Silent recorded no configuration: .*self.record_config\(locals\(\)\)"):
        registry.create_model("silent_model")
    with pytest.raises(ValueError, match=r"has no `config`.*self.record_config\(locals\(\)\)"):
        Silent().save_pretrained("unused")


def test_class_path_configs_round_trip(tmp_path):
    from hoformer.models import TrafficTransformer

    torch.manual_seed(0)
    model = TrafficTransformer(layout="temporal", num_layers=1, num_nodes=5, window=6, horizon=4, dim=8,
                               num_heads=2).eval()
    loaded = from_pretrained(model.save_pretrained(tmp_path / "m"))
    assert type(loaded) is TrafficTransformer and loaded.config == model.config and loaded.modes == ["temporal"]
    from hoformer.models import model_from_config

    rebuilt = model_from_config(json.loads(json.dumps(model.config)))
    assert type(rebuilt) is TrafficTransformer and rebuilt.config == model.config
    assert model_from_config(create_model("traffic_hot").config).config == create_model("traffic_hot").config
    with pytest.raises(ValueError, match="'name' and 'kwargs'"):
        model_from_config({"name": "hot_forecaster"})
    args, kwargs = model.example_inputs(batch_size=1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(*args, **kwargs), model(*args, **kwargs), rtol=0, atol=0)
    # only HoformerModel subclasses load; a module outside hoformer is never imported because a file names it
    for name, why in (("os.system", "does not name a HoformerModel subclass"),
                      ("not_imported_pkg.Model", "does not name a HoformerModel subclass"),
                      ("hoformer.models.no_such_module.Model", "cannot import"),
                      ("no_such_model", "unknown model name")):
        cfg = json.loads((tmp_path / "m" / "config.json").read_text())
        cfg["name"] = name
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors").write_bytes((tmp_path / "m" / "model.safetensors").read_bytes())
        with pytest.warns(UserWarning, match="trust_edited_config=True"), pytest.raises(ValueError, match=why):
            from_pretrained(d, trust_edited_config=True)
    assert "not_imported_pkg" not in sys.modules


def test_model_constructors_are_typed_and_documented():
    """jsonargparse builds models from their class and shows each argument's type, default and docstring text."""
    import typing

    from hoformer.layers import ATTENTION_TYPES
    from hoformer.models.base import constructor_signature
    from hoformer.models.hot import AttentionName, ForecastAttentionName
    from hoformer.models.registry import _REGISTRY

    assert set(typing.get_args(AttentionName)) == set(ATTENTION_TYPES)
    assert set(typing.get_args(ForecastAttentionName)) == set(ATTENTION_TYPES) | set(FORECAST_ATTENTIONS)
    for name, (cls, _) in _REGISTRY.items():
        hints = {}  # a forwarded argument is typed where it is declared (hot.HOTModel for the HOT models)
        for klass in reversed(cls.__mro__):
            if "__init__" in vars(klass) and issubclass(klass, HoformerModel):
                hints.update(typing.get_type_hints(klass.__init__))
        doc = inspect.getdoc(cls) or ""
        assert "Args:" in doc, f"{cls.__name__}: docstring without an Args: section"
        for p in constructor_signature(cls).parameters.values():
            assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), f"{cls.__name__}: *args / unresolved **kwargs"
            assert p.name in hints, f"{cls.__name__}.{p.name} has no type annotation"
            # alone, or in a group of arguments described together (``num_nodes, window: ...``)
            assert re.search(rf"^\s+(\w+, )*{p.name}(, \w+)*:", doc, re.M), \
                f"{cls.__name__}: `{p.name}` not documented under Args"


def test_hot_models_declare_their_shared_arguments_once():
    """The HOT models take :class:`~hoformer.models.hot.HOTModel`'s arguments through ``**kwargs``: each has all of
    them (resolved, in ``config`` and in jsonargparse's help), names one itself only to change its default or type,
    and a value off the default reaches the encoder."""
    import typing

    from hoformer.models.base import constructor_signature
    from hoformer.models.hot import HOTModel
    from hoformer.models.registry import _REGISTRY

    shared = constructor_signature(HOTModel).parameters
    hot = sorted(name for name, (cls, _) in _REGISTRY.items() if issubclass(cls, HOTModel))
    assert hot == ["hot_causal_forecaster", "hot_forecaster", "hot_forecaster_official", "hot_segmenter",
                   "hot_volume_classifier"]
    for name in hot:
        cls = _REGISTRY[name].cls
        assert set(shared) <= set(constructor_signature(cls).parameters), name
        for klass in cls.__mro__[:cls.__mro__.index(HOTModel)]:
            if "__init__" not in vars(klass):
                continue
            hints = typing.get_type_hints(klass.__init__)
            for p in list(inspect.signature(klass.__init__).parameters.values())[1:]:
                if p.name in shared:  # re-declared: with another default or a wider type
                    assert (p.default != shared[p.name].default
                            or hints[p.name] != typing.get_type_hints(HOTModel.__init__)[p.name]), \
                        f"{klass.__name__} repeats HOTModel's `{p.name}`"
    sizes = {"hot_segmenter": dict(input_size=16), "hot_volume_classifier": dict(input_size=8)}
    off = dict(dim=16, num_heads=2, depth=1, d_mlp=12, mlp_bias=False, kronecker_pool="mean", qk_bias=True,
               rope_theta=100.0, drop_path=0.0)
    for name in hot:
        model = create_model(name, **sizes.get(name, {}), **off)
        assert {k: model.config["kwargs"][k] for k in off} == off
        assert len(model.encoder.blocks) == 1
        attn, mlp = model.encoder.blocks[0].attn, model.encoder.blocks[0].mlp
        first = next(m for m in mlp.modules() if isinstance(m, torch.nn.Linear))
        assert (first.in_features, first.bias) == (16, None) and first.out_features in (12, 24), name  # SwiGLU: 2x
        assert (attn.pool, attn.qk_bias) == ("mean", True), name


def test_constructor_signature_resolves_forwarded_kwargs(registry):
    """A ``**kwargs`` forwarded to the parent's constructor stands for the parent's arguments the child does not name,
    with the nearest default; the configuration records them; a ``**kwargs`` forwarded to nothing is refused."""
    from hoformer.models.base import constructor_signature

    class Base(HoformerModel):
        def __init__(self, *, width: int = 4, depth: int = 2) -> None:
            super().__init__()
            self.width, self.depth = width, depth

    class Mid(Base):
        def __init__(self, channels: int = 1, depth: int = 6, **kwargs) -> None:
            super().__init__(depth=depth, **kwargs)
            self.record_config(locals())

    class Leaf(Mid):
        def __init__(self, channels: int = 3, **kwargs) -> None:
            super().__init__(channels=channels, **kwargs)
            self.record_config(locals())

    sig = constructor_signature(Leaf)
    assert [(p.name, p.default, p.kind.name) for p in sig.parameters.values()] == [
        ("channels", 3, "POSITIONAL_OR_KEYWORD"), ("depth", 6, "KEYWORD_ONLY"), ("width", 4, "KEYWORD_ONLY")]
    leaf = Leaf(width=8)
    assert leaf.config["kwargs"] == {"channels": 3, "depth": 6, "width": 8} and (leaf.depth, leaf.width) == (6, 8)
    assert Mid(depth=1).config["kwargs"] == {"channels": 1, "depth": 1, "width": 4}

    class Loose(HoformerModel):
        def __init__(self, width: int = 4, **kwargs) -> None:
            super().__init__()
            self.record_config(locals())

    assert "kwargs" in constructor_signature(Loose).parameters
    with pytest.raises(TypeError, match=r"Loose: .*`\*\*kwargs` cannot be recorded"):
        Loose()


def test_jsonargparse_builds_models_from_class_path():
    jsonargparse = pytest.importorskip("jsonargparse")

    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--model", type=HoformerModel)
    cfg = parser.parse_args(["--model", "hoformer.models.HOTForecaster", "--model.dim", "16",
                             "--model.num_heads", "2", "--model.attention", "kronecker_sum"])
    model = parser.instantiate_classes(cfg).model
    assert model.config == create_model("hot_forecaster", dim=16, num_heads=2, attention="kronecker_sum").config
    with pytest.raises(jsonargparse.ArgumentError):  # a Literal choice is checked at parse time
        parser.parse_args(["--model", "hoformer.models.HOTForecaster", "--model.attention", "kronecker_prod"])


# ----------------------------------------------------------------------------------------- every model
@pytest.mark.parametrize("name", ALL_MODELS)
def test_forward_backward_every_param_gets_grad(name):
    torch.manual_seed(0)
    model = small_model(name)
    assert isinstance(model, HoformerModel)
    args, kwargs = model.example_inputs(batch_size=2)
    model.train()
    outs = float_outputs(model, args, kwargs)
    assert outs, f"{name}: forward returned no floating-point tensor"
    for t in outs:
        assert torch.isfinite(t).all(), f"{name}: non-finite output"
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:  # parameter-free baselines (e.g. last value): nothing to train, no output asks for a gradient
        assert not any(t.requires_grad for t in outs), f"{name}: output requires grad without trainable parameters"
        return
    loss = sum(t.float().square().mean() for t in outs if t.requires_grad)
    loss.backward()
    missing = [n for n, p in params if p.grad is None]
    assert not missing, f"{name}: parameters without gradient: {missing[:8]}"
    bad = [n for n, p in params if not torch.isfinite(p.grad).all()]
    assert not bad, f"{name}: non-finite gradients: {bad[:8]}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_bf16_autocast_and_bf16_weights(name):
    """Device-agnostic low precision, checked on CPU: under bf16 autocast (what `precision="bf16-mixed"` does) every
    model's forward + backward is finite and close to float32; with bf16 weights and inputs (`precision="bf16-true"`)
    the forward is finite and floating outputs stay bf16 (fp32-only internals such as entmax cast back)."""
    torch.manual_seed(0)
    model = small_model(name).eval()  # eval: no dropout, so fp32 and bf16 runs see the same function
    args, kwargs = model.example_inputs(batch_size=2)
    ref = float_outputs(model, args, kwargs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = float_outputs(model, args, kwargs)
    assert len(outs) == len(ref)
    for o, r in zip(outs, ref):
        assert torch.isfinite(o).all(), f"{name}: non-finite output under bf16 autocast"
        err = (o.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1e-6)
        assert err < 0.1, f"{name}: bf16 autocast output differs from float32 by {err:.3f} (relative to max)"
    if any(p.requires_grad for p in model.parameters()) and any(t.requires_grad for t in outs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = sum(t.float().square().mean() for t in float_outputs(model, args, kwargs) if t.requires_grad)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    to16 = lambda t: t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        outs = float_outputs(model, [to16(a) for a in args], {k: to16(v) for k, v in kwargs.items()})
    for o in outs:
        assert torch.isfinite(o).all(), f"{name}: non-finite output with bf16 weights"
        assert o.dtype == torch.bfloat16, f"{name}: bf16 model returned {o.dtype}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_save_pretrained_round_trip_identical(name, tmp_path):
    torch.manual_seed(0)
    model = small_model(name).eval()
    args, kwargs = model.example_inputs(batch_size=1)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = from_pretrained(tmp_path / "m")  # no .eval(): from_pretrained returns an inference-ready model
    assert loaded.training is False and not any(m.training for m in loaded.modules())
    assert type(loaded) is type(model) and loaded.config == json.loads(json.dumps(model.config))
    with torch.no_grad():
        ref = tensors(model(*args, **kwargs))
        first, second = tensors(loaded(*args, **kwargs)), tensors(loaded(*args, **kwargs))
    assert len(ref) == len(first) == len(second)
    for a, b, c in zip(ref, first, second):
        torch.testing.assert_close(b, c, rtol=0, atol=0)  # deterministic: dropout is off
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("map_location", [
    "cpu", torch.device("cpu"),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
    pytest.param(torch.device("cuda", 0), marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
])
def test_from_pretrained_map_location_places_whole_model(map_location, tmp_path):
    torch.manual_seed(0)
    model = create_model("hot_forecaster", dim=16, num_heads=2, seq_len=32, pred_len=8, num_variates=3)
    d = model.save_pretrained(tmp_path / "m")
    loaded = from_pretrained(d, map_location=map_location)
    want = torch.device(map_location)
    tensors = list(loaded.parameters()) + list(loaded.buffers())
    assert tensors and all(t.device.type == want.type for t in tensors)
    x = torch.randn(2, 32, 3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x.to(want)).cpu(), model.eval()(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="map_location"):
        from_pretrained(d, map_location="no_such_device")


@pytest.mark.parametrize("name", ALL_MODELS)
def test_from_pretrained_rejects_tampered_weights(name, tmp_path):
    model = create_model(name)
    d = model.save_pretrained(tmp_path / "m")
    state = load_file(str(d / "model.safetensors"))
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()  # keep the save_id: this test is about the tensor keys
    # an injected key is rejected for every model, parameter-free baselines (empty state) included
    save_file({**state, "not_a_parameter": torch.zeros(1)}, str(d / "model.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="do not match"):
        from_pretrained(d)
    if state:  # a removed key: only models with weights have one to remove
        key = sorted(state)[0]
        save_file({k: v for k, v in state.items() if k != key}, str(d / "model.safetensors"), metadata=meta)
        with pytest.raises(ValueError, match="do not match"):
            from_pretrained(d)
    save_file(state, str(d / "model.safetensors"), metadata=meta)  # restored: loads again
    assert from_pretrained(d).state_dict().keys() == model.state_dict().keys()


def test_from_pretrained_mismatched_config_and_corrupt_files(tmp_path):
    model = create_model("hot_forecaster", dim=32, num_heads=4)
    d = model.save_pretrained(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["kwargs"]["dim"] = 64  # weights were saved for dim 32
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="not the configuration model.safetensors was saved with"):
        from_pretrained(d)
    restamp_config(d, lambda c: c["kwargs"].update(dim=64))  # consistent files, weights of another shape
    with pytest.raises(ValueError, match="(?s)do not fit.*size mismatch"):
        from_pretrained(d)
    restamp_config(d, lambda c: c.update(kwargs={"attention": "no_such_attention"}))
    with pytest.raises(ValueError, match="attention"):
        from_pretrained(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_pretrained(d)
    (d / "config.json").write_text(json.dumps({"name": "hot_forecaster"}))
    with pytest.raises(ValueError, match="kwargs"):
        from_pretrained(d)
    model.save_pretrained(tmp_path / "ok")
    (tmp_path / "ok" / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ValueError, match="cannot read weights"):
        from_pretrained(tmp_path / "ok")


def _set_default(monkeypatch, fn, param, value):
    """Simulate a later release changing the default of ``param`` of function ``fn``."""
    if param in (fn.__kwdefaults__ or {}):  # keyword-only
        monkeypatch.setattr(fn, "__kwdefaults__", {**fn.__kwdefaults__, param: value})
        return
    names = fn.__code__.co_varnames[: fn.__code__.co_argcount]
    defaults = list(fn.__defaults__)
    defaults[names.index(param) - (len(names) - len(defaults))] = value
    monkeypatch.setattr(fn, "__defaults__", tuple(defaults))


def test_config_records_fully_bound_constructor_arguments():
    from hoformer.models.base import constructor_signature
    from hoformer.models.hot import HOTForecaster
    from hoformer.models.weaver import TrafficTransformer

    kw = create_model("hot_forecaster", dim=32, num_heads=4).config["kwargs"]
    assert kw["dim"] == 32 and kw["depth"] == 2 and kw["dropout"] == 0.1
    assert set(kw) == set(constructor_signature(HOTForecaster).parameters)
    assert {"seq_len", "head", "dim", "kronecker_pool", "d_mlp"} <= set(kw)  # its own and the shared HOTModel ones
    # a preset: the class's arguments, the preset's among them
    kw = create_model("traffic_hot", dim=32, num_heads=4).config["kwargs"]
    assert kw["num_layers"] == 2 and kw["dim"] == 32 and kw["mlp_ratio"] == 2.0 and kw["num_nodes"] == 207
    assert kw["layout"] == "kronecker"
    assert set(kw) == set(list(inspect.signature(TrafficTransformer.__init__).parameters)[1:])
    assert constructor_signature(TrafficTransformer).parameters == inspect.signature(TrafficTransformer).parameters
    kw = create_model("hoba_classifier", depth=1).config["kwargs"]
    assert kw["depth"] == 1 and kw["vocab_size"] == 8000 and kw["attention"] == "hoba"
    for name in ALL_MODELS:  # rebuilding from the recorded arguments records the same arguments
        cfg = json.loads(json.dumps(create_model(name).config))
        assert create_model(cfg["name"], **cfg["kwargs"]).config == cfg


@pytest.mark.parametrize("name,kw,patch", [
    # a default of the shared HOT arguments, which reach the forecaster through **kwargs
    ("hot_forecaster", dict(dim=16, num_heads=2), [("hot", "HOTModel.__init__", "depth", 3)]),
    ("traffic_hot", dict(num_nodes=5), [("weaver", "TrafficTransformer.__init__", "dim", 32),
                                         ("weaver", "TrafficTransformer.__init__", "num_layers", 1)]),
])
def test_checkpoint_survives_default_changes(name, kw, patch, tmp_path, monkeypatch):
    """A checkpoint rebuilds the saved architecture even if a later release changes a constructor default."""
    import importlib

    torch.manual_seed(0)
    model = create_model(name, **kw).eval()
    d = model.save_pretrained(tmp_path / "m")
    for module, attr, param, value in patch:
        obj = importlib.import_module(f"hoformer.models.{module}")
        for part in attr.split("."):
            obj = getattr(obj, part)
        _set_default(monkeypatch, obj, param, value)
    rebuilt = {k: v.shape for k, v in create_model(name, **kw).state_dict().items()}
    assert rebuilt != {k: v.shape for k, v in model.state_dict().items()}  # the defaults did change
    loaded = from_pretrained(d)
    assert loaded.config == json.loads(json.dumps(model.config))
    args, kwargs = model.example_inputs(batch_size=1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(*args, **kwargs), model(*args, **kwargs), rtol=0, atol=0)


def test_from_pretrained_warns_on_version_mismatch(tmp_path):
    import hoformer

    d = create_model("hot_forecaster", dim=16, num_heads=2).save_pretrained(tmp_path / "m")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*hoformer")
        from_pretrained(d)  # same version: no warning
    cfg = json.loads((d / "config.json").read_text())
    cfg["hoformer_version"] = "0.0.1.dev0"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match=rf"hoformer 0\.0\.1\.dev0.*hoformer {re.escape(hoformer.__version__)}"):
        from_pretrained(d)


def test_from_pretrained_loads_legacy_explicit_kwargs_config(tmp_path):
    """Directories written before full argument recording (explicit kwargs only, no save_id) still load."""
    torch.manual_seed(0)
    model = create_model("hot_forecaster", dim=16, num_heads=2).eval()
    d = tmp_path / "legacy"
    d.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps({"hoformer_version": hoformer_version_str, "name": "hot_forecaster",
                                               "kwargs": {"dim": 16, "num_heads": 2}}))
    loaded = from_pretrained(d)
    x = torch.randn(1, 96, 7)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_from_pretrained_names_a_removed_constructor_argument(tmp_path):
    model = create_model("hot_forecaster", dim=16, num_heads=2)
    d = model.save_pretrained(tmp_path / "m")
    restamp_config(d, lambda c: c["kwargs"].update(qk_normalisation=True))  # e.g. an argument a later release renamed
    with pytest.raises(ValueError, match="qk_normalisation"):
        from_pretrained(d)


def test_model_classes_keep_their_constructor_signature():
    import inspect

    from hoformer.models.hot import HOTForecaster

    assert list(inspect.signature(HOTForecaster).parameters)[:3] == ["seq_len", "pred_len", "num_variates"]


def _fail_on_call(monkeypatch, target, attr, n):
    """Make the ``n``-th call (1-based) of ``target.attr`` raise, simulating a crash at that point."""
    real, calls = getattr(target, attr), []

    def wrapper(*a, **k):
        calls.append(a)
        if len(calls) == n:
            raise OSError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(target, attr, wrapper)


def test_save_pretrained_interrupted_between_weights_and_config(tmp_path, monkeypatch):
    """A save that dies after the weights are in place but before the config is never loaded as a silent mix."""
    torch.manual_seed(0)
    old = create_model("hot_forecaster", dim=16, num_heads=2)
    d = old.save_pretrained(tmp_path / "m")
    new = create_model("hot_forecaster", dim=16, num_heads=2)  # same architecture, other weights
    _fail_on_call(monkeypatch, os, "replace", 2)  # the second rename: the config's
    with pytest.raises(OSError, match="simulated crash"):
        new.save_pretrained(d)
    monkeypatch.undo()
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]  # no temporary left
    with pytest.raises(ValueError, match="different save_pretrained calls"):
        from_pretrained(d)
    new.save_pretrained(d)  # saving again repairs the directory
    torch.testing.assert_close(from_pretrained(d).state_dict(), new.state_dict(), rtol=0, atol=0)


def test_save_pretrained_failure_while_writing_keeps_previous_save(tmp_path, monkeypatch):
    """A failure while the files are being written leaves the previous complete save loadable."""
    torch.manual_seed(0)
    old = create_model("hot_forecaster", dim=16, num_heads=2)
    d = old.save_pretrained(tmp_path / "m")
    new = create_model("hot_forecaster", dim=16, num_heads=2)
    _fail_on_call(monkeypatch, type(d), "write_text", 1)  # the config write
    with pytest.raises(OSError, match="simulated crash"):
        new.save_pretrained(d)
    monkeypatch.undo()
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]
    torch.testing.assert_close(from_pretrained(d).state_dict(), old.state_dict(), rtol=0, atol=0)


def test_atomic_write_fsyncs_file_and_directory(tmp_path, monkeypatch):
    from hoformer._io import atomic_write

    synced, real_fsync, proc = [], os.fsync, os.path.exists("/proc/self/fd")

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if proc else fd)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "out.txt"
    atomic_write(target, lambda p: open(p, "w").write("hello"))
    assert target.read_text() == "hello"
    if proc:
        tmp_files = [s for s in synced if os.path.basename(s).startswith(".out.txt.")]
        assert tmp_files and synced.index(tmp_files[0]) < synced.index(str(tmp_path))  # file first, then dir
    else:
        assert len(synced) >= 2



@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_atomic_write_leaves_the_permissions_of_a_plain_open(tmp_path):
    """A new file gets 0o666 minus the umask (not mkstemp's 0o600); a rewritten file keeps its own mode."""
    from hoformer._io import atomic_write

    old = os.umask(0o027)
    try:
        new = tmp_path / "new.txt"
        atomic_write(new, lambda tmp: open(tmp, "w").write("a"))
        assert stat.S_IMODE(new.stat().st_mode) == 0o640
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        os.chmod(kept, 0o604)
        atomic_write(kept, lambda tmp: open(tmp, "w").write("b"))
        assert stat.S_IMODE(kept.stat().st_mode) == 0o604 and kept.read_text() == "b"
    finally:
        os.umask(old)


def test_atomic_write_into_a_new_directory_persists_its_entry(tmp_path, monkeypatch):
    """A directory created for the file is itself made durable: its parent is fsynced (then the new directory after
    the rename); an existing directory's parent is not."""
    import hoformer._io as io

    synced = []
    monkeypatch.setattr(io, "fsync_dir", lambda p: synced.append(os.fspath(p)))
    io.atomic_write(tmp_path / "a" / "f.txt", lambda tmp: open(tmp, "w").write("x"))
    assert synced == [os.fspath(tmp_path), os.fspath(tmp_path / "a")]
    synced.clear()
    io.atomic_write(tmp_path / "a" / "g.txt", lambda tmp: open(tmp, "w").write("y"))
    assert synced == [os.fspath(tmp_path / "a")]

# -------------------------------------------------------------------------------- HOT public API shapes
@pytest.mark.parametrize("attention", FORECAST_ALL)
def test_forecaster_api_shape(attention):
    m = create_model("hot_forecaster", seq_len=96, pred_len=96, num_variates=7, attention=attention).eval()
    with torch.no_grad():
        y = m(torch.randn(2, 96, 7))
    assert y.shape == (2, 96, 7) and torch.isfinite(y).all()


@pytest.mark.parametrize("attention", HOT_ATTENTIONS)
def test_volume_classifier_api_shape(attention):
    m = create_model("hot_volume_classifier", in_channels=1, input_size=28, num_classes=2, attention=attention).eval()
    with torch.no_grad():
        y = m(torch.rand(2, 1, 28, 28, 28))
    assert y.shape == (2, 2) and torch.isfinite(y).all()


@pytest.mark.parametrize("attention", HOT_ATTENTIONS)
def test_segmenter_api_shape(attention):
    m = create_model("hot_segmenter", in_channels=7, num_classes=17, input_size=64, attention=attention).eval()
    with torch.no_grad():
        y = m(torch.randn(2, 7, 64, 64))
    assert y.shape == (2, 17, 64, 64) and torch.isfinite(y).all()


@pytest.mark.parametrize("attention", sorted(ATTENTION_TYPES))
def test_every_layer_attention_is_accepted(attention):
    """A new attention type in hoformer.layers is usable by every HOT model without model changes: it builds and
    runs a forward pass on the model's example inputs with the right output shape, finite values, and (training)
    a finite gradient reaching the attention layer's parameters."""
    tiny = dict(attention=attention, dim=16, num_heads=2, depth=1)
    cases = [
        (create_model("hot_forecaster", seq_len=16, pred_len=4, num_variates=3, **tiny), (2, 4, 3)),
        (create_model("hot_volume_classifier", input_size=8, num_classes=3, **tiny), (2, 3)),
        (create_model("hot_segmenter", in_channels=2, num_classes=5, input_size=16, **tiny), (2, 5, 16, 16)),
    ]
    for model, shape in cases:
        args, kwargs = model.example_inputs(batch_size=2)
        y = model.train()(*args, **kwargs)
        assert y.shape == shape and torch.isfinite(y).all(), (type(model).__name__, tuple(y.shape))
        y.square().mean().backward()
        grads = [p.grad for p in model.encoder.blocks[0].attn.parameters()]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads), type(model).__name__
        with torch.no_grad():
            y = model.eval()(*args, **kwargs)
        assert y.shape == shape and torch.isfinite(y).all()


# ------------------------------------------------------------------------------------- HOT behaviour
@pytest.mark.parametrize("attention", FORECAST_ALL)
def test_forecaster_permutation_equivariant_over_variates(attention):
    """No positional code on the variate mode: permuting input variates permutes the forecast."""
    torch.manual_seed(1)
    m = create_model("hot_forecaster", seq_len=32, pred_len=8, num_variates=5, attention=attention, dim=32,
                     num_heads=4).eval().double()
    x, perm = torch.randn(2, 32, 5, dtype=torch.float64), torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(m(x[..., perm]), m(x)[..., perm])


def test_forecaster_revin_affine_equivariance():
    """RevIN: forecasting a * x + b per variate gives a * f(x) + b."""
    m = create_model("hot_forecaster", seq_len=32, pred_len=8, num_variates=3, dim=32, num_heads=4).eval().double()
    x = torch.randn(2, 32, 3, dtype=torch.float64)
    a, b = torch.tensor([2.0, 0.5, 10.0], dtype=torch.float64), torch.tensor([-3.0, 100.0, 0.0], dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x * a + b), m(x) * a + b, rtol=1e-4, atol=1e-4)  # eps inside the std


def test_forecaster_time_order_matters():
    """RoPE on the time mode: the model is not invariant to reversing time patches."""
    m = create_model("hot_forecaster", seq_len=32, pred_len=8, num_variates=3, dim=32, num_heads=4,
                     head="mean").eval()
    x = torch.randn(2, 32, 3)
    xr = x.view(2, 8, 4, 3).flip(1).reshape(2, 32, 3)  # reverse the order of the 8 patches
    with torch.no_grad():
        assert not torch.allclose(m(x), m(xr), atol=1e-4)


@pytest.mark.parametrize("attention, mode", [("spatial", 0), ("temporal", 1)])
def test_single_mode_baselines_attend_along_one_mode(attention, mode):
    """'spatial' / 'temporal' (HOT Table 1's 1-mode Transformers) are axial attention along one mode: equal to a
    1-mode full attention (same weights, RoPE on the time mode) applied to every fiber of the other mode."""
    from hoformer.layers import AxialAttention, FullAttention

    torch.manual_seed(0)
    m = create_model("hot_forecaster", seq_len=24, pred_len=8, num_variates=5, dim=16, num_heads=2,
                     attention=attention).double().eval()
    att = m.encoder.blocks[0].attn
    assert isinstance(att, AxialAttention) and att.modes == (mode,)
    inner = FullAttention(16, 2, rope_modes=(0,) if mode == 1 else ()).double().eval()
    inner.load_state_dict(att.state_dict())
    x = torch.randn(2, 5, 6, 16, dtype=torch.float64)  # (b, variates, time patches, d)
    ref = torch.empty_like(x)
    with torch.no_grad():
        for b in range(2):
            for j in range(x.shape[2 - mode]):
                if mode == 0:
                    ref[b, :, j] = inner(x[b : b + 1, :, j])[0]
                else:
                    ref[b, j] = inner(x[b : b + 1, j])[0]
        torch.testing.assert_close(att(x), ref)


def test_segmenter_head_is_patch_local():
    """The per-token head maps token (i, j) to pixel block (i p : (i+1) p, j p : (j+1) p) (depth 0: no mixing)."""
    m = create_model("hot_segmenter", in_channels=3, num_classes=4, input_size=32, depth=0, patch_size=8).eval()
    x = torch.randn(1, 3, 32, 32)
    x2 = x.clone()
    x2[:, :, 8:16, 16:24] += 1.0  # token (1, 2)
    with torch.no_grad():
        diff = (m(x2) - m(x)).abs().sum(1)[0]
    changed = diff > 1e-6
    assert changed[8:16, 16:24].all()
    changed[8:16, 16:24] = False
    assert not changed.any()


@pytest.mark.parametrize("name,kw", [
    ("hot_forecaster", dict(seq_len=32, pred_len=8, num_variates=3)),
    ("hot_volume_classifier", dict(input_size=16, depth=2)),
    ("hot_segmenter", dict(input_size=32, depth=2)),
])
@pytest.mark.parametrize("attention", ["kronecker_product", "kronecker_sum", "full"])
def test_attention_maps_recorded(name, kw, attention):
    m = create_model(name, attention=attention, dim=32, num_heads=4, **kw).eval()
    (x,), _ = m.example_inputs(1)
    with torch.no_grad():
        y = m(x)
        with record_attention(m) as rec:
            y2 = m(x)
    assert isinstance(y, torch.Tensor)  # models return tensors only
    torch.testing.assert_close(y, y2)
    assert len(rec) == len(m.encoder.blocks)
    assert [name for name, _ in rec] == [f"encoder.blocks.{i}.attn" for i in range(len(m.encoder.blocks))]
    for _, per_mode in rec:
        for a in per_mode:  # rows of softmax attention sum to one
            torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,kw,bad", [
    ("hot_forecaster", {}, torch.randn(2, 95, 7)),
    ("hot_forecaster", {}, torch.randn(2, 96, 8)),
    ("hot_volume_classifier", {}, torch.randn(2, 28, 28, 28)),
    ("hot_segmenter", dict(input_size=64), torch.randn(2, 7, 64, 60)),
])
def test_bad_input_raises_clear_error(name, kw, bad):
    m = create_model(name, dim=16, num_heads=2, **kw)
    with pytest.raises(ValueError, match="expected `x` of shape"):
        m(bad)
    with pytest.raises(TypeError, match="floating-point"):
        m(bad.long())


@pytest.mark.parametrize("name,kw,match", [
    ("hot_forecaster", dict(attention="nope"), "attention"),
    ("hot_forecaster", dict(seq_len=30, patch_size=4), "divisible"),
    ("hot_segmenter", dict(patch_size=0), "patch_size"),
    ("hot_forecaster", dict(head="max"), "head"),
    ("hot_volume_classifier", dict(attention="spatial"), "attention"),  # 1-mode baselines are forecasting-only
    ("hot_volume_classifier", dict(num_classes=1), "num_classes"),
    ("hot_volume_classifier", dict(input_size=(28, 28)), "input_size"),
    ("hot_segmenter", dict(pos_embed="alibi"), "pos_embed"),
])
def test_bad_config_raises(name, kw, match):
    with pytest.raises(ValueError, match=match):
        create_model(name, **kw)


def test_paper_scale_defaults():
    """Defaults = appendix B.4: width 128; 2 blocks (forecasting), 6 blocks (3D classification, segmentation)."""
    for name, depth in (("hot_forecaster", 2), ("hot_volume_classifier", 6), ("hot_segmenter", 6)):
        m = create_model(name)
        assert len(m.encoder.blocks) == depth and m.encoder.norm.normalized_shape == (128,)


def test_cnn3d_reference_arguments():
    m = create_model("cnn3d_classifier", norm="batch", widths=(4, 8), input_size=(8, 6, 4)).eval()
    assert m(torch.randn(2, 1, 8, 6, 4)).shape == (2, 2)
    assert any(isinstance(x, torch.nn.BatchNorm3d) for x in m.modules())
    assert any(isinstance(x, torch.nn.GroupNorm) for x in create_model("cnn3d_classifier").modules())
    odd = create_model("cnn3d_classifier", widths=(12, 6), input_size=4)  # widths not divisible by 8 groups
    assert [g.num_groups for g in odd.modules() if isinstance(g, torch.nn.GroupNorm)] == [4, 4, 2, 2]
    assert odd(torch.randn(1, 1, 4, 4, 4)).shape == (1, 2)
    with pytest.raises(ValueError, match="`norm` must be 'group' or 'batch', got 'layer'"):
        create_model("cnn3d_classifier", norm="layer")
    with pytest.raises(ValueError, match=r"`input_size` \(28, 28, 27\) must be divisible by 2 \*\* \(len\(widths\)"):
        create_model("cnn3d_classifier", input_size=(28, 28, 27))
    with pytest.raises(ValueError, match="`widths` must be a non-empty sequence of positive ints"):
        create_model("cnn3d_classifier", widths=())
    with pytest.raises(ValueError, match=r"expected `x` of shape \(B, 1, 28, 28, 28\)"):
        create_model("cnn3d_classifier")(torch.randn(2, 1, 28, 28, 14))


def _batch_rows(obj, sl, n):
    """``obj`` with every batch-major tensor (leading dim ``n``) sliced by ``sl``."""
    if isinstance(obj, torch.Tensor):
        return obj[sl] if obj.ndim and obj.shape[0] == n else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_batch_rows(o, sl, n) for o in obj)
    if isinstance(obj, dict):
        return {k: _batch_rows(v, sl, n) for k, v in obj.items()}
    return obj


@pytest.mark.parametrize("name", ALL_MODELS)
def test_samples_in_a_batch_are_independent(name):
    """In eval mode a sample's output does not depend on the other samples of its batch (statistics pooled over the
    batch, e.g. a RevIN mean over (B, T), passed every other generic test)."""
    torch.manual_seed(0)
    model = small_model(name).eval()
    args, kwargs = model.example_inputs(batch_size=3)
    with torch.no_grad():
        full = float_outputs(model, args, kwargs)
        one = float_outputs(model, _batch_rows(list(args), slice(1, 2), 3), _batch_rows(kwargs, slice(1, 2), 3))
    assert len(full) == len(one) and any(f.ndim and f.shape[0] == 3 for f in full)
    for f, o in zip(full, one):
        if f.ndim and f.shape[0] == 3:
            torch.testing.assert_close(f[1:2], o, rtol=1e-4, atol=1e-5)



def _forecaster_reference(m, x):
    """HOT forecaster written out (appendix B.4): RevIN with the biased variance and eps 1e-5 inside the sqrt, a
    per-variate linear patch embedding + ReLU, the encoder, pool over *time patches* (mean or time-major flatten),
    the linear head to pred_len, de-normalisation with the same statistics."""
    b, L, c = x.shape
    p = m.embed.patch_size[0]
    mu = x.mean(1, keepdim=True)
    sd = torch.sqrt(((x - mu) ** 2).mean(1, keepdim=True) + 1e-5)
    xn = (x - mu) / sd
    patches = xn.permute(0, 2, 1).reshape(b, c, L // p, p)  # (b, c, t, p): variate c's t-th patch
    w, bias = m.embed.proj.weight[:, 0, :], m.embed.proj.bias  # Conv1d(1, D, p, stride=p)
    z = m.encoder(torch.relu(patches @ w.T + bias))  # (b, c, t, d)
    if m.head_kind == "mean":  # time-mean -> LayerNorm (biased variance, eps 1e-5, affine) -> (eval: no dropout)
        t = z.mean(2)
        ln = m.head_norm[0]
        pooled = (t - t.mean(-1, keepdim=True)) / torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + 1e-5) \
            * ln.weight + ln.bias
    else:
        pooled = z.reshape(b, c, -1)
    return m.head(pooled).transpose(1, 2) * sd + mu


@pytest.mark.parametrize("head", ["flatten", "mean"])
def test_forecaster_matches_explicit_revin_pipeline(head):
    """Kills: RevIN std without eps (NaN on a constant variate), RevIN with the unbiased variance, mean pooling over
    the wrong mode."""
    torch.manual_seed(0)
    m = create_model("hot_forecaster", seq_len=32, pred_len=8, num_variates=4, dim=16, num_heads=2, depth=2,
                     head=head).double().eval()
    if head == "mean":  # a LayerNorm that is not the identity map
        torch.nn.init.normal_(m.head_norm[0].weight)
        torch.nn.init.normal_(m.head_norm[0].bias)
    x = torch.randn(2, 32, 4, dtype=D64) * 3 + 1
    x[0, :, 1] = 3.0  # a constant (flat-lined) sensor: RevIN's eps keeps it finite
    with torch.no_grad():
        y = m(x)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, _forecaster_reference(m, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("pos_embed", ["rope", "sincos", "learned", "none"])
def test_volume_classifier_is_head_of_global_average_pool(pos_embed):
    """logits = head(mean over all 3 patch modes of encoder(pos(embed(x)))). Kills: pooling a single token, the
    absolute positional encoding not applied."""
    torch.manual_seed(0)
    m = create_model("hot_volume_classifier", input_size=8, patch_size=2, num_classes=3, dim=16, num_heads=2,
                     depth=1, pos_embed=pos_embed).double().eval()
    if m.pos is not None and m.pos.kind == "learned":
        for t in m.pos.tables:
            torch.nn.init.normal_(t)  # visible against the embedding
    x = torch.randn(2, 1, 8, 8, 8, dtype=D64)
    with torch.no_grad():
        z = m.embed(x)
        z = m.pos(z) if m.pos is not None else z
        ref = m.head(m.encoder(z).mean(dim=(1, 2, 3)))
        torch.testing.assert_close(m(x), ref, rtol=1e-10, atol=1e-10)


def _flip_patches(x, mode, p):
    """Reverse the order of the patches along spatial mode ``mode`` of ``x (B, C, S1..Sk)`` (each patch intact)."""
    ax = 2 + mode
    return x.unflatten(ax, (x.shape[ax] // p, p)).flip(ax).flatten(ax, ax + 1)


@pytest.mark.parametrize("pos_embed", ["rope", "sincos", "learned"])
def test_volume_classifier_position_code_reaches_every_mode(pos_embed):
    """Without a position code Kronecker attention is equivariant to reordering the patches of any one mode and the
    global mean pool makes the logits invariant; every documented position code must break that on *every* mode.
    Kills: RoPE on all modes but the last, the absolute encoding not applied."""
    torch.manual_seed(0)
    kw = dict(input_size=8, patch_size=2, num_classes=3, dim=16, num_heads=2, depth=1)
    ref = create_model("hot_volume_classifier", pos_embed="none", **kw).double().eval()
    m = create_model("hot_volume_classifier", pos_embed=pos_embed, **kw).double().eval()
    if pos_embed == "rope":
        assert all(blk.attn.rope_modes == (0, 1, 2) for blk in m.encoder.blocks)
    if pos_embed == "learned":
        for t in m.pos.tables:
            torch.nn.init.normal_(t)
    x = torch.randn(2, 1, 8, 8, 8, dtype=D64)
    with torch.no_grad():
        for mode in range(3):
            xf = _flip_patches(x, mode, 2)
            torch.testing.assert_close(ref(xf), ref(x), rtol=1e-9, atol=1e-9)  # the invariance the test relies on
            assert not torch.allclose(m(xf), m(x), rtol=1e-6, atol=1e-6), (pos_embed, mode)


def test_cnn3d_pools_between_stages_only():
    """``len(widths)`` stages with a 2x2x2 max-pool *between* stages: 28^3 -> 7^3 with 3 stages; logits are the
    classifier of the global average. Kills: a max-pool before the first stage too."""
    torch.manual_seed(0)
    m = create_model("cnn3d_classifier", input_size=28, num_classes=2).double().eval()
    assert sum(isinstance(mod, torch.nn.MaxPool3d) for mod in m.modules()) == 2
    x = torch.randn(2, 1, 28, 28, 28, dtype=D64)
    with torch.no_grad():
        f = m.features(x)
        assert f.shape == (2, 64, 7, 7, 7)
        torch.testing.assert_close(m(x), m.head(f.mean(dim=(2, 3, 4))))


# --------------------------------------------------------------------------- directories written by release 0.1.0
#: the "kwargs" 0.1.0 wrote for the three TrafficTransformer presets, which differ in ``num_layers`` only
_TRAFFIC_0_1_0 = {'dim': 8, 'dropout': 0.1, 'horizon': 4, 'in_channels': 1, 'mlp_ratio': 2.0, 'num_heads': 2,
                  'num_nodes': 5, 'out_channels': None, 'use_time': True, 'window': 6}
#: (name, the "kwargs" that hoformer 0.1.0's save_pretrained wrote for a small model, a fingerprint of that model's
#: state-dict keys and shapes computed with 0.1.0). The configs are written below exactly as 0.1.0 wrote them:
#: json.dumps({"hoformer_version", "kwargs", "name", "save_id"}, indent=2, sort_keys=True), weights with
#: {"format": "pt", "save_id": ...} metadata and no config digest.
LEGACY_0_1_0 = [
    ('hot_forecaster',
     {'attention': 'kronecker_product',
      'depth': 1,
      'dim': 8,
      'drop_path': 0.0,
      'dropout': 0.1,
      'mlp_ratio': 4.0,
      'num_heads': 2,
      'num_variates': 3,
      'patch_size': 4,
      'pool': 'flatten',
      'pred_len': 4,
      'qk_norm': True,
      'revin': True,
      'rope': True,
      'seq_len': 16},
     'bbc9da33c1a68e3e'),
    ('hot_volume_classifier',
     {'attention': 'kronecker_product',
      'depth': 1,
      'dim': 8,
      'drop_path': 0.0,
      'dropout': 0.1,
      'in_channels': 1,
      'input_size': 8,
      'mlp_ratio': 4.0,
      'num_classes': 2,
      'num_heads': 2,
      'patch_size': 4,
      'pos_embed': 'rope',
      'qk_norm': True},
     '44ac8847bcc2675f'),
    ('hot_segmenter',
     {'attention': 'kronecker_product',
      'depth': 1,
      'dim': 8,
      'drop_path': 0.0,
      'dropout': 0.1,
      'in_channels': 2,
      'input_size': 16,
      'mlp_ratio': 4.0,
      'num_classes': 3,
      'num_heads': 2,
      'patch_size': 8,
      'pos_embed': 'rope',
      'qk_norm': True},
     '154b7ecea782e5dc'),
    ('cnn3d_classifier',
     {'dropout': 0.0, 'in_channels': 1, 'input_size': 8, 'norm': 'group', 'num_classes': 2, 'widths': [4, 8]},
     '9b2c6ee3f006bcf5'),
    ('weaver',
     {'dict_width': 4,
      'dim': 8,
      'dropout': 0.1,
      'horizon': 4,
      'in_channels': 1,
      'kern_dim': 4,
      'kern_layers': 3,
      'kernel': 'tanimoto',
      'mlp_expansion': 2,
      'num_heads': 2,
      'num_landmarks': 4,
      'num_nodes': 5,
      'num_scorers': 5,
      'out_channels': None,
      'ratio_space': 0.6,
      'ratio_time': 0.6,
      'use_dictionary': True,
      'use_time': True,
      'window': 6},
     'f854e05f499fcf90'),
    *[(name, {**_TRAFFIC_0_1_0, 'num_layers': layers}, fingerprint)
      for name, layers, fingerprint in (('traffic_full_attention', 1, '453a0e6101a2e98d'),
                                        ('traffic_alternating', 1, '8f78fd8c9416f39a'),
                                        ('traffic_hot', 2, 'a4c3d99cec4b72f4'))],
    ('last_value',
     {'horizon': 4, 'num_nodes': 5, 'window': 6},
     'e3b0c44298fc1c14'),
    ('historical_average',
     {},
     'e3b0c44298fc1c14'),
    ('hoba_classifier',
     {'attention': 'hoba',
      'block_size': 4,
      'cross_block': True,
      'depth': 1,
      'dim': 8,
      'dropout': 0.1,
      'max_len': 16,
      'mlp_ratio': 4.0,
      'norm_first': True,
      'num_classes': 2,
      'num_heads': 2,
      'overlap': 0.25,
      'pad_id': 0,
      'pooling': 'cls',
      'vocab_size': 50},
     '0d775e56a1daa33b'),
]


def _state_fingerprint(model) -> str:
    import hashlib

    sig = "\n".join(f"{k}:{tuple(v.shape)}" for k, v in sorted(model.state_dict().items()))
    return hashlib.sha256(sig.encode()).hexdigest()[:16]


#: models registered after release 0.1.0: no directory that release wrote can hold them
ADDED_AFTER_0_1_0 = {"hot_causal_forecaster", "hot_forecaster_official"}


def test_legacy_table_covers_every_registered_model():
    assert ADDED_AFTER_0_1_0 <= set(ALL_MODELS)
    assert sorted(name for name, _, _ in LEGACY_0_1_0) == sorted(set(ALL_MODELS) - ADDED_AFTER_0_1_0)


@pytest.mark.parametrize("name,kwargs,fingerprint", LEGACY_0_1_0, ids=[n for n, _, _ in LEGACY_0_1_0])
def test_directories_written_by_release_0_1_0_load(name, kwargs, fingerprint, tmp_path):
    from hoformer.models.pretrained import model_class

    torch.manual_seed(0)
    today = model_class(name).upgrade_kwargs(kwargs)  # renamed arguments (hot_forecaster: pool -> head)
    model = create_model(name, **today).eval()
    assert _state_fingerprint(model) == fingerprint  # the same parameter names and shapes as 0.1.0
    d = tmp_path / name
    d.mkdir()
    save_id = "0123456789abcdef0123456789abcdef"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"),
              metadata={"format": "pt", "save_id": save_id})
    (d / "config.json").write_text(json.dumps({"hoformer_version": "0.1.0", "kwargs": kwargs, "name": name,
                                               "save_id": save_id}, indent=2, sort_keys=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a later version warns that 0.1.0 wrote the directory
        loaded = from_pretrained(d)
    assert type(loaded) is type(model) and loaded.config["name"] == name
    assert {k: v for k, v in loaded.config["kwargs"].items() if k in today} == today
    args, kw = model.example_inputs(batch_size=1)
    with torch.no_grad():
        for a, b in zip(tensors(loaded(*args, **kw)), tensors(model(*args, **kw))):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    loaded.save_pretrained(tmp_path / "again")  # re-saved: the current format, with a config digest
    with safe_open(str(tmp_path / "again" / "model.safetensors"), framework="pt") as f:
        assert f.metadata()["config_digest"]
    assert from_pretrained(tmp_path / "again").config == loaded.config


# ------------------------------------------------------------------------------ config bound to the weights
@pytest.mark.parametrize("edit,why", [
    (lambda kw: kw.update(attention="kronecker_sum"), "product -> sum: the same weight shapes"),
    (lambda kw: kw.update(num_variates=8), "7 -> 8 variates: shared weights over variates"),
    (lambda kw: kw.update(dropout=0.3), "an inference no-op, still not the saved model"),
])
def test_edited_config_is_refused_unless_trusted(edit, why, tmp_path):
    torch.manual_seed(0)
    model = create_model("hot_forecaster", seq_len=16, pred_len=4, dim=8, num_heads=2, depth=1)
    d = model.save_pretrained(tmp_path / "m")
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        from hoformer.models.base import config_digest

        assert f.metadata()["config_digest"] == config_digest(model.config)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg["kwargs"])
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    with pytest.raises(ValueError, match=r"(?s)config\.json is not the configuration model\.safetensors was saved "
                                         r"with.*edited.*trust_edited_config=True"):
        from_pretrained(d)
    with pytest.warns(UserWarning, match="loading it because trust_edited_config=True"):
        loaded = from_pretrained(d, trust_edited_config=True)
    assert loaded.config["kwargs"] == cfg["kwargs"]  # the edited model, as asked
    # formatting, key order and the recorded version are not the configuration: reformatting is no edit
    model.save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hoformer_version"] = __import__("hoformer").__version__
    (d / "config.json").write_text(json.dumps(dict(reversed(list(cfg.items())))))
    assert from_pretrained(d).config == json.loads(json.dumps(model.config))


def test_edited_model_name_is_refused(tmp_path):
    model = create_model("traffic_hot", num_nodes=5, window=6, horizon=4, dim=8, num_heads=2, num_layers=1)
    d = model.save_pretrained(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["name"], cfg["kwargs"]["layout"] = "traffic_full_attention", "full"  # other attention, same parameters
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="trust_edited_config"):
        from_pretrained(d)


@pytest.mark.parametrize("head,pred_len,count", [("mean", 720, 555_728), ("mean", 96, 475_232),
                                                 ("flatten", 96, 757_600), ("flatten", 720, 2_675_152)])
def test_forecaster_parameter_count_at_the_paper_configuration(head, pred_len, count):
    """Width 128, 2 blocks, 8 heads, patch 4, lookback 96 (appendix B.4), written out per part: the patch embedding,
    per block two LayerNorms, the Kronecker attention (a query-key map per mode, bias-free; values and output with
    biases; q/k LayerNorms over the 16-wide heads) and the 4x MLP, the final LayerNorm and the head (``"mean"``: a
    LayerNorm over the width, then 128 -> pred_len; ``"flatten"``: 24 * 128 -> pred_len). Table 1 reports 680K."""
    d, t = 128, 96 // 4
    block = 2 * 2 * d + 2 * (2 * d * d) + (d * d + d) * 2 + 2 * 2 * (d // 8) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    out = 2 * d + d * pred_len + pred_len if head == "mean" else d * t * pred_len + pred_len
    assert (4 * d + d) + 2 * block + 2 * d + out == count
    m = create_model("hot_forecaster", seq_len=96, pred_len=pred_len, num_variates=21, dim=128, depth=2, num_heads=8,
                     patch_size=4, head=head)
    assert sum(p.numel() for p in m.parameters()) == count
