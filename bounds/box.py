"""Input validation for score boxes: one place that turns user input into float64 tensors.

Every public bound takes (c, lower, upper) or (lower, upper). Bad input raises a ValueError
that names the argument; it never reaches the arithmetic, so it never yields a certificate.
"""
from __future__ import annotations

import numpy as np
import torch

NEG_INF = float("-inf")


def _plainly_valid(lo: torch.Tensor, hi: torch.Tensor) -> bool:
    """One cheap test that passes exactly for boxes with no NaN, no +inf, lo <= hi, and no
    masked (-inf, -inf) entries; anything else takes the detailed checks below, which name
    the problem. NaN propagates through the difference and through max."""
    return bool((hi - lo).min() >= 0) and bool(hi.max() < float("inf"))


def _check_python_ints(x, name: str) -> None:
    """Reject integers nested in lists/tuples (Python or numpy ints) that float64 would round;
    np.asarray would round them silently when floats share the list."""
    for item in x:
        if isinstance(item, (list, tuple)):
            _check_python_ints(item, name)
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool) and (
                item > 2**53 or item < -(2**53)):
            _require_exact(int(item), name)


def _require_exact(v: int, name: str) -> None:
    try:
        exact = int(float(v)) == v
    except OverflowError:
        exact = False
    if not exact:
        raise ValueError(
            f"{name}: the integer {v} is not exactly representable in float64; a bound for the "
            "rounded value would not be a certificate for it (pass a float to accept rounding)"
        )


def _check_integer_array(t: torch.Tensor, name: str) -> None:
    """Integer tensors: every entry above 2^53 in magnitude must convert to float64 exactly."""
    if t.dtype in (torch.int64, torch.uint64):
        a = t.numpy() if t.dtype == torch.int64 else np.asarray(t.tolist(), dtype=object)
        for v in a[(a > 2**53) | (a < -(2**53))].tolist():
            _require_exact(int(v), name)


def as_float64(x, name: str, check_nan: bool = True, device=None) -> torch.Tensor:
    """Convert array-like ``x`` to a float64 tensor on ``device`` (default: the CPU).

    Exact for float32/float16 input; integers (Python ints, integer arrays) must be exactly
    representable in float64, else ValueError: a bound for a rounded input would certify
    another problem. Tensors on another device are copied there; a meta tensor (no values)
    is rejected.
    """
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise ValueError(f"{name}: a meta tensor carries no values")
        t = x.detach()
    else:
        if isinstance(x, (list, tuple)):
            _check_python_ints(x, name)
        elif isinstance(x, int) and not isinstance(x, bool) and abs(x) > 2**53:
            _require_exact(x, name)
        try:
            arr = np.asarray(x)
            if arr.dtype == object:
                # big Python ints (already checked exact above) and floats only
                if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                           for v in arr.ravel().tolist()):
                    raise TypeError("unsupported element types")
                arr = arr.astype(np.float64)
            # copy reversed/strided views (torch cannot wrap negative strides); keep 0-d as is
            t = torch.as_tensor(np.ascontiguousarray(arr) if arr.ndim else arr)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{name}: cannot be read as a numeric array ({exc})") from None
    if t.is_complex():
        raise ValueError(f"{name}: complex values are not supported")
    if t.dtype == torch.bool:
        raise ValueError(f"{name}: boolean arrays are not scores")
    if not t.is_floating_point():
        _check_integer_array(t.cpu(), name)
    t = t.to(device="cpu" if device is None else device, dtype=torch.float64)
    if t.dim() == 0:
        raise ValueError(f"{name}: expected at least one dimension (the score axis), got a scalar")
    if check_nan and torch.isnan(t).any():
        raise ValueError(f"{name}: contains NaN")
    return t


def validate_scores(scores, name: str = "scores", device=None) -> torch.Tensor:
    """Score rows (..., n) as float64 on ``device`` (default the CPU): rejects NaN, +inf, an
    empty key axis and fully masked rows (-inf marks a masked key)."""
    s = as_float64(scores, name, device=device)
    if s.shape[-1] == 0:
        raise ValueError(f"{name}: the key axis (last dimension) is empty")
    if torch.isposinf(s).any():
        raise ValueError(f"{name}: contains +inf (masked keys are -inf)")
    if torch.isneginf(s).all(dim=-1).any():
        raise ValueError(f"{name}: a row has every key masked (-inf); softmax is undefined there")
    return s


