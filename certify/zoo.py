"""Small trained checkpoints committed under certify/zoo/ (regenerate: softcert train --all)."""
from __future__ import annotations

from softcert.certify import data
from softcert.certify.models import ViT
from softcert.certify.train import CERTIFIED, RECIPES, ZOO_DIR


def names() -> list[str]:
    """Checkpoints available on disk: the naturally and PGD-trained recipes and the certifiably
    trained models (``certify.train.CERTIFIED``)."""
    return sorted(n for n in (*RECIPES, *CERTIFIED) if (ZOO_DIR / f"{n}.pt").exists())


def load(name: str):
    """(model in eval mode, X_test, y_test); loads with weights_only=True."""
    import torch

    if name not in RECIPES and name not in CERTIFIED:
        raise ValueError(f"name: unknown model {name!r}; available: {', '.join(names())}")
    path = ZOO_DIR / f"{name}.pt"
    if not path.exists():
        how = f"softcert train {'--certified ' if name in CERTIFIED else ''}{name}"
        raise ValueError(f"name: the checkpoint of {name!r} is not in {ZOO_DIR}; train it: {how}")
    ckpt = torch.load(path, weights_only=True)
    cfg = dict(ckpt["config"])
    cfg["image"] = tuple(cfg["image"])
    model = ViT(**cfg)
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    _, _, xte, yte = getattr(data, ckpt["dataset"])()
    return model, xte, yte
