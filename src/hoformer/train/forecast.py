"""``hoformer forecast``: the steps after the end of the data, from a trained forecaster, as a CSV.

``hoformer test`` scores windows whose future is known; a user of a forecaster wants the future that is not. Given a
checkpoint (a Lightning ``.ckpt`` of a :class:`~hoformer.train.ForecastingTask` or a ``save_pretrained`` folder) and
its LTSF data (the datamodule stored in the checkpoint, the run's ``config.yaml``, or ``--config``), this reads the
last ``seq_len`` rows of the data file (or of ``--history``, e.g. the same series with newer rows), standardises them
with the training slice's scaler, and writes the ``pred_len`` forecast steps on the original scale, with their
timestamps, to a CSV (atomically). ``--end ROW`` forecasts from an earlier row instead (a backtest)::

    hoformer forecast --checkpoint runs/hot/ltsf/etth1_96_96_hot_product/checkpoints/last.ckpt --output forecast.csv
    hoformer forecast --checkpoint runs/.../pretrained --config configs/hot/ltsf/etth1_96_96_hot_product.yaml \\
                      --history ETTh1_with_new_rows.csv

The Python form is :meth:`hoformer.data.LTSFDataset.forecast`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from hoformer._io import atomic_write

__all__ = ["forecast_checkpoint", "forecast_main"]


def forecast_checkpoint(checkpoint, *, config=None, data: str | None = None, data_args: dict | None = None,
                        history=None, end: int | None = None, device: str = "cpu"):
    """``pandas.DataFrame`` of the forecast of ``checkpoint`` after row ``end`` of ``history`` (defaults: the end of
    the training file); see :meth:`hoformer.data.LTSFDataset.forecast`. The data come from ``config``, or the class
    path ``data`` with ``data_args`` on top of the datamodule hyper-parameters the checkpoint stored (a checkpoint
    of a plain ``Trainer.fit``, e.g. ``hoformer demo``'s, stores them without their class), or the checkpoint /
    its run folder alone."""
    from hoformer.analysis.analyze import checkpoint_datamodule, load_checkpoint

    model, info = load_checkpoint(checkpoint, map_location=device)
    stored = info["datamodule"] or {}
    if data is not None and not stored.get("_class_path"):
        data_args = {**{k: v for k, v in stored.items() if not k.startswith("_")}, **(data_args or {})}
    dm = checkpoint_datamodule(info, config=config, data=data, data_args=data_args)
    dataset = dm.dataset("train") if hasattr(dm, "dataset") else None
    if not callable(getattr(dataset, "forecast", None)):
        raise ValueError(f"forecast: the checkpoint's data ({type(dm).__name__}) is not an LTSF datamodule; pass "
                         "--config with an LTSFDataModule `data` section")
    return dataset.forecast(model.to(device), history, end=end)


def forecast_main(argv: Sequence[str] | None = None) -> int:
    """``hoformer forecast``: forecast the steps after the end of a series with a trained forecaster (CSV out)."""
    p = argparse.ArgumentParser(prog="hoformer forecast", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "--ckpt", required=True, help="Lightning .ckpt or save_pretrained folder")
    p.add_argument("--config", help="LightningCLI YAML whose `data` section gives the LTSF data (default: the "
                                    "checkpoint's stored datamodule or its run's config.yaml)")
    p.add_argument("--data", help="datamodule class path (e.g. hoformer.data.LTSFDataModule) when the checkpoint "
                                  "stores its hyper-parameters but not its class (a plain Trainer.fit)")
    p.add_argument("--data-args", default="{}", help="JSON overrides of the data's init args (e.g. root)")
    p.add_argument("--history", help="CSV in the LTSF layout to forecast from (default: the training file); its "
                                     "columns must include the training ones")
    p.add_argument("--end", type=int, help="forecast from this 0-based row (default: after the last row)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--output", default="forecast.csv", help="CSV to write (default forecast.csv)")
    a = p.parse_args(argv)
    try:
        data_args = json.loads(a.data_args)
    except json.JSONDecodeError as e:
        p.error(f"--data-args must be a JSON object: {e}")
    if not isinstance(data_args, dict):
        p.error("--data-args must be a JSON object")
    try:
        df = forecast_checkpoint(a.checkpoint, config=a.config, data=a.data, data_args=data_args, history=a.history,
                                 end=a.end, device=a.device)
    except (FileNotFoundError, ValueError, TypeError) as e:  # input errors (incl. wrong data args): one line
        print(f"hoformer forecast: error: {e}", file=sys.stderr)
        return 2
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: df.to_csv(tmp, index=False))
    first, last = df.iloc[0, 0], df.iloc[-1, 0]
    print(f"hoformer forecast: {len(df)} steps ({first} .. {last}) x {df.shape[1] - 1} column(s) -> {out}")
    return 0
