"""Settings that hold within a block: a context variable set on entry and reset on exit, for
this thread or task only (``core.arithmetic``, ``host.reads``, ``lowering``'s device and
softmax form)."""
from __future__ import annotations

import contextlib
import contextvars


@contextlib.contextmanager
def context_setting(var: contextvars.ContextVar, value):
    """``var`` holds ``value`` within the block (for this thread or task only)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
