"""Sound enclosures of softmax over score boxes: the primitives of softcert.

- ``vertex_softmax``: exact min/max of c·softmax(s) over lower <= s <= upper, outward rounded.
- ``softmax_interval``: tight elementwise bounds of softmax(s) over the box.
- ``check_certificate``: exact decision of a claimed bound ("holds" / "refuted" / "undecided");
  ``exact_rational`` reads a claim (int, float, Fraction, Decimal, str) without rounding.
- ``bounds.box``: the input validation every bound shares (float64 CPU tensors, ValueError
  naming the argument).
- baselines for comparison: ``naive_interval``, ``shi2020``, ``wei2023_lse``, ``wei2023_er``.
"""
from softcert.bounds.baselines import BASELINES, BoxBounds, naive_interval, shi2020, wei2023_er, wei2023_lse
from softcert.bounds.certificate import CertificateCheck, check_certificate, exact_rational
from softcert.bounds.interval import SoftmaxInterval, softmax_interval
from softcert.bounds.vertex import VertexBounds, vertex_softmax

__all__ = [
    "BASELINES",
    "BoxBounds",
    "CertificateCheck",
    "SoftmaxInterval",
    "VertexBounds",
    "check_certificate",
    "exact_rational",
    "naive_interval",
    "shi2020",
    "softmax_interval",
    "vertex_softmax",
    "wei2023_er",
    "wei2023_lse",
]
