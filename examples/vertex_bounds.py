"""Bound an attention row's output coordinate over a box of scores, and re-check it exactly.

    python examples/vertex_bounds.py
"""
import torch

from softcert import bounds

torch.manual_seed(0)
n = 16
scores = torch.randn(n, dtype=torch.float64)
radius = 0.3
values = torch.randn(n, dtype=torch.float64)  # one output coordinate of V

exact = bounds.vertex_softmax(values, scores - radius, scores + radius)
print(f"Vertex-Softmax: [{exact.lower.item():.6f}, {exact.upper.item():.6f}]")
for name, fn in bounds.BASELINES.items():
    b = fn(values, scores - radius, scores + radius)
    print(f"{name:>15}: [{b.lower.item():.6f}, {b.upper.item():.6f}]")

# independent re-check with rational arithmetic (and outward exp enclosures)
for sense, value in (("lower", exact.lower.item()), ("upper", exact.upper.item())):
    check = bounds.check_certificate(values, scores - radius, scores + radius, value, sense=sense)
    print(f"exact check of the {sense} bound: {check.holds}")

# a random point in the box never escapes the bound
s = scores + radius * (2 * torch.rand(10000, n, dtype=torch.float64) - 1)
f = torch.softmax(s, -1) @ values
print(f"10,000 samples in [{f.min().item():.6f}, {f.max().item():.6f}]")
