"""``softcert train``: retrain zoo checkpoints from their recipes (certify.train.RECIPES), or
train a model certifiably (``--certified``: IBP / CROWN-IBP, certify.training).

Trains each named model (or every recipe with ``--all``) on one CPU thread and writes
``<out>/<name>.pt`` (default: certify/zoo/, the committed checkpoints that certify.zoo loads).
With ``--certified``: one model (``--model``, or one name) trained by
``certify.train_certified``; writes ``<out>/<stem>-ct.pt`` ({"recipe", "config", "state_dict",
"dataset", "training"}: ``--model`` loads it back) and ``<out>/<stem>-ct.json`` (the options and
the per-epoch history). A certifiably trained zoo name (certify.train.CERTIFIED, e.g.
mnist-vit4-ct) trains its recorded architecture with its recorded options (flags override them)
and writes ``<out>/<name>.pt``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from softcert.certify import train

# the certified-training options the command line sets: flag -> CertifiedTraining field
_CT_FLAGS = {"--eps": "eps", "--epochs": "epochs", "--warmup-epochs": "warmup_epochs",
             "--ramp-epochs": "ramp_epochs", "--bound": "bound", "--kappa-end": "kappa_end",
             "--beta-end": "beta_end", "--lr": "lr", "--lr-milestones": "lr_milestones",
             "--lr-decay": "lr_decay", "--batch-size": "batch_size", "--ramp": "ramp",
             "--grad-clip": "grad_clip", "--box-fraction": "box_fraction", "--attack-steps": "attack_steps",
             "--ramp-start": "ramp_start", "--kappa-start": "kappa_start", "--shift": "shift"}
_VIT = "softcert.certify.models:ViT"


def configure(parser) -> None:
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(train.RECIPES)}; with --certified also "
                                                 f"{', '.join(train.CERTIFIED)}")
    parser.add_argument("--all", action="store_true", help="every recipe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: the zoo's checkpoints were trained on one; another count "
                             "sums in another order, so the weights differ in their last bits)")
    parser.add_argument("--out", default=None,
                        help="checkpoint folder (default: certify/zoo, the committed zoo; with --certified: the "
                             "current folder, except for a certifiably trained zoo name)")
    ct = parser.add_argument_group("certified training (--certified; defaults: certify.CertifiedTraining)")
    ct.add_argument("--certified", action="store_true",
                    help="train one model certifiably (IBP / CROWN-IBP, certify.train_certified)")
    ct.add_argument("--model", default=None, metavar="MODEL",
                    help="a certifiably trained zoo name (its recorded architecture and options), a zoo recipe name "
                         "(a fresh model of that architecture, seeded by --seed, trained on the "
                         "recipe's dataset), or file.py:function / package.module:function returning the nn.Module, "
                         "or a checkpoint {'recipe', 'config', 'state_dict'} / {'config', 'state_dict'} of "
                         "certify.ViT, trained from its weights on --data")
    ct.add_argument("--data", default=None, metavar="FILE",
                    help="the training set of a model that is not a zoo recipe: .pt or .npz with x (B, C, H, W) in "
                         "[0, 1] and integer labels y, or a bundled split (digits, mnist5k: its training part)")
    ct.add_argument("--n", type=int, default=None, help="train on the first n samples only (default: all)")
    from softcert.certify.models import BRANCH_INITS
    from softcert.certify.training import BOUNDS, RAMPS, CertifiedTraining

    # default None: the options recorded for a certifiably trained zoo name, else CertifiedTraining's
    d = CertifiedTraining()
    ct.add_argument("--eps", type=float, default=None, help=f"final training radius (default {d.eps})")
    for flag, kind in (("--epochs", int), ("--warmup-epochs", int), ("--ramp-epochs", int), ("--kappa-end", float),
                       ("--beta-end", float), ("--lr", float), ("--lr-decay", float), ("--batch-size", int),
                       ("--grad-clip", float), ("--attack-steps", int), ("--ramp-start", float),
                       ("--kappa-start", float), ("--shift", int)):
        field = _CT_FLAGS[flag]
        ct.add_argument(flag, type=kind, default=None, help=f"default {getattr(d, field)}")
    ct.add_argument("--lr-milestones", type=int, nargs="*", default=None, metavar="EPOCH",
                    help="epochs (0-based) at whose start the rate is multiplied by --lr-decay (default: none)")
    ct.add_argument("--bound", choices=BOUNDS, default=None, help=f"default {d.bound}")
    ct.add_argument("--ramp", choices=tuple(RAMPS), default=None, help=f"shape of the eps ramp (default {d.ramp})")
    ct.add_argument("--dtype", choices=("float32", "float64"), default=None,
                    help="train the model in this dtype (default: the model's own; float64 keeps the interval "
                         "bounds informative at radii float32 rounding would swamp)")
    ct.add_argument("--branch-init", choices=BRANCH_INITS, default=None,
                    help="the residual branches of a fresh zoo architecture: default (PyTorch's initialisation) or "
                         "zero (each block starts as the identity, so that interval bounds of a deep LayerNorm model "
                         "are informative from the first step; certify.models.ViTConfig)")
    ct.add_argument("--box-fraction", type=float, default=None,
                    help=f"bound a box of this fraction of eps around a PGD point (SABR; default {d.box_fraction}: "
                         f"the whole box)")


def _set_threads(args) -> None:
    if not isinstance(args.threads, int) or args.threads < 1:
        raise ValueError(f"--threads: expected an int >= 1, got {args.threads!r}")
    torch.set_num_threads(args.threads)


def run(args) -> int:
    _set_threads(args)
    if args.certified:
        return _run_certified(args)
    for flag in ("--model", "--data", "--n", "--dtype", "--branch-init", *_CT_FLAGS):
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise ValueError(f"{flag}: only with --certified")
    names = list(train.RECIPES) if args.all else args.names
    if not names:
        raise ValueError("names: give zoo names or --all")
    for name in names:
        if name not in train.RECIPES:
            raise ValueError(f"names: unknown zoo model {name!r}; recipes: {', '.join(train.RECIPES)}")
    out = Path(args.out) if args.out is not None else train.ZOO_DIR
    for name in names:
        path = train.save(name, train.train(name, seed=args.seed, log=print), out)
        print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------- --certified
def _spec(args):
    """The one model named by --model or the positional names."""
    if args.all:
        raise ValueError("--all: certified training takes one model (--model)")
    if args.model is not None and args.names:
        raise ValueError(f"names: give the model once (--model {args.model} or a name, not both)")
    if len(args.names) > 1:
        raise ValueError("names: certified training takes one model")
    spec = args.model if args.model is not None else (args.names[0] if args.names else None)
    if spec is None:
        raise ValueError("--model: name the model to train (a zoo recipe, an entry point or a checkpoint)")
    return spec


def _zoo_certified(spec):
    return spec in train.CERTIFIED and not Path(spec).exists()


def _build(args, spec):
    """How the model to train is made (ViTConfig's branch_init, "dtype", "start_from"): as
    recorded for a certified zoo name (``certify.train.certified_recipe``), overridden by
    --branch-init and --dtype."""
    recorded = train.certified_recipe(spec)[2] if _zoo_certified(spec) else {}
    flags = {"branch_init": args.branch_init, "dtype": args.dtype}
    return {**recorded, **{k: v for k, v in flags.items() if v is not None}}


def _options(args, spec):
    from softcert.certify.training import CertifiedTraining

    recorded = train.certified_recipe(spec)[1] if _zoo_certified(spec) else {}
    flags = {field: getattr(args, flag[2:].replace("-", "_")) for flag, field in _CT_FLAGS.items()}
    fields = {**recorded, **{k: v for k, v in flags.items() if v is not None}, "seed": args.seed}
    try:
        return CertifiedTraining(**fields)
    except ValueError as exc:
        # "CertifiedTraining.lr: expected ..." -> name the command-line flag
        msg = str(exc)
        for flag, field in {**_CT_FLAGS, "--seed": "seed"}.items():
            if msg.startswith(f"CertifiedTraining.{field}:"):
                raise ValueError(f"{flag}: {msg.split(':', 1)[1].strip()}") from None
        raise


def _started_from(name, cfg):
    """The zoo model ``name`` in its weights' own dtype (CERTIFIED "start_from": training
    continues from it), grown to the recipe's depth when that is deeper (``certify.models.grown``)."""
    from softcert.certify.models import ViT, ViTConfig, grown

    path = train.ZOO_DIR / f"{name}.pt"
    if not path.exists():
        raise ValueError(f"--model: starts from {name!r}, whose checkpoint is not in {train.ZOO_DIR}; train it first: "
                         f"softcert train --certified {name}")
    ckpt = torch.load(path, weights_only=True)
    source = dict(ckpt["config"], image=tuple(ckpt["config"]["image"]))
    want, have = dataclasses.asdict(ViTConfig(**cfg)), dataclasses.asdict(ViTConfig(**source))
    differs = [k for k in want if k not in ("depth", "branch_init") and want[k] != have[k]]
    if differs:
        raise ValueError(f"--model: {name!r} is not the recipe's architecture at another depth ({differs[0]} differs)")
    model = ViT(**source).to(next(iter(ckpt["state_dict"].values())).dtype)
    model.load_state_dict(ckpt["state_dict"])
    return grown(model, cfg["depth"])


