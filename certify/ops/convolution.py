"""2-D convolution as an affine verifier operator, with torch.nn.functional.conv2d semantics.

y = W ⋆ x + b. Params (``conv2d_params`` validates and normalises them): ``weight``
(O, C/groups, kh, kw), ``bias`` (O,) or None, ``stride``, ``dilation`` (pairs), ``padding``
(top, bottom, left, right; from an int, a pair, 'valid' or 'same' as F.conv2d takes them),
``groups``, ``in_shape`` (the traced input shape: its last three axes are C, H, W, leading
axes are flattened into the convolution's batch). At run time x is (B, *in_shape) and y
(B, *lead, O, Ho, Wo).
Backward step: the exact transpose, torch.nn.grad.conv2d_input (a transposed convolution
with the output padding that restores H, W), cropped where padding is asymmetric; the bias
adds A·b. Interval: centre-radius with radius |W| ⋆ r (no bias). Sound arithmetic: both are
charged by the generic rule of ``certify.ops.core.Affine`` (the radius must be |W| ⋆ r, which
it is: tests/test_certify_conv.py checks it against the explicit matrix).
"""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input

from softcert.certify.ops.core import Affine, register, sum_rest


def _pair(v, name, minimum):
    """An int or a pair of ints (anything with __index__, not bool) -> a pair >= minimum."""
    vals = (v, v) if not isinstance(v, (tuple, list)) else tuple(v)
    try:
        ok = len(vals) == 2 and not any(isinstance(t, bool) for t in vals)
        vals = tuple(operator.index(t) for t in vals)
    except TypeError:
        ok = False
    if not ok or min(vals) < minimum:
        raise ValueError(f"conv2d: {name}: expected an int or a pair of ints >= {minimum}, got {v!r}")
    return vals


