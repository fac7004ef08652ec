"""Lightning tasks, losses and metrics. Requires the ``train`` extra (lightning, torchmetrics)."""
from hoformer.compat import quiet_lightning

quiet_lightning()  # Lightning's advertising tips and a deprecation warning of its own, on every run
from .base import TaskModule  # noqa: F401
from .optim import Optimization  # noqa: F401
from .metrics import *  # noqa: F401,F403
from .tasks import *  # noqa: F401,F403
from .callbacks import *  # noqa: F401,F403
from .checkpoint_io import AtomicCheckpointIO, install_checkpoint_io  # noqa: F401
from .traffic import *  # noqa: F401,F403
from .text import *  # noqa: F401,F403
from .class_balance import *  # noqa: F401,F403
from .guards import *  # noqa: F401,F403
from .deadline import *  # noqa: F401,F403
