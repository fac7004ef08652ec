"""Test helper: rewrite a ``save_pretrained`` directory's configuration consistently (config and weights agree, the
weights' recorded SHA-256 included)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hoformer.models.base import DIGEST_KEY, WEIGHTS_SHA256_KEY, _sha256, config_digest


def restamp_config(directory, edit: Callable[[dict], None]) -> dict:
    """Apply ``edit`` to ``directory/config.json`` and store the edited configuration's digest in the weights'
    metadata, as if ``save_pretrained`` had written that configuration (what a later release reading an older save,
    or a deliberate re-save, looks like); returns the new configuration."""
    d = Path(directory)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    w = str(d / "model.safetensors")
    with safe_open(w, "pt") as f:
        meta = dict(f.metadata() or {})
    meta[DIGEST_KEY] = config_digest(cfg)
    save_file(load_file(w), w, metadata=meta)
    if WEIGHTS_SHA256_KEY in cfg:  # the rewritten weights' digest, as save_pretrained records it
        cfg[WEIGHTS_SHA256_KEY] = _sha256(w)
    (d / "config.json").write_text(json.dumps(cfg))
    return cfg
