"""Stable ranks, attention maps, FLOPs."""
from .stable_rank import *  # noqa: F401,F403
