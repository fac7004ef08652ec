"""What a run says (on one tiny synthetic ``hoformer fit`` and its ``test`` / ``forecast``): the data and split
protocol, a small-validation warning, epoch lines numbered from 0 like the checkpoint names, progress inside an epoch,
why it stopped with its best checkpoint and ``pretrained/`` folder, the forecast PNG, a forecast from the
``pretrained/`` folder, an interrupted (SIGTERM) fit, and the demo's fixed epoch count."""
from __future__ import annotations

import contextlib
import io
import os
import re
import signal
from pathlib import Path

import lightning.pytorch as pl
import pytest

from hoformer import cli

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "hot" / "ltsf_cpu" / "etth1_96_96_hot_product.yaml")
#: 300 synthetic rows at 32 -> 16: 163 / 15 / 45 windows (a 15-window validation split); a large learning rate, so
#: validation stops improving and early stopping (patience 1) ends the run before max_epochs
TINY = ["--config", CONFIG, "--data.init_args.synthetic=true", "--data.init_args.synthetic_length=300",
        "--data.init_args.seq_len=32", "--data.init_args.pred_len=16", "--data.init_args.batch_size=16",
        "--model.model.init_args.dim=16", "--model.model.init_args.depth=1", "--model.model.init_args.num_heads=2",
        "--model.model.init_args.patch_size=8", "--model.init_args.optim.lr=0.3", "--trainer.limit_train_batches=3",
        "--trainer.max_epochs=6", "--trainer.callbacks.patience=1", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--threads=1"]


def _run(argv) -> tuple[int | None, str]:
    """``hoformer ARGV`` in this process: (exit code, stdout + stderr)."""
    out = io.StringIO()
    code = None
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        try:
            code = cli.main(list(argv))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One tiny early-stopped fit whose progress lines are printed at every step (``progress_every_s=0``)."""
    root = tmp_path_factory.mktemp("run") / "tiny"
    code, text = _run(["fit", *TINY, f"--trainer.default_root_dir={root}",
                       "--trainer.callbacks+=hoformer.train.EpochSummary", "--trainer.callbacks.progress_every_s=0"])
    assert code in (0, None), text[-3000:]
    return root, text


def test_fit_says_which_data_and_split_protocol_it_trains_on(fitted):
    _, text = fitted
    assert ("hoformer fit: data: synthetic(length=300, num_variates=7, seed=0), split 70/10/20 of all rows (custom "
            "CSV protocol): train/val/test 163 / 15 / 45 windows") in text


def test_a_known_dataset_read_as_a_csv_says_how_to_get_its_published_split(tmp_path):
    import pandas as pd

    from hoformer.data import LTSFDataModule

    rows = pd.DataFrame({"date": pd.date_range("2016-07-01", periods=300, freq="h"), "HUFL": range(300),
                         "OT": [i % 7 for i in range(300)]})
    rows.to_csv(tmp_path / "ETTh2.csv", index=False)
    own = LTSFDataModule(str(tmp_path), "ETTh2.csv", seq_len=32, pred_len=16, verify=False)
    own.setup("fit")
    line, sizes = own.split_summary()
    assert line == ("ETTh2.csv, split 70/10/20 of all rows (custom CSV protocol): train/val/test 163 / 15 / 45 "
                    "windows; name=ETTh2.csv is read as a CSV of your own; name=ETTh2 (root: the folder holding "
                    "ETT-small/ETTh2.csv) gives ETTh2's published split")
    assert sizes == {"train": 163, "val": 15, "test": 45}


def test_a_small_validation_split_is_warned_about(fitted):
    _, text = fitted
    assert ("hoformer fit: warning: the validation split holds only 15 windows (fewer than 30); early stopping and "
            "the best checkpoint are chosen on it") in text


def test_early_stopping_says_why_the_best_epoch_and_the_files(fitted):
    root, text = fitted
    (line,) = [x for x in text.splitlines() if x.startswith("hoformer fit: early stopping after epoch ")]
    m = re.search(r"best val/mae [\d.]+ at epoch (\d+); best checkpoint (\S+) \(val/mae [\d.]+, epoch (\d+)\)", line)
    assert m and "did not improve for 1 epoch(s) (patience 1)" in line, line
    assert m.group(1) == m.group(3) and Path(m.group(2)).name == f"best-epoch={int(m.group(1)):03d}.ckpt"
    assert f"last {root / 'checkpoints' / 'last.ckpt'}" in line and f"save_pretrained {root / 'pretrained'}" in line
    assert Path(m.group(2)).is_file() and (root / "pretrained" / "config.json").is_file()


def test_epochs_are_numbered_from_0_everywhere_and_each_metric_shows_once(fitted):
    root, text = fitted
    lines = [x for x in text.splitlines() if re.match(r"epoch \d+/5: train/loss", x)]
    assert lines and lines[0].startswith("epoch 0/5: ")  # as the progress bar and best-epoch=000.ckpt count
    assert all(x.count("train/loss") == 1 and x.count("val/mae") == 1 for x in lines), lines
    stopped = int(re.search(r"early stopping after epoch (\d+)/5", text).group(1))
    assert lines[-1].startswith(f"epoch {stopped}/5: ")


def test_progress_lines_inside_an_epoch_for_a_log_file(fitted):
    _, text = fitted
    assert re.search(r"^epoch 0/5: step 1/3, train/loss [\d.]+ \(\d+ s; about \d+ s left in the epoch\)$", text,
                     flags=re.M), text[:3000]


def test_hoformer_test_prints_the_forecast_plot_labelled_standardised(fitted, monkeypatch):
    import hoformer._plot as plot

    root, _ = fitted
    figures = []
    save = plot.save_figure
    monkeypatch.setattr(plot, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path))[1])
    code, text = _run(["test", *TINY, f"--trainer.default_root_dir={root}", "--ckpt_path", "best"])
    assert code in (0, None), text[-3000:]
    m = re.search(r"forecast plot of the first test window \(standardised values, as the model sees them\): (\S+)",
                  text)
    assert m and Path(m.group(1)).is_file() and Path(m.group(1)).name == "forecast.png"
    (fig,) = figures
    assert [ax.get_ylabel() for ax in fig.axes][:2] == ["OT\n(standardised)", "v5\n(standardised)"]


def test_forecast_from_the_pretrained_folder_says_what_it_does(fitted, tmp_path, monkeypatch):
    root, _ = fitted
    code, text = _run(["forecast", "--checkpoint", str(root / "pretrained"), "--output", str(tmp_path / "f.csv")])
    assert code == 0, text
    for step in ("loading ", "loaded hot_forecaster (lookback 32, horizon 16)", "reading the training data",
                 "16 steps"):
        assert f"hoformer forecast: {step}" in text, text
    # with a history the folder's own data.json (scaler, columns) is enough: the training data are not read
    import pandas as pd

    import hoformer.inference

    future = pd.read_csv(tmp_path / "f.csv")
    history = tmp_path / "history.csv"
    from hoformer.data import LTSFDataModule

    LTSFDataModule(synthetic=True, synthetic_length=300, seq_len=32, pred_len=16).history().to_csv(history, index=False)
    monkeypatch.setattr(hoformer.inference, "checkpoint_datamodule", lambda *a, **k: pytest.fail("read the data"))
    code, text = _run(["forecast", "--checkpoint", str(root / "pretrained"), "--history", str(history),
                       "--output", str(tmp_path / "g.csv")])
    assert code == 0 and "the training data's scaler and columns from" in text, text
    again = pd.read_csv(tmp_path / "g.csv")
    assert again.equals(future)  # the same forecast as with the training file read


class _Sigterm(pl.Callback):
    """Sends this process SIGTERM during the first training step of the second epoch (as a scheduler ending a job
    does)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_ends_fit_with_a_nonzero_status_and_the_resume_command(tmp_path):
    root = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    argv = ["fit", *TINY, f"--trainer.default_root_dir={root}", "--trainer.callbacks+=test_run_output._Sigterm"]
    code, text = _run(argv)
    assert signal.getsignal(signal.SIGTERM) == before  # Lightning's handler is gone again
    assert code == 143, text[-2000:]
    assert ("hoformer fit: stopped by SIGTERM in epoch 1/5: the run did not finish; its last complete epoch (0/5) is "
            f"in {root / 'checkpoints' / 'last.ckpt'}") in text, text[-2000:]
    resume = text.split("Resume it exactly with:\n  ", 1)[1].splitlines()[0]
    assert resume.startswith("hoformer fit --config ") and resume.endswith(
        f"--ckpt_path {root / 'checkpoints' / 'last.ckpt'}")
    assert (root / "checkpoints" / "last.ckpt").is_file() and not (root / ".hoformer.lock").exists()


class _Built(Exception):
    pass


def test_the_demo_trains_a_fixed_number_of_epochs_and_says_how_long_it_took(tmp_path, monkeypatch):
    import lightning.pytorch as lpl

    seen = {}

    def trainer(**kw):  # the demo's trainer, as it is built (nothing is trained)
        seen.update(kw)
        raise _Built

    monkeypatch.setattr(lpl, "Trainer", trainer)
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(_Built):
        cli.main(["demo", "--dataset", "synthetic", "--output", str(tmp_path / "demo"), "--threads", "1"])
    assert seen["max_epochs"] == 3 and "max_time" not in seen  # no wall-clock budget: the same result anywhere
    assert not any(type(c).__name__ == "EarlyStopping" for c in seen["callbacks"])
    source = (REPO / "src" / "hoformer" / "cli.py").read_text()
    assert "trained {trainer.current_epoch} epoch(s) in {fit_s:.0f} s and tested in" in source
    assert "--max-minutes" not in source


def test_a_command_builds_only_its_own_subcommand_parser():
    """``hoformer fit --help`` / ``--print_config`` parse with the ``fit`` parser alone (each of the four
    subcommand parsers is a quarter of the parsing time); the help of another subcommand still works."""
    from hoformer.lightning_cli import HoformerCLI

    assert set(HoformerCLI(parse_only=True)._subcommand_parsers) == {"fit"}
    code, text = _run(["test", "--help"])
    assert code in (0, None) and text.startswith("usage: hoformer [options] test ")
