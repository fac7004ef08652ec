"""Task models behind a timm-style registry."""
from .base import HoformerModel, from_pretrained  # noqa: F401
from .registry import create_model, is_model, list_models, register_model  # noqa: F401

from . import hot, weaver, hoba, cnn  # noqa: F401,E402  (register the model families)
from .hot import *  # noqa: F401,F403,E402
from .weaver import *  # noqa: F401,F403,E402
from .hoba import *  # noqa: F401,F403,E402
from .cnn import *  # noqa: F401,F403,E402
