"""Value checks that do not stall an accelerator.

Checking tensor *values* (labels in range, token ids below the vocabulary size, time features in their periods)
needs the answer on the host: on a GPU that is a device-to-host copy that waits for every queued kernel, once per
training step. :func:`check_values` raises the full, descriptive error for CPU tensors and, on any other device,
queues an asynchronous device-side assertion with the same message instead (``torch._assert_async``): bad input
still stops the run (at the next synchronisation, as an out-of-range embedding index would), but good input never
waits.
"""
from __future__ import annotations

from typing import Callable

import torch


DETAIL = "{detail}"


def check_values(ok: torch.Tensor, message: str, detail: Callable[[], str] | None = None,
                 exc: type[Exception] = ValueError) -> None:
    """Require the 0-dim bool tensor ``ok``. On CPU, when it is False: ``raise exc(message)`` with the literal
    ``{detail}`` in ``message`` replaced by ``detail()`` (which may inspect the offending values: it runs only on
    failure). Elsewhere: an asynchronous device-side assert with ``message`` (``{detail}`` removed), no host sync."""
    if ok.device.type == "cpu":
        if not bool(ok):
            raise exc(message.replace(DETAIL, detail() if detail is not None else ""))
    else:
        torch._assert_async(ok, message.replace(DETAIL, ""))
