"""The six small architectures of the ghosts-of-softmax experiments (8x8 digit images).

Linear, MLP (64-128-10), CNN, MLP+LayerNorm, CNN+BatchNorm and a small Transformer (d=32, 2
layers, 4 heads, the 8 image rows as tokens). Sizes follow the published list (Sao, "Ghosts of
Softmax", arXiv:2603.13552; docs/report/references.bib); the exact published layer shapes were
not available, so the CNNs and the Transformer here are our own small choices. Inputs: flattened
8x8 images (N, 64) in [0, 1], as certify.data.digits gives them after ``reshape(-1, 64)``.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["ARCHITECTURES", "make_model"]


class TinyTransformer(nn.Module):
    """Rows of the 8x8 image as 8 tokens, d=32, 2 pre-norm encoder layers, 4 heads, mean pool."""

    def __init__(self, d: int = 32, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.pos = nn.Parameter(torch.zeros(1, 8, d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=64, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        h = self.embed(x.view(-1, 8, 8)) + self.pos
        return self.head(self.norm(self.encoder(h).mean(dim=1)))


def _cnn(batchnorm: bool) -> nn.Module:
    norm = (lambda c: nn.BatchNorm2d(c)) if batchnorm else (lambda c: nn.Identity())
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1), norm(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), norm(32), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10),
    )


ARCHITECTURES = {
    "Linear": lambda: nn.Linear(64, 10),
    "MLP": lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)),
    "CNN": lambda: _cnn(False),
    "MLP+LN": lambda: nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.ReLU(), nn.Linear(128, 10)),
    "CNN+BN": lambda: _cnn(True),
    "Transformer": lambda: TinyTransformer(),
}


def make_model(name: str, seed: int = 0) -> nn.Module:
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {name!r}")
    torch.manual_seed(seed)
    return ARCHITECTURES[name]()

