"""Deployable models: the kernels' custom ops, torch.export, full-graph torch.compile and ONNX for every registered
model (small sizes), and the ``hoformer export`` command."""
from __future__ import annotations

import importlib.util
import inspect
import os
import re

import pytest
import torch

from hoformer.export import ExportError, export_model, export_program, verify_export
from hoformer.functional import kron_apply, kron_sum_apply, triplet_attention, triplet_windows
from hoformer.functional._ops import EXPORT_DECOMPOSITIONS, _window_shape
from hoformer.models import create_model, list_models

from _small import SMALL, small_model

D64 = torch.float64
HAS_ONNX = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxscript", "onnxruntime"))
needs_onnx = pytest.mark.skipif(not HAS_ONNX, reason="needs the export extra (onnx, onnxscript, onnxruntime)")

ALL_MODELS = list_models()
#: one model per family in the default suite (HOT, HOBA, Weaver and its traffic baselines, CNN); the other models
#: run the same tests with ``-m slow``
FAMILY = ["cnn3d_classifier", "hoba_classifier", "hot_forecaster", "weaver"]


def _per_family(names):
    return [n if n in FAMILY else pytest.param(n, marks=pytest.mark.slow) for n in names]


def _small(name, dtype=torch.float32):
    return small_model(name, dtype).eval()


def _cast(tree, dtype):
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    return type(tree)(_cast(v, dtype) for v in tree)


def _inputs(model, b, dtype=torch.float32):
    torch.manual_seed(b)
    args, kwargs = model.example_inputs(batch_size=b)
    return _cast(tuple(args), dtype), _cast(dict(kwargs), dtype)


def _ops_of(ep) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


# --------------------------------------------------------------------------------------------- custom ops
def _triplet_args(L=10, mask=True):
    q = [torch.randn(2, 2, L, 4, dtype=D64, requires_grad=True) for _ in range(5)]
    m = torch.ones(2, L, dtype=torch.bool)
    m[1, 7:] = False
    return (*q, m if mask else None, 4, 0.25, 0.5, 1 << 19)


