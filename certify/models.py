"""The supported model family: small ViT-style classifiers built from plain torch modules.

x (B, C, H, W) in [0, 1] -> patches (B, N, C·p·p) -> patch Linear + positional embedding
(stored as (N, d), an auto_LiRPA requirement) [+ class token] -> L blocks of
x + MHSA(LN?(x)) then x + MLP(LN?(x)) (ReLU MLP) -> [LN] -> mean or class-token pooling ->
Linear classifier: the architecture of the zoo (certify/zoo). The verifier itself takes any
module built from supported operators (``certify.trace``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention: softmax(Q Kᵀ / sqrt(d_h)) V, heads merged, output Linear."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"heads: {heads} does not divide dim {dim}")
        self.heads, self.dim = heads, dim
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def split(self, t):
        b, n, _ = t.shape
        return t.reshape(b, n, self.heads, self.dim // self.heads).transpose(1, 2)

    def forward(self, x):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scale = 1.0 / math.sqrt(self.dim // self.heads)
        p = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)
        o = (p @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], self.dim)
        return self.o(o)


class CentredLayerNorm(nn.Module):
    """LayerNorm without the division by the standard deviation: (x - mean(x)) · w + b over
    the last axis, the "no_var" LayerNorm that Xu et al. 2020 (auto_LiRPA, NeurIPS) use for
    certified training of Transformers. It is affine, so its interval and its linear bounds are
    exact up to rounding, where the standard one's 1/std has no useful interval once the box is
    wider than the features' spread (docs/certify/training.md measures both)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return (x - x.mean(dim=-1, keepdim=True)) * self.weight + self.bias


def _norm(dim: int, layer_norm: bool, norm_variance: bool) -> nn.Module:
    if not layer_norm:
        return nn.Identity()
    return nn.LayerNorm(dim) if norm_variance else CentredLayerNorm(dim)


