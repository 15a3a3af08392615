"""Attention classifiers written the way a user writes them, for 8x8 digits (1, 8, 8) in [0, 1].

None of these uses anything of ``certify``: they are plain ``torch.nn`` (or Hugging Face
``transformers``) models, the inputs the generic front end (``certify.verify``) must accept.
- ``MHAClassifier``: patch-embedding Linear, class token and positional embedding,
  ``nn.MultiheadAttention`` (``batch_first`` either way) with pre-LayerNorm, a GELU MLP;
- ``QKVClassifier``: hand-written q/k/v ``nn.Linear`` attention with ``torch.softmax`` and
  ``@``, mean pooling;
- ``EncoderClassifier``: ``nn.TransformerEncoderLayer`` (``norm_first`` either way, dropout
  0.1, so it must be in eval mode to be certified);
- ``hf_vit`` / ``hf_bert``: tiny randomly initialised ``ViTForImageClassification`` and
  ``BertForSequenceClassification`` built from configs (nothing is downloaded).
``train(model, X, y, epochs, seed)`` fits any of the image models briefly with Adam on
cross-entropy; ``build(name)`` returns the model of ``NAMES`` trained on sklearn digits
(``certify.data.digits``, the zoo's split), with the test split.
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["NAMES", "EncoderClassifier", "MHAClassifier", "QKVClassifier", "build", "hf_bert", "hf_vit",
           "make", "train"]

CLASSES = 10
PATCH = 4  # 8x8 digits -> 4 patches of 4x4 pixels


def _patches(x):
    """(B, 1, 8, 8) -> (B, 4, 16): non-overlapping 4x4 patches, row-major."""
    b = x.shape[0]
    x = x.reshape(b, 1, 2, PATCH, 2, PATCH).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, 4, PATCH * PATCH)


class MHAClassifier(nn.Module):
    """Patch Linear + class token + positions -> x + MHA(LN(x)) -> x + MLP(LN(x)) with GELU
    -> LN -> head on the class token. ``batch_first=False`` runs the attention on (N, B, d)."""

    def __init__(self, dim=16, heads=2, hidden=32, batch_first=True):
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Linear(PATCH * PATCH, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, 5, dim))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        t = self.embed(_patches(x))
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        h = self.norm1(t)
        if self.batch_first:
            a, _ = self.attn(h, h, h, need_weights=False)
        else:
            h = h.transpose(0, 1)
            a, _ = self.attn(h, h, h, need_weights=False)
            a = a.transpose(0, 1)
        t = t + a
        t = t + self.mlp(self.norm2(t))
        return self.head(self.norm(t)[:, 0])


class QKVClassifier(nn.Module):
    """One attention layer written out: q, k, v = Linear(x); softmax(q kᵀ / sqrt(d_h)) v per
    head, an output Linear, a residual, ReLU MLP, mean over tokens, head."""

    def __init__(self, dim=16, heads=2, hidden=32):
        super().__init__()
        self.heads, self.dh = heads, dim // heads
        self.embed = nn.Linear(PATCH * PATCH, dim)
        self.pos = nn.Parameter(0.02 * torch.randn(4, dim))
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        self.head = nn.Linear(dim, CLASSES)

    def split(self, t):
        b, n, _ = t.shape
        return t.view(b, n, self.heads, self.dh).transpose(1, 2)

    def forward(self, x):
        t = self.embed(_patches(x)) + self.pos
        q, k, v = self.split(self.q(t)), self.split(self.k(t)), self.split(self.v(t))
        p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.dh), dim=-1)
        a = (p @ v).transpose(1, 2).reshape(t.shape)
        t = t + self.o(a)
        t = t + self.mlp(t)
        return self.head(t.mean(dim=1))


class EncoderClassifier(nn.Module):
    """Patch Linear + positions -> ``nn.TransformerEncoderLayer`` (GELU, dropout 0.1,
    ``norm_first`` as given) -> mean over tokens -> head."""

    def __init__(self, dim=16, heads=2, hidden=32, norm_first=False):
        super().__init__()
        self.embed = nn.Linear(PATCH * PATCH, dim)
        self.pos = nn.Parameter(0.02 * torch.randn(1, 4, dim))
        self.encoder = nn.TransformerEncoderLayer(dim, heads, hidden, dropout=0.1, activation="gelu",
                                                  batch_first=True, norm_first=norm_first)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        return self.head(self.encoder(self.embed(_patches(x)) + self.pos).mean(dim=1))


def hf_vit(seed=0):
    """A randomly initialised ``ViTForImageClassification``: 8x8 images, 4x4 patches, 1
    channel, hidden 16, 1 layer, 2 heads, MLP 32, 10 labels."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    cfg = ViTConfig(image_size=8, patch_size=PATCH, num_channels=1, hidden_size=16, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=32, num_labels=CLASSES)
    return ViTForImageClassification(cfg).eval()


def hf_bert(seed=0, vocab=30, positions=16, labels=2):
    """A randomly initialised ``BertForSequenceClassification``: vocabulary ``vocab``, hidden
    16, 1 layer, 2 heads, MLP 32, ``positions`` positions, ``labels`` labels."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=positions, num_labels=labels)
    return BertForSequenceClassification(cfg).eval()


class _Logits(nn.Module):
    """The logits of a Hugging Face model, for training (certify reads ModelOutput itself)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return out if isinstance(out, torch.Tensor) else out.logits


def train(model, X, y, epochs=30, seed=0, lr=3e-3, batch=64):
    """Adam on cross-entropy over minibatches of (X, y) for ``epochs`` passes; returns the
    model in eval mode. Deterministic given ``seed`` (on one thread)."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs: expected a non-negative integer, got {epochs!r}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"y: {y.shape[0]} labels for {X.shape[0]} inputs")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = _Logits(model).train()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(epochs):
        for idx in torch.randperm(X.shape[0], generator=gen).split(batch):
            opt.zero_grad()
            nn.functional.cross_entropy(net(X[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


#: name -> constructor (seeded); every one maps (B, 1, 8, 8) digits to 10 logits
_MAKERS = {
    "mha": lambda: MHAClassifier(batch_first=True),
    "mha-seq-first": lambda: MHAClassifier(batch_first=False),
    "qkv": QKVClassifier,
    "encoder-post-norm": lambda: EncoderClassifier(norm_first=False),
    "encoder-pre-norm": lambda: EncoderClassifier(norm_first=True),
    "hf-vit": hf_vit,
}
NAMES = tuple(_MAKERS)
EPOCHS = 30


def make(name, seed=0):
    """The untrained model ``name`` (one of ``NAMES``), initialised under ``seed``."""
    if name not in _MAKERS:
        raise ValueError(f"name: expected one of {', '.join(NAMES)}, got {name!r}")
    torch.manual_seed(seed)
    return _MAKERS[name]().eval()


def build(name, epochs=EPOCHS, seed=0):
    """``make(name, seed)`` trained ``epochs`` epochs on the digits training split ->
    (model, X_test, y_test), float32, the model in eval mode."""
    from softcert.certify.data import digits

    xtr, ytr, xte, yte = digits()
    return train(make(name, seed), xtr, ytr, epochs, seed), xte, yte
