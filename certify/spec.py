"""The verification problem: an L∞ ball around an input, clipped to the input domain (default
[0, 1]), and the margin specification logit_y - logit_j >= 0 for every j (row j of C is
e_y - e_j). Validation lives here so every method rejects bad input in the same words: each
error names the argument and what it accepts.
"""
from __future__ import annotations

import math
import numbers
import os
from fractions import Fraction

import numpy as np
import torch

from softcert.certify.ops.core import tensor_of

DOMAIN = (0.0, 1.0)


def _real_scalar(value, name):
    """float(value) for a Python, numpy or 0-d tensor real scalar; ValueError otherwise."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 0 or value.dtype in (torch.bool, np.bool_) or tensor_of(value).is_complex():
            raise ValueError(f"{name}: expected a real scalar (Python, numpy or 0-d tensor), "
                             f"got a {type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}")
        return float(value.item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a real scalar (Python, numpy or 0-d tensor), got {type(value).__name__}")
    return float(value)


def check_eps(eps) -> float:
    """The ball radius as a float: finite and >= 0."""
    value = _real_scalar(eps, "eps")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"eps: must be finite and >= 0, got {value!r}")
    return value


def check_progress(progress):
    """None or a callable taking a count of finished samples (a tqdm bar's ``update``)."""
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected a callable (e.g. a tqdm bar's update) or None, got {progress!r}")
    return progress


def check_domain(domain) -> tuple:
    """(lo, hi): finite reals with lo < hi."""
    try:
        lo, hi = domain
    except (TypeError, ValueError):
        raise ValueError(f"domain: expected a pair (lo, hi), got {domain!r}") from None
    lo, hi = _real_scalar(lo, "domain"), _real_scalar(hi, "domain")
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"domain: expected finite lo < hi, got ({lo!r}, {hi!r})")
    return lo, hi


def check_batch_size(batch_size) -> int:
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    return int(batch_size)


def model_device(model):
    """The device of the model's parameters (of its buffers when it has none; None when it
    has neither, or is not a module); ValueError when they lie on several devices or on the
    meta device."""
    if not isinstance(model, torch.nn.Module):
        return None  # the caller names what a model must be
    devices = {t.device for t in model.parameters()} or {t.device for t in model.buffers()}
    if len(devices) > 1:
        raise ValueError(f"model: parameters on several devices ({', '.join(sorted(map(str, devices)))}); "
                         f"move the model to one device")
    device = next(iter(devices), None)
    if device is not None and device.type == "meta":
        raise ValueError("model: its parameters are meta tensors, which carry no values (load them onto a "
                         "real device)")
    return device


#: environment settings under which a device's float64 is not IEEE float64 with round to
#: nearest: cuBLAS (13.0 update 2 and later) then may emulate DGEMM in fixed point on integer
#: tensor cores, whose error the γ_n |A||B| charges (certify.crown.ARITHMETIC) do not cover
EMULATION_SETTINGS = ("CUBLAS_EMULATE_DOUBLE_PRECISION",)


def check_arithmetic(device: torch.device) -> None:
    """ValueError naming the setting when float64 on ``device`` may be emulated (a CUDA
    device with an ``EMULATION_SETTINGS`` variable set to anything but 0)."""
    if device.type != "cuda":
        return
    for name in EMULATION_SETTINGS:
        value = os.environ.get(name, "").strip()
        if value not in ("", "0"):
            raise ValueError(f"{name}={value}: cuBLAS may emulate float64 matrix products in fixed point, "
                             "which the sound rounding model (IEEE float64, round to nearest) does not cover; "
                             f"unset it or set {name}=0 before certifying on {device}")


def check_device(model, t, name="x"):
    """``t`` on the model's device (``model_device``); ValueError naming ``name`` otherwise.
    Certify computes where the model and its inputs are, as torch does, and moves neither.
    On a CUDA device the float64 arithmetic is checked too (``check_arithmetic``)."""
    device = model_device(model)
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device} but the model's parameters are on {device}; move both to one device")
    check_arithmetic(t.device)


def check_graph_device(graph, t, name="lower"):
    """``t`` on the device of the graph's constants (``Graph.device``); ValueError naming
    ``name`` otherwise."""
    device = graph.device
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device} but the graph's constants are on {device}; move both to one device")
    check_arithmetic(t.device)


