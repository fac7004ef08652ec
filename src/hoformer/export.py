"""Deployable models: any registered model as a ``torch.export`` program (``.pt2``) or an ONNX file.

Command line (a Lightning ``.ckpt`` of a hoformer task or a ``save_pretrained`` folder)::

    hoformer export --checkpoint runs/.../pretrained --format onnx --output model.onnx
    hoformer export --checkpoint runs/.../checkpoints/last.ckpt --output model.pt2     # format from the suffix

Python::

    from hoformer.export import export_model, export_program
    export_model("runs/.../pretrained", "model.onnx")          # or a model object; returns the path written
    program = export_program(model)                              # torch.export.ExportedProgram

What is exported is the model's default forward (tensors in, one tensor out) in eval mode, traced on
``model.example_inputs()``: the same inputs, in the same order (e.g. Weaver's ``x, time, mask``; an input given as
``None`` there is not an input of the file). The batch dimension is dynamic (shared by all inputs, any size from 1);
every other size is the one the model was built for, which its forward checks anyway: variates, nodes, the image
grid, and HOBA's token count (the windows of eq 3 are laid out on the host from the sequence length: pad shorter
texts to it and pass the mask).

The hand-written kernels run as the custom ops of :mod:`hoformer.functional._ops` while tracing, and the written
files are lowered to core ATen ops with their pure-tensor transcriptions (``EXPORT_DECOMPOSITIONS``), so a ``.pt2``
loads with plain ``torch.export.load`` and an ONNX file runs in ONNX Runtime without hoformer installed. ONNX needs
the ``export`` extra (``pip install hoformer[export]``: onnx, onnxscript, onnxruntime). ONNX has no assertions:
the value checks of the forward (e.g. Weaver's time features in range) are left out of an ONNX file (a ``.pt2``
keeps them).

Anything that cannot be exported is refused up front with an :class:`ExportError` naming the model and the reason
(and a tracer failure is reported the same way, its traceback kept as the cause).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import sys
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


def _check_exportable(model: torch.nn.Module, kwargs: dict) -> None:
    """Refuse, with the reason, what the exported program could not reproduce."""
    from hoformer.models import HoformerModel

    if not isinstance(model, HoformerModel):
        raise ExportError(f"export: expected a hoformer model (hoformer.models.create_model / from_pretrained), got "
                          f"{type(model).__name__}")
    name = _name(model)
    if kwargs.get("return_attention"):
        raise ExportError(f"export: model {name}: `return_attention=True` cannot be exported (an exported program "
                          f"returns the model's output tensor only; record maps in Python with "
                          f"hoformer.layers.record_attention)")
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


def export_program(model: torch.nn.Module, example: tuple[tuple, dict] | None = None, *, dynamic_batch: bool = True,
                   lower: bool = True) -> torch.export.ExportedProgram:
    """``torch.export`` program of ``model``'s eval-mode forward on ``example`` (default ``model.example_inputs(2)``)
    with a dynamic batch dimension (``dynamic_batch``). ``lower``: core ATen ops only (hoformer's custom ops replaced
    by their pure-tensor transcriptions; what the written files hold); ``False`` keeps the custom ops, whose eager
    kernels are the fast ones, for use inside a Python process with hoformer imported."""
    from hoformer.functional._ops import EXPORT_DECOMPOSITIONS

    args, kwargs = _inputs(model, example)
    _check_exportable(model, kwargs)
    name = _name(model)
    with _eval(model):
        try:
            ep = torch.export.export(model, args, kwargs or None, strict=False,
                                     dynamic_shapes=_dynamic_shapes(model, args, kwargs) if dynamic_batch else None)
        except Exception as e:  # noqa: BLE001 - the tracer raises many types; report one clear error
            raise ExportError(f"export: model {name} could not be traced by torch.export "
                              f"({type(e).__name__}: {_first_line(e)})") from e
    if lower:
        table = torch.export.default_decompositions()
        table.update(EXPORT_DECOMPOSITIONS)
        ep = ep.run_decompositions(table)
    return ep


def _drop_value_checks(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``ep`` without the asynchronous value checks of :func:`hoformer._checks.check_values` (labels, time features
    in range), which ONNX cannot express: their assertions and the reductions feeding only them are removed."""
    graph = ep.graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in (torch.ops.aten._assert_async.msg,
                                                          torch.ops.aten._assert_async.default):
            graph.erase_node(node)
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
                 opset_version: int | None = None) -> Path:
    """Write ``checkpoint`` (a model, a Lightning ``.ckpt`` of a hoformer task or a ``save_pretrained`` folder) to
    ``output`` as ``format`` (``"pt2"`` or ``"onnx"``; default: from the file suffix) and return the path.

    The program is :func:`export_program`'s (lowered, dynamic batch, on ``example``). With ``verify`` the written
    file is loaded back and run on fresh inputs at batch sizes 1 and 3 (:func:`verify_export`): a difference to eager
    above :data:`TOLERANCE` raises :class:`ExportError`. ``opset_version``: ONNX opset (default: the exporter's).
    """
    output = Path(output)
    if output.is_dir():
        raise ExportError(f"export: --output {str(output)!r} is a directory; expected a file path such as "
                          f"{str(output / 'model.onnx')!r} or {str(output / 'model.pt2')!r}")
    fmt = _format(output, format)
    if fmt == "onnx":
        _require_onnx()
    model = _load(checkpoint)
    args, kwargs = _inputs(model, example)
    _write(export_program(model, (args, kwargs)), model, _input_names(model, args, kwargs), output, fmt,
           opset_version)
    if verify:
        verify_export(model, output, fmt)
    return output


def _write(ep: torch.export.ExportedProgram, model, input_names: list[str], output: Path, fmt: str,
           opset_version: int | None = None) -> None:
    """Write the lowered program ``ep`` of ``model`` to ``output`` as ``fmt``."""
    output.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "pt2":
        torch.export.save(ep, str(output))
        return
    try:
        prog = torch.onnx.export(_drop_value_checks(ep), (), kwargs=None, dynamo=True, opset_version=opset_version,
                                 input_names=input_names, output_names=["output"], verbose=False)
    except Exception as e:  # noqa: BLE001 - the converter raises many types; report one clear error
        raise ExportError(f"export: model {_name(model)} could not be converted to ONNX "
                          f"({type(e).__name__}: {_first_line(e)})") from e
    prog.save(str(output))


def _run_file(path: Path, fmt: str, args: tuple, kwargs: dict) -> torch.Tensor:
    if fmt == "pt2":
        with torch.no_grad():
            return torch.export.load(str(path)).module()(*args, **kwargs)
    import onnxruntime as ort
    from torch.utils._pytree import tree_leaves

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
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
    a = p.parse_args(argv)
    try:
        out = export_model(a.checkpoint, a.output, format=a.format, verify=not a.no_verify, opset_version=a.opset)
    except (ExportError, FileNotFoundError, ValueError) as e:
        print(f"hoformer export: {e}", file=sys.stderr)
        return 2
    fmt = _format(out, a.format)
    print(f"wrote {out} ({fmt}, {out.stat().st_size / 2**20:.2f} MiB)"
          + ("" if a.no_verify else f"; matches the eager model within {TOLERANCE[fmt]:g} at batch sizes 1 and 3"))
    return 0
