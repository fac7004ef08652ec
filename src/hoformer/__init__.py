"""hoformer: higher-order transformers for multiway data.

Sub-packages
------------
functional  pure tensor math (Kronecker attention, signed scores, triplet attention)
layers      nn.Modules built on the functional core
models      task models behind a timm-style registry (``create_model``, ``list_models``)
data        datasets and datamodules
train       Lightning modules, losses and metrics
analysis    stable ranks, attention maps, FLOPs
"""

__version__ = "0.1.0"