def check_images(model, x, domain=None):
    """float64 inputs (B, ...) with a batch axis first, on the model's device
    (``check_device``); a model that declares its input shape (an ``image`` attribute, as
    certify.ViT) also takes one unbatched input. With ``domain``, every value must lie in
    [lo, hi]."""
    x = tensor_of(x)
    if x.device.type == "meta":
        raise ValueError("x: a meta tensor carries no values (load the inputs onto a real device)")
    check_device(model, x)
    if not torch.is_floating_point(x):
        hint = (" (token ids? bound the embeddings with certify.verify_text(model, input_ids, label, eps))"
                if x.dtype in (torch.int32, torch.int64) else "")
        raise ValueError(f"x: expected a floating tensor, got dtype {x.dtype}{hint}")
    shape = tuple(x.shape)  # as passed, for the error messages
    image = getattr(model, "image", None)
    if image is not None:
        image = tuple(image)
        if x.dim() == len(image):
            x = x.unsqueeze(0)
        if x.dim() != len(image) + 1 or tuple(x.shape[1:]) != image:
            raise ValueError(f"x: expected shape (B, {', '.join(map(str, image))}) or "
                             f"({', '.join(map(str, image))}), got {shape}")
    elif x.dim() < 1:
        raise ValueError("x: expected a batch of inputs (B, ...), got a scalar")
    if x.shape[0] == 0:
        raise ValueError("x: empty batch")
    if torch.isnan(x).any() or torch.isinf(x).any():
        raise ValueError("x: contains NaN or inf")
    if domain is not None:
        lo, hi = check_domain(domain)
        if (x < lo).any() or (x > hi).any():
            raise ValueError(f"x: values must lie in the input domain [{lo}, {hi}], got values in "
                             f"[{x.min().item():.6g}, {x.max().item():.6g}] (rescale the inputs, e.g. "
                             f"pixels / 255, or pass domain=)")
    return x.to(torch.float64)


def check_box(lower, upper, center=None):
    """float64 (lower, upper, center) of one shape (B, ...): finite, lower <= center <= upper
    (center defaults to the midpoint)."""
    out = []
    for name, t in (("lower", lower), ("upper", upper)):
        t = tensor_of(t)
        if not torch.is_floating_point(t):
            raise ValueError(f"{name}: expected a floating tensor, got dtype {t.dtype}")
        if t.dim() < 1 or t.shape[0] == 0:
            raise ValueError(f"{name}: expected a batch of inputs (B, ...), got shape {tuple(t.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name}: contains NaN or inf")
        out.append(t.to(torch.float64))
    lo, hi = out
    if hi.device != lo.device:
        raise ValueError(f"upper: on {hi.device} but lower is on {lo.device}; move both to one device")
    if lo.shape != hi.shape:
        raise ValueError(f"upper: expected the shape of lower {tuple(lo.shape)}, got {tuple(hi.shape)}")
    if (lo > hi).any():
        raise ValueError(f"lower: exceeds upper at {int((lo > hi).sum())} entries (lower <= upper required)")
    if center is None:
        center = lo + (hi - lo) / 2
    center = tensor_of(center, device=lo.device).to(torch.float64)
    if center.device != lo.device:
        raise ValueError(f"center: on {center.device} but lower is on {lo.device}; move both to one device")
    if center.shape != lo.shape or not torch.isfinite(center).all():
        raise ValueError(f"center: expected finite values of shape {tuple(lo.shape)}")
    if (center < lo).any() or (center > hi).any():
        raise ValueError("center: must lie in the box [lower, upper]")
    return lo, hi, center


def check_labels(label, batch, classes, device=None):
    """int64 labels (batch,): integers (integral floats accepted) in [0, classes); one label
    is broadcast to the batch. ``device``: where the labels go (the inputs' device; labels
    are integers, so the copy is exact)."""
    try:
        t = tensor_of(label, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"label: expected integers, got {type(label).__name__}") from None
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"label: expected integers, got dtype {t.dtype}")
    if t.is_floating_point():
        bad = ~torch.isfinite(t) | (t != torch.round(t))
        if bad.any():
            raise ValueError(f"label: expected integers, got non-integral values {t[bad].tolist()[:5]}")
    t = t.to(torch.int64).reshape(-1)
    if device is not None:
        t = t.to(device)
    if t.numel() == 1 and batch > 1:
        t = t.expand(batch)
    if t.shape[0] != batch:
        raise ValueError(f"label: expected {batch} labels, got {t.shape[0]}")
    if (t < 0).any() or (t >= classes).any():
        raise ValueError(f"label: values must lie in [0, {classes})")
    return t


