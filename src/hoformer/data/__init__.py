"""Datasets and datamodules (download -> verify -> load; scalers fitted on the training split only)."""
from ._utils import *  # noqa: F401,F403
from .series import *  # noqa: F401,F403
from .ltsf import *  # noqa: F401,F403
from .medmnist import *  # noqa: F401,F403
from .multispectral import *  # noqa: F401,F403
from .traffic import *  # noqa: F401,F403
from .text import *  # noqa: F401,F403
from .text_csv import *  # noqa: F401,F403
from .datamodules import *  # noqa: F401,F403
from hoformer.checkpoint import DataMismatchError, check_data_signature  # noqa: F401,E402 (documented there)