def test_custom_ops_pass_opcheck():
    """Schema, fake (meta) implementation with dynamic shapes, and registered autograd of every custom op."""
    torch.manual_seed(0)
    v = torch.randn(2, 3, 4, 5, 2, dtype=D64, requires_grad=True)
    fs = [torch.randn(2, 3, n, n, dtype=D64, requires_grad=True) for n in (4, 5)]
    cases = [
        (torch.ops.hoformer.kron_apply.default, (v, fs)),
        (torch.ops.hoformer.kron_sum_apply.default, (v, fs, 0.5)),
        (torch.ops.hoformer.triplet_attention.default, _triplet_args()),
        (torch.ops.hoformer.triplet_attention.default, _triplet_args(L=3, mask=False)),  # one window, L < block
        (torch.ops.hoformer.entmax15.default, (torch.randn(3, 7, dtype=D64, requires_grad=True), -1)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert all(r == "SUCCESS" for r in result.values()), (op, result)


@pytest.mark.parametrize("wanted", ["all", "one factor"])
def test_custom_op_gradients_are_the_hand_written_ones(wanted):
    """gradcheck (float64) through the ops with any subset of inputs needing a gradient (the backward ops skip the
    rest), and the ops' gradients equal the eager autograd Functions'."""
    torch.manual_seed(0)
    v = torch.randn(2, 3, 4, 5, 2, dtype=D64, requires_grad=wanted in ("all", "v"))
    fs = [torch.randn(2, 3, n, n, dtype=D64, requires_grad=wanted in ("all", "factors") or
                      (wanted == "one factor" and m == 1)) for m, n in enumerate((4, 5))]
    leaves = [t for t in (v, *fs) if t.requires_grad]
    ops = {"product": lambda: torch.ops.hoformer.kron_apply(v, fs),
           "sum": lambda: torch.ops.hoformer.kron_sum_apply(v, fs, 0.5)}
    eager = {"product": lambda: kron_apply(fs, v), "sum": lambda: kron_sum_apply(fs, v, normalize=True)}
    for combine, op in ops.items():
        assert torch.autograd.gradcheck(lambda *_: op(), leaves, fast_mode=True)
        g = torch.randn_like(v)
        got = torch.autograd.grad(op(), leaves, g)
        want = torch.autograd.grad(eager[combine](), leaves, g)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    args = _triplet_args()
    assert torch.autograd.gradcheck(lambda *q: torch.ops.hoformer.triplet_attention(*q, *args[5:])[0], args[:5],
                                   fast_mode=True)


@pytest.mark.parametrize("L", [3, 8, 10, 17, 33])
def test_window_count_by_arithmetic_matches_triplet_windows(L):
    for b in (4, 8, 16):
        for ov in (0.0, 0.25, 0.5, 0.9):
            assert _window_shape(L, b, ov) == (len(triplet_windows(L, b, ov)), min(b, L)), (L, b, ov)


def test_export_lowerings_equal_the_kernels():
    """The pure-tensor transcriptions that the written files hold compute what the fast kernels compute (float64),
    broadcast factors, 1-3 modes, masks and one-window sequences included."""
    torch.manual_seed(0)
    lower = {op.name(): fn for op, fn in EXPORT_DECOMPOSITIONS.items()}
    for sizes in ((4,), (4, 5), (3, 2, 4)):
        v = torch.randn(2, 3, *sizes, 2, dtype=D64).movedim(-1, 2).contiguous().movedim(2, -1)  # strided like a view
        for lead in ((2, 3), (1, 3), (2, 1)):
            fs = [torch.randn(*lead, n, n, dtype=D64) for n in sizes]
            ex = [f.expand(2, 3, n, n) for f, n in zip(fs, sizes)]
            torch.testing.assert_close(lower["hoformer::kron_apply"](v, ex), kron_apply(fs, v))
            torch.testing.assert_close(lower["hoformer::kron_sum_apply"](v, ex, 1 / len(sizes)),
                                       kron_sum_apply(fs, v, normalize=True))
    for L, b, ov in ((10, 4, 0.25), (17, 8, 0.5), (3, 4, 0.0), (16, 4, 0.0)):
        x = [torch.randn(2, 2, L, 3, dtype=D64) for _ in range(5)]
        mask = torch.ones(2, L, dtype=torch.bool)
        mask[1, L // 2:] = False
        for m in (None, mask):
            want = triplet_attention(*x, block_size=b, overlap=ov, mask=m, scale=0.7)
            torch.testing.assert_close(lower["hoformer::triplet_attention"](*x, m, b, ov, 0.7, 1 << 19)[0], want)
    from entmax import entmax15

    z = torch.randn(3, 4, 9, dtype=D64)
    torch.testing.assert_close(lower["hoformer::entmax15"](z, -1), entmax15(z, dim=-1))


# ------------------------------------------------------------------------------------------ torch.export
def _plain_export(model, b=2):
    """``torch.export.export`` as a PyTorch user calls it (no hoformer helper), batch dimension dynamic."""
    args, kwargs = model.example_inputs(batch_size=b)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    batch = torch.export.Dim("batch", min=1)
    names = list(inspect.signature(model.forward).parameters)
    shapes = {n: {0: batch} for n in [*names[:len(args)], *kwargs]}
    return torch.export.export(model, tuple(args), kwargs or None, dynamic_shapes=shapes), (tuple(args), kwargs)


def _runs_without_hoformer(ep, args, kwargs, want, folder: Path) -> float:
    """``torch.export.save`` of ``ep``, loaded and run on ``args``/``kwargs`` by a fresh Python process that never
    imports hoformer (checked in ``sys.modules``): the largest difference from ``want``."""
    import subprocess
    import sys

    torch.export.save(ep, str(folder / "program.pt2"))
    torch.save({"args": args, "kwargs": kwargs, "want": want}, folder / "io.pt")
    script = (
        "import sys, torch\n"
        "ep = torch.export.load('program.pt2')\n"
        "io = torch.load('io.pt')\n"
        "got = ep.module()(*io['args'], **io['kwargs'])\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'hoformer'], 'hoformer was imported'\n"
        "print((got - io['want']).abs().max().item())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return float(done.stdout.strip())


@pytest.mark.parametrize("name", _per_family(ALL_MODELS))
def test_torch_export_and_onnx_every_model_dynamic_batch(name, tmp_path):
    """Plain ``torch.export.export`` traces hoformer's kernels as core ATen ops (no hoformer op in the program) and
    the program equals eager within 1e-5 (float32) at batch sizes other than the traced one, as does
    :func:`export_program`'s lowered one; the plain program saved with ``torch.export.save`` runs in a Python
    process that never imports hoformer, within 1e-5 of eager; the ONNX file (standard domain only, dynamic batch)
    run by ONNX Runtime equals eager within 1e-4."""
    from hoformer.export import _input_names, _write

    model = _small(name)
    ep, (args2, kwargs2) = _plain_export(model)
    low = export_program(model)
    for prog in (ep, low):
        assert not any(o.startswith("hoformer.") for o in _ops_of(prog)), _ops_of(prog)
    for b in (1, 3):
        args, kwargs = _inputs(model, b)
        with torch.no_grad():
            want = model(*args, **kwargs)
            for prog in (ep, low):
                torch.testing.assert_close(prog.module()(*args, **kwargs), want, rtol=0, atol=1e-5)
    with torch.no_grad():
        want = model(*args2, **kwargs2)
    assert _runs_without_hoformer(ep, args2, kwargs2, want, tmp_path) <= 1e-5
    if not HAS_ONNX:
        pytest.skip("ONNX part needs the export extra (onnx, onnxscript, onnxruntime)")
    import onnx

    args, kwargs = model.example_inputs(batch_size=2)
    path = tmp_path / f"{name}.onnx"
    _write(ep, model, _input_names(model, args, {k: v for k, v in kwargs.items() if v is not None}), path, "onnx")
    graph = onnx.load(str(path)).graph
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}, "custom-domain nodes left in the file"
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param, "batch dimension is not dynamic"
    assert verify_export(model, path, batch_sizes=(1, 3, 5)) <= 1e-4


def test_custom_ops_run_under_torch_compile_and_core_ops_under_torch_export():
    """The kernels' dispatch in traced code: ``torch.compile`` calls the opaque custom op (its fast kernels),
    ``torch.export`` the op's pure-tensor transcription; both equal eager (float64)."""
    import torch._dynamo as dynamo

    from hoformer.functional._traced import traced_call

    torch.manual_seed(0)
    v = torch.randn(2, 3, 4, 5, 2, dtype=D64)
    fs = [torch.randn(2, 3, n, n, dtype=D64) for n in (4, 5)]
    op = torch.ops.hoformer.kron_apply.default
    seen = []

    def backend(gm, example):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    dynamo.reset()
    got = torch.compile(lambda v, *fs: traced_call(op, v, list(fs)), backend=backend, fullgraph=True)(v, *fs)
    dynamo.reset()
    assert any("hoformer.kron_apply" in t for t in seen), seen
    torch.testing.assert_close(got, kron_apply(fs, v), rtol=0, atol=1e-12)

    class Apply(torch.nn.Module):
        def forward(self, v, *fs):
            return traced_call(op, v, list(fs))

    ep = torch.export.export(Apply(), (v, *fs))
    assert not any(o.startswith("hoformer.") for o in _ops_of(ep)), _ops_of(ep)
    torch.testing.assert_close(ep.module()(v, *fs), kron_apply(fs, v), rtol=0, atol=1e-12)


@needs_onnx
@pytest.mark.parametrize("name", _per_family(ALL_MODELS))
def test_plain_torch_onnx_export_every_model(name, tmp_path):
    """``torch.onnx.export(model, args, dynamo=True)`` as a timm user calls it (no hoformer helper) converts every
    registered model; ONNX Runtime runs the file and equals eager within 1e-4 (the traced batch size)."""
    import onnxruntime as ort

    model = _small(name)
    args, kwargs = _inputs(model, 2)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(model, args, str(path), kwargs=kwargs or None, dynamo=True, verbose=False)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = [*args, *kwargs.values()]
    (got,) = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), feeds)})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(*args, **kwargs), rtol=0, atol=1e-4)


