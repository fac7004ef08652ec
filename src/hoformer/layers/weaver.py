"""Weaver layers (paper 003, section 5) and the input embedding of the traffic baselines (whose attention blocks are
the shared :class:`~hoformer.layers.Block` with full, axial or Kronecker attention).

Tensors are channels-last ``(B, P, N, E)``: ``P`` history steps (temporal nodes), ``N`` sensors (spatial nodes).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .recording import RecordableAttention
from .blocks import RMSNorm
from .dropout import Dropout
from hoformer.functional.weaver import (
    VALENCE_KERNELS,
    atk_pool,
    cyclic_time_encoding,
    dictionary_retrieval,
    p2_kmv,
    valence_attention,
)

__all__ = [
    "GLU",
    "TrafficPhaseDictionary",
    "ATkPooling",
    "WeaverInput",
    "KroneckerValenceAttention",
    "StateTransition",
    "TrafficEmbedding",
]


def _check_grid(x, name: str, fn: str, **expect: int | None) -> None:
    """``x`` must be a floating tensor ``(B, P, N, C)``; each given ``P=``, ``N=``, ``C=`` / ``E=`` size is checked."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{fn}: `{name}` must be a floating-point tensor (B, P, N, C), got "
                        f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
    want = "(B, " + ", ".join(f"{k}={v}" if v is not None else k for k, v in expect.items()) + ")"
    if x.ndim != 4 or any(v is not None and x.shape[i + 1] != v for i, v in enumerate(expect.values())):
        raise ValueError(f"{fn}: `{name}` must have shape {want} (sizes fixed at construction), got {tuple(x.shape)}")


def _check_ratio(r, name: str, fn: str) -> None:
    """ATk pooling ratio ``rho`` (eq 43, ``k = ceil(rho * size)``) must be a number in ``(0, 1]``."""
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r <= 1.0:
        raise ValueError(f"{fn}: `{name}` must be a number in (0, 1], got {r!r}")


def check_time_input(time, x: torch.Tensor, fn: str) -> None:
    """The time-of-day / day-of-week input of the traffic layers: ``None`` or ``(B, P, 2)`` for ``x (B, P, ...)``;
    a model checks it once at its entry and hands it to every layer (which then does not check it again)."""
    if time is not None and (not isinstance(time, torch.Tensor) or tuple(time.shape) != (*x.shape[:2], 2)):
        got = tuple(time.shape) if isinstance(time, torch.Tensor) else type(time).__name__
        raise ValueError(f"{fn}: `time` must have shape (B, P, 2) = {(*x.shape[:2], 2)} [minute of day, day of "
                         f"week], got {got}")


class GLU(nn.Module):
    """``GLU(x W + b)`` (eqs 85-88): a linear map to ``2 * out`` split into signal and sigmoid gate."""

    def __init__(self, dim_in: int, dim_out: int, bias: bool = True) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, 2 * dim_out, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.glu(self.proj(x), dim=-1)


