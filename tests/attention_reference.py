"""The float64 reference of the attention tests (tests/test_analysis_fp_attention_masks.py,
tests/test_kernels_triton_attention.py) and its own error."""
import math

import numpy as np


def reference64(q, k, v, mask=None):
    """float64 attention over the attended keys (``mask`` True = attend; products of float32
    are exact in float64); a row with no attended key is 0 (torch's convention). Its own
    error is covered by ``slack64``."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = p.sum(-1, keepdims=True)
    return np.where(total > 0, (p / np.where(total > 0, total, 1.0)) @ v, 0.0)


def slack64(v, n, d):
    """The float64 reference's own error: ~(n + d) 2^-53 relative to max |v|."""
    return (n + d + 16) * 2.0 ** -50 * np.abs(np.asarray(v, dtype=np.float64)).max() + 1e-300
