"""``softcert usermodels``: certified accuracy of attention models written the way users write
them (``softcert.cli.user_models``), each trained on sklearn digits by the command itself.

For each model and radius: PGD (``certify.attack``) on the correctly classified images of the
first n test digits, then every method through the generic front end (``certify.verify``),
then the cross-check (no certified image falsified, no PGD margin below a certified bound:
``certify.SoundnessError`` otherwise). A baseline that cannot handle a model (auto_LiRPA on
a graph it does not parse) is recorded with its error instead of a number; our own methods
failing is a bug and stops the run. Writes user-models.md and user-models.json.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from softcert import certify
from softcert.certify.trace import logits_of
from softcert.cli import common, user_models

DEFAULT_METHODS = ["crown", "alpha-crown", "vertex", "lirpa-crown"]
TOLERANCE = 1e-9  # as certify.evaluate: PGD margins are float64 forward passes


def configure(parser):
    parser.add_argument("--model", nargs="+", default=list(user_models.NAMES), choices=user_models.NAMES,
                        metavar="MODEL", help=f"from {', '.join(user_models.NAMES)}")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.02])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, metavar="METHOD",
                        help=f"bound-only methods of certify.METHODS: {', '.join(m for m, x in certify.METHODS.items() if not x.complete)}")
    parser.add_argument("--n", type=int, default=16, help="first n test digits")
    parser.add_argument("--epochs", type=int, default=user_models.EPOCHS, help="training epochs per model")
    parser.add_argument("--out", default="docs/certify")


def run(args) -> int:
    torch.set_num_threads(1)
    bound = [m for m, meth in certify.METHODS.items() if not meth.complete]
    unknown = [m for m in args.methods if m not in bound]
    if unknown:
        raise ValueError(f"--methods: unknown method(s) {', '.join(map(repr, unknown))} (branch and bound runs in "
                         f"`softcert bab`); choose from {', '.join(bound)}")
    if args.n < 1:
        raise ValueError("--n: must be >= 1")
    if args.epochs < 0:
        raise ValueError("--epochs: must be >= 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "usermodels", [
        ("--model", args.model), ("--eps", args.eps), ("--methods", args.methods), ("--n", args.n),
        ("--epochs", args.epochs), ("--out", args.out)])
    bar = common.progress(total=len(args.model) * len(args.eps) * (1 + len(args.methods)), desc="usermodels",
                          unit="run")
    rows = []
    for name in args.model:
        t0 = time.perf_counter()
        model, xte, yte = user_models.build(name, epochs=args.epochs)
        train_s = time.perf_counter() - t0
        with torch.no_grad():
            full_acc = (logits_of(model(xte)).argmax(1) == yte).float().mean().item()
        for eps in args.eps:
            rows += [dict(r, clean_acc_full_test=full_acc, train_seconds=train_s)
                     for r in _measure(name, model, xte[: args.n], yte[: args.n], eps, args.methods, bar)]
        _write(out, rows, command, args)  # after every model, so a long run keeps its results
    bar.close()
    return 0


def _measure(name, model, x, y, eps, methods, bar) -> list:
    """Rows for one (model, eps): PGD, then each method, cross-checked against PGD."""
    with torch.no_grad():
        correct = logits_of(model(x)).argmax(1) == y
    xc, yc = x[correct], y[correct]
    n, k = x.shape[0], int(correct.sum())
    att = certify.attack(model, xc, yc, eps)
    bar.update(1)
    robust = int((att.min_margin >= 0).sum())
    rows = []
    for meth in methods:
        base = dict(model=name, eps=eps, method=meth, n=n, clean_acc=k / n, pgd_acc=robust / n)
        try:
            res = certify.verify(model, xc, yc, eps, method=meth)
        except Exception as exc:  # a baseline that cannot parse the model: reported, not hidden
            if not meth.startswith("lirpa"):
                raise
            rows.append(dict(base, certified_acc=None, seconds_per_sample=None, mean_lower_margin=None,
                             note=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
            bar.update(1)
            continue
        _cross_check(att, res, name, meth, eps)
        worst = res.worst_margin
        finite = [float(w) for w in worst if math.isfinite(float(w))]
        # a baseline that gave up on every digit (-inf bounds and a note) measured nothing
        failed = bool(res.note) and not finite
        rows.append(dict(base, certified_acc=None if failed else int(res.certified.sum()) / n,
                         seconds_per_sample=res.seconds / k,
                         mean_lower_margin=math.fsum(finite) / len(finite) if finite else None,
                         note=res.note))
        bar.set_postfix_str(f"{name} eps={eps} {meth}")
        bar.update(1)
    return rows


def _cross_check(att, res, name, meth, eps):
    broken = res.certified & (att.min_margin < 0)
    if broken.any():
        raise certify.SoundnessError(f"soundness violation: {meth} certified images "
                                     f"{broken.nonzero().flatten().tolist()} of {name} at eps={eps} that PGD broke")
    below = att.min_margin < res.worst_margin - TOLERANCE
    if below.any():
        raise certify.SoundnessError(f"soundness violation: a PGD margin of {name} lies below the {meth} bound "
                                     f"at eps={eps}")


def _g(v, fmt=".3g"):
    return "–" if v is None else format(v, fmt)


def _write(out, rows, command, args):
    common.write_json(out / "user-models.json", {"command": command, "rows": rows})
    lines = ["# Certified accuracy of user-style attention models", "",
             f"Regenerate: `{command}` (1 CPU thread).", "",
             "The models are `softcert/cli/user_models.py`: plain `torch.nn` and Hugging Face models that",
             "use nothing of `certify`, certified through the generic front end (`certify.verify` traces",
             f"them with `torch.export`). Each is trained {args.epochs} epochs on the sklearn digits training",
             "split (8x8, [0, 1]) by the command; the table uses the first n test digits. Ball: L∞ radius",
             "eps clipped to [0, 1]. Certified and PGD-robust accuracy count misclassified digits as",
             "failures; PGD (40 steps x 2 restarts) is the ceiling. Every run checked that no certified",
             "digit is falsified and no PGD margin lies below a certified bound. Mean lower margin: over",
             "correctly classified digits, of min_{j≠y} (certified lower bound of z_y - z_j). Seconds per",
             "sample: the method's wall time over the correctly classified digits. \"failed\": the",
             "baseline raised on every digit (its error in brackets), so it certified nothing.", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        lines += [f"## {model} (clean accuracy on the test split {rs[0]['clean_acc_full_test']:.3f}; "
                  f"clean {common.share(rs[0]['clean_acc'], rs[0]['n'])})", "",
                  "| eps | method | PGD-robust acc | certified acc | mean lower margin | s / sample |",
                  "|---|---|---|---|---|---|"]
        for r in rs:
            note = f" ({r['note']})" if r.get("note") else ""
            cert = "failed" if r["certified_acc"] is None else common.share(r["certified_acc"], r["n"])
            lines.append(f"| {r['eps']} | {r['method']}{note} | {common.share(r['pgd_acc'], r['n'])} | {cert} "
                         f"| {_g(r['mean_lower_margin'], '.4g')} | {_g(r['seconds_per_sample'])} |")
        lines.append("")
    common.write_markdown(out / "user-models.md", lines)
