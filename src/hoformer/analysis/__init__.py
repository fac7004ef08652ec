"""Stable ranks, attention maps, FLOPs."""
from .ranks import *  # noqa: F401,F403
from .maps import *  # noqa: F401,F403
from .flops import *  # noqa: F401,F403
from .plots import *  # noqa: F401,F403
from .callbacks import *  # noqa: F401,F403
from .bench import *  # noqa: F401,F403
from .analyze import *  # noqa: F401,F403

#: names ``hoformer.analysis`` exported in 0.1.0 that live elsewhere: name -> their module
MOVED = {"load_checkpoint": "hoformer.checkpoint", "build_datamodule": "hoformer.inference",
         "checkpoint_datamodule": "hoformer.inference"}


def __getattr__(name: str):
    """The 0.1.0 names of :data:`MOVED`, with a ``DeprecationWarning`` naming their module."""
    if name not in MOVED:
        raise AttributeError(f"module 'hoformer.analysis' has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"hoformer.analysis.{name} is {MOVED[name]}.{name}; import it from there", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module(MOVED[name]), name)