@needs_onnx
def test_export_prints_its_phases_with_times(tmp_path, capsys):
    """A small causal forecaster (the default one's unrolled generation loop, shortened) to ONNX through
    ``export_model``: one line per phase with its time, and the file equals eager (a ``.pt2``'s lowering phase:
    :func:`test_cli_export_from_a_lightning_checkpoint`)."""
    model = create_model("hot_causal_forecaster", seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1,
                         num_heads=2, patch_size=4).eval()
    export_model(model, tmp_path / "causal.onnx")
    err = capsys.readouterr().err
    for phase in ("tracing model 'hot_causal_forecaster' (torch.export)", "converting to ONNX", "writing",
                  "verifying causal.onnx"):
        assert re.search(rf"export: {re.escape(phase)}.*: done in \d+\.\d s", err), err


@needs_onnx
@pytest.mark.slow
def test_the_default_causal_forecaster_exports_to_onnx(tmp_path):
    """The default ``hot_causal_forecaster`` (96-step lookback, 24 generated patches, unrolled) converts to ONNX and
    runs in ONNX Runtime within 1e-4 of eager at batch sizes 1 and 3; the ONNX graph optimiser, which did not finish
    in tens of minutes on this graph, is skipped."""
    model = create_model("hot_causal_forecaster").eval()
    path = export_model(model, tmp_path / "causal.onnx")  # verified at batch sizes 1 and 3
    assert path.stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_MODELS)
