"""Test helper shared by the training test files: a quiet one-device CPU Lightning trainer."""
from __future__ import annotations

import lightning.pytorch as pl


def quiet_trainer(tmp_path, **kw) -> pl.Trainer:
    """CPU, one device, no progress bar or model summary; no logger and no checkpointing unless given."""
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    return pl.Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1, enable_progress_bar=False,
                      enable_model_summary=False, **kw)
