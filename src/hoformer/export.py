"""Deployable models: any registered model as a ``torch.export`` program (``.pt2``) or an ONNX file.

Command line (a Lightning ``.ckpt`` of a hoformer task or a ``save_pretrained`` folder)::

    hoformer export --checkpoint runs/.../pretrained --format onnx --output model.onnx
    hoformer export --checkpoint runs/.../checkpoints/last.ckpt --output model.pt2     # format from the suffix

Python::

    from hoformer.export import export_model, export_program
    export_model("runs/.../pretrained", "model.onnx")          # or a model object; returns the path written
    program = export_program(model)                              # torch.export.ExportedProgram (core ATen ops)

What is exported is the model's default forward (tensors in, one tensor out) in eval mode, traced on
``model.example_inputs()``: the same inputs, in the same order (e.g. Weaver's ``x, time, mask``; an input given as
``None`` there is not an input of the file). The batch dimension is dynamic (shared by all inputs, any size from 1);
every other size is the one the model was built for, which its forward checks anyway: variates, nodes, the image
grid, and HOBA's token count (the windows of eq 3 are laid out on the host from the sequence length: pad shorter
texts to it and pass the mask). The causal forecaster's program holds its generation loop unrolled (one causal
forward per generated patch), for the ``pred_len`` it was built with.

The plain PyTorch paths work as well: ``torch.export.export(model, args)`` and ``torch.onnx.export(model, args,
dynamo=True)`` trace hoformer's hand-written kernels (custom ops under ``torch.compile``) as their pure-tensor
transcriptions (core ATen ops), so a saved program loads with ``torch.export.load`` and an ONNX file runs in ONNX
Runtime without hoformer installed. What this module adds: a dynamic batch, progress with times, ONNX without the
value checks ONNX cannot express (e.g. Weaver's time features in range; a ``.pt2`` keeps them), no ONNX graph
optimiser (it runs for tens of minutes on the unrolled generation loop of the causal forecaster; ONNX Runtime
optimises a graph when it loads it), a check of the written file against the eager model and clear refusals (below).
ONNX needs the ``export`` extra (``pip install hoformer[export]``: onnx, onnxscript, onnxruntime).

Anything that cannot be exported is refused up front with an :class:`ExportError` naming the model and the reason
(and a tracer failure is reported the same way, its traceback kept as the cause).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

__all__ = ["FORMATS", "ExportError", "export_program", "export_model", "verify_export", "export_main"]

#: file formats: a torch.export program (``torch.export.save``) and ONNX
FORMATS = ("pt2", "onnx")
#: the largest difference to eager accepted by :func:`verify_export` (float32), per format
TOLERANCE = {"pt2": 1e-5, "onnx": 1e-4}


class ExportError(RuntimeError):
    """A model, an option or an input that cannot be exported, with the reason."""


# ------------------------------------------------------------------------------------------------ tracing
def _name(model) -> str:
    cfg = getattr(model, "config", None)
    return repr(cfg["name"]) if isinstance(cfg, dict) and "name" in cfg else type(model).__name__


@contextlib.contextmanager
def _eval(model: torch.nn.Module):
    """``model`` in eval mode for the block (the caller's mode is restored)."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


def _check_exportable(model: torch.nn.Module) -> None:
    """Refuse, with the reason, what the exported program could not reproduce."""
    from hoformer.models import HoformerModel

    if not isinstance(model, HoformerModel):
        raise ExportError(f"export: expected a hoformer model (hoformer.models.create_model / from_pretrained), got "
                          f"{type(model).__name__}")
    name = _name(model)
    recording = [n for n, m in model.named_modules() if getattr(m, "_sinks", ())]
    if recording:
        raise ExportError(f"export: model {name}: attention recording is on ({', '.join(recording[:3])}); its maps "
                          f"are stored as a Python side effect that an exported program cannot keep: export "
                          f"outside the hoformer.layers.record_attention block")
    bad = [n for n, p in model.named_parameters() if p.is_complex()]
    if bad:
        raise ExportError(f"export: model {name}: complex parameters {bad[:3]} are not supported")


def _inputs(model, example) -> tuple[tuple, dict]:
    if example is None:
        args, kwargs = model.example_inputs(batch_size=2)
    elif (isinstance(example, (tuple, list)) and len(example) == 2 and isinstance(example[0], (tuple, list))
          and isinstance(example[1], dict)):
        args, kwargs = example
    else:
        raise ExportError(f"export: `example` must be an (args tuple, kwargs dict) pair like "
                          f"model.example_inputs() returns, got {type(example).__name__}")
    return tuple(args), {k: v for k, v in dict(kwargs).items() if v is not None}


def _dynamic_shapes(model, args: tuple, kwargs: dict):
    """Dim 0 of every tensor input is the one dynamic batch size; everything else is static."""
    batch = torch.export.Dim("batch", min=1)
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    spec: dict[str, Any] = {}
    for p, a in zip(params, args):
        spec[p.name] = {0: batch} if isinstance(a, torch.Tensor) else None
    for k, v in kwargs.items():
        spec[k] = {0: batch} if isinstance(v, torch.Tensor) else None
    return spec


class _Progress:
    """One line per export phase on stderr, with its time (``enabled=False``: silent)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @contextlib.contextmanager
    def __call__(self, what: str):
        start = time.perf_counter()
        if self.enabled:
            print(f"export: {what} ...", file=sys.stderr, flush=True)
        yield
        if self.enabled:
            print(f"export: {what}: done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def _trace(model, args: tuple, kwargs: dict, dynamic_batch: bool, phase: _Progress) -> torch.export.ExportedProgram:
    _check_exportable(model)
    name = _name(model)
    with phase(f"tracing model {name} (torch.export)"), _eval(model):
        try:
            return torch.export.export(model, args, kwargs or None, strict=False,
                                       dynamic_shapes=_dynamic_shapes(model, args, kwargs) if dynamic_batch else None)
        except Exception as e:  # noqa: BLE001 - the tracer raises many types; report one clear error
            raise ExportError(f"export: model {name} could not be traced by torch.export "
                              f"({type(e).__name__}: {_first_line(e)})") from e


def _lower(ep: torch.export.ExportedProgram, phase: _Progress) -> torch.export.ExportedProgram:
    with phase("lowering to core ATen ops"):
        return ep.run_decompositions()


def export_program(model: torch.nn.Module, example: tuple[tuple, dict] | None = None, *, dynamic_batch: bool = True,
                   progress: bool = False) -> torch.export.ExportedProgram:
    """``torch.export`` program of ``model``'s eval-mode forward on ``example`` (default ``model.example_inputs(2)``)
    with a dynamic batch dimension (``dynamic_batch``), lowered to core ATen ops (hoformer's kernels traced as their
    pure-tensor transcriptions): what a ``.pt2`` file holds. ``progress``: one line per phase on stderr."""
    args, kwargs = _inputs(model, example)
    phase = _Progress(progress)
    return _lower(_trace(model, args, kwargs, dynamic_batch, phase), phase)


def _for_onnx(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` as the ONNX converter without its graph optimiser takes it:

    * without the asynchronous value checks of :func:`hoformer._checks.check_values` (labels, time features in
      range), which ONNX cannot express: their assertions and the reductions feeding only them are removed;
    * a bias-free ``aten.conv3d`` as ``aten.convolution`` (the converter's ``conv3d`` gives a bias-free convolution a
      bias of the wrong shape, which only its optimiser removes).
    """
    graph = ep.graph_module.graph
    aten = torch.ops.aten
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten._assert_async.msg, aten._assert_async.default):
            graph.erase_node(node)
        elif node.target is aten.conv3d.default:
            a = node.normalized_arguments(ep.graph_module, normalize_to_only_use_kwargs=True).kwargs
            if a["bias"] is None:
                node.target = aten.convolution.default
                node.args = (a["input"], a["weight"], None, a["stride"], a["padding"], a["dilation"], False,
                             [0, 0, 0], a["groups"])
                node.kwargs = {}
    graph.eliminate_dead_code()
    ep.graph_module.recompile()
    return ep


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


