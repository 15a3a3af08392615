"""Training recipes for the model zoo: standard and PGD-adversarial (Madry et al. 2018).

Regenerate every committed checkpoint (about a few minutes on one CPU thread):
    softcert train --all
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from softcert.certify import data
from softcert.certify.attack import pgd_cross_entropy
from softcert.certify.models import ViT
from softcert.certify.training import translated

ZOO_DIR = Path(__file__).with_name("zoo")

#: name -> (dataset, model config, recipe)
RECIPES = {
    "mnist-vit1": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=32, heads=4, mlp=64, depth=1),
                   dict(epochs=30, adv_eps=0.0)),
    "mnist-vit1-pgd": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=32, heads=4, mlp=64, depth=1),
                       dict(epochs=30, adv_eps=0.02)),
    "mnist-vit2": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=32, heads=4, mlp=64, depth=2),
                   dict(epochs=30, adv_eps=0.0)),
    "mnist-vit1-cls-ln": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=32, heads=4, mlp=64,
                                          depth=1, layer_norm=True, pool="cls"),
                          dict(epochs=30, adv_eps=0.0)),
    # deep models of the depth benchmark (softcert depth, docs/certify/depth.md): 20 epochs,
    # 45 s each on one CPU thread; test accuracy 0.939 (mnist-vit4) and 0.939 (mnist-vit8)
    "mnist-vit4": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4),
                   dict(epochs=20, adv_eps=0.0)),
    "mnist-vit8": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=8),
                   dict(epochs=20, adv_eps=0.0)),
    # the same with pre-norm LayerNorm blocks and a final norm (issue 34's architecture for
    # certified training; the naturally trained baseline of mnist-vit4-ct / -vit8-ct)
    "mnist-vit2-ln": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=2,
                                      layer_norm=True), dict(epochs=20, adv_eps=0.0)),
    "mnist-vit4-ln": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4,
                                      layer_norm=True), dict(epochs=20, adv_eps=0.0)),
    "mnist-vit8-ln": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=8,
                                      layer_norm=True), dict(epochs=20, adv_eps=0.0)),
    # the same with the centred LayerNorm (no division by the standard deviation, Xu et al.
    # 2020's choice for certified training of Transformers): the architecture of mnist-vit4-ct
    # and -vit8-ct, whose interval bounds the standard LayerNorm makes vacuous
    # (docs/certify/training.md)
    "mnist-vit4-nv": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4,
                                      layer_norm=True, norm_variance=False), dict(epochs=20, adv_eps=0.0)),
    "mnist-vit8-nv": ("mnist5k", dict(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=8,
                                      layer_norm=True, norm_variance=False), dict(epochs=20, adv_eps=0.0)),
    "digits-vit1": ("digits", dict(image=(1, 8, 8), patch=2, dim=16, heads=2, mlp=32, depth=1),
                    dict(epochs=120, adv_eps=0.0)),
}


def _at_eps(epochs, milestone):
    """IBP at eps 0.02 from the first step (a trained model continued, or grown deeper): the
    natural and robust losses weighted equally, Adam 1e-3 with one 10x decay at ``milestone``,
    gradients clipped to norm 10 (docs/certify/training.md, mnist-vit4-ln-ct130)."""
    return dict(eps=0.02, epochs=epochs, warmup_epochs=0, ramp_epochs=0, kappa_start=0.5, kappa_end=0.5, lr=1e-3,
                lr_milestones=(milestone,), grad_clip=10.0, bound="ibp")


def _tuned(epochs, milestone):
    """``_at_eps`` for a fine-tune towards clean accuracy: the natural loss weighted 0.8 and Adam
    3e-4 (docs/certify/training.md, "Trading certificates for clean accuracy")."""
    return dict(_at_eps(epochs, milestone), kappa_start=0.8, kappa_end=0.8, lr=3e-4)


def _from_scratch(epochs, milestone):
    """``_at_eps`` from a fresh model: eps from 2e-12 to 0.02 geometrically over the first 40
    epochs (docs/certify/training.md, mnist-vit4-ct and mnist-vit4-ln-ct)."""
    return dict(_at_eps(epochs, milestone), ramp_epochs=40, ramp="geometric", ramp_start=1e-10)


#: certifiably trained zoo models (certify.training, issue 34): name -> (the recipe whose
#: architecture and dataset they use, the ``CertifiedTraining`` fields that differ from its
#: defaults[, how the model to train is made: ViTConfig fields such as branch_init, "dtype", and
#: "start_from": a zoo model to continue from, grown to the recipe's depth by
#: certify.models.grown], read by ``certified_recipe``). Regenerate one (not part of --all; docs/certify/training.md gives the times):
#:     softcert train --certified NAME        (writes certify/zoo/NAME.pt and NAME.json)
CERTIFIED = {
    # 10 natural epochs first: with the reference's one (32 steps on 4,000 images) the models
    # entered the eps ramp untrained and ended at clean 0.66-0.69 / CROWN 0.57-0.61 at eps
    # 0.02; with ten, lr 1e-3 and 60 epochs: 0.83-0.85 / 0.73-0.80 (docs/certify/training.md)
    "mnist-vit1-ct": ("mnist-vit1", dict(eps=0.02, epochs=60, warmup_epochs=10, ramp_epochs=30, lr=1e-3)),
    # 250 epochs and one 10x decay at epoch 235 (38 min; the 210 epochs after the ramp train on
    # IBP alone, 3-4 s each): its training error was still falling after 100 epochs (natural
    # 0.137 -> 0.070, robust 0.247 -> 0.149) and clean accuracy rose 0.845 -> 0.90
    # (docs/certify/training.md); a decay at 45 and 55 of 60 stopped it early
    "mnist-vit2-ct": ("mnist-vit2", dict(eps=0.02, epochs=250, warmup_epochs=10, ramp_epochs=30, lr=1e-3,
                                         lr_milestones=(235,))),
    # four blocks, no LayerNorm (with it every IBP bound is saturated at every radius; without
    # it a fresh model's bound is informative at eps 2e-12), from scratch: no natural warm-up
    # (natural training multiplies the bounds' growth), eps from 2e-12 to 0.02 geometrically
    # over 40 epochs with the two losses weighted equally, then 100 epochs at 0.02 (67.5 min of
    # one thread; the training errors fell until epoch ~125). docs/certify/training.md
    "mnist-vit4-ct": ("mnist-vit4", _from_scratch(140, 120)),
    # four blocks with LayerNorm (mnist-vit4-ln's architecture): with PyTorch's initialisation
    # every IBP bound is saturated at every radius; with zero residual branches (ViTConfig
    # branch_init) a fresh model's bound is the natural margin up to eps 1e-6 (at 8 blocks too),
    # and the geometric ramp from 2e-12 then trains it in float64 (52.6 min; docs/certify/training.md)
    "mnist-vit4-ln-ct": ("mnist-vit4-ln", _from_scratch(80, 70),
                         dict(branch_init="zero", dtype="float64")),
    # two blocks with LayerNorm (mnist-vit2-ln's architecture: d 64, 4 heads, MLP 128), trained
    # as mnist-vit4-ln-ct with 80 epochs at eps 0.02 after the ramp (docs/certify/training.md)
    "mnist-vit2-ln-ct": ("mnist-vit2-ln", _from_scratch(120, 110),
                         dict(branch_init="zero", dtype="float64")),
    # mnist-vit2-ln-ct trained 120 more epochs at eps 0.02 in float32 (240 in all), as
    # mnist-vit4-ln-ct250 continues mnist-vit4-ln-ct130 (docs/certify/training.md)
    "mnist-vit2-ln-ct240": ("mnist-vit2-ln", _at_eps(120, 105),
                            dict(start_from="mnist-vit2-ln-ct", dtype="float32")),
    # mnist-vit2-ln-ct240 trained 60 more epochs at eps 0.02 with the natural loss weighted 0.7
    # (kappa; 0.5 before): clean 0.850 -> 0.866 on the split, PGD leaves 172 of the first 200
    # (168 before), IBP 152, the ibp -> crown -> alpha-crown cascade 170 (docs/certify/training.md)
    "mnist-vit2-ln-ct300": ("mnist-vit2-ln", dict(_at_eps(60, 52), kappa_start=0.7, kappa_end=0.7),
                            dict(start_from="mnist-vit2-ln-ct240", dtype="float32")),
    # mnist-vit4-ln-ct trained 50 more epochs at eps 0.02 (130 in all; 45.3 min): training errors
    # 0.203 / 0.387 -> 0.173 / 0.302, clean 0.774 -> 0.806 (docs/certify/training.md)
    "mnist-vit4-ln-ct130": ("mnist-vit4-ln", _at_eps(50, 40),
                            dict(start_from="mnist-vit4-ln-ct", dtype="float64")),
    # mnist-vit4-ln-ct130 trained 120 more epochs at eps 0.02 in float32 (250 in all; 39.4 min; a
    # trained model's IBP loss in float32 is its float64 one to 5 digits, at 0.6x the time):
    # training errors 0.173 / 0.302 -> 0.157 / 0.259 (docs/certify/training.md)
    "mnist-vit4-ln-ct250": ("mnist-vit4-ln", _at_eps(120, 105),
                            dict(start_from="mnist-vit4-ln-ct130", dtype="float32")),
    # four blocks with LayerNorm grown from the 2-block mnist-vit2-ln-ct240 (certify.models.grown),
    # then 60 epochs at eps 0.02 in float32 (docs/certify/training.md)
    "mnist-vit4-ln-ct-grown": ("mnist-vit4-ln", _at_eps(60, 52),
                               dict(start_from="mnist-vit2-ln-ct240", dtype="float32")),
    # mnist-vit4-ln-ct-grown trained 60 more epochs with every training image translated by up
    # to one pixel (CertifiedTraining.shift): clean 179 of the first 200 test images (0.895; 0.858
    # on the split), IBP 150, the ibp -> crown cascade 168 of PGD's 169 (docs/certify/training.md)
    "mnist-vit4-ln-ct-shift": ("mnist-vit4-ln", dict(_at_eps(60, 52), shift=1),
                               dict(start_from="mnist-vit4-ln-ct-grown", dtype="float32")),
    # mnist-vit4-ln-ct-shift trained 25 more epochs on the untranslated images with the natural
    # loss weighted 0.8 and Adam 3e-4: clean 182 of the first 200 test images (0.881 on the
    # split), PGD 172, IBP 150 at eps 0.02; the same fine-tune of the models not trained on
    # translated images stayed at 176-179 (docs/certify/training.md, "Trading certificates for
    # clean accuracy")
    "mnist-vit4-ln-ct-shift-tuned": ("mnist-vit4-ln", _tuned(25, 20),
                                     dict(start_from="mnist-vit4-ln-ct-shift", dtype="float32")),
    # four blocks grown from the 2-block mnist-vit2-ln-ct240 and trained 75 epochs on images
    # translated by up to a pixel: mnist-vit4-ln-ct-grown's and mnist-vit4-ln-ct-shift's two
    # 4-block stages as one (120 epochs -> 75): clean 177 of the first 200 test images, IBP 149
    # (docs/certify/training.md, "A 4-block chain with both targets")
    "mnist-vit4-ln-ct-shift75": ("mnist-vit4-ln", dict(_at_eps(75, 66), shift=1),
                                 dict(start_from="mnist-vit2-ln-ct240", dtype="float32")),
    # mnist-vit4-ln-ct-shift75 fine-tuned as mnist-vit4-ln-ct-shift-tuned: clean 183 of the first
    # 200 (0.915; 0.883 on the split), PGD 171, IBP 149, the ibp -> crown cascade 169 (0.845) at
    # eps 0.02; both 4-block accuracy targets from the chain ct -> ct240 -> shift75 -> this
    # (docs/certify/training.md, "A 4-block chain with both targets", for its time)
    "mnist-vit4-ln-ct-shift75-tuned": ("mnist-vit4-ln", _tuned(25, 20),
                                       dict(start_from="mnist-vit4-ln-ct-shift75", dtype="float32")),
    # four blocks grown from the 2-block mnist-vit2-ln-ct300 (the kappa-0.7 model), then 60 epochs
    # at eps 0.02 with kappa 0.7 as it was trained: one 4-block stage instead of
    # mnist-vit4-ln-ct-shift's two (docs/certify/training.md, "Training time on both cores")
    "mnist-vit4-ln-ct-grown300": ("mnist-vit4-ln", dict(_at_eps(60, 52), kappa_start=0.7, kappa_end=0.7),
                                  dict(start_from="mnist-vit2-ln-ct300", dtype="float32")),
    # eight blocks with LayerNorm, grown from mnist-vit4-ln-ct250 (certify.models.grown: its blocks
    # copied with zero output layers, so training starts at its function and bounds) and trained
    # at eps 0.02 directly, in float32: from scratch the geometric ramp collapsed to a constant
    # predictor on its last decades at 8 blocks (docs/certify/training.md)
    "mnist-vit8-ln-ct250": ("mnist-vit8-ln", _at_eps(50, 44),
                            dict(start_from="mnist-vit4-ln-ct250", dtype="float32")),
    # eight blocks grown at once from the 2-block mnist-vit2-ln-ct240 (block j a zero-output copy
    # of block j mod 2), then mnist-vit8-ln-ct250's 50 epochs: with --threads 2 the whole chain
    # (ct -> ct240 -> this) fits the issue's hour, where mnist-vit8-ln-ct250's took 170.7 min of
    # one thread (docs/certify/training.md, "An 8-block chain inside the hour")
    "mnist-vit8-ln-ct-grown": ("mnist-vit8-ln", _at_eps(50, 44),
                               dict(start_from="mnist-vit2-ln-ct240", dtype="float32")),
    # the first 8-block model: grown from mnist-vit4-ln-ct as mnist-vit8-ln-ct250 is from
    # mnist-vit4-ln-ct250, and trained 24 epochs in float64
    "mnist-vit8-ln-ct": ("mnist-vit8-ln", _at_eps(24, 20),
                         dict(start_from="mnist-vit4-ln-ct", dtype="float64")),
}


def certified_recipe(name: str) -> tuple[str, dict, dict]:
    """(architecture recipe, CertifiedTraining fields, model fields) of the certifiably trained
    zoo model ``name`` (``CERTIFIED``; an entry of two has no model fields)."""
    arch, options, *build = CERTIFIED[name]
    return arch, options, dict(build[0]) if build else {}


def _pgd_batch(model, x, y, eps, steps=5):
    return pgd_cross_entropy(model, y, ((x - eps).clamp(min=0), (x + eps).clamp(max=1)), eps / 2, steps)


def train(name: str, seed: int = 0, log=None, *, epochs: int | None = None, shift: int = 0) -> ViT:
    """Train zoo model ``name`` from its recipe (AdamW 3e-3, cosine schedule, batch 128; PGD
    adversarial training at ``adv_eps`` with a linear warm-up); ``log``, if given, receives
    one line with the test accuracy. ``epochs`` replaces the recipe's; ``shift`` moves each
    training image by up to that many pixels (``certify.training.translated``; 0, as the zoo's
    were trained: docs/certify/training.md measures 1 and 2)."""
    if name not in RECIPES:
        raise ValueError(f"name: unknown zoo model {name!r}; recipes: {', '.join(RECIPES)}")
    if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
        raise ValueError(f"epochs: expected an int >= 1 or None (the recipe's), got {epochs!r}")
    if not isinstance(shift, int) or shift < 0:
        raise ValueError(f"shift: expected an int >= 0, got {shift!r}")
    dataset, cfg, recipe = RECIPES[name]
    torch.manual_seed(seed)
    xtr, ytr, xte, yte = getattr(data, dataset)()
    model = ViT(**cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    epochs, adv = recipe["epochs"] if epochs is None else epochs, recipe["adv_eps"]
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    for ep in range(epochs):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 128):
            xb, yb = translated(xtr[perm[i:i + 128]], shift), ytr[perm[i:i + 128]]
            if adv:
                xb = _pgd_batch(model, xb, yb, adv * min(1.0, 2 * (ep + 1) / epochs))
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    if log is not None:
        log(f"{name}: test accuracy {acc:.3f}")
    return model


def save(name: str, model: ViT, directory: Path = ZOO_DIR) -> Path:
    """Write ``{config, dataset, state_dict}`` to ``directory/<name>.pt`` (what zoo.load reads)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = dict(model.config)
    cfg["image"] = list(cfg["image"])
    path = directory / f"{name}.pt"
    torch.save({"config": cfg, "dataset": RECIPES[name][0], "state_dict": state}, path)
    return path

