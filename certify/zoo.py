"""Small trained checkpoints committed under certify/zoo/ (regenerate: softcert train --all)."""
from __future__ import annotations

from softcert.certify import data
from softcert.certify.models import ViT
from softcert.certify.train import RECIPES, ZOO_DIR


def names() -> list[str]:
    """Checkpoints available on disk."""
    return sorted(n for n in RECIPES if (ZOO_DIR / f"{n}.pt").exists())


def load(name: str):
    """(model in eval mode, X_test, y_test); loads with weights_only=True."""
    import torch

    if name not in RECIPES:
        raise ValueError(f"name: unknown model {name!r}; available: {', '.join(names())}")
    ckpt = torch.load(ZOO_DIR / f"{name}.pt", weights_only=True)
    cfg = dict(ckpt["config"])
    cfg["image"] = tuple(cfg["image"])
    model = ViT(**cfg)
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    _, _, xte, yte = getattr(data, ckpt["dataset"])()
    return model, xte, yte
