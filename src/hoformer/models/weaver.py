"""Weaver (paper 003) and the traffic-forecasting baselines, all with the same interface:

``forward(x (B, P, N, C), time=None, mask=None) -> (B, Q, N, C)``, where ``x`` is the standardised history,
``time (B, P, 2)`` optional ``[minute of day, day of week]`` of every history step and ``mask`` optional bool
``(B, P, N, C)`` (or ``(B, P, N)``), True = observed; missing inputs are set to 0 (the training mean) as in
TSL (eq 62). Outputs are on the standardised scale (the task inverts the scaler). Attention maps:
:func:`hoformer.layers.record_attention`.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from hoformer._checks import check_int
from hoformer.functional.weaver import check_time_features
from hoformer.layers import CheckedMasks
from hoformer.layers.blocks import Block
from hoformer.layers.weaver import (
    KroneckerValenceAttention,
    StateTransition,
    TrafficEmbedding,
    WeaverInput,
    check_time_input,
)

from .base import HoformerModel, check_batch_input
from .registry import register_model

__all__ = [
    "TrafficModel",
    "Weaver",
    "TrafficTransformer",
    "BASELINE_ATTENTION",
    "TRAFFIC_LAYOUTS",
    "LastValue",
    "HistoricalAverage",
]


class TrafficModel(HoformerModel):
    """Shared input validation and ``example_inputs`` for ``(B, P, N, C) -> (B, Q, N, C)`` forecasters.

    Args:
        num_nodes: sensors of the graph (``N``).
        window: history steps (``P``).
        horizon: forecast steps (``Q``).
        in_channels: input channels per sensor and step (``C``).
        out_channels: forecast channels (``None``: ``in_channels``).
    """

    def __init__(self, num_nodes: int = 207, window: int = 12, horizon: int = 12, in_channels: int = 1,
                 out_channels: int | None = None) -> None:
        super().__init__()
        self.record_config(locals())
        for name, v in (("num_nodes", num_nodes), ("window", window), ("horizon", horizon),
                        ("in_channels", in_channels)):
            check_int(type(self).__name__, name, v)
        self.num_nodes, self.window, self.horizon = num_nodes, window, horizon
        self.in_channels, self.out_channels = in_channels, out_channels or in_channels

    def _prepare(self, x, time, mask):
        name = type(self).__name__
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{name}: `x` must be a floating-point tensor (B, P, N, C), got {type(x).__name__}"
                            + (f" {x.dtype}" if isinstance(x, torch.Tensor) else ""))
        expect = (self.window, self.num_nodes, self.in_channels)
        if x.ndim != 4 or tuple(x.shape[1:]) != expect:
            raise ValueError(f"{name}: `x` must have shape (B, P={expect[0]}, N={expect[1]}, C={expect[2]}) "
                             f"(N = nodes of the graph the model was built for), got {tuple(x.shape)}")
        check_batch_input(self, x, name, legend=" (B, P, N, C)")
        check_time_input(time, x, name)  # (B, P, 2): the layers' shape check, run here once for all of them
        if time is not None:  # minute of day in [0, 1440), day of week in [0, 7); checked even by models that
            check_time_features(time, name)  # ignore `time`: a bad feature column is a data bug wherever it goes
        # (the only check of `time` in a model's forward: the layers are called with check_time=False)
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
                raise TypeError(f"{name}: `mask` must be a bool tensor (True = observed), got "
                                f"{getattr(mask, 'dtype', type(mask).__name__)}")
            if mask.ndim == 3:
                mask = mask.unsqueeze(-1)
            if mask.ndim != 4 or mask.shape[:3] != x.shape[:3] or mask.shape[-1] not in (1, x.shape[-1]):
                raise ValueError(f"{name}: `mask` must have shape {tuple(x.shape)} or {tuple(x.shape[:3])}, "
                                 f"got {tuple(mask.shape)}")
            x = x.masked_fill(~mask, 0.0)
        return x, time, mask

    def example_inputs(self, batch_size: int = 2) -> tuple[tuple, dict]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch_size, self.window, self.num_nodes, self.in_channels, generator=g)
        tod = (torch.arange(self.window) * 5.0 + 480.0).expand(batch_size, -1)
        time = torch.stack([tod, torch.full_like(tod, 2.0)], dim=-1)
        mask = torch.rand(x.shape, generator=g) > 0.1
        return (x,), {"time": time, "mask": mask}


@register_model(name="weaver")
class Weaver(TrafficModel):
    """Weaver (paper 003, sections 4-5): phase-dictionary input module, Kronecker valence attention with P^2-KMV
    message passing, state-transition MLP and linear readout. Defaults = Table 3, Default(T); ``use_time=False``
    is Default(NT).

    With ``use_time=True`` and no ``time`` passed, the temporal encoding input is zero.

    Args:
        num_nodes, window, horizon, in_channels: sensors ``N``, history steps ``P``, forecast steps ``Q``, input
            channels ``C`` (the data's: the CLI links them from the datamodule).
        out_channels: forecast channels (``None``: ``in_channels``).
        dim: embedding width ``E``.
        num_heads: attention heads.
        use_time: feed the time-of-day / day-of-week encoding to the temporal attention (Default(T)).
        dropout: dropout of the input module and the state transition.
        num_landmarks: phase-dictionary landmarks.
        dict_width: phase-dictionary feature width.
        use_dictionary: use the phase dictionary in the input module.
        num_scorers: scorers of the attentive top-k pooling.
        ratio_space: top-k ratio of the pooling over nodes (gives the temporal nodes).
        ratio_time: top-k ratio of the pooling over time (gives the spatial nodes).
        kern_dim: width of the learned spatial structural encoding.
        kern_layers: layers of the structural-encoding MLP.
        kernel: valence kernel (section 7.2 ablation).
        mlp_expansion: hidden expansion of the state-transition MLP.
    """

    def __init__(self, num_nodes: int = 207, window: int = 12, horizon: int = 12, in_channels: int = 1,
                 out_channels: int | None = None, dim: int = 128, num_heads: int = 8, use_time: bool = True,
                 dropout: float = 0.1, num_landmarks: int = 64, dict_width: int = 32, use_dictionary: bool = True,
                 num_scorers: int = 5, ratio_space: float = 0.6, ratio_time: float = 0.6, kern_dim: int = 32,
                 kern_layers: int = 3, kernel: Literal["tanimoto", "cosine", "sdpa"] = "tanimoto",
                 mlp_expansion: int = 2) -> None:
        super().__init__(num_nodes, window, horizon, in_channels, out_channels)
        self.record_config(locals())
        self.input = WeaverInput(num_nodes, window, in_channels, dim, num_landmarks, dict_width, dropout,
                                 use_dictionary)
        self.attention = KroneckerValenceAttention(num_nodes, dim, num_heads, kernel, num_scorers, ratio_space,
                                                   ratio_time, kern_dim, kern_layers, use_time)
        self.transition = StateTransition(dim, self.out_channels, window, horizon, mlp_expansion, dropout)

    def forward(self, x: torch.Tensor, time: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        x, time, _ = self._prepare(x, time, mask)
        u = self.input(x)
        return self.transition(self.attention(u, time, check_time=False))  # `time` checked in _prepare


# The baselines' attention over the (P, N) grid, all from the shared layer library (no traffic-specific attention
# code): name -> (hoformer.layers attention name, its keyword arguments).
BASELINE_ATTENTION = {
    "full": ("full", {}),  # all P*N tokens jointly (vanilla spatiotemporal transformer, O(P^2 N^2))
    "temporal": ("axial", {"modes": (0,)}),  # each sensor's P steps (STAEformer's temporal layer)
    "spatial": ("axial", {"modes": (1,)}),  # each step's N sensors (STAEformer's spatial layer)
    "kronecker": ("kronecker_product", {"pool": "mean", "num_modes": 2}),  # HOT S_T (x) S_S (paper 000)
}


#: ``layout`` of :class:`TrafficTransformer` -> the :data:`BASELINE_ATTENTION` keys of its blocks for ``num_layers``
TRAFFIC_LAYOUTS = {
    "full": lambda n: ["full"] * n,  # vanilla spatiotemporal transformer
    "alternating": lambda n: ["temporal"] * n + ["spatial"] * n,  # STAEformer-like: temporal layers, then spatial
    "kronecker": lambda n: ["kronecker"] * n,  # HOT S_T (x) S_S
    "temporal": lambda n: ["temporal"] * n,
    "spatial": lambda n: ["spatial"] * n,
}


class TrafficTransformer(TrafficModel):
    """Baseline spatiotemporal transformer in Weaver's framework: :class:`TrafficEmbedding`, pre-norm
    :class:`~hoformer.layers.Block` s whose attention over the ``(P, N)`` grid follows ``layout``, and a per-node
    readout of the flattened ``(P, E)`` history to ``(Q, C)`` (STAEformer's output projection).

    Blocks use plain q/k (no q/k norm) and dropout on the attention output and the MLP, not on the attention
    probabilities, as STAEformer does. Registered as ``traffic_full_attention`` (``layout="full"``),
    ``traffic_alternating`` (``"alternating"``) and ``traffic_hot`` (``"kronecker"``).

    Args:
        layout: the blocks' attention: ``"full"`` (all ``P*N`` tokens jointly, O(P^2 N^2)), ``"alternating"``
            (``num_layers`` temporal blocks, then ``num_layers`` spatial ones), ``"kronecker"`` (HOT softmax attention
            ``S_T (x) S_S``, paper 000), ``"temporal"`` (each sensor's ``P`` steps) or ``"spatial"`` (each step's
            ``N`` sensors).
        num_layers: blocks per layout stage (``"alternating"`` has two stages).
        num_nodes, window, horizon, in_channels: sensors ``N``, history steps ``P``, forecast steps ``Q``, input
            channels ``C`` (the data's: the CLI links them from the datamodule).
        out_channels: forecast channels (``None``: ``in_channels``).
        dim: embedding width ``E``.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width / ``dim``.
        dropout: dropout on attention outputs and MLPs.
        use_time: time-of-day / day-of-week embeddings.
    """

    def __init__(self, layout: Literal["full", "alternating", "kronecker", "temporal", "spatial"] = "kronecker",
                 num_layers: int = 2, num_nodes: int = 207, window: int = 12, horizon: int = 12,
                 in_channels: int = 1, out_channels: int | None = None, dim: int = 64, num_heads: int = 4,
                 mlp_ratio: float = 2.0, dropout: float = 0.1, use_time: bool = True) -> None:
        super().__init__(num_nodes, window, horizon, in_channels, out_channels)
        self.record_config(locals())
        if not isinstance(layout, str) or layout not in TRAFFIC_LAYOUTS:
            raise ValueError(f"TrafficTransformer: `layout` must be one of {sorted(TRAFFIC_LAYOUTS)}, got {layout!r}")
        check_int("TrafficTransformer", "num_layers", num_layers)
        if dim % num_heads:
            raise ValueError(f"TrafficTransformer: `dim` ({dim}) must be divisible by `num_heads` ({num_heads})")
        self.layout = layout
        self.modes = TRAFFIC_LAYOUTS[layout](num_layers)
        self.embed = TrafficEmbedding(num_nodes, window, in_channels, dim, use_time)
        self.blocks = nn.ModuleList(
            Block(dim, num_heads, attention=BASELINE_ATTENTION[m][0], mlp_ratio=mlp_ratio, dropout=dropout,
                  qk_norm=False, attn_dropout=0.0, **BASELINE_ATTENTION[m][1])
            for m in self.modes
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(window * dim, horizon * self.out_channels)

    def forward(self, x: torch.Tensor, time: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        x, time, _ = self._prepare(x, time, mask)
        h = self.embed(x, time, check_time=False)  # validated once, in _prepare
        for blk in self.blocks:
            h = blk(h, masks=CheckedMasks(None))  # h is the embedding of the checked input: no per-block check
        b, p, n, e = h.shape
        y = self.head(self.norm(h).permute(0, 2, 1, 3).reshape(b, n, p * e))  # (b, n, q*c)
        return y.view(b, n, self.horizon, self.out_channels).transpose(1, 2)


register_model(TrafficTransformer, name="traffic_full_attention", preset={"layout": "full"})
register_model(TrafficTransformer, name="traffic_alternating", preset={"layout": "alternating"})
register_model(TrafficTransformer, name="traffic_hot", preset={"layout": "kronecker"})


class _CopyBaseline(TrafficModel):
    """Parameter-free baselines forecast the input channels themselves: ``out_channels`` must equal ``in_channels``.

    Args:
        num_nodes: sensors of the graph (``N``).
        window: history steps (``P``).
        horizon: forecast steps (``Q``).
        in_channels: channels per sensor and step (``C``).
        out_channels: ``None`` or ``in_channels`` (they forecast their inputs).
    """

    def __init__(self, num_nodes: int = 207, window: int = 12, horizon: int = 12, in_channels: int = 1,
                 out_channels: int | None = None) -> None:
        super().__init__(num_nodes, window, horizon, in_channels, out_channels)
        self.record_config(locals())
        if self.out_channels != self.in_channels:
            raise ValueError(f"{type(self).__name__}: forecasts its input channels, so `out_channels` must equal "
                             f"in_channels={self.in_channels} (or be None), got {out_channels!r}")

    def forward(self, x: torch.Tensor, time: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        x, _, mask = self._prepare(x, time, mask)
        return self._value(x, mask).unsqueeze(1).expand(-1, self.horizon, -1, -1).contiguous()

    def _value(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:  # pragma: no cover - abstract
        """The value ``(B, N, C)`` repeated over the horizon, from the history ``x`` and its ``mask``."""
        raise NotImplementedError


@register_model(name="last_value")
class LastValue(_CopyBaseline):
    """Parameter-free baseline: repeat each sensor's last observed value over the horizon.

    Args:
        num_nodes, window, horizon, in_channels, out_channels: as in :class:`TrafficModel` (``out_channels``: ``None``
            or ``in_channels``).
    """

    def _value(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return x[:, -1]
        steps = torch.arange(self.window, device=x.device).view(1, -1, 1, 1)
        idx = torch.where(mask, steps, -1).amax(dim=1, keepdim=True).expand(-1, 1, -1, x.shape[-1])
        return x.gather(1, idx.clamp_min(0)).squeeze(1).masked_fill(idx.squeeze(1) < 0, 0.0)


@register_model(name="historical_average")
class HistoricalAverage(_CopyBaseline):
    """Parameter-free baseline: each sensor's mean observed value over the history window.

    Args:
        num_nodes, window, horizon, in_channels, out_channels: as in :class:`TrafficModel` (``out_channels``: ``None``
            or ``in_channels``).
    """

    def _value(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return x.mean(dim=1)
        m = mask.expand_as(x).to(x.dtype)
        return (x * m).sum(1) / m.sum(1).clamp_min(1.0)
