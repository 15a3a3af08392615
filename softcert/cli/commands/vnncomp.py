"""``softcert vnncomp MODEL.onnx PROPERTY.vnnlib --timeout S --out RESULT``: one VNN-COMP instance.

Reads the ONNX model (certify.onnx_graph.read_onnx) and the VNN-LIB 1.0/2.0 property
(certify.vnnlib.read_vnnlib; ``.gz`` accepted), decides it with certify.vnncomp.solve in
what is left of the time budget after loading, and writes the VNN-COMP result file (``sat``
with the counterexample, ``unsat``, ``unknown`` or ``timeout``) plus RESULT.json beside it
(verdict, seconds, method, assumptions, command). Prints the word.
"""
from __future__ import annotations

import time

from softcert.cli.common import command_line, write_json


def configure(parser) -> None:
    from softcert.certify.vnncomp import SOLVE_METHODS

    parser.add_argument("model", help="the network (.onnx or .onnx.gz)")
    parser.add_argument("property", help="the VNN-LIB 1.0 or 2.0 property (.vnnlib or .vnnlib.gz)")
    parser.add_argument("--timeout", type=float, required=True, help="time budget in seconds, loading included")
    parser.add_argument("--out", required=True, help="the result file to write (VNN-COMP format)")
    parser.add_argument("--method", default="crown", choices=SOLVE_METHODS,
                        help="bounding method for the unsat proof (default: crown)")
    parser.add_argument("--max-boxes", type=int, default=64,
                        help="input-bisection budget per region (default: 64 boxes)")


def verdict_json(verdict, args, name) -> dict:
    return {"result": verdict.result, "seconds": verdict.seconds, "method": verdict.method,
            "boxes": verdict.boxes, "assumptions": verdict.assumptions,
            "counterexample": None if verdict.counterexample is None else
            {"x": list(verdict.counterexample[0]), "y": list(verdict.counterexample[1])},
            "command": command_line(args, name)}


def run(args) -> int:
    from softcert.certify.onnx_graph import read_onnx
    from softcert.certify.vnncomp import solve, write_result
    from softcert.certify.vnnlib import read_vnnlib

    start = time.monotonic()
    network = read_onnx(args.model)
    prop = read_vnnlib(args.property)
    left = args.timeout - (time.monotonic() - start)
    if left <= 0:
        from softcert.certify.vnncomp import Verdict

        verdict = Verdict("timeout", None, time.monotonic() - start, args.method, "the budget ran out while loading")
    else:
        verdict = solve(network, prop, left, args.method, max_boxes=args.max_boxes)
    write_result(verdict, args.out)
    write_json(f"{args.out}.json", verdict_json(verdict, args, "vnncomp"))
    print(verdict.result)
    return 0