class Block(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)); norms are Identity unless layer_norm,
    centred only (``CentredLayerNorm``) unless norm_variance."""

    def __init__(self, dim: int, heads: int, mlp: int, layer_norm: bool, norm_variance: bool = True):
        super().__init__()
        self.norm1 = _norm(dim, layer_norm, norm_variance)
        self.attn = Attention(dim, heads)
        self.norm2 = _norm(dim, layer_norm, norm_variance)
        self.fc1, self.relu, self.fc2 = nn.Linear(dim, mlp), nn.ReLU(), nn.Linear(mlp, dim)

    def branch_outputs(self):
        """The last layers of the two residual branches (attention output projection, second MLP
        layer): zero weights make the block the identity up to their biases."""
        return self.attn.o, self.fc2

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.relu(self.fc1(self.norm2(x))))


#: the initialisations of the residual branches (``ViTConfig.branch_init``)
BRANCH_INITS = ("default", "zero")


@dataclass(frozen=True)
class ViTConfig:
    """The architecture of a ``ViT``: ``image`` (C, H, W), square patches of side ``patch``
    (dividing H and W), width ``dim``, ``heads`` (dividing ``dim``), MLP width ``mlp``,
    ``depth`` blocks, ``classes`` logits, ``layer_norm`` (pre-norm blocks and a final norm;
    else Identity), ``norm_variance`` (False: those norms are ``CentredLayerNorm``s, without
    the division by the standard deviation), ``pool`` ("mean" over tokens or the "cls" token) and
    ``branch_init``: "default" (PyTorch's initialisation) or "zero" (each block's attention output
    projection and second MLP layer start with weight 0, so every block is the identity at the first
    step: SkipInit, De & Smith 2020; ReZero, Bachlechner et al. 2020; it keeps the interval bounds of
    a fresh deep LayerNorm model informative, docs/certify/training.md). ``ViT.config`` is its dict
    (``asdict``), the form ``certify/train.py`` saves in the zoo checkpoints."""

    image: tuple = (1, 28, 28)
    patch: int = 7
    dim: int = 32
    heads: int = 4
    mlp: int = 64
    depth: int = 1
    classes: int = 10
    layer_norm: bool = False
    pool: str = "mean"
    norm_variance: bool = True
    branch_init: str = "default"

    def __post_init__(self):
        object.__setattr__(self, "image", tuple(self.image))
        _, h, w = self.image
        if h % self.patch or w % self.patch:
            raise ValueError(f"patch: {self.patch} does not divide the image size {h}x{w}")
        if self.pool not in ("mean", "cls"):
            raise ValueError(f"pool: expected 'mean' or 'cls', got {self.pool!r}")
        if self.branch_init not in BRANCH_INITS:
            raise ValueError(f"branch_init: expected one of {', '.join(BRANCH_INITS)}, got {self.branch_init!r}")
        for name in ("layer_norm", "norm_variance"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected True or False, got {getattr(self, name)!r}")


class ViT(nn.Module):
    """ViT-style classifier; ``forward`` takes images, ``forward_patches`` flattened patches.
    Built from a ``ViTConfig`` or its fields as keywords (``ViT(**checkpoint["config"])``, as
    ``certify/zoo.py`` loads the zoo), not both."""

    def __init__(self, config: ViTConfig | None = None, /, **fields):
        super().__init__()
        if config is None:
            config = ViTConfig(**fields)
        elif not isinstance(config, ViTConfig):
            raise ValueError(f"config: expected a ViTConfig, got {type(config).__name__}")
        elif fields:
            raise ValueError(f"config: give a ViTConfig or its fields, not both (got {', '.join(fields)})")
        c, dim, patch, pool = config.image[0], config.dim, config.patch, config.pool
        self.config = asdict(config)
        self.image, self.patch, self.pool = config.image, patch, pool
        self.tokens = (config.image[1] // patch) * (config.image[2] // patch)
        self.embed = nn.Linear(c * patch * patch, dim)
        n = self.tokens + (pool == "cls")
        self.pos = nn.Parameter(0.02 * torch.randn(n, dim))
        self.cls = nn.Parameter(torch.zeros(dim)) if pool == "cls" else None
        self.blocks = nn.ModuleList(Block(dim, config.heads, config.mlp, config.layer_norm, config.norm_variance)
                                    for _ in range(config.depth))
        self.norm = _norm(dim, config.layer_norm, config.norm_variance)
        self.head = nn.Linear(dim, config.classes)
        if config.branch_init == "zero":
            self._zero_branches()

    def _zero_branches(self):
        # after every random draw, so that "zero" and "default" models of one seed share the rest
        with torch.no_grad():
            for blk in self.blocks:
                for layer in blk.branch_outputs():
                    layer.weight.zero_()

    def patchify(self, x):
        """(B, C, H, W) -> (B, N, C·p·p), patches in row-major order."""
        b, c, h, w = x.shape
        p = self.patch
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def forward_patches(self, z):
        t = self.embed(z)
        if self.cls is not None:
            t = torch.cat([self.cls.expand(t.shape[0], 1, -1), t], dim=1)
        t = t + self.pos
        for blk in self.blocks:
            t = blk(t)
        t = self.norm(t)
        t = t.mean(dim=1) if self.pool == "mean" else t[:, 0]
        return self.head(t)

    def forward(self, x):
        return self.forward_patches(self.patchify(x))


def grown(model: ViT, depth: int) -> ViT:
    """``model`` with ``depth`` blocks (progressive stacking, Gong et al. 2019): block j >= L (L
    the model's depth, any depth >= L) is a copy of block j mod L whose attention output projection
    and second MLP layer (weights and biases) are zero, so the grown model computes the same
    function, in the model's dtype, and every new block starts as the identity on trained
    (not fresh) branches: their interval bounds are the model's own at the first step, and an
    optimiser's first steps on the zeros move branches of trained size."""
    if not isinstance(model, ViT):
        raise ValueError(f"model: expected a certify.models.ViT, got {type(model).__name__}")
    old = model.config["depth"]
    if not (isinstance(depth, int) and depth >= old):
        raise ValueError(f"depth: expected an int >= {old} (the model has {old} blocks), got {depth!r}")
    out = ViT(**dict(model.config, image=tuple(model.config["image"]), depth=depth)).to(next(model.parameters()).dtype)
    out.load_state_dict(model.state_dict(), strict=False)  # every key but the new blocks'
    with torch.no_grad():
        for j, blk in enumerate(out.blocks[old:], start=old):
            blk.load_state_dict(model.blocks[j % old].state_dict())
            for layer in blk.branch_outputs():
                layer.weight.zero_()
                layer.bias.zero_()
    return out.train(model.training)