class TrafficPhaseDictionary(nn.Module):
    """Traffic phase dictionary (eqs 35-38): node states ``(B, N, P*C)`` query ``M`` learned landmarks through a
    GLU, entmax-1.5 with per-node softplus temperatures selects a sparse convex combination, and the dictionary
    ``C_Xi (M, P*K)`` returns latent cofactors ``Xi (B, P, N, K)``."""

    def __init__(self, num_nodes: int, window: int, in_channels: int, num_landmarks: int = 64, width: int = 32,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.num_nodes, self.window, self.in_channels, self.width = num_nodes, window, in_channels, width
        self.query = GLU(window * in_channels, num_landmarks)
        self.drop = Dropout(dropout)
        self.temperature = nn.Parameter(torch.full((num_nodes, 1), math.log(math.e - 1)))  # softplus -> 1
        self.dictionary = nn.Parameter(torch.randn(num_landmarks, window * width) * 0.02)

    def forward(self, x: torch.Tensor, return_weights: bool = False):
        _check_grid(x, "x", type(self).__name__, P=self.window, N=self.num_nodes, C=self.in_channels)
        b, p, n, _ = x.shape
        states = rearrange(x, "b p n c -> b n (p c)")  # eq 35
        w, cof = dictionary_retrieval(self.drop(self.query(states)), self.temperature, self.dictionary)  # 36-37
        xi = rearrange(cof, "b n (p k) -> b p n k", p=p)  # eq 38
        return (xi, w) if return_weights else xi


class ATkPooling(nn.Module):
    """ATk-pooling (eqs 42-46) with ``num_scorers`` unit-norm linear scorers; ``dim=1`` pools over time
    (-> ``U_S (B, N, E)``), ``dim=2`` pools over nodes (-> ``U_T (B, P, E)``)."""

    def __init__(self, dim: int, num_scorers: int = 5, ratio: float = 0.6, pool_dim: int = 1) -> None:
        super().__init__()
        if pool_dim not in (1, 2):
            raise ValueError(f"ATkPooling: `pool_dim` must be 1 (time) or 2 (nodes), got {pool_dim}")
        _check_ratio(ratio, "ratio", "ATkPooling")
        self.ratio, self.pool_dim = ratio, pool_dim
        self.scorers = nn.Parameter(torch.randn(dim, num_scorers) / math.sqrt(dim))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return atk_pool(u, self.scorers, self.ratio, self.pool_dim)


class WeaverInput(nn.Module):
    """Input module (eqs 35-41): dictionary augmentation ``X || Xi``, projection, RMSNorm + GLU + residual."""

    def __init__(self, num_nodes: int, window: int, in_channels: int, dim: int, num_landmarks: int = 64,
                 width: int = 32, dropout: float = 0.1, use_dictionary: bool = True) -> None:
        super().__init__()
        self.num_nodes, self.window, self.in_channels = num_nodes, window, in_channels
        self.dictionary = (TrafficPhaseDictionary(num_nodes, window, in_channels, num_landmarks, width, dropout)
                           if use_dictionary else None)
        self.proj = nn.Linear(in_channels + (width if use_dictionary else 0), dim)  # eq 39
        # the library's RMSNorm (float32 statistics for bf16 / fp16 inputs) with torch.nn.RMSNorm's float32 eps, so
        # float32 results (and the published Los-loop numbers) are unchanged up to rounding; float64 now also uses
        # this eps (nn.RMSNorm took float64's 2.2e-16)
        self.norm = RMSNorm(dim, eps=torch.finfo(torch.float32).eps)
        self.glu = GLU(dim, dim)
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_grid(x, "x", type(self).__name__, P=self.window, N=self.num_nodes, C=self.in_channels)
        if self.dictionary is not None:
            x = torch.cat([x, self.dictionary(x)], dim=-1)
        u = self.proj(x)
        return self.drop(self.glu(self.norm(u))) + u  # eq 40


class KroneckerValenceAttention(RecordableAttention):
    """Weaver's Kronecker attention module (eqs 42-58).

    ATk-pooling gives spatial ``U_S (B, N, E)`` and temporal ``U_T (B, P, E)`` node representations; the spatial
    structural encoding (learned ``B_kern (N, D_kern)`` + ReLU MLP, eq 51) and the optional temporal encoding
    (cyclic TOD/DOW, eqs 52-54) feed multi-head valence attention maps ``Theta_S (B, H, N, N)`` and
    ``Theta_T (B, H, P, P)`` (eq 47); the P^2-KMV (eqs 55-57) weaves them with the embedding, then GLU head mixing
    and a residual (eq 58, the W-iKPS).

    ``ratio_time`` (rho_T) is the top-k ratio of the pooling *over time* that yields the spatial nodes
    (``k = ceil(rho_T * P)``, eqs 42-46), ``ratio_space`` that of the pooling over nodes that yields the temporal ones.
    """

    record_kind = "kronecker"
    combine = "product"  # Theta_T (x) Theta_S

    def __init__(self, num_nodes: int, dim: int, num_heads: int = 8, kernel: str = "tanimoto", num_scorers: int = 5,
                 ratio_space: float = 0.6, ratio_time: float = 0.6, kern_dim: int = 32, kern_layers: int = 3,
                 use_time: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"KroneckerValenceAttention: `dim` ({dim}) must be divisible by `num_heads` ({num_heads})")
        if kernel not in VALENCE_KERNELS:
            raise ValueError(f"KroneckerValenceAttention: `kernel` must be one of {VALENCE_KERNELS}, got {kernel!r}")
        # checked here too so that the error names this layer's argument, not ATkPooling's `ratio`
        _check_ratio(ratio_space, "ratio_space", "KroneckerValenceAttention")
        _check_ratio(ratio_time, "ratio_time", "KroneckerValenceAttention")
        self.num_nodes, self.dim = num_nodes, dim
        self.num_heads, self.kernel, self.use_time = num_heads, kernel, use_time
        self.pool_s = ATkPooling(dim, num_scorers, ratio_time, pool_dim=1)  # top-k over time -> spatial nodes
        self.pool_t = ATkPooling(dim, num_scorers, ratio_space, pool_dim=2)  # top-k over nodes -> temporal nodes
        self.b_kern = nn.Parameter(torch.randn(num_nodes, kern_dim) * 0.02)
        layers, d_in = [], dim + kern_dim
        for _ in range(kern_layers):
            layers += [nn.Linear(d_in, dim), nn.ReLU()]
            d_in = dim
        self.struct = nn.Sequential(*layers, nn.Linear(d_in, dim))  # eq 51
        self.time_proj = nn.Linear(dim + 4, dim) if use_time else None  # eq 52
        self.qk_s = nn.Linear(dim, 2 * dim, bias=False)  # eq 50
        self.qk_t = nn.Linear(dim, 2 * dim, bias=False)
        self.mix = GLU(dim, dim)  # eq 58
        # The signed (unnormalised) Tanimoto / cosine maps sum ~N*P messages, so at a random init the woven message
        # is O(sqrt(N P)) times the embedding and drowns the residual stream (Los-loop: val MAE 6.9 after one epoch
        # vs 4.5 with this). Zero-initialising the signal half of the head-mixing GLU makes every block start as the
        # identity (as ReZero / Fixup do for residual branches); the gate half keeps its init, so gradients flow.
        with torch.no_grad():
            self.mix.proj.weight[:dim].zero_()
            self.mix.proj.bias[:dim].zero_()

    def forward(self, u: torch.Tensor, time: torch.Tensor | None = None, *, check_time: bool = True) -> torch.Tensor:
        """``u (b, p, n, e)``, ``time (b, p, 2)`` or None -> ``(b, p, n, e)``; the maps ``[Theta_T, Theta_S]`` go to
        :func:`hoformer.layers.record_attention`.
        ``check_time=False`` skips validating ``time`` (for callers that did, e.g. :class:`hoformer.models.Weaver`:
        the value check costs a few reductions per layer)."""
        _check_grid(u, "u", type(self).__name__, P=None, N=self.num_nodes, E=self.dim)
        if check_time:
            check_time_input(time, u, type(self).__name__)
        b, p, n, e = u.shape
        g_s = self.struct(torch.cat([self.pool_s(u), self.b_kern.expand(b, -1, -1).to(u.dtype)], dim=-1))
        g_t = self.pool_t(u)
        if self.time_proj is not None:
            enc = u.new_zeros(b, p, 4) if time is None else cyclic_time_encoding(time, check=check_time).to(u.dtype)
            g_t = self.time_proj(torch.cat([g_t, enc], dim=-1))
        heads = lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.num_heads)  # noqa: E731  (eq 49)
        q_s, k_s = map(heads, self.qk_s(g_s).chunk(2, dim=-1))
        q_t, k_t = map(heads, self.qk_t(g_t).chunk(2, dim=-1))
        theta_s = valence_attention(q_s, k_s, self.kernel)  # (b, h, n, n), eq 47
        theta_t = valence_attention(q_t, k_t, self.kernel)  # (b, h, p, p)
        v = rearrange(u, "b p n (h d) -> b h p n d", h=self.num_heads)
        z = rearrange(p2_kmv(theta_t, theta_s, v), "b h p n d -> b p n (h d)")  # eqs 55-57
        out = self.mix(z) + u  # eq 58
        self._maybe_record([theta_t, theta_s])
        return out