def test_pt2_file_round_trip(name, tmp_path):
    model = _small(name)
    path = export_model(model, tmp_path / f"{name}.pt2")
    assert verify_export(model, path, batch_sizes=(1, 4)) <= 1e-5
    args, kwargs = _inputs(model, 2)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(str(path)).module()(*args, **kwargs), model(*args, **kwargs),
                                   rtol=0, atol=1e-5)


# -------------------------------------------------------------------------------------- torch.compile
@pytest.mark.parametrize("name", _per_family(ALL_MODELS))
def test_compile_fullgraph_every_model_forward_and_backward(name):
    """``torch.compile(model, fullgraph=True)`` (aot_eager: Dynamo + AOTAutograd, no C++ toolchain) traces every
    model without a graph break; forward (float32, 1e-5) and parameter gradients (float64) equal eager's."""
    import torch._dynamo as dynamo

    for dtype in (torch.float32, D64):
        model = _small(name, dtype)
        args, kwargs = _inputs(model, 2, dtype)
        dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        y, y0 = compiled(*args, **kwargs), model(*args, **kwargs)
        torch.testing.assert_close(y, y0, rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-12)
        params = [p for p in model.parameters() if p.requires_grad]
        if dtype == D64 and params:
            g = torch.randn_like(y0)
            got = torch.autograd.grad(y, params, g, allow_unused=True)
            want = torch.autograd.grad(y0, params, g, allow_unused=True)
            for a, b in zip(got, want):
                assert (a is None) == (b is None)
                if a is not None:
                    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hot_forecaster", "hoba_classifier", "weaver"])
