"""``softcert train``: retrain zoo checkpoints from their recipes (certify.train.RECIPES).

Trains each named model (or every recipe with ``--all``) on one CPU thread and writes
``<out>/<name>.pt`` (default: certify/zoo/, the committed checkpoints that certify.zoo loads).
"""
from __future__ import annotations

from pathlib import Path

import torch

from softcert.certify import train


def configure(parser) -> None:
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(train.RECIPES)}")
    parser.add_argument("--all", action="store_true", help="every recipe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(train.ZOO_DIR),
                        help="checkpoint folder (default: certify/zoo, the committed zoo)")


def run(args) -> int:
    names = list(train.RECIPES) if args.all else args.names
    if not names:
        raise ValueError("names: give zoo names or --all")
    for name in names:
        if name not in train.RECIPES:
            raise ValueError(f"names: unknown zoo model {name!r}; recipes: {', '.join(train.RECIPES)}")
    torch.set_num_threads(1)
    for name in names:
        path = train.save(name, train.train(name, seed=args.seed, log=print), Path(args.out))
        print(f"wrote {path}")
    return 0