# ------------------------------------------------------------------------------------------------- files
def _format(output: Path, fmt: str | None) -> str:
    if fmt is None:
        fmt = output.suffix.lstrip(".").lower()
        if fmt not in FORMATS:
            raise ExportError(f"export: cannot tell the format from the file name {str(output)!r}: pass "
                              f"format='pt2' or 'onnx' (or name the file *.pt2 / *.onnx)")
    if fmt not in FORMATS:
        raise ExportError(f"export: `format` must be one of {FORMATS}, got {fmt!r}")
    return fmt


def _require_onnx() -> None:
    missing = [m for m in ("onnx", "onnxscript") if _missing(m)]
    if missing:
        raise ExportError(f"export: ONNX export needs the packages {missing} (pip install 'hoformer[export]')")


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def _load(checkpoint) -> torch.nn.Module:
    if isinstance(checkpoint, torch.nn.Module):
        return checkpoint
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise ExportError(f"export: `checkpoint` must be a model, a Lightning .ckpt path or a save_pretrained folder, "
                          f"got {type(checkpoint).__name__}")
    from hoformer.checkpoint import load_checkpoint

    model, _ = load_checkpoint(checkpoint, map_location="cpu")
    return model.eval()


def _input_names(model, args: tuple, kwargs: dict) -> list[str]:
    params = [p.name for p in inspect.signature(model.forward).parameters.values()]
    return [*params[:len(args)], *kwargs]