def input_box(x, eps, domain=DOMAIN):
    """[max(x - eps, lo), min(x + eps, hi)]: the L∞ ball intersected with the input domain
    (``domain`` None: the ball itself)."""
    # x ± eps rounded outward, so the box contains the real-arithmetic ball
    lo = torch.nextafter(x - eps, torch.full_like(x, -torch.inf)) if eps else x
    hi = torch.nextafter(x + eps, torch.full_like(x, torch.inf)) if eps else x
    if domain is None:
        return lo, hi
    lo = torch.clamp(lo, min=domain[0])
    hi = torch.clamp(hi, max=domain[1])
    return torch.minimum(lo, x), torch.maximum(hi, x)


def _ball_end(x, eps, sign):
    """The float64 nearest x + sign·eps on the inside: the smallest float >= x - eps (sign
    -1) or the largest <= x + eps (sign +1), exactly. s = fl(x ± eps) and its error e
    (x ± eps = s + e, Knuth's TwoSum, exact without overflow) say on which side s lies."""
    b = sign * torch.as_tensor(eps, dtype=torch.float64, device=x.device)
    s = x + b
    bp = s - x
    e = (x - (s - bp)) + (b - bp)
    outside = e > 0 if sign < 0 else e < 0
    s = torch.where(outside, torch.nextafter(s, torch.full_like(s, -sign * torch.inf)), s)
    big = torch.finfo(torch.float64).max  # x ± eps beyond the float range: the last float
    return torch.where(torch.isinf(s), torch.full_like(s, -big if sign < 0 else big), s)


def inner_box(x, eps, domain=DOMAIN, dtype=torch.float64):
    """The points of ``dtype`` in the ball as written: [x - eps, x + eps] ∩ domain in exact
    real arithmetic (x, eps, domain: the given floats, taken exactly), each end rounded
    inward to ``dtype`` (then returned as float64). Where no ``dtype`` value lies in range,
    lo > hi. Attacks move in this box; ``input_box`` (outward) is the one to bound."""
    x = tensor_of(x, torch.float64)
    lo, hi = _ball_end(x, eps, -1), _ball_end(x, eps, 1)
    if domain is not None:
        lo, hi = torch.clamp(lo, min=float(domain[0])), torch.clamp(hi, max=float(domain[1]))
    if dtype == torch.float64:
        return lo, hi
    lo_d, hi_d = lo.to(dtype), hi.to(dtype)
    # float64 -> dtype rounds to nearest; a step back inward where that went outside
    lo_d = torch.where(lo_d.double() < lo, torch.nextafter(lo_d, torch.full_like(lo_d, torch.inf)), lo_d)
    hi_d = torch.where(hi_d.double() > hi, torch.nextafter(hi_d, torch.full_like(hi_d, -torch.inf)), hi_d)
    return lo_d.double(), hi_d.double()


def in_ball(point, x, eps, domain=DOMAIN) -> bool:
    """Does ``point`` (one input, any float dtype) lie in the ball as written,
    |point - x| <= eps and inside ``domain``, compared in exact rationals of the floats?"""
    p = tensor_of(point).double().reshape(-1).tolist()
    c = tensor_of(x).double().reshape(-1).tolist()
    if len(p) != len(c) or not all(math.isfinite(v) for v in p):
        return False
    r = Fraction(float(eps))
    lo, hi = (None, None) if domain is None else (Fraction(float(domain[0])), Fraction(float(domain[1])))
    for v, m in zip(p, c):
        q, m = Fraction(v), Fraction(m)
        if abs(q - m) > r or (lo is not None and not lo <= q <= hi):
            return False
    return True


def margin_spec(label, classes, dtype=torch.float64):
    """C (B, K, K) with row j = e_label - e_j (row label is zero), on the labels' device."""
    label = tensor_of(label)
    eye = torch.eye(classes, dtype=dtype, device=label.device)
    return eye[label].unsqueeze(1) - eye.unsqueeze(0)
