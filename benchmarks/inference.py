"""CPU inference latency of deployed models: eager PyTorch, ``torch.compile`` and ONNX Runtime, side by side.

Run:  .venv/bin/python benchmarks/inference.py [--threads 1] [--reps 20] [--batch 1 32]
                                               [--models hot_forecaster hot_volume_classifier weaver]
                                               [--runtimes eager compile onnx]

Models at their paper defaults on their datasets' shapes: ``hot_forecaster`` ETTh1 (seq 96, 7 variates, pred 96),
``hot_volume_classifier`` a 28^3 MedMNIST volume, ``weaver`` METR-LA (207 nodes, 12 steps in and out, with time
features and the observation mask). Weights are random (latency does not depend on them); every model is in eval
mode. Per model and batch size:

* ``eager``: ``model(*inputs)`` under ``torch.inference_mode``;
* ``compile``: ``torch.compile(model, fullgraph=True)`` (Inductor), the same call; compile time reported apart;
* ``onnx``: the file written by :func:`hoformer.export.export_model` (dynamic batch) run by ONNX Runtime's CPU InferenceSession
  with ``intra_op_num_threads`` = ``--threads``; export time reported apart.

Latency is the median wall time of ``--reps`` calls after 3 warm-up calls; the runtimes of one (model, batch) are
measured in interleaved rounds so that machine load hits them alike. Every runtime's output is checked against eager
first (max abs difference printed).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from hoformer.export import export_model
from hoformer.models import create_model

import timing  # benchmarks/: a script's own folder is first on sys.path

MODELS = {
    "hot_forecaster": dict(seq_len=96, pred_len=96, num_variates=7),
    "hot_volume_classifier": dict(input_size=28),
    "weaver": dict(num_nodes=207),
}


def _runners(name: str, model, args, kwargs, runtimes, tmp: Path, threads: int):
    """``{runtime: (callable(args, kwargs) -> tensor, setup seconds)}``."""
    out = {}
    if "eager" in runtimes:
        out["eager"] = (lambda a, k: model(*a, **k), 0.0)
    if "compile" in runtimes:
        import torch._dynamo as dynamo

        dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        with torch.inference_mode():
            setup = timing.time_call(lambda: compiled(*args, **kwargs))  # the first call compiles
        out["compile"] = (lambda a, k: compiled(*a, **k), setup)
    if "onnx" in runtimes:
        import onnxruntime as ort
        from torch.utils._pytree import tree_leaves

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        built = []  # the ONNX Runtime InferenceSession, kept out of the timed call
        setup = timing.time_call(lambda: built.append(ort.InferenceSession(
            str(export_model(model, tmp / f"{name}.onnx", verify=False)), opts, providers=["CPUExecutionProvider"])))
        sess = built[0]
        names = [i.name for i in sess.get_inputs()]

        def run(a, k):
            feeds = [x for x in tree_leaves((a, k)) if isinstance(x, torch.Tensor)]
            return torch.from_numpy(sess.run(None, {n: x.numpy() for n, x in zip(names, feeds)})[0])

        out["onnx"] = (run, setup)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--runtimes", nargs="+", default=["eager", "compile", "onnx"],
                    choices=["eager", "compile", "onnx"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (torch and ONNX Runtime)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, threads={a.threads}, median of {a.reps} calls (ms)")
    print(f"{'model':>22} {'batch':>5} " + " ".join(f"{r:>10}" for r in a.runtimes) + "   setup (s) / max |diff|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            torch.manual_seed(0)
            model = create_model(name, **MODELS[name]).eval()
            for b in a.batch:
                args, kwargs = model.example_inputs(batch_size=b)
                kwargs = {k: v for k, v in kwargs.items() if v is not None}
                runners = _runners(name, model, args, kwargs, a.runtimes, Path(tmp), a.threads)
                times = {r: [] for r in runners}
                notes = []
                with torch.inference_mode():
                    want = model(*args, **kwargs)
                    for r, (fn, setup) in runners.items():
                        diff = (fn(args, kwargs) - want).abs().max().item()
                        notes.append(f"{r} {setup:.1f}/{diff:.1e}")
                        for _ in range(2):
                            fn(args, kwargs)
                    for _ in range(a.reps):
                        for r, (fn, _) in runners.items():
                            times[r].append(timing.time_call(lambda fn=fn: fn(args, kwargs)))  # noqa: B023 (called at once)
                cells = " ".join(f"{statistics.median(times[r]) * 1e3:>10.2f}" for r in a.runtimes)
                print(f"{name:>22} {b:>5} {cells}   {', '.join(notes)}", flush=True)


if __name__ == "__main__":
    main()
