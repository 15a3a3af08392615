"""Verifier operators: one registered object per operator (see ``certify.ops.core``).

Importing this package registers every family: ``affine``, ``elementwise``, ``bilinear``,
``activations`` (smooth elementwise maps), ``convolution``.
"""
from certify.ops import activations, affine, bilinear, convolution, elementwise  # noqa: F401  (registration)
from certify.ops.convolution import conv2d_params, conv2d_shape
from certify.ops.core import (
    KINDS,
    OPERATORS,
    Affine,
    Bilinear,
    Elementwise,
    Input,
    Operator,
    adjoint,
    forward,
    get,
    names,
    register,
    sum_rest,
)

__all__ = ["KINDS", "OPERATORS", "Affine", "Bilinear", "Elementwise", "Input", "Operator", "adjoint",
           "conv2d_params", "conv2d_shape", "forward", "get", "names", "register", "sum_rest"]
