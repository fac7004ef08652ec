"""Pure tensor math, layout ``(B, H, N1..Nk, D)``; one file per mechanism."""
from .products import *  # noqa: F401,F403
from .kronecker import *  # noqa: F401,F403
from .dense import *  # noqa: F401,F403
from .scores import *  # noqa: F401,F403
from .triplet import *  # noqa: F401,F403
from .weaver import *  # noqa: F401,F403
from .causal import *  # noqa: F401,F403
from .dropout_bits import *  # noqa: F401,F403
from . import _ops  # noqa: E402,F401  (registers the kernels as custom ops for torch.compile / torch.export)
from . import unchecked  # noqa: E402,F401  (the unchecked twins of the public functions, for callers that checked)
