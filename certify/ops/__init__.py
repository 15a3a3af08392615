"""Verifier operators: one registered object per operator (see ``certify.ops.core``).

Importing this package registers every family: ``affine``, ``elementwise``, ``bilinear``,
``activations`` (smooth elementwise maps), ``convolution``.
"""
from softcert.certify.ops import activations, affine, bilinear, convolution, elementwise  # noqa: F401  (registration)
from softcert.certify.ops.convolution import conv2d_params, conv2d_shape
from softcert.certify.ops.core import (
    KINDS,
    MIDPOINT,
    MODES,
    OPERATORS,
    Affine,
    Bilinear,
    Elementwise,
    Input,
    Operator,
    Params,
    SplitRule,
    add_down,
    adjoint,
    all_finite,
    arithmetic,
    charge,
    down,
    first_order_gain,
    floor_charge,
    forward,
    gamma_charge,
    get,
    is_sound,
    magnitude,
    midpoint_split,
    names,
    register,
    scale_charge,
    sub_down,
    sum_rest,
    tensor_of,
    up,
    weighted_sum,
)

__all__ = ["KINDS", "MIDPOINT", "MODES", "OPERATORS", "Affine", "Bilinear", "Elementwise", "Input", "Operator", "Params", "SplitRule", "add_down", "all_finite",
           "adjoint", "arithmetic", "charge", "conv2d_params", "conv2d_shape", "down", "first_order_gain", "floor_charge", "forward",
           "gamma_charge", "get", "is_sound", "magnitude", "midpoint_split", "names", "register", "scale_charge", "sub_down", "sum_rest", "tensor_of", "up",
           "weighted_sum"]
