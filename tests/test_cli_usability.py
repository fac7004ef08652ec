"""What new users meet first: the CLI says how many threads PyTorch uses; the demo tries the checksummed ETTh1
download before it falls back to synthetic data."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

import hoformer.data as data_utils  # the names the CLI calls (hoformer.data.download_url, ...)
from hoformer import cli

REPO = Path(__file__).resolve().parents[1]


class _Stop(Exception):
    pass


def _no_shared_data(monkeypatch, tmp_path):
    monkeypatch.setenv("HOFORMER_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("HOFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "a" / "b" / "c" / "cli.py"))  # no repo-relative data
    monkeypatch.chdir(tmp_path)


def _stop_at_datamodule(monkeypatch, seen):
    import hoformer.data

    def fake_dm(**kw):
        seen.append(kw)
        raise _Stop

    monkeypatch.setattr(hoformer.data, "LTSFDataModule", fake_dm)


def test_demo_downloads_etth1_when_the_data_folder_lacks_it(tmp_path, monkeypatch, capsys):
    _no_shared_data(monkeypatch, tmp_path)
    seen, calls = [], []

    def fake_download(url, dest, *, sha256=None, timeout=60.0, **kw):
        calls.append((url, Path(dest), sha256, timeout))
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_text("date,OT\n")
        return Path(dest)

    monkeypatch.setattr(data_utils, "download_url", fake_download)
    _stop_at_datamodule(monkeypatch, seen)
    with pytest.raises(_Stop):
        cli.main(["demo", "--output", str(tmp_path / "demo"), "--threads", "1", "--download", "--download-timeout", "3"])
    (url, dest, sha, timeout), = calls
    assert "ETTh1.csv" in url and dest == tmp_path / "cache" / "ltsf" / "ETT-small" / "ETTh1.csv"
    assert sha == "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066" and timeout == 3
    assert (seen[-1]["name"], seen[-1]["root"], seen[-1]["synthetic"]) == ("ETTh1", str(tmp_path / "cache" / "ltsf"),
                                                                           False)
    assert "trying the checksummed download" in capsys.readouterr().out


def test_demo_falls_back_to_synthetic_with_a_one_line_reason(tmp_path, monkeypatch, capsys):
    _no_shared_data(monkeypatch, tmp_path)
    seen = []

    def offline(url, dest, **kw):
        raise OSError(f"could not download {url} to {dest}: <urlopen error [Errno -3] name resolution>")

    monkeypatch.setattr(data_utils, "download_url", offline)
    _stop_at_datamodule(monkeypatch, seen)
    with pytest.raises(_Stop):
        cli.main(["demo", "--output", str(tmp_path / "demo"), "--threads", "1", "--download"])
    assert (seen[-1]["name"], seen[-1]["synthetic"]) == ("synthetic", True)
    lines = [x for x in capsys.readouterr().out.splitlines() if "synthetic" in x]
    assert len(lines) == 1 and "the download of ETTh1 failed: could not download" in lines[0]
    # by default nothing is downloaded (the README: nothing is downloaded unless you ask)
    monkeypatch.setattr(data_utils, "download_url", lambda *a, **k: pytest.fail("downloaded"))
    with pytest.raises(_Stop):
        cli.main(["demo", "--output", str(tmp_path / "demo"), "--threads", "1"])
    assert "--download fetches the ETT files" in capsys.readouterr().out
    # a named dataset is never replaced by synthetic data
    monkeypatch.setattr(data_utils, "download_url", offline)
    assert cli.main(["demo", "--dataset", "ETTm1", "--output", str(tmp_path / "demo"), "--download"]) == 2
    assert "the download of ETTm1 failed" in capsys.readouterr().err


def test_lightning_commands_report_and_set_threads(tmp_path):
    before = torch.get_num_threads()
    err = io.StringIO()
    cfg = str(REPO / "configs" / "hot" / "ltsf" / "etth1_96_96_hot_sum.yaml")
    with contextlib.redirect_stderr(err), pytest.raises(ValueError, match="`--threads` must be an int >= 1, got 0"):
        cli.main(["validate", "--config", cfg, "--data.init_args.synthetic=true", "--threads", "0",
                  f"--trainer.default_root_dir={tmp_path}"])
    err2 = io.StringIO()
    try:
        with contextlib.redirect_stderr(err2), contextlib.redirect_stdout(io.StringIO()):
            cli.main(["validate", "--config", cfg, "--data.init_args.synthetic=true", "--threads", "1",
                      "--trainer.limit_val_batches=1", "--trainer.logger=false",
                      f"--trainer.default_root_dir={tmp_path}"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert "hoformer validate: PyTorch uses 1 CPU thread(s) (set by --threads" in err2.getvalue()
    assert "OMP_NUM_THREADS=N" in err2.getvalue()


def test_demo_honours_omp_num_threads(tmp_path, monkeypatch):
    seen = []
    _no_shared_data(monkeypatch, tmp_path)
    _stop_at_datamodule(monkeypatch, seen)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(_Stop):
            cli.main(["demo", "--output", str(tmp_path / "demo")])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _series_csv(path: Path, rows: int = 600) -> Path:
    import numpy as np
    import pandas as pd

    t = np.arange(rows)
    pd.DataFrame({"date": pd.date_range("2020-01-01", periods=rows, freq="h").astype(str),
                  "a": np.sin(t / 10), "b": np.cos(t / 7), "OT": np.sin(t / 5) + 0.1 * t / rows}).to_csv(path,
                                                                                                  index=False)
    return path


def _fit_argv(tmp_path, *more) -> list[str]:
    return ["hoformer", "fit", "--config", str(REPO / "configs/hot/ltsf_cpu/etth1_96_96_hot_product.yaml"),
            "--data.init_args.root", str(tmp_path), "--data.init_args.name", "my_series.csv",
            "--data.init_args.seq_len", "48", "--data.init_args.pred_len", "24",
            "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false", *more]


@pytest.mark.parametrize("more,says", [
    (["--data.init_args.batch_size", "0"], "LTSFDataModule: `batch_size` must be an int >= 1, got 0"),
    (["--data.init_args.name", "my_seris.csv"], "Did you mean 'my_series.csv'"),
    (["--data.init_args.seq_len", "400", "--data.init_args.pred_len", "200"], "--data.init_args.seq_len"),
    (["--trainer.max_epochs=-2"], "`max_epochs` must be a non-negative integer or -1"),
    (["--trainer.max_epochs=0"], "ExportPretrained: the fit ran no training step"),
])
def test_an_input_error_of_fit_is_one_line_from_the_command_line(tmp_path, monkeypatch, capsys, more, says):
    """However deep jsonargparse and Lightning wrap an input check's error (a constructor's, a link's, the
    trainer's), ``hoformer fit`` from the command line prints it as one ``error:`` line and returns 2; a run that
    trained nothing writes no ``pretrained/``; ``HOFORMER_TRACEBACK=1`` gives the traceback."""
    _series_csv(tmp_path / "my_series.csv")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("HOFORMER_TRACEBACK", raising=False)
    monkeypatch.setattr("sys.argv", _fit_argv(tmp_path, *more))
    assert cli.main() == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("error: hoformer fit: "))
    assert says in line and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "run" / "pretrained").exists()
    if more == ["--data.init_args.batch_size", "0"]:
        monkeypatch.setenv("HOFORMER_TRACEBACK", "1")
        with pytest.raises(Exception, match="batch_size"):
            cli.main()


def test_a_library_error_keeps_its_traceback(tmp_path, monkeypatch):
    """An exception that is not an input check's (here a KeyError from inside the data read) is not shortened."""
    import hoformer.data.ltsf as ltsf

    _series_csv(tmp_path / "my_series.csv")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(ltsf.LTSFDataModule, "_path", lambda self: {}["bug"])
    monkeypatch.setattr("sys.argv", _fit_argv(tmp_path))
    with pytest.raises(Exception) as info:
        cli.main()
    e = info.value
    while e.__cause__ is not None:
        e = e.__cause__
    assert isinstance(e, KeyError)


def test_create_model_names_the_closest_model_and_argument():
    from hoformer.models import create_model

    with pytest.raises(ValueError, match=r"unknown model name 'hot_forcaster' \(did you mean 'hot_forecaster'"):
        create_model("hot_forcaster")
    with pytest.raises(TypeError, match=r"has no argument 'num_varites' \(did you mean 'num_variates'\?\)"):
        create_model("hot_forecaster", seq_len=16, pred_len=8, num_varites=3)
