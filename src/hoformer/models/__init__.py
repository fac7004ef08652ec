"""Task models behind a timm-style registry (a registered model is a class plus preset constructor arguments)."""
from .base import HoformerModel  # noqa: F401
from .registry import create_model, is_model, list_models, register_model  # noqa: F401
from .pretrained import from_pretrained, model_from_config  # noqa: F401

from . import hot, weaver, hoba, cnn  # noqa: F401,E402  (register the model families)
from .hot import *  # noqa: F401,F403,E402
from .weaver import *  # noqa: F401,F403,E402
from .hoba import *  # noqa: F401,F403,E402
from .cnn import *  # noqa: F401,F403,E402
from .causal_forecaster import *  # noqa: F401,F403,E402
