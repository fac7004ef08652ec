"""Bad inputs and faults as data: each case is a call that must raise one exception type with a message naming the
argument or file, what was expected and what was found.

A case is ``Case(id, call, error, substrings)``: ``call`` takes pytest's ``tmp_path`` (a fresh directory per case)
and performs the bad call; ``error`` is the exception type it must raise; every string of ``substrings`` must occur
in the message. To add cases, append to :data:`CASES` (or a per-area list concatenated into it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch

from hoformer.models import create_model, from_pretrained


class Case(NamedTuple):
    id: str
    call: Callable[[Path], object]
    error: type[BaseException]
    substrings: tuple[str, ...]


def _tiny_forecaster():
    return create_model("hot_forecaster", seq_len=16, pred_len=4, num_variates=3, dim=8, num_heads=2, depth=1)


def _saved_forecaster(tmp_path: Path) -> Path:
    return _tiny_forecaster().save_pretrained(tmp_path / "model")


def _missing_device() -> str:
    """A device type this machine does not have (CUDA on a CPU machine, else an index past the last GPU)."""
    if not torch.cuda.is_available():
        return "cuda"
    return f"cuda:{torch.cuda.device_count()}"


# ------------------------------------------------------------------------------------------------------ models
MODEL_CASES = [
    Case("hot_forecaster-float64-input-to-float32-model",
         lambda tmp: _tiny_forecaster()(torch.randn(2, 16, 3, dtype=torch.float64)),
         TypeError, ("hot_forecaster", "`x`", "torch.float64", "weights are torch.float32", "model.to(")),
    Case("hot_forecaster-float16-input-to-float32-model",
         lambda tmp: _tiny_forecaster()(torch.randn(2, 16, 3).half()),
         TypeError, ("hot_forecaster", "`x`", "torch.float16", "torch.float32", "x.to(torch.float32)")),
    Case("hot_volume_classifier-float64-input",
         lambda tmp: create_model("hot_volume_classifier", input_size=8, dim=8, num_heads=2, depth=1)(
             torch.randn(1, 1, 8, 8, 8, dtype=torch.float64)),
         TypeError, ("hot_volume_classifier", "`x`", "torch.float64", "torch.float32")),
    Case("weaver-float64-input",
         lambda tmp: create_model("weaver", num_nodes=5, window=6, horizon=4, dim=8, num_heads=2)(
             torch.randn(2, 6, 5, 1, dtype=torch.float64)),
         TypeError, ("Weaver", "`x`", "torch.float64", "torch.float32")),
    Case("hot_forecaster-empty-batch",
         lambda tmp: _tiny_forecaster()(torch.randn(0, 16, 3)),
         ValueError, ("hot_forecaster", "`x`", "empty batch (B = 0)", "at least one sample", "(0, 16, 3)")),
    Case("hot_segmenter-empty-batch",
         lambda tmp: create_model("hot_segmenter", in_channels=2, num_classes=3, input_size=16, dim=8, num_heads=2,
                                  depth=1)(torch.randn(0, 2, 16, 16)),
         ValueError, ("hot_segmenter", "`x`", "empty batch (B = 0)", "(0, 2, 16, 16)")),
    Case("traffic_hot-empty-batch",
         lambda tmp: create_model("traffic_hot", num_nodes=5, window=6, horizon=4, dim=8, num_heads=2)(
             torch.randn(0, 6, 5, 1)),
         ValueError, ("TrafficTransformer", "`x`", "empty batch (B = 0)", "(0, 6, 5, 1)")),
    Case("hoba_classifier-empty-batch",
         lambda tmp: create_model("hoba_classifier", vocab_size=50, max_len=16, dim=8, num_heads=2, depth=1)(
             torch.zeros(0, 8, dtype=torch.long)),
         ValueError, ("hoba_classifier", "`ids`", "empty batch (B = 0)", "(0, 8)")),
    Case("from_pretrained-map_location-device-not-available",
         lambda tmp: from_pretrained(_saved_forecaster(tmp), map_location=_missing_device()),
         ValueError, ("from_pretrained", "`map_location`", _missing_device(), "map_location='cpu'")),
    Case("from_pretrained-map_location-not-a-device",
         lambda tmp: from_pretrained(_saved_forecaster(tmp), map_location="gpu0"),
         ValueError, ("from_pretrained", "`map_location`", "device string or torch.device", "'gpu0'")),
    Case("from_pretrained-directory-is-a-file",
         lambda tmp: from_pretrained((tmp / "weights.bin", (tmp / "weights.bin").write_bytes(b"x"))[0]),
         FileNotFoundError, ("from_pretrained", "`directory`", "config.json", "weights.bin", "a file")),
    Case("from_pretrained-directory-missing",
         lambda tmp: from_pretrained(tmp / "no_such_dir"),
         FileNotFoundError, ("from_pretrained", "`directory`", "no_such_dir", "not found")),
    Case("save_pretrained-onto-an-existing-file",
         lambda tmp: _tiny_forecaster().save_pretrained((tmp / "out.safetensors",
                                                         (tmp / "out.safetensors").write_bytes(b"x"))[0]),
         FileExistsError, ("save_pretrained", "`directory`", "must be a directory", "existing file",
                           "out.safetensors")),
    Case("create_model-unknown-name",
         lambda tmp: create_model("hot_forcaster"),
         ValueError, ("create_model", "unknown model name 'hot_forcaster'", "hot_forecaster")),
    Case("create_model-preset-changed",
         lambda tmp: create_model("traffic_hot", layout="full"),
         ValueError, ("create_model", "'traffic_hot'", "'layout': 'kronecker'", "'layout': 'full'")),
]

CASES: list[Case] = MODEL_CASES


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_a_clear_error(case: Case, tmp_path):
    with pytest.raises(case.error) as info:
        case.call(tmp_path)
    message = str(info.value)
    missing = [s for s in case.substrings if s not in message]
    assert not missing, f"{case.id}: message lacks {missing}: {message!r}"
