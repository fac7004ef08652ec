"""HOT task models (paper 000, section 4.3 and appendix B.4): conv patch embedding + ReLU, pre-norm blocks of
Kronecker (or baseline) attention, then a pooling / per-token head.

* ``hot_forecaster``        ``x (B, seq_len, C) -> (B, pred_len, C)``: a ``(variates, time patches)`` 2-mode tensor.
* ``hot_volume_classifier`` ``x (B, C_in, D, H, W) -> logits (B, num_classes)``: 3-mode tensor of 3D patches.
* ``hot_segmenter``         ``x (B, C_in, H, W) -> logits (B, num_classes, H, W)``: 2-mode tensor of 2D patches.

Every model takes ``attention=`` by name (:data:`hoformer.layers.ATTENTION_TYPES`: ``"kronecker_product"``,
``"kronecker_sum"``, ``"kronecker_linear"``, ``"full"``, ``"axial"``, ``"divided"``, ...), so the paper's baseline
rows are the same model with another attention. The forecaster adds Table 1's 1-mode Transformers:
``"spatial"`` (attention over variates only, for every time patch; with ``patch_size=seq_len`` this is exactly
iTransformer: one token per variate) and ``"temporal"`` (attention over time patches only, every variate on its own).

Axis legend: ``b`` batch, ``c`` variates / channels, ``t`` time patches, ``n1..nk`` patch grid, ``d`` model dim.
"""
from __future__ import annotations

import inspect
from typing import Any, Literal, Sequence

import torch
from torch import nn

from hoformer._checks import check_finite_output, check_int, is_int
from hoformer.layers import ATTENTION_TYPES, AbsolutePositionalEncoding, Dropout, Encoder, PatchEmbed

from .base import HoformerModel, check_batch_input
from .registry import register_model

__all__ = ["HOTModel", "HOTForecaster", "HOTVolumeClassifier", "HOTSegmenter", "FORECAST_ATTENTIONS", "ATTENTION_KNOBS",
           "AttentionName", "ForecastAttentionName"]

#: attention names accepted by the forecaster: every layer type plus the 1-mode baselines of Table 1, which are
#: :class:`~hoformer.layers.AxialAttention` along that mode only (for every fiber of the other mode)
FORECAST_ATTENTIONS = {"spatial": 0, "temporal": 1}

#: the names of :data:`hoformer.layers.ATTENTION_TYPES`, as a type (command-line help and config validation list
#: them), derived from the registry of layers
AttentionName = Literal[tuple(ATTENTION_TYPES)]
#: :data:`AttentionName` plus the forecaster's 1-mode baselines (:data:`FORECAST_ATTENTIONS`)
ForecastAttentionName = Literal[(*ATTENTION_TYPES, *FORECAST_ATTENTIONS)]
PosEmbed = Literal["rope", "learned", "sincos", "none"]
KroneckerPool = Literal["sum", "mean"]
MlpKind = Literal["gelu", "swiglu"]

#: the attention settings every HOT model takes -> (the attention layer's keyword, the default that leaves the layer's
#: own default in place); only values other than the default reach :func:`hoformer.layers.build_attention`
ATTENTION_KNOBS: dict[str, tuple[str, Any]] = {
    "qk_bias": ("qk_bias", False),
    "qkv_bias": ("bias", True),
    "attn_dropout": ("attn_dropout", None),
    "rope_theta": ("rope_theta", 10000.0),
    "num_features": ("num_features", None),
    "redraw_interval": ("redraw_interval", 0),
    "kronecker_pool": ("pool", "sum"),
}
_FAVOR_KNOBS = ("num_features", "redraw_interval")  # FAVOR+ settings: only the linear kernel draws features

