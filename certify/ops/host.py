"""Host reads of device values in the bounding pass: made where they cost nothing, avoided where they stall.

On a GPU every read of a device value by the host (``bool(t)``, ``.item()``, ``nonzero``, a
boolean mask) waits until the device has finished the work queued before it; on the CPU it
costs nothing. So the operators follow one of two policies (``reads``), chosen by the
tensors' device unless set:
- "read" (the CPU's): select elements by index (``nonzero``), test at once. This keeps the
  CPU's results as they were: torch's CPU sigmoid rounds the scalar tail of a kernel
  differently from its vector body, so evaluating masked full tensors instead of the indexed
  ones moves a few values by an ulp, and alpha-CROWN's Adam turns that into different
  margins (0.12 relative on a digits-vit1 margin at eps 0.08, measured);
- "defer" (every other device's, CUDA's): compute on every element and mask (no read to
  size a selection), read a search's convergence only every few steps
  (``activations.SEARCH_READS``), and batch the tests below into one read per block.
Two kinds of test do not change the arithmetic when they come out the usual way:
- checks that only raise (``require``): an input interval outside an operator's domain;
- ``core.weighted_sum``'s test for infinite weights (``infinite``): Σ W·v is one batched
  matrix product when v is finite, a masked sum (0·inf = 0) otherwise.
Under "defer", inside ``read_once(fn, t)`` each test records a 0-d device flag instead of
reading it (the sum takes the matrix product, as for a finite v), and the flags are read
together, once, when fn returns or raises:
- no flag set: fn's outcome stands. It is bitwise the outcome of reading every flag at once,
  since every branch went where the read would have sent it;
- an infinite weight seen: a branch may have gone wrong (the matrix product makes 0·inf NaN),
  so fn runs again with every test read at once, as without the block;
- else a failed check: its error is raised (the first one recorded, as reading at once would).
An inner block joins the outer one's read. fn may run twice, so it must have no side effects.
Outside any block (or inside ``at_once()``) every test reads at once.
"""
from __future__ import annotations

import contextvars

import torch

from softcert.certify.ops.context import context_setting

#: "auto" (the default): "read" on the CPU, "defer" on any other device; see the module docstring
POLICIES = ("auto", "read", "defer")
_POLICY = contextvars.ContextVar("certify_host_reads", default="auto")
#: the flags of the enclosing ``read_once`` block, a list of (flag, error or None); None: no
#: block (tests read at once); AT_ONCE: tests read at once and no block opens (``at_once``)
_PENDING = contextvars.ContextVar("certify_pending_reads", default=None)
AT_ONCE = ()


def reads(policy):
    """Within the block the operators follow ``policy`` (``POLICIES``) on every device, e.g.
    "defer" on the CPU to count the reads a GPU run makes (tests/bab_sync_counter.py)."""
    if policy not in POLICIES:
        raise ValueError(f"reads: expected one of {POLICIES}, got {policy!r}")
    return context_setting(_POLICY, policy)


def deferring(t):
    """Whether work on the tensor ``t``'s device avoids host reads ("defer")."""
    policy = _POLICY.get()
    return policy == "defer" or (policy == "auto" and t.device.type != "cpu")


def maybe(flag):
    """``bool(flag)`` for a 0-d bool tensor under "read"; True under "defer", where the
    caller computes for every element and masks instead of reading whether any needs it."""
    return True if deferring(flag) else bool(flag)


def require(ok, error):
    """Raise ``error()`` unless the 0-d bool tensor ``ok`` is true: read now, or, inside
    ``read_once``, when the block ends."""
    pending = _PENDING.get()
    if not isinstance(pending, list):
        if not bool(ok):
            raise error()
    else:
        pending.append((~ok, error))


def infinite(v):
    """Whether the tensor ``v`` holds ±inf, read now; inside ``read_once`` False, with the
    block's read deciding afterwards whether that was right (module docstring)."""
    flag = torch.isinf(v).any()
    pending = _PENDING.get()
    if not isinstance(pending, list):
        return bool(flag)
    pending.append((flag, None))
    return False


def at_once():
    """Within the block every test reads at once and no ``read_once`` block opens (for callers
    that catch a check's error, and for a block's second run)."""
    return context_setting(_PENDING, AT_ONCE)


def read_once(fn, t):
    """``fn()``, its tests read once at its end when work on ``t``'s device defers its reads
    (module docstring); else, or inside another block, just ``fn()``."""
    if _PENDING.get() is not None or not deferring(t):
        return fn()
    pending = []
    token = _PENDING.set(pending)
    try:
        out, raised = fn(), None
    except Exception as exc:  # noqa: BLE001  (re-raised below once the flags are read)
        out, raised = None, exc
    finally:
        _PENDING.reset(token)
    flags = torch.stack([f for f, _ in pending]).tolist() if pending else []
    if any(f and error is None for f, (_, error) in zip(flags, pending)):
        with at_once():
            return fn()  # an infinite weight: run again, every test read at once
    failed = [error for f, (_, error) in zip(flags, pending) if f]
    if failed:
        raise failed[0]()
    if raised is not None:
        raise raised
    return out
