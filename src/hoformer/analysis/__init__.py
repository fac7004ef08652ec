"""Stable ranks, attention maps, FLOPs."""
from .ranks import *  # noqa: F401,F403
from .maps import *  # noqa: F401,F403
from .flops import *  # noqa: F401,F403
from .plots import *  # noqa: F401,F403
from .callbacks import *  # noqa: F401,F403
from .bench import *  # noqa: F401,F403
from .analyze import *  # noqa: F401,F403