def export_model(checkpoint, output: str | os.PathLike, *, format: str | None = None,
                 example: tuple[tuple, dict] | None = None, verify: bool = True,
                 opset_version: int | None = None, progress: bool = True) -> Path:
    """Write ``checkpoint`` (a model, a Lightning ``.ckpt`` of a hoformer task or a ``save_pretrained`` folder) to
    ``output`` as ``format`` (``"pt2"`` or ``"onnx"``; default: from the file suffix) and return the path.

    The program is traced on ``example`` with a dynamic batch; a ``.pt2`` holds it lowered to core ATen ops
    (:func:`export_program`'s), ONNX is converted from it without the ONNX graph optimiser. With
    ``verify`` the written file is loaded back and run on fresh inputs at batch sizes 1 and 3 (:func:`verify_export`):
    a difference to eager above :data:`TOLERANCE` raises :class:`ExportError`. ``opset_version``: ONNX opset
    (default: the exporter's). ``progress``: one line per phase (tracing, lowering or converting, writing,
    verifying) with its time on stderr.
    """
    output = Path(output)
    if output.is_dir():
        raise ExportError(f"export: --output {str(output)!r} is a directory; expected a file path such as "
                          f"{str(output / 'model.onnx')!r} or {str(output / 'model.pt2')!r}")
    fmt = _format(output, format)
    if fmt == "onnx":
        _require_onnx()
    if output.is_dir():
        raise ExportError(f"export: `output` must be a file path (*.pt2 / *.onnx), got the directory {str(output)!r}")
    model = _load(checkpoint)
    args, kwargs = _inputs(model, example)
    phase = _Progress(progress)
    ep = _trace(model, args, kwargs, True, phase)
    if fmt == "pt2":  # ONNX: the converter lowers the program to the ops ONNX has itself (one pass, not two)
        ep = _lower(ep, phase)
    _write(ep, model, _input_names(model, args, kwargs), output, fmt, opset_version, phase)
    if verify:
        with phase(f"verifying {output.name} against the eager model (batch sizes 1 and 3)"):
            verify_export(model, output, fmt)
    return output


@contextlib.contextmanager
def _quiet_converter():
    """The ONNX converter's noise off for the conversion: its warning per torchvision op it skips when torchvision
    is not installed (``torch.onnx`` registration log), and torch's ``LeafSpec`` ``FutureWarning`` (torch >= 2.10),
    neither of which is about the model. Errors still surface."""
    import logging
    import warnings

    log = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            yield
    finally:
        log.setLevel(level)


