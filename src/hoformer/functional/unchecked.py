"""The unchecked twins of :mod:`hoformer.functional`'s public functions: what each computes after its argument
checks. For callers that validated their inputs themselves, once, at their own public entry (:mod:`hoformer.layers`
checks ``x`` and the masks when a layer is called, then calls these); every function here assumes the shapes,
dtypes, devices, masks and argument values its checked twin verifies, and checks nothing (the PyTorch SDPA split:
the public function checks, the internal one computes).

=============================  ====================================================================
unchecked                      checked twin (:mod:`hoformer.functional`)
=============================  ====================================================================
``kronecker_attention``        :func:`~hoformer.functional.kronecker_attention` (softmax / score kernels)
``linear_attention``           :func:`~hoformer.functional.kronecker_attention` with ``kernel="linear"``, on features
``causal_kronecker``           :func:`~hoformer.functional.causal_kronecker_attention`
``causal_apply_rest``          the other modes' part of :func:`~hoformer.functional.causal_kronecker_attention`
``dot``                        the scaled dot-product scores of :func:`~hoformer.functional.kronecker_attention`
``masked_softmax``             :func:`~hoformer.functional.masked_softmax`
``SCORE_KERNELS``              the signed score kernels (``"tanimoto"``, ``"cosine"``) of :mod:`~hoformer.functional.scores`
``triplet_attention``          :func:`~hoformer.functional.triplet_attention`
``block_attention``            :func:`~hoformer.functional.block_attention`
``cross_block_attention``      :func:`~hoformer.functional.cross_block_attention`
``triplet_windows``            :func:`~hoformer.functional.triplet_windows`
``triplet_grid_length``        :func:`~hoformer.functional.triplet_grid_length`
=============================  ====================================================================

Use them as ``from hoformer.functional import unchecked`` and ``unchecked.kronecker_attention(...)``: the module
name at the call site says that nothing is checked there.
"""
from __future__ import annotations

from .causal import _apply_rest as causal_apply_rest, _causal_kronecker as causal_kronecker
from .kronecker import _kronecker_attention as kronecker_attention, _linear_attention as linear_attention
from .scores import _SCORE_KERNELS as SCORE_KERNELS, _dot as dot, _masked_softmax as masked_softmax
from .triplet import (
    _block_attention as block_attention,
    _cross_block_attention as cross_block_attention,
    _grid_length as triplet_grid_length,
    _triplet_attention as triplet_attention,
    _windows as triplet_windows,
)

__all__ = ["kronecker_attention", "linear_attention", "causal_kronecker", "causal_apply_rest", "dot", "masked_softmax",
           "SCORE_KERNELS", "triplet_attention", "block_attention", "cross_block_attention", "triplet_windows",
           "triplet_grid_length"]
