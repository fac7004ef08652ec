"""nn.Modules on channels-last tensors ``(B, N1..Nk, D)``, built on :mod:`hoformer.functional`.

``layers`` never imports ``models``.
"""
from .attention import *  # noqa: F401,F403
from .blocks import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .pos import *  # noqa: F401,F403
from .triplet import *  # noqa: F401,F403
from .weaver import *  # noqa: F401,F403