def _padding(padding, kernel, stride, dilation):
    """(top, bottom, left, right). 'same' puts the odd extra row/column at the end, as torch."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(f"conv2d: padding: expected 'valid', 'same', an int or a pair, got {padding!r}")
        if stride != (1, 1):
            raise ValueError(f"conv2d: padding: 'same' needs stride 1, got stride {stride}")
        th, tw = (d * (k - 1) for d, k in zip(dilation, kernel))
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        try:
            out = tuple(operator.index(t) for t in padding)
        except TypeError:
            out = (-1,)
        if min(out) < 0 or any(isinstance(t, bool) for t in padding):
            raise ValueError(f"conv2d: padding: expected non-negative ints, got {padding!r}")
        return out
    ph, pw = _pair(padding, "padding", 0)
    return (ph, ph, pw, pw)


def conv2d_params(weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, in_shape):
    """Validated, normalised params of a ``conv2d`` node (ValueError naming the argument).

    ``in_shape``: the traced input shape (..., C, H, W). Returns a dict with float64
    ``weight``/``bias``, pairs ``stride``/``dilation``, ``padding`` (top, bottom, left,
    right), ``groups``, ``in_shape`` and ``out_shape`` (..., O, Ho, Wo). The weights stay on
    their device (the model's)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        raise ValueError(f"conv2d: weight: expected a 4-D tensor (O, C/groups, kh, kw), got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    weight = weight.detach().to(torch.float64)
    if not torch.isfinite(weight).all():
        raise ValueError("conv2d: weight: contains NaN or inf")
    o, cg, kh, kw = weight.shape
    if min(o, cg, kh, kw) < 1:
        raise ValueError(f"conv2d: weight: empty shape {tuple(weight.shape)}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (o,):
            raise ValueError(f"conv2d: bias: expected shape ({o},), got {getattr(bias, 'shape', bias)!r}")
        bias = bias.detach().to(torch.float64)
        if not torch.isfinite(bias).all():
            raise ValueError("conv2d: bias: contains NaN or inf")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"conv2d: groups: expected a positive int, got {groups!r}")
    try:
        in_shape = tuple(int(s) for s in in_shape)
    except (TypeError, ValueError):
        raise ValueError(f"conv2d: in_shape: expected a sequence of ints, got {in_shape!r}") from None
    if len(in_shape) < 3 or min(in_shape) < 1:
        raise ValueError(f"conv2d: in_shape: expected (..., C, H, W) with positive sizes, got {in_shape}")
    c, h, w = in_shape[-3:]
    if o % groups or cg * groups != c:
        raise ValueError(f"conv2d: groups: {groups} groups need O = {o} divisible by groups and "
                         f"weight.shape[1] * groups = C = {c}, got weight.shape[1] = {cg}")
    stride = _pair(stride, "stride", 1)
    dilation = _pair(dilation, "dilation", 1)
    pad = _padding(padding, (kh, kw), stride, dilation)
    ho = (h + pad[0] + pad[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + pad[2] + pad[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if ho < 1 or wo < 1:
        raise ValueError(f"conv2d: in_shape: input {h}x{w} (padded {pad}) is smaller than the dilated kernel")
    return {"weight": weight, "bias": bias, "stride": stride, "padding": pad, "dilation": dilation,
            "groups": groups, "in_shape": in_shape, "out_shape": (*in_shape[:-3], o, ho, wo)}


def conv2d_shape(params):
    """The output shape (..., O, Ho, Wo) of a ``conv2d`` node with these params."""
    return _norm(params)["out_shape"]


def _norm(p):
    if "out_shape" in p:
        return p
    keys = ("bias", "stride", "padding", "dilation", "groups")
    return conv2d_params(p["weight"], in_shape=p["in_shape"], **{k: p[k] for k in keys if k in p})


def _symmetric(pad):
    return pad[0] == pad[1] and pad[2] == pad[3]


def _conv(p, x, weight, bias):
    """Apply the convolution (weight may be |W|) to x (B, *in_shape)."""
    shape = p["in_shape"]
    if tuple(x.shape[1:]) != shape:
        raise ValueError(f"conv2d: input: expected shape (B, *{shape}), got {tuple(x.shape)}")
    xx = x.reshape(-1, *shape[-3:])
    pad = p["padding"]
    if _symmetric(pad):
        y = F.conv2d(xx, weight, bias, p["stride"], (pad[0], pad[2]), p["dilation"], p["groups"])
    else:
        xx = F.pad(xx, (pad[2], pad[3], pad[0], pad[1]))
        y = F.conv2d(xx, weight, bias, p["stride"], 0, p["dilation"], p["groups"])
    return y.reshape(x.shape[0], *p["out_shape"])


def _apply(p, xs, const):
    p = _norm(p)
    return _conv(p, xs[0], p["weight"], p["bias"])


def _adjoint(p, A, const):
    """A (B, S, *out_shape) -> (A M (B, S, *in_shape), A·b (B, S))."""
    p = _norm(p)
    c, h, w = p["in_shape"][-3:]
    o, ho, wo = p["out_shape"][-3:]
    a = A.reshape(-1, o, ho, wo)
    top, bottom, left, right = p["padding"]
    if _symmetric(p["padding"]):
        g = conv2d_input((a.shape[0], c, h, w), p["weight"], a, p["stride"], (top, left), p["dilation"], p["groups"])
    else:
        g = conv2d_input((a.shape[0], c, h + top + bottom, w + left + right), p["weight"], a, p["stride"], 0,
                         p["dilation"], p["groups"])[..., top: top + h, left: left + w]
    bias = A.new_zeros(A.shape[:2]) if p["bias"] is None else sum_rest(A * p["bias"].view(o, 1, 1))
    return [g.reshape(*A.shape[:2], *p["in_shape"])], bias


def _radius(p, r):
    p = _norm(p)
    return _conv(p, r, p["weight"].abs(), None)


register(Affine(name="conv2d", description="2-D convolution W ⋆ x + b (F.conv2d: stride, padding, dilation, groups)",
                apply=_apply, adjoint=_adjoint, radius=_radius))
