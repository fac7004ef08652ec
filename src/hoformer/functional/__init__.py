"""Pure tensor math, layout ``(B, H, N1..Nk, D)``; one file per mechanism."""
from .kronecker import *  # noqa: F401,F403
from .scores import *  # noqa: F401,F403
from .triplet import *  # noqa: F401,F403
from .weaver import *  # noqa: F401,F403
from .causal import *  # noqa: F401,F403
