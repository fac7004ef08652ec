"""Shared fixtures. Real data is read from ``$HOFORMER_DATA`` (default ``../shared/data``); tests that need it
skip with a clear reason when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Every tensor in the default suite is tiny: one intra-op thread. A second one only adds per-op wake-ups, which on
# a busy 2-core machine made small-op tests ~100x slower (FAVOR's 512 small QRs: 6 s instead of 15 ms). The CPU
# cache blocking of kron_apply is tested for every chunk size by patching its chunk rule, independent of threads.
torch.set_num_threads(1)


def _data_root() -> Path | None:
    env = os.environ.get("HOFORMER_DATA")
    cands = [Path(env)] if env else []
    cands.append(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    for c in cands:
        if c.is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = _data_root()
    if root is None:
        pytest.skip("real benchmark data not found: set HOFORMER_DATA to the shared data directory (e.g. ../shared/data)")
    return root


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread():
    """A command under test may set the process's thread count (``hoformer demo`` without ``--threads`` sets up to
    two): put it back after each test, or every later test runs with two threads (see above)."""
    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
