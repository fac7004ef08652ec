"""Transformer building blocks for channels-last multiway tensors ``(B, N1..Nk, D)``.

Axis legend: ``b`` batch, ``c`` input channels, ``n1..nk`` modes (patches), ``d`` model dim.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from hoformer._checks import check_finite_output, check_fraction, check_int

from .attention import build_attention
from ._common import CheckedMasks
from .decoding import _check_caches, _check_eval, _check_step_input, _check_max_steps
from .dropout import Dropout
from hoformer.functional._linear import linear_t
from hoformer.functional.dropout_bits import bias_gelu_dropout, fuses_bias_gelu

__all__ = ["Mlp", "SwiGLU", "RMSNorm", "DropPath", "PatchEmbed", "Block", "Encoder"]


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * weight``.

    float16 / bfloat16 inputs are normalised in float32 and cast back; float32 / float64 stay in their own dtype.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # never round float64 down to float32
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Mlp(nn.Module):
    """``Linear -> GELU -> Dropout -> Linear -> Dropout``; ``bias``: biases on both linear maps.

    Training on float32 CPU tensors (:func:`hoformer.functional.fuses_bias_gelu`), the first bias, the GELU and the
    dropout run as one fused pass (:func:`hoformer.functional.bias_gelu_dropout`, the same masks as
    :class:`Dropout`; its GELU agrees with :func:`torch.nn.functional.gelu` to within float rounding), unless a hook
    is registered on one of the three modules; otherwise (eval mode, other dtypes and devices, autocast, traced
    code) the modules run one by one."""

    def __init__(self, dim: int, hidden: int, out: int | None = None, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden, bias=bias), nn.GELU(), Dropout(dropout), nn.Linear(hidden, out or dim, bias=bias),
            Dropout(dropout),
        )

    def forward(self, x):
        fc1, act, drop, fc2, drop2 = self.net
        if (fuses_bias_gelu(x, self.training) and fc1.bias is not None and type(act) is nn.GELU
                and act.approximate == "none" and isinstance(drop, nn.Dropout)
                and not any(m._forward_hooks or m._forward_pre_hooks for m in (fc1, act, drop))
                and not (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)):
            # float32: the weight gradient in its faster layout (functional._linear); under bf16 autocast F.linear
            h = F.linear(x, fc1.weight) if torch.is_autocast_enabled("cpu") else linear_t(x, fc1.weight)
            return drop2(fc2(bias_gelu_dropout(h, fc1.bias, drop.p)))
        return self.net(x)


class SwiGLU(nn.Module):
    """``W2 (silu(W1 x) * W3 x)`` (Shazeer 2020); ``hidden`` is the gated width; ``bias``: biases on ``W1``, ``W3``
    and ``W2`` (``False``: the bias-free form of LLaMA-style feed-forwards). Dropout after the gate and the output."""

    def __init__(self, dim: int, hidden: int, out: int | None = None, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=bias)
        self.w2 = nn.Linear(hidden, out or dim, bias=bias)
        self.drop = Dropout(dropout)

    def forward(self, x):
        a, g = self.w13(x).chunk(2, dim=-1)
        return self.drop(self.w2(self.drop(F.silu(a) * g)))


class DropPath(nn.Module):
    """Stochastic depth per sample: in training, each sample's ``x`` is zeroed with probability ``p`` and otherwise
    scaled by ``1 / (1 - p)`` (the expectation is ``x``); identity in eval mode.

    ``p`` must be in ``[0, 1)``: ``p = 1`` would drop every sample and rescale by ``1 / 0`` (NaN), and a branch that is
    always dropped in training but kept at inference is not stochastic depth, so it is rejected.
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        check_fraction("DropPath", "p", p)
        self.p = float(p)

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        keep = 1 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class PatchEmbed(nn.Module):
    """Non-overlapping patch embedding for 1-D/2-D/3-D inputs (conv with kernel = stride = patch).

    ``(B, C, S1..Sn) -> (B, S1/p1, .., Sn/pn, D)`` (channels last). ``act="relu"`` follows the conv as in HOT.
    The parameters are the conv's (``proj``, so checkpoints are a conv's); a conv whose kernel is its stride is one
    matrix product of the flattened patches, and that is how it is computed: the output comes out channels last
    with no copy, and its backward is two matmuls, where a CPU's conv backward for this shape (strided, few input
    channels) runs far below the matmul rate, in bf16 most of all (``benchmarks/train_step.py --precision bf16``).

    Axis legend: ``c`` input channels, ``gi`` patches along spatial axis ``i``, ``pi`` the patch size along it.
    """

    def __init__(self, in_chans: int, dim: int, patch_size: int | Sequence[int], ndim: int = 2,
                 act: str | None = None, bias: bool = True) -> None:
        super().__init__()
        if ndim not in (1, 2, 3):
            raise ValueError(f"PatchEmbed: `ndim` must be 1, 2 or 3, got {ndim}")
        ps = (patch_size,) * ndim if isinstance(patch_size, int) else tuple(patch_size)
        if len(ps) != ndim:
            raise ValueError(f"PatchEmbed: `patch_size` {patch_size} does not have {ndim} entries")
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[ndim]
        self.in_chans, self.ndim, self.patch_size = in_chans, ndim, ps
        self.proj = conv(in_chans, dim, kernel_size=ps, stride=ps, bias=bias)
        # e.g. "b c (g0 p0) (g1 p1) -> b g0 g1 (c p0 p1)": the conv weight's (c, p0, p1) order last
        g, p = [f"g{i}" for i in range(ndim)], [f"p{i}" for i in range(ndim)]
        self._patches = (f"b c {' '.join(f'({a} {b})' for a, b in zip(g, p))} -> b {' '.join(g)} (c {' '.join(p)})",
                         dict(zip(p, ps)))
        if act not in (None, "relu", "gelu"):
            raise ValueError(f"PatchEmbed: `act` must be None, 'relu' or 'gelu', got {act!r}")
        self.act = {None: nn.Identity(), "relu": nn.ReLU(), "gelu": nn.GELU()}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != self.ndim + 2 or x.shape[1] != self.in_chans:
            raise ValueError(
                f"PatchEmbed: expected x of shape (B, {self.in_chans}, {', '.join(['S'] * self.ndim)}), got {tuple(x.shape)}"
            )
        bad = [s for s, p in zip(x.shape[2:], self.patch_size) if s % p]
        if bad:
            raise ValueError(f"PatchEmbed: spatial sizes {tuple(x.shape[2:])} must be divisible by patch {self.patch_size}")
        # the conv as the matmul of its patches (class doc): the conv weight (D, c, p0 ..) flattened is the matrix
        pattern, sizes = self._patches
        patches = rearrange(x, pattern, **sizes)
        return self.act(F.linear(patches, self.proj.weight.flatten(1), self.proj.bias))