def test_compile_fullgraph_inductor(name):
    """The default backend (Inductor, C++ on CPU) with the custom ops in the graph: forward and backward run and
    equal eager."""
    import torch._dynamo as dynamo

    model = _small(name)
    args, kwargs = _inputs(model, 2)
    dynamo.reset()
    y = torch.compile(model, fullgraph=True)(*args, **kwargs)
    y0 = model(*args, **kwargs)
    torch.testing.assert_close(y, y0, rtol=0, atol=1e-5)
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.randn_like(y0)
    for a, b in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(y0, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    dynamo.reset()


# -------------------------------------------------------------------------------------------------- errors
def test_unexportable_models_and_options_raise_clear_errors(tmp_path):
    model = _small("hot_forecaster")
    from hoformer.layers import record_attention

    hoba = _small("hoba_classifier")
    with record_attention(hoba), pytest.raises(ExportError, match=r"model 'hoba_classifier': attention recording is on"):
        export_program(hoba)
    with pytest.raises(ExportError, match="expected a hoformer model"):
        export_program(torch.nn.Linear(2, 2), ((torch.randn(1, 2),), {}))
    with pytest.raises(ExportError, match=r"cannot tell the format from the file name"):
        export_model(model, tmp_path / "model.bin")
    with pytest.raises(ExportError, match=r"`format` must be one of \('pt2', 'onnx'\), got 'tflite'"):
        export_model(model, tmp_path / "model.pt2", format="tflite")
    with pytest.raises(ExportError, match=r"`example` must be an \(args tuple, kwargs dict\) pair"):
        export_program(model, torch.randn(2, 16, 3))


def test_a_tracer_failure_is_one_clear_error_naming_the_model(monkeypatch):
    """Python control flow on tensor values cannot be exported: the error names the model and the tracer's reason,
    the tracer's traceback is kept as the cause."""
    model = _small("last_value")
    forward = type(model).forward

    def data_dependent(self, x, *args, **kwargs):
        y = forward(self, x, *args, **kwargs)
        return y * 2 if bool(x.sum() > 0) else y

    monkeypatch.setattr(type(model), "forward", data_dependent)
    with pytest.raises(ExportError, match=r"model 'last_value' could not be traced by torch.export \(") as err:
        export_program(model)
    assert err.value.__cause__ is not None


# ------------------------------------------------------------------------------------------------------ CLI
def test_cli_export_from_a_lightning_checkpoint(tmp_path, capsys):
    from hoformer.cli import main

    model = _small("hot_forecaster")
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    ckpt = {"state_dict": state, "hyper_parameters": {"model_name": "hot_forecaster",
                                                      "model_kwargs": SMALL["hot_forecaster"]}}
    torch.save(ckpt, tmp_path / "last.ckpt")
    out = tmp_path / "out" / "model.pt2"
    assert main(["export", "--checkpoint", str(tmp_path / "last.ckpt"), "--output", str(out)]) == 0
    printed = capsys.readouterr()
    assert out.is_file() and "matches the eager model within 1e-05" in printed.out
    assert "export: tracing model 'hot_forecaster' (torch.export)" in printed.err  # progress by default
    assert re.search(r"export: lowering to core ATen ops: done in \d+\.\d s", printed.err)  # a .pt2 is lowered
    assert verify_export(model, out) <= 1e-5
    assert main(["export", "--checkpoint", str(tmp_path / "missing"), "--output", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "last.ckpt"), "--output", str(tmp_path / "m.xyz")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err


@needs_onnx
def test_cli_export_onnx_from_a_pretrained_folder(tmp_path, capsys):
    from hoformer.cli import main

    model = _small("historical_average")
    model.save_pretrained(tmp_path / "pretrained")
    out = tmp_path / "model.onnx"
    argv = ["export", "--checkpoint", str(tmp_path / "pretrained"), "--format", "onnx", "--output", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "(onnx," in printed.out and "export:" not in printed.err  # --quiet: no progress lines
    assert verify_export(model, out) <= 1e-4