#: the Args entries of :class:`HOTModel`'s arguments; appended to the docstring of every HOT model (they reach each
#: one through ``**kwargs``), so the API reference and ``--model.model.help`` list them with the model's own
_SHARED_DOC = """
        dim: model width.
        depth: number of blocks.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width / ``dim``.
        dropout: dropout on attention outputs and MLPs.
        drop_path: stochastic depth of the last block (linearly increasing from 0).
        qk_norm: LayerNorm on queries and keys.
        qk_bias: biases on the per-mode query / key projections of Kronecker attention, added as the reference HOT
            implementation does (it projects every token with a bias, then sum-pools, so the pooled bias is
            ``b * prod(N_j, j != i)``). Kronecker attentions only.
        qkv_bias: biases on the attention's input and output projections (values and output for Kronecker
            attention, queries / keys / values and output for the others).
        attn_dropout: dropout on the attention weights (Kronecker: on the softmax factors); None: ``dropout``.
        rope_theta: base of the rotary position embedding.
        num_features: FAVOR+ random features per head (``attention="kronecker_linear"`` only; None:
            ``max(E, E log E)`` for head dim ``E``).
        redraw_interval: redraw the FAVOR+ features every this many training forwards (0: never;
            ``"kronecker_linear"`` only).
        kronecker_pool: how Kronecker attention pools the other modes' tokens before a mode's queries / keys: ``"sum"``
            (HOT eqs 5-6) or ``"mean"``. Kronecker attentions only.
        mlp: feed-forward of every block: ``"gelu"`` (Linear -> GELU -> Linear) or ``"swiglu"``.
        d_mlp: hidden width of every block's feed-forward (SwiGLU: the gated width); None: ``int(dim * mlp_ratio)``
            for GELU, two thirds of it for SwiGLU.
        mlp_bias: biases in the feed-forward's linear maps.
"""


def _documented(cls):
    """Class decorator: append :data:`_SHARED_DOC` to the class's Args section, the last section of its docstring."""
    cls.__doc__ = "\n".join([cls.__doc__.rstrip(), _SHARED_DOC.strip("\n")]) + "\n    "
    return cls


def _attention_kwargs(model: str, attention: str, args: dict[str, Any]) -> dict[str, Any]:
    """The :data:`ATTENTION_KNOBS` among a model's constructor ``args`` that differ from their defaults, as the
    attention layer's keyword arguments. A setting the chosen attention does not take (``num_features`` with
    ``attention="full"``, ``qk_bias`` with ``"axial"``) raises, naming the model, the setting and the attention."""
    layer = "axial" if attention in FORECAST_ATTENTIONS else attention
    cls, preset = ATTENTION_TYPES[layer]
    params = inspect.signature(cls).parameters

    def applies(arg: str) -> bool:
        return ATTENTION_KNOBS[arg][0] in params and (arg not in _FAVOR_KNOBS or preset.get("kernel") == "linear")

    out = {}
    for arg, (key, default) in ATTENTION_KNOBS.items():
        value = args[arg]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise TypeError(f"{model}: `{arg}` must be a bool, got {value!r}")
        if (value is None) == (default is None) and value == default:
            continue
        if not applies(arg):
            kernel = f", kernel {preset['kernel']!r}" if "kernel" in preset else ""
            raise ValueError(f"{model}: `{arg}={value!r}` does not apply to attention={attention!r} "
                             f"({cls.__name__}{kernel}); the settings it takes: "
                             f"{[a for a in ATTENTION_KNOBS if applies(a)]}")
        out[key] = value
    return out


def _check_attention(name: str, model: str, extra: Sequence[str] = ()) -> None:
    allowed = sorted(ATTENTION_TYPES) + list(extra)
    if not isinstance(name, str) or name not in allowed:
        raise ValueError(f"{model}: `attention` must be one of {allowed}, got {name!r}")


def _check_input(model: nn.Module, x, shape: tuple, fn: str, legend: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{fn}: `x` must be a floating-point tensor {legend}, got "
                        f"{type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}")
    if x.ndim != len(shape) + 1 or any(s is not None and a != s for a, s in zip(x.shape[1:], shape)):
        want = ", ".join("?" if s is None else str(s) for s in shape)
        raise ValueError(f"{fn}: expected `x` of shape (B, {want}) {legend}, got {tuple(x.shape)}")
    check_batch_input(model, x, fn, legend=f" {legend}")