def common_device(**arrays) -> torch.device:
    """The one device of the tensors among ``arrays`` (name -> value; other array-likes follow
    it), the CPU when there are none; ValueError naming them when they are on two devices."""
    where = {name: a.device for name, a in arrays.items() if isinstance(a, torch.Tensor)}
    for name, d in where.items():
        if d.type == "meta":
            raise ValueError(f"{name}: a meta tensor carries no values")
    devices = set(where.values())
    if len(devices) > 1:
        said = ", ".join(f"{name} on {d}" for name, d in where.items())
        raise ValueError(f"{said}: move them to one device (results are computed and returned there)")
    return devices.pop() if devices else torch.device("cpu")


def score_box(lower, upper, *, allow_masked: bool = True, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a score box ``lower <= s <= upper`` over the last axis, on ``device`` (default
    the CPU).

    -inf in ``upper`` marks a masked entry (it then must be -inf in ``lower`` as well and takes
    no mass); -inf in ``lower`` alone means the entry's mass can approach 0. +inf is rejected.
    """
    lo = as_float64(lower, "lower", check_nan=False, device=device)
    hi = as_float64(upper, "upper", check_nan=False, device=device)
    if lo.shape == hi.shape and lo.numel() and _plainly_valid(lo, hi):
        if allow_masked or bool(lo.min() > float("-inf")):
            return lo, hi
    for t, name in ((lo, "lower"), (hi, "upper")):
        if torch.isnan(t).any():
            raise ValueError(f"{name}: contains NaN")
        if torch.isposinf(t).any():
            raise ValueError(f"{name}: contains +inf (scores must be finite above)")
    try:
        lo, hi = torch.broadcast_tensors(lo, hi)
    except RuntimeError:
        raise ValueError(
            f"lower and upper: shapes {tuple(lo.shape)} and {tuple(hi.shape)} do not broadcast"
        ) from None
    if lo.shape[-1] == 0:
        raise ValueError("lower/upper: the score axis (last dimension) is empty")
    bad = lo > hi
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"lower > upper at index {idx}: lower={lo[idx].item()!r}, upper={hi[idx].item()!r}"
        )
    masked = torch.isneginf(hi)
    if masked.all(dim=-1).any():
        raise ValueError("upper: a row has every entry masked (-inf); softmax is undefined there")
    if not allow_masked and (torch.isinf(lo).any() or masked.any()):
        raise ValueError("lower/upper: this method needs a finite box (no -inf entries)")
    return lo, hi


def _plain_tensors(c, lower, upper) -> bool:
    """Three float64 CPU tensors of one non-empty shape, contiguous, that ``plain_box``
    accepts: nothing to convert, broadcast or report."""
    ts = (c, lower, upper)
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.device.type == "cpu"
               and t.is_contiguous() and t.shape == c.shape and not t.requires_grad
               and not t.is_neg() for t in ts):
        return False
    if c.dim() == 0 or c.shape[-1] == 0:
        return False
    from softcert.kernels.box_check import plain_box

    return plain_box(*(t.reshape(-1).numpy() for t in ts))


def coefficient_box(c, lower, upper, *, allow_masked: bool = True, keep_device: bool = False):
    """Validate (c, lower, upper) and broadcast them to one shape (..., n): on the CPU, or
    with ``keep_device`` on the tensors' one device (``common_device``)."""
    if allow_masked and _plain_tensors(c, lower, upper):  # the common case, one pass
        return c.detach(), lower.detach(), upper.detach()
    device = common_device(c=c, lower=lower, upper=upper) if keep_device else None
    cc = as_float64(c, "c", check_nan=False, device=device)
    # two reductions without a temporary: NaN and ±inf show in the extremes
    if cc.numel() and not (torch.isfinite(cc.amax()) and torch.isfinite(cc.amin())):
        if torch.isnan(cc).any():
            raise ValueError("c: contains NaN")
        raise ValueError("c: contains +-inf (coefficients must be finite)")
    lo, hi = score_box(lower, upper, allow_masked=allow_masked, device=device)
    try:
        shape = torch.broadcast_shapes(cc.shape, lo.shape)
    except RuntimeError:
        raise ValueError(
            f"c: shape {tuple(cc.shape)} does not broadcast with the box shape {tuple(lo.shape)}"
        ) from None
    return (cc.expand(shape).contiguous(), lo.expand(shape).contiguous(),
            hi.expand(shape).contiguous())
