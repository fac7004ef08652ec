"""``Dropout``: :class:`torch.nn.Dropout` whose CPU masks are a counter-based random stream applied in one fused pass
(:func:`hoformer.functional.dropout`): the same distribution, the same sites and rates, a fraction of the cost of
``bernoulli_``, and no mask kept for the backward pass. Every hoformer layer and model uses it; it has no parameters or buffers, so a state dict is that of
``nn.Dropout``. Eval mode returns the input itself."""
from __future__ import annotations

import torch
from torch import nn

from hoformer.functional.dropout_bits import dropout

__all__ = ["Dropout"]


class Dropout(nn.Dropout):
    """:class:`torch.nn.Dropout` (``p``, ``inplace``) with :func:`hoformer.functional.dropout`'s masks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, self.inplace)
