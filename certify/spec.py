"""The verification problem: an L∞ ball around an input, clipped to the pixel domain [0, 1],
and the margin specification logit_y - logit_j >= 0 for every j (row j of C is e_y - e_j).
Validation lives here so every method rejects bad input in the same words."""
from __future__ import annotations

import math

import torch

DOMAIN = (0.0, 1.0)


def check_problem(model, x, label, eps):
    """Validate (x, label, eps) against ``model``; return float64 x (B, C, H, W), label (B,)."""
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
    x = torch.as_tensor(x)
    if not torch.is_floating_point(x):
        raise ValueError(f"x: expected a floating tensor, got dtype {x.dtype}")
    if x.dim() == len(model.image):
        x = x.unsqueeze(0)
    if x.dim() != len(model.image) + 1 or tuple(x.shape[1:]) != tuple(model.image):
        raise ValueError(f"x: expected shape (B, {', '.join(map(str, model.image))}), got {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError("x: empty batch")
    if torch.isnan(x).any() or torch.isinf(x).any():
        raise ValueError("x: contains NaN or inf")
    label = torch.as_tensor(label, dtype=torch.int64).reshape(-1)
    if label.numel() == 1 and x.shape[0] > 1:
        label = label.expand(x.shape[0])
    if label.shape[0] != x.shape[0]:
        raise ValueError(f"label: expected {x.shape[0]} labels, got {label.shape[0]}")
    classes = model.head.out_features
    if (label < 0).any() or (label >= classes).any():
        raise ValueError(f"label: values must lie in [0, {classes})")
    return x.to(torch.float64), label


def input_box(x, eps):
    """[max(x - eps, 0), min(x + eps, 1)]: the L∞ ball intersected with the pixel domain."""
    lo = torch.clamp(x - eps, min=DOMAIN[0])
    hi = torch.clamp(x + eps, max=DOMAIN[1])
    return torch.minimum(lo, x), torch.maximum(hi, x)


def margin_spec(label, classes, dtype=torch.float64):
    """C (B, K, K) with row j = e_label - e_j (row label is zero)."""
    eye = torch.eye(classes, dtype=dtype)
    return eye[label].unsqueeze(1) - eye.unsqueeze(0)