def _sizes(input_size, n: int, fn: str) -> tuple[int, ...]:
    sizes = (input_size,) * n if is_int(input_size) else tuple(input_size)
    if len(sizes) != n or not all(is_int(s) and s > 0 for s in sizes):
        raise ValueError(f"{fn}: `input_size` must be a positive int or {n} ints, got {input_size!r}")
    return sizes


def _pos(kind: str, grid: Sequence[int], dim: int, fn: str):
    """``pos_embed`` -> (rope modes, absolute encoding or None)."""
    if kind not in ("rope", "learned", "sincos", "none"):
        raise ValueError(f"{fn}: `pos_embed` must be rope|learned|sincos|none, got {kind!r}")
    if kind == "rope":
        return tuple(range(len(grid))), None
    return (), (AbsolutePositionalEncoding(grid, dim, kind) if kind != "none" else None)


def _window_stats(x: torch.Tensor, detach: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-window, per-variate instance-normalisation statistics of ``x (B, L, C)`` over time: ``(mean, std)``, each
    ``(B, 1, C)`` (population variance, ``eps = 1e-5``); ``detach``: constants for the backward pass."""
    mu = x.mean(1, keepdim=True)
    sd = torch.sqrt(x.var(1, keepdim=True, unbiased=False) + 1e-5)
    return (mu.detach(), sd.detach()) if detach else (mu, sd)


def _grid(sizes, patch: int, fn: str, what: str = "input_size") -> tuple[int, ...]:
    if not is_int(patch) or patch <= 0 or any(s % patch for s in sizes):
        shown = sizes[0] if len(sizes) == 1 else tuple(sizes)
        raise ValueError(f"{fn}: `{what}` {shown} must be divisible by `patch_size` (a positive int), "
                         f"got patch_size={patch!r}")
    return tuple(s // patch for s in sizes)


# ------------------------------------------------------------------------------------------------ shared base
@_documented
class HOTModel(HoformerModel):
    """Base of the HOT models: the encoder settings they share (attention, width, depth, heads, patch size, block
    and attention options), declared once here.

    A HOT model takes its own arguments (input and head) and forwards the others to this constructor as ``**kwargs``;
    one that changes a default here (``depth=6`` for the image models) names that argument and passes it on.
    ``constructor_signature``, ``model.config``, jsonargparse and ``--model.model.help`` resolve the forwarded
    arguments, so every HOT model is configured by one flat list of arguments. Subclasses set ``_name`` (the name in
    error messages) and build their encoder with :meth:`build_encoder`.

    Args:
        attention: a name of :data:`hoformer.layers.ATTENTION_TYPES` over the model's grid of patch tokens.
        patch_size: time steps / pixels / voxels per patch side (kernel and stride of the embedding convolution).
    """

    _name = "hot_model"
    #: attention names a model accepts beyond :data:`hoformer.layers.ATTENTION_TYPES`
    _extra_attentions: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        attention: AttentionName = "kronecker_product",
        dim: int = 128,
        depth: int = 2,
        num_heads: int = 8,
        patch_size: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.1,
        drop_path: float = 0.0,
        qk_norm: bool = True,
        qk_bias: bool = False,
        qkv_bias: bool = True,
        attn_dropout: float | None = None,
        rope_theta: float = 10000.0,
        num_features: int | None = None,
        redraw_interval: int = 0,
        kronecker_pool: KroneckerPool = "sum",
        mlp: MlpKind = "gelu",
        d_mlp: int | None = None,
        mlp_bias: bool = True,
    ) -> None:
        super().__init__()
        fn = self._name
        _check_attention(attention, fn, self._extra_attentions)
        check_int(fn, "d_mlp", d_mlp, optional=True)
        if not isinstance(mlp_bias, bool):
            raise TypeError(f"{fn}: `mlp_bias` must be a bool, got {mlp_bias!r}")
        self.attention, self.dim, self.patch_size, self.dropout = attention, dim, patch_size, dropout
        single = FORECAST_ATTENTIONS.get(attention)  # 1-mode baselines: axial attention along that mode only
        layer = {"attention": "axial", "modes": (single,)} if single is not None else {"attention": attention}
        self._block_kw = dict(
            depth=depth, num_heads=num_heads, drop_path=drop_path, mlp_ratio=mlp_ratio, dropout=dropout,
            qk_norm=qk_norm, mlp=mlp, mlp_hidden=d_mlp, mlp_bias=mlp_bias, **layer,
            **_attention_kwargs(fn, attention, locals()),
        )

    def build_encoder(self, num_modes: int, rope_modes: Sequence[int], **extra: Any) -> Encoder:
        """``depth`` blocks of the model's attention over a ``num_modes``-mode grid, RoPE on ``rope_modes``;
        ``extra``: further :class:`~hoformer.layers.Encoder` block arguments (``causal_mode``)."""
        return Encoder(self.dim, num_modes=num_modes, rope_modes=tuple(rope_modes), **self._block_kw, **extra)


# ------------------------------------------------------------------------------------------------ forecaster
@_documented
@register_model(name="hot_forecaster")
class HOTForecaster(HOTModel):
    """HOT long-term forecaster (Table 1). Input ``(B, seq_len, C)``, output ``(B, pred_len, C)``.

    Per-variate instance normalisation (RevIN, non-affine by default) -> Conv1d patch embedding on time (kernel =
    stride = ``patch_size``, ReLU) giving ``z (B, C, T, D)`` with ``T = seq_len / patch_size`` -> ``depth`` blocks
    of 2-mode attention, RoPE on the time mode only (no positional code on variates: permutation-equivariant over
    variates) -> per-variate head -> de-normalisation. The head (``head``):

    * ``"mean"``: the paper's (appendix B.4: "pooled ... by taking the average over time", and the reference
      implementation's): the time-mean of the ``T`` patch tokens -> LayerNorm -> Dropout -> linear map to
      ``pred_len``. The paper presets (``configs/hot/ltsf*.yaml``) use it.
    * ``"flatten"`` (default): the ``T`` patch tokens flattened -> linear map to ``pred_len`` (PatchTST's head).
      RoPE only encodes *relative* time offsets, so after a time-mean the head can hardly tell recent from old
      patches; the flattened head sees each patch at its position, at ``T`` times the head's parameters.

    Parameters at width 128, 2 blocks, patch 4, lookback 96 (a test counts them): ``head="mean"`` 475.2K at a 96-step
    horizon and 555.7K at 720 steps; ``head="flatten"`` 757.6K at 96 steps and 2.68M at 720. Table 1 reports 680K
    for HOT, which neither head gives at these sizes. With ``patch_size=seq_len`` (one token per variate,
    iTransformer) both heads see the one token; ``"mean"`` adds its LayerNorm.

    Defaults follow appendix B.4 / Table 6: 2 blocks, width 128, patch 4.

    The reference HOT implementation's forecaster differs outside the attention too; each difference is an option
    (default: off), and the registered preset ``hot_forecaster_official`` turns all of them on:
    ``embed_norm=True`` (embedding Conv1d -> ReLU -> LayerNorm -> Dropout), ``mlp="swiglu", mlp_bias=False``
    (bias-free SwiGLU feed-forward, hidden width ``d_mlp``), ``head="mean"`` (head LayerNorm -> Dropout -> Linear
    over the time-mean), ``revin_detach=False`` (gradients flow through the per-window mean / std)
    and ``qk_bias=True`` (q/k biases added before the sum-pooling). Two differences remain, both in the attention:
    with ``attention="kronecker_sum"`` hoformer averages the ``k`` factor terms where the reference adds them
    unnormalised (a factor ``k`` on the attention output before the output projection), and hoformer pools before
    projecting (equal results, cheaper). The reference trains one 720-step model on the average of the 96 / 192 /
    336 / 720 prefix losses: :class:`~hoformer.train.ForecastingTask`'s ``protocol="hot"``.

    Args:
        seq_len: lookback window (time steps of the input); a multiple of ``patch_size``.
        pred_len: forecast horizon (time steps of the output).
        num_variates: variates (channels) of the series.
        attention: a name of :data:`hoformer.layers.ATTENTION_TYPES` over the ``(variates, time patches)`` grid, or
            the 1-mode baselines ``"spatial"`` (over variates; iTransformer with ``patch_size=seq_len``) and
            ``"temporal"`` (over time patches).
        patch_size: time steps per patch (kernel and stride of the embedding convolution).
        head: ``"mean"`` (time-mean -> LayerNorm -> Dropout -> Linear, the paper's) or ``"flatten"`` (all patch
            tokens -> Linear).
        revin: per-variate instance normalisation of the input, undone on the output.
        rope: rotary positions on the time mode.
        embed_norm: LayerNorm -> Dropout after the patch embedding's ReLU.
        revin_detach: treat the instance-normalisation mean / std as constants in the backward pass (False: the
            loss's gradient flows through them into the input window).
    """

    _name = "hot_forecaster"
    _extra_attentions = tuple(FORECAST_ATTENTIONS)

    def __init__(
        self,
        seq_len: int = 96,
        pred_len: int = 96,
        num_variates: int = 7,
        attention: ForecastAttentionName = "kronecker_product",
        *,
        head: Literal["flatten", "mean"] = "flatten",
        revin: bool = True,
        rope: bool = True,
        embed_norm: bool = False,
        revin_detach: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(attention=attention, **kwargs)
        self.record_config(locals())
        fn, dim, dropout = self._name, self.dim, self.dropout
        for name, v in (("seq_len", seq_len), ("pred_len", pred_len), ("num_variates", num_variates)):
            check_int(fn, name, v)
        if head not in ("mean", "flatten"):
            raise ValueError(f"{fn}: `head` must be 'mean' or 'flatten', got {head!r}")
        for name, v in (("embed_norm", embed_norm), ("revin_detach", revin_detach)):
            if not isinstance(v, bool):
                raise TypeError(f"{fn}: `{name}` must be a bool, got {v!r}")
        if not revin and not revin_detach:
            raise ValueError(f"{fn}: `revin_detach=False` needs `revin=True` (there is no instance normalisation "
                             "whose statistics could be detached)")
        (self.num_patches,) = _grid((seq_len,), self.patch_size, fn, "seq_len")
        self.seq_len, self.pred_len, self.num_variates = seq_len, pred_len, num_variates
        self.head_kind, self.revin, self.revin_detach = head, revin, revin_detach
        self.embed = PatchEmbed(1, dim, self.patch_size, ndim=1, act="relu")
        self.embed_norm = nn.Sequential(nn.LayerNorm(dim), Dropout(dropout)) if embed_norm else None
        self.encoder = self.build_encoder(2, (1,) if rope else ())
        self.head_norm = nn.Sequential(nn.LayerNorm(dim), Dropout(dropout)) if head == "mean" else None
        self.head = nn.Linear(dim * (self.num_patches if head == "flatten" else 1), pred_len)

    @classmethod
    def upgrade_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Configurations of hoformer 0.1.0 name the head ``pool`` (``"flatten"`` or ``"mean"``, the time-mean
        without a LayerNorm) and later ones ``pool="mean", head_norm=True``: both become ``head``. The 0.1.0 mean
        head without its LayerNorm no longer exists and is refused."""
        if "pool" not in kwargs and "head_norm" not in kwargs:
            return kwargs
        kwargs = dict(kwargs)
        old = (kwargs.pop("pool", "flatten"), bool(kwargs.pop("head_norm", False)))
        heads = {("flatten", False): "flatten", ("mean", True): "mean"}
        if old not in heads:
            raise ValueError(f"{cls._name}: a saved configuration with pool={old[0]!r}, head_norm={old[1]} has no "
                             "equivalent head in this version (head='mean' is time-mean -> LayerNorm -> Linear, "
                             "head='flatten' has no norm)")
        kwargs.setdefault("head", heads[old])
        return kwargs

    def example_inputs(self, batch_size: int = 2):
        return (torch.randn(batch_size, self.seq_len, self.num_variates),), {}

    def forward(self, x: torch.Tensor, masks=None) -> torch.Tensor:
        _check_input(self, x, (self.seq_len, self.num_variates), "hot_forecaster", "(B, seq_len, num_variates)")
        x_in, (b, _, c) = x, x.shape
        if self.revin:
            mu, sd = _window_stats(x, self.revin_detach)
            x = (x - mu) / sd
        z = self.embed(x.transpose(1, 2).reshape(b * c, 1, self.seq_len)).view(b, c, self.num_patches, -1)
        if self.embed_norm is not None:
            z = self.embed_norm(z)
        z = self.encoder(z, masks=masks)
        z = self.head_norm(z.mean(2)) if self.head_kind == "mean" else z.flatten(2)  # (b, c, d | t*d)
        y = self.head(z).transpose(1, 2)  # (b, pred_len, c)
        if self.revin:
            y = y * sd + mu
        check_finite_output(y, x_in, "hot_forecaster")
        return y


# ---------------------------------------------------------------------------------------- 3D classification
class _ImageModel(HoformerModel):
    """Input side shared by the image / volume models ``(B, C_in, *input_size) -> ...`` (the HOT classifier and
    segmenter, the CNN reference): the class-count and size checks, ``example_inputs`` and ``forward``'s input check."""

    _name, _legend = "", ""

    def _set_io(self, ndim: int, in_channels, input_size, num_classes) -> None:
        check_int(self._name, "num_classes", num_classes, low=2)
        self.in_channels, self.num_classes = in_channels, num_classes
        self.input_size = _sizes(input_size, ndim, self._name)

    def example_inputs(self, batch_size: int = 2):
        return (torch.randn(batch_size, self.in_channels, *self.input_size),), {}

    def _check_x(self, x: torch.Tensor) -> None:
        _check_input(self, x, (self.in_channels, *self.input_size), self._name, self._legend)


class _PatchGridModel(_ImageModel, HOTModel):
    """Shared backbone of the image-like HOT models: ``(B, C_in, *input_size)`` -> conv patch embedding (ReLU) ->
    ``k``-mode grid of patches ``(B, n1..nk, dim)`` -> optional positional encoding -> ``depth`` blocks -> the
    subclass's head (:meth:`_head`). The volume classifier takes this constructor; the segmenter changes its
    defaults.

    Args:
        in_channels: input channels.
        input_size: the input's size along each of its ``k`` axes (one int: the same on every axis); each a multiple
            of ``patch_size``.
        num_classes: classes (>= 2).
        depth: number of blocks.
        pos_embed: ``"rope"`` (mode-wise rotary), ``"learned"``, ``"sincos"`` or ``"none"``.
    """

    _ndim = 0

    def __init__(
        self,
        in_channels: int = 1,
        input_size: int | Sequence[int] = 28,
        num_classes: int = 2,
        *,
        depth: int = 6,
        pos_embed: PosEmbed = "rope",
        **kwargs: Any,
    ) -> None:
        super().__init__(depth=depth, **kwargs)
        self.record_config(locals())
        fn, ndim, dim, patch_size = self._name, self._ndim, self.dim, self.patch_size
        self._set_io(ndim, in_channels, input_size, num_classes)
        self.grid = _grid(self.input_size, patch_size, fn)
        rope_modes, self.pos = _pos(pos_embed, self.grid, dim, fn)
        self.embed = PatchEmbed(in_channels, dim, patch_size, ndim=ndim, act="relu")
        self.encoder = self.build_encoder(ndim, rope_modes)
        self.head = self._head(dim, num_classes, patch_size)

    def _head(self, dim: int, num_classes: int, patch_size: int) -> nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    def _encode(self, x: torch.Tensor, masks) -> torch.Tensor:
        """``x`` -> encoded grid ``(B, n1..nk, dim)``."""
        self._check_x(x)
        z = self.embed(x)
        if self.pos is not None:
            z = self.pos(z)
        return self.encoder(z, masks=masks)


@_documented
@register_model(name="hot_volume_classifier")
class HOTVolumeClassifier(_PatchGridModel):
    """HOT 3D image classifier (Table 2, MedMNIST3D). ``(B, C_in, D, H, W) -> logits (B, num_classes)``.

    Conv3d patch embedding (kernel = stride = ``patch_size``, ReLU) -> 3-mode grid ``(B, n1, n2, n3, dim)`` ->
    ``depth`` blocks (``pos_embed="rope"``: mode-wise RoPE, best for HOT product in appendix D; or ``"learned"``,
    ``"sincos"``, ``"none"``) -> global average pooling -> linear classifier.
    Defaults: 6 blocks, width 128, patch 4 on 28^3 (7^3 tokens), binary classes (AdrenalMNIST3D).

    Args:
        in_channels: input channels.
        input_size: volume size ``D = H = W`` or ``(D, H, W)``; each a multiple of ``patch_size``.
        num_classes: classes (>= 2).
        attention: a name of :data:`hoformer.layers.ATTENTION_TYPES` over the 3-mode patch grid.
        patch_size: voxels per patch side.
        pos_embed: ``"rope"`` (mode-wise rotary), ``"learned"``, ``"sincos"`` or ``"none"``.
    """

    _name, _legend, _ndim = "hot_volume_classifier", "(B, C_in, D, H, W)", 3

    def _head(self, dim: int, num_classes: int, patch_size: int) -> nn.Module:
        return nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor, masks=None) -> torch.Tensor:
        return self.head(self._encode(x, masks).mean(dim=(1, 2, 3)))


# ---------------------------------------------------------------------------------------------- segmentation
@_documented
@register_model(name="hot_segmenter")
class HOTSegmenter(_PatchGridModel):
    """HOT multispectral segmenter (Table 3, SSL4EO-L). ``(B, C_in, H, W) -> logits (B, num_classes, H, W)``.

    Conv2d patch embedding (ReLU) -> 2-mode grid of patches -> ``depth`` blocks -> per-token MLP (no pooling)
    emitting ``patch_size^2 * num_classes`` logits per token, rearranged to pixels.
    Defaults: 7 Landsat bands, 264^2 patches, NLCD's 17 classes, 6 blocks, width 128, patch 8 (33^2 tokens).

    Args:
        in_channels: input bands.
        input_size: image size ``H = W`` or ``(H, W)``; each a multiple of ``patch_size``.
        num_classes: classes per pixel (>= 2).
        attention: a name of :data:`hoformer.layers.ATTENTION_TYPES` over the 2-mode patch grid.
        patch_size: pixels per patch side.
        pos_embed: ``"rope"`` (mode-wise rotary), ``"learned"``, ``"sincos"`` or ``"none"``.
    """

    _name, _legend, _ndim = "hot_segmenter", "(B, C_in, H, W)", 2

    def __init__(
        self,
        in_channels: int = 7,
        input_size: int | Sequence[int] = 264,
        num_classes: int = 17,
        *,
        patch_size: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(in_channels=in_channels, input_size=input_size, num_classes=num_classes,
                         patch_size=patch_size, **kwargs)
        self.record_config(locals())

    def _head(self, dim: int, num_classes: int, patch_size: int) -> nn.Module:
        return nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, patch_size**2 * num_classes))

    def forward(self, x: torch.Tensor, masks=None) -> torch.Tensor:
        z = self._encode(x, masks)
        b, (gh, gw), p, k = x.shape[0], self.grid, self.patch_size, self.num_classes
        return self.head(z).view(b, gh, gw, p, p, k).permute(0, 5, 1, 3, 2, 4).reshape(b, k, gh * p, gw * p)


# the reference HOT implementation's forecaster (see HOTForecaster's docstring): every option it differs by, on
register_model(HOTForecaster, name="hot_forecaster_official", preset={
    "embed_norm": True, "mlp": "swiglu", "mlp_bias": False, "head": "mean", "revin_detach": False,
    "qk_bias": True,
})