def _source(args, spec):
    """(model, x, y, output name, recipe, config, dataset) of the model ``spec`` and --data."""
    from softcert.certify import data as bundled
    from softcert.certify.models import ViT
    from softcert.cli import model_formats, modelio

    zoo = {**{n: (n, f"{n}-ct") for n in train.RECIPES},
           **{n: (train.certified_recipe(n)[0], n) for n in train.CERTIFIED}}
    if spec in zoo and not Path(spec).exists():
        arch, name = zoo[spec]
        if args.data is not None:
            raise ValueError(f"--data: the zoo model {spec!r} trains on its own dataset "
                             f"({train.RECIPES[arch][0]}); drop --data")
        dataset, cfg, _ = train.RECIPES[arch]
        build = _build(args, spec)
        if "start_from" in build:
            model = _started_from(build["start_from"], cfg)
        else:
            torch.manual_seed(args.seed)
            model = ViT(**cfg, **{k: v for k, v in build.items() if k != "dtype"})
        x, y, _, _ = getattr(bundled, dataset)()
        config = dict(model.config, image=list(model.config["image"]))
        return model, x, y, name, _VIT, config, dataset
    source = model_formats.parse(spec)
    if args.branch_init is not None:
        raise ValueError(f"--branch-init: initialises a fresh zoo architecture; {spec} brings its own weights")
    if source.kind in ("zoo", "onnx", "export"):
        raise ValueError(f"--model: {spec} is {'a zoo checkpoint without a recipe' if source.kind == 'zoo' else 'an ' + source.kind + ' file'}; "
                         f"certified training needs a model it can rebuild: a zoo recipe ({', '.join(train.RECIPES)}), "
                         f"file.py:function, package.module:function or a checkpoint with a recipe")
    if args.data is None:
        raise ValueError(f"--data: {spec} is your own model, so name its training set (.pt or .npz with x, y, or "
                         f"{', '.join(modelio.BUNDLED)})")
    model = model_formats.build(source)
    if args.data in modelio.BUNDLED and not Path(args.data).exists():
        x, y, _, _ = getattr(bundled, modelio.BUNDLED[args.data][1])()
        dataset = args.data
    else:
        x, y = modelio.load_test_set(args.data, getattr(model, "image", None), None)
        dataset = str(Path(args.data))
    if source.kind == "entry":
        where = source.target
        recipe, config = f"{Path(where).resolve() if where.endswith('.py') else where}:{source.function}", {}
    else:
        obj = torch.load(source.target, weights_only=True, map_location="cpu")
        recipe, config = obj.get("recipe", _VIT), dict(obj.get("config", {}))
    stem = source.function if source.kind == "entry" else Path(spec).stem
    return model, x, y, f"{stem}-ct", recipe, config, dataset


