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
