"""``softcert vertex``: bound c·softmax(s) over one score box from the command line (JSON out).

Prints bounds.vertex_softmax's result (bounds, optimal vertices, method, assumptions);
``--check`` re-checks both bounds with bounds.check_certificate (exact rationals).
"""
from __future__ import annotations

import json

from softcert import bounds


def configure(parser) -> None:
    parser.add_argument("--c", type=float, nargs="+", required=True, help="coefficients c")
    parser.add_argument("--lower", type=float, nargs="+", required=True, help="score lower bounds")
    parser.add_argument("--upper", type=float, nargs="+", required=True,
                        help="score upper bounds (-inf masks an entry)")
    parser.add_argument("--check", action="store_true",
                        help="re-check both bounds exactly with rational arithmetic")
    parser.add_argument("--baselines", action="store_true", help="also print the baseline bounds")


def run(args) -> int:
    res = bounds.vertex_softmax(args.c, args.lower, args.upper)
    out = {
        "method": res.method,
        "assumptions": res.assumptions,
        "lower": res.lower.item(),
        "upper": res.upper.item(),
        "lower_vertex": res.lower_vertex.tolist(),
        "upper_vertex": res.upper_vertex.tolist(),
    }
    if args.check:
        out["check"] = {
            sense: bounds.check_certificate(args.c, args.lower, args.upper, out[sense], sense=sense).holds
            for sense in ("lower", "upper")
        }
    if args.baselines:
        out["baselines"] = {}
        for name, fn in bounds.BASELINES.items():
            try:
                b = fn(args.c, args.lower, args.upper)
                out["baselines"][name] = {"lower": b.lower.item(), "upper": b.upper.item()}
            except ValueError as exc:  # e.g. baselines need finite boxes
                out["baselines"][name] = {"error": str(exc)}
    print(json.dumps(out, indent=1))
    return 0 if not args.check or all(out["check"].values()) else 1
