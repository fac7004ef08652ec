"""Test helper shared by the model test files: small constructor arguments per registered model, so that the
registry-wide tests (every model, every family) run on models of a few thousand parameters. Only sizes are changed;
every other argument (attention kind, RoPE, norms, dropout, pooling) keeps its default."""
from __future__ import annotations

import torch

from hoformer.models import create_model

#: small constructor arguments per registered model (a model missing here is tested at its defaults)
SMALL = {
    "cnn3d_classifier": dict(input_size=8, widths=(4, 8)),
    "historical_average": dict(num_nodes=5, window=4, horizon=3),
    "last_value": dict(num_nodes=5, window=4, horizon=3),
    "hoba_classifier": dict(vocab_size=40, num_classes=3, max_len=16, dim=16, num_heads=2, depth=2, block_size=4),
    "hot_forecaster": dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1, num_heads=2),
    "hot_causal_forecaster": dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1, num_heads=2),
    "hot_forecaster_official": dict(seq_len=16, pred_len=8, num_variates=3, dim=16, depth=1, num_heads=2),
    "hot_volume_classifier": dict(input_size=8, dim=16, depth=1, num_heads=2),
    "hot_segmenter": dict(in_channels=3, num_classes=4, input_size=16, dim=16, depth=1, num_heads=2, patch_size=4),
    "weaver": dict(num_nodes=5, window=4, horizon=3, dim=16, num_heads=2, num_landmarks=4, dict_width=4,
                   kern_dim=8, kern_layers=2),
    "traffic_alternating": dict(num_nodes=5, window=4, horizon=3, dim=16, num_heads=2),
    "traffic_full_attention": dict(num_nodes=5, window=4, horizon=3, dim=16, num_heads=2),
    "traffic_hot": dict(num_nodes=5, window=4, horizon=3, dim=16, num_heads=2),
}


def small_model(name: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """``create_model(name, **SMALL[name])`` in ``dtype``, seeded (the same weights on every call), in training mode."""
    torch.manual_seed(0)
    return create_model(name, **SMALL.get(name, {})).to(dtype)
