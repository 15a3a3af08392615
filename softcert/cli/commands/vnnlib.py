"""``softcert vnnlib``: the VNN-LIB 2.0 solver command line, for standard harnesses.

``softcert vnnlib verify PROP.vnnlib --network N=MODEL.onnx --timeout S`` decides the
property (certify.vnncomp.solve) and prints ``sat`` / ``unsat`` / ``unknown`` (or
``timeout``); for ``sat`` the counterexample follows in the VNN-COMP form.
``softcert vnnlib supports --onnx-operators`` lists the ONNX operators softcert reads, one a
line (certify.onnx_graph.ONNX_OPERATORS).
"""
from __future__ import annotations

import time


def configure(parser) -> None:
    from softcert.certify.vnncomp import SOLVE_METHODS

    sub = parser.add_subparsers(dest="action", metavar="<action>", required=True)
    v = sub.add_parser("verify", help="decide a VNN-LIB property on an ONNX network",
                       description="decide a VNN-LIB property on an ONNX network; prints sat/unsat/unknown")
    v.add_argument("property", help="the VNN-LIB 1.0 or 2.0 property (.vnnlib or .vnnlib.gz)")
    v.add_argument("--network", required=True, action="append", metavar="NAME=MODEL.onnx",
                   help="the network the property names (declare-network NAME) and its ONNX file")
    v.add_argument("--timeout", type=float, required=True, help="time budget in seconds, loading included")
    v.add_argument("--method", default="crown", choices=SOLVE_METHODS,
                   help="bounding method for the unsat proof (default: crown)")
    s = sub.add_parser("supports", help="what softcert reads", description="what softcert reads")
    s.add_argument("--onnx-operators", action="store_true", help="list the supported ONNX operators, one a line")


def _network(args, declared):
    pairs = []
    for item in args.network:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--network: expected NAME=MODEL.onnx, got {item!r}")
        pairs.append((name, path))
    if len(pairs) != 1:
        raise ValueError(f"--network: exactly one network is supported, got {len(pairs)}")
    name, path = pairs[0]
    if declared is not None and name != declared:
        raise ValueError(f"--network: the property declares network {declared!r}, got {name!r}")
    return path


def run(args) -> int:
    if args.action == "supports":
        if not args.onnx_operators:
            raise ValueError("supports: give --onnx-operators")
        from softcert.certify.onnx_graph import ONNX_OPERATORS

        print("\n".join(ONNX_OPERATORS))
        return 0
    from softcert.certify.onnx_graph import read_onnx
    from softcert.certify.vnncomp import Verdict, result_text, solve
    from softcert.certify.vnnlib import read_vnnlib

    start = time.monotonic()
    prop = read_vnnlib(args.property)
    network = read_onnx(_network(args, prop.network))
    left = args.timeout - (time.monotonic() - start)
    if left <= 0:
        verdict = Verdict("timeout", None, time.monotonic() - start, args.method, "the budget ran out while loading")
    else:
        verdict = solve(network, prop, left, args.method)
    print(result_text(verdict), end="")
    return 0