def _run_certified(args) -> int:
    from softcert.certify.training import train_certified
    from softcert.cli import common

    spec = _spec(args)
    options = _options(args, spec)
    model, x, y, name, recipe, config, dataset = _source(args, spec)
    if args.n is not None:
        if args.n < 1:
            raise ValueError(f"--n: expected a positive number of samples, got {args.n}")
        x, y = x[:args.n], y[:args.n]
    zoo_name = _zoo_certified(spec)
    out = Path(args.out) if args.out is not None else (train.ZOO_DIR if zoo_name else Path("."))
    dtype = _build(args, spec).get("dtype")
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    steps = options.epochs * -(-len(x) // options.batch_size)
    bar = common.progress(total=steps, desc=f"{name} (certified, {options.bound})")

    def progress(epoch, step, eps, natural, robust):
        bar.set_postfix(epoch=epoch, eps=f"{eps:.3g}", nat=f"{natural:.3f}",
                        rob="-" if robust is None else f"{robust:.3f}", refresh=False)
        bar.update(1)

    try:
        model, history = train_certified(model, x, y, options, progress=progress)
    finally:
        bar.close()
    out.mkdir(parents=True, exist_ok=True)
    training = dict(dataclasses.asdict(options), n=len(x), source=spec, threads=torch.get_num_threads(),
                    dtype=str(next(model.parameters()).dtype).removeprefix("torch."))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckpt = out / f"{name}.pt"
    torch.save({"recipe": recipe, "config": config, "state_dict": state, "dataset": dataset,
                "training": _jsonable(training)}, ckpt)
    log = out / f"{name}.json"
    log.write_text(json.dumps({"command": " ".join(getattr(args, "invocation", [])), "checkpoint": ckpt.name,
                               "training": _jsonable(training),
                               "history": [dataclasses.asdict(r) for r in history]}, indent=1) + "\n")
    last = history[-1]
    rob = "-" if last.robust_loss is None else f"{last.robust_loss:.3f}"
    print(f"{name}: epoch {last.epoch}: eps {last.eps:.4f}, natural loss {last.natural_loss:.3f}, robust loss {rob}")
    print(f"wrote {ckpt} and {log}")
    return 0


def _jsonable(d):
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