class StateTransition(nn.Module):
    """State transition (eqs 59-60): residual LeakyReLU MLP (expansion ``M_z``) and linear readout to ``C``;
    a learned linear map over time takes the ``P`` history positions to the ``Q`` horizon steps when ``P != Q``."""

    def __init__(self, dim: int, out_channels: int, window: int, horizon: int, expansion: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.dim, self.window = dim, window
        self.up, self.down = nn.Linear(dim, expansion * dim), nn.Linear(expansion * dim, dim)
        self.drop = Dropout(dropout)
        self.readout = nn.Linear(dim, out_channels)
        self.time_map = nn.Linear(window, horizon) if window != horizon else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        _check_grid(z, "z", type(self).__name__, P=self.window, N=None, E=self.dim)
        z = self.down(self.drop(F.leaky_relu(self.up(z)))) + z  # eq 59
        y = self.readout(z)  # eq 60, (b, p, n, c)
        if self.time_map is not None:
            y = self.time_map(y.movedim(1, -1)).movedim(-1, 1)
        return y


# ----------------------------------------------------------------------------------------------- baselines
class TrafficEmbedding(nn.Module):
    """Baseline input embedding: ``Linear(C -> E)`` of the (masked) input + learned node and step embeddings +
    optional linear cyclic TOD/DOW embedding (like STAEformer's, with learned node-position embeddings)."""

    def __init__(self, num_nodes: int, window: int, in_channels: int, dim: int, use_time: bool = True) -> None:
        super().__init__()
        self.num_nodes, self.window, self.in_channels = num_nodes, window, in_channels
        self.proj = nn.Linear(in_channels, dim)
        self.node = nn.Parameter(torch.randn(num_nodes, dim) * 0.02)
        self.step = nn.Parameter(torch.randn(window, 1, dim) * 0.02)
        self.time = nn.Linear(4, dim) if use_time else None

    def forward(self, x: torch.Tensor, time: torch.Tensor | None = None, *, check_time: bool = True) -> torch.Tensor:
        """``x (b, p, n, c)``, ``time (b, p, 2)`` or None -> ``(b, p, n, e)``; ``check_time=False`` skips validating
        ``time`` (already done by the caller)."""
        _check_grid(x, "x", type(self).__name__, P=self.window, N=self.num_nodes, C=self.in_channels)
        if check_time:
            check_time_input(time, x, type(self).__name__)
        h = self.proj(x) + self.node + self.step
        if self.time is not None and time is not None:
            h = h + self.time(cyclic_time_encoding(time, check=check_time).to(h.dtype)).unsqueeze(2)
        return h