def _norm(kind: str, dim: int) -> nn.Module:
    if kind == "layernorm":
        return nn.LayerNorm(dim)
    if kind == "rmsnorm":
        return RMSNorm(dim)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x)); x + mlp(norm(x))`` with any attention by name. Returns the
    tensor only; attention maps are collected by :func:`hoformer.layers.record_attention`.

    Args:
        dim, num_heads: model width and heads.
        attention: a name of :data:`~hoformer.layers.ATTENTION_TYPES`.
        mlp_ratio: hidden width / dim. mlp: ``"gelu"`` | ``"swiglu"``. norm: ``"layernorm"`` | ``"rmsnorm"``.
        mlp_hidden: the MLP's hidden width (SwiGLU: its gated width); default ``int(dim * mlp_ratio)`` for GELU and
            ``int(int(dim * mlp_ratio) * 2 / 3)`` for SwiGLU (about the GELU MLP's parameter count).
        mlp_bias: biases in the MLP's linear maps.
        drop_path: stochastic depth. dropout: MLP/attention output dropout.
        **attn_kw: forwarded to the attention layer (e.g. ``num_modes``, ``rope_modes``, ``qk_norm``).
    """

    def __init__(self, dim: int, num_heads: int = 8, attention: str = "kronecker_product", mlp_ratio: float = 4.0,
                 mlp: str = "gelu", norm: str = "layernorm", dropout: float = 0.0, drop_path: float = 0.0,
                 mlp_hidden: int | None = None, mlp_bias: bool = True, **attn_kw) -> None:
        super().__init__()
        check_int("Block", "mlp_hidden", mlp_hidden, optional=True)
        self.norm1 = _norm(norm, dim)
        self.attn = build_attention(attention, dim, num_heads, dropout=dropout, **attn_kw)
        self.norm2 = _norm(norm, dim)
        hidden = int(dim * mlp_ratio)
        if mlp == "gelu":
            self.mlp = Mlp(dim, mlp_hidden or hidden, dropout=dropout, bias=mlp_bias)
        elif mlp == "swiglu":
            self.mlp = SwiGLU(dim, mlp_hidden or int(hidden * 2 / 3), dropout=dropout, bias=mlp_bias)
        else:
            raise ValueError(f"Block: `mlp` must be 'gelu' or 'swiglu', got {mlp!r}")
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, masks=None) -> torch.Tensor:
        # A strided residual stream (x + a keeps x's strides) breaks torch.compile(backend="aot_eager") training:
        # the eager CPU kernel of aten.native_dropout_backward follows the gradient's strides, its traced (fake)
        # strides are contiguous, so the traced backward's `view` of a dropout gradient fails (pytorch#120035).
        # Free when x is already contiguous, as PatchEmbed's output is.
        x = x.contiguous()
        x = x + self.drop_path(self.attn(self.norm1(x), masks=masks))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def step(self, x, cache, masks=None):
        """One decoding step of a block whose attention is causal (see the attention layer's ``step``): ``x`` is one
        index of the causal mode; the norms and the MLP act per token; ``masks``: per-mode masks of the other modes.
        Eval mode only (a block in training mode with a non-zero dropout is refused: it would make the steps differ
        from the forward), no gradients."""
        if not isinstance(masks, CheckedMasks):
            _check_eval(self, "Block.step")
        with torch.no_grad():
            x = x + self.attn.step(self.norm1(x), cache, masks)
            return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    """``depth`` :class:`Block` s with linearly increasing drop-path and a final norm."""

    def __init__(self, dim: int, depth: int, num_heads: int = 8, drop_path: float = 0.0, norm: str = "layernorm",
                 **block_kw) -> None:
        super().__init__()
        check_int("Encoder", "depth", depth, low=0, note=" (0: no blocks, the final norm only)")
        rates = [drop_path * i / max(1, depth - 1) for i in range(depth)]
        self.blocks = nn.ModuleList(Block(dim, num_heads, drop_path=r, norm=norm, **block_kw) for r in rates)
        self.norm = _norm(norm, dim)

    def forward(self, x: torch.Tensor, masks=None) -> torch.Tensor:
        entry = not isinstance(masks, CheckedMasks)
        if self.blocks:  # every block takes an input of x's shape: checked once, by the first attention layer
            masks = CheckedMasks(self.blocks[0].attn._entry(x, masks))
        y = x
        for blk in self.blocks:
            y = blk(y, masks=masks)
        y = self.norm(y)
        if entry:
            check_finite_output(y, x, "Encoder")
        return y

    def init_cache(self, max_steps: int | None = None) -> list:
        """Decoding state for :meth:`step`: one cache per block (every attention type decodes when built with
        ``causal_mode``). ``max_steps``: ``None`` for key / value buffers that grow, or the steps to preallocate."""
        _check_max_steps("Encoder.init_cache", max_steps)
        return [blk.attn._new_cache(max_steps) for blk in self.blocks]

    def step(self, x, cache: list, masks=None):
        """The encoder's output at the next index of the causal mode from that index's input slice ``x`` (size 1 along
        the causal mode): equal to ``forward`` on every slice so far, read at the last. ``masks``: per-mode masks of
        the other modes. Per-step cost: the blocks' (see the attention layers' ``step``). Eval mode only, as
        :meth:`Block.step`; the input is checked once for all blocks."""
        _check_eval(self, "Encoder.step")
        if not isinstance(cache, list) or len(cache) != len(self.blocks):
            raise TypeError(f"Encoder.step: `cache` must be the list from init_cache() ({len(self.blocks)} entries)")
        if self.blocks:  # every block's input has x's shape: checked once, and every cache in one pass
            attn = self.blocks[0].attn
            fn = f"{type(attn).__name__}.step"
            if attn.causal_mode is None:
                raise ValueError(f"{fn}: decoding needs a layer built with `causal_mode`")
            if not isinstance(masks, CheckedMasks):
                masks = CheckedMasks(_check_step_input(attn, fn, x, masks))
            _check_caches(fn, cache, x, attn.causal_mode)
        for blk, c in zip(self.blocks, cache):
            x = blk.step(x, c, masks)
        with torch.no_grad():
            return self.norm(x)