def _write(ep: torch.export.ExportedProgram, model, input_names: list[str], output: Path, fmt: str,
           opset_version: int | None = None, phase: _Progress | None = None) -> None:
    """Write the program ``ep`` of ``model`` to ``output`` as ``fmt`` (as it is: lower it first for a ``.pt2``)."""
    phase = phase or _Progress(False)
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "pt2":
        with phase(f"writing {output}"):
            torch.export.save(ep, str(output))
        return
    with phase("converting to ONNX (torch.onnx: lowering, translation; no graph optimiser)"):
        try:
            # optimize=False: the onnxscript optimiser does not finish in tens of minutes on the causal forecaster's
            # unrolled generation loop; ONNX Runtime optimises the graph when it loads it
            with _quiet_converter():
                prog = torch.onnx.export(_for_onnx(ep), (), kwargs=None, dynamo=True, optimize=False,
                                         opset_version=opset_version, input_names=input_names,
                                         output_names=["output"], verbose=False)
        except Exception as e:  # noqa: BLE001 - the converter raises many types; report one clear error
            raise ExportError(f"export: model {_name(model)} could not be converted to ONNX "
                              f"({type(e).__name__}: {_first_line(e)})") from e
    with phase(f"writing {output}"):
        prog.save(str(output))


def _run_file(path: Path, fmt: str, args: tuple, kwargs: dict) -> torch.Tensor:
    if fmt == "pt2":
        with torch.no_grad():
            return torch.export.load(str(path)).module()(*args, **kwargs)
    import onnxruntime as ort
    from torch.utils._pytree import tree_leaves

    options = ort.SessionOptions()
    # ONNX Runtime's graph optimiser logs a warning per node it cannot constant-fold on the CPU (CastLike: "Could not
    # find a CPU kernel"), which changes nothing in the results: errors only
    options.log_severity_level = 3
    sess = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    feeds = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    names = [i.name for i in sess.get_inputs()]
    (out,) = sess.run(None, {n: t.detach().cpu().numpy() for n, t in zip(names, feeds)})
    return torch.from_numpy(out)


def verify_export(model: torch.nn.Module, path: str | os.PathLike, format: str | None = None,
                  batch_sizes: Sequence[int] = (1, 3)) -> float:
    """Largest absolute difference between ``model`` (eval) and the exported file ``path`` on
    ``model.example_inputs(b)`` for each ``b`` in ``batch_sizes``; raises :class:`ExportError` above
    :data:`TOLERANCE` (float32 models)."""
    path = Path(path)
    fmt = _format(path, format)
    worst = 0.0
    for b in batch_sizes:
        args, kwargs = _inputs(model, model.example_inputs(batch_size=b))
        with _eval(model), torch.no_grad():
            want = model(*args, **kwargs)
        got = _run_file(path, fmt, args, kwargs)
        if got.shape != want.shape:
            raise ExportError(f"export: {path} gives shape {tuple(got.shape)} at batch size {b}, eager "
                              f"{tuple(want.shape)}")
        worst = max(worst, (got.to(want.dtype) - want).abs().max().item())
    tol = TOLERANCE[fmt] if next(model.parameters(), torch.empty(0)).dtype != torch.float64 else 1e-9
    if not worst <= tol:
        raise ExportError(f"export: {path} differs from the eager model {_name(model)} by {worst:.3g} (> {tol:g})")
    return worst


# --------------------------------------------------------------------------------------------------- CLI
def export_main(argv: list[str] | None = None) -> int:
    """``hoformer export --checkpoint CKPT_OR_PRETRAINED_DIR --format onnx|pt2 --output FILE``."""
    p = argparse.ArgumentParser(prog="hoformer export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "--ckpt", required=True, help="Lightning .ckpt or save_pretrained folder")
    p.add_argument("--format", choices=FORMATS, default=None, help="default: from the --output suffix")
    p.add_argument("--output", "-o", required=True, help="file to write (*.pt2 or *.onnx)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip running the written file against the eager model at batch sizes 1 and 3")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines (tracing, converting, ...) on stderr")
    a = p.parse_args(argv)
    try:
        out = export_model(a.checkpoint, a.output, format=a.format, verify=not a.no_verify, opset_version=a.opset,
                           progress=not a.quiet)
    except (ExportError, FileNotFoundError, ValueError) as e:
        print(f"hoformer export: {e}", file=sys.stderr)
        return 2
    fmt = _format(out, a.format)
    print(f"wrote {out} ({fmt}, {out.stat().st_size / 2**20:.2f} MiB)"
          + ("" if a.no_verify else f"; matches the eager model within {TOLERANCE[fmt]:g} at batch sizes 1 and 3"))
    return 0
