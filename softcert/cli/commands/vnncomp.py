"""``softcert vnncomp MODEL.onnx PROPERTY.vnnlib --timeout S --out RESULT``: one VNN-COMP instance.

Reads the ONNX model (certify.onnx_graph.read_onnx) and the VNN-LIB 1.0/2.0 property
(certify.vnnlib.read_vnnlib; ``.gz`` accepted), decides it with certify.vnncomp.solve (through
certify.vnnlib_binding.solve: inputs a disjunct equates are one variable) in what is left of
the time budget after loading, and writes the VNN-COMP result file (``sat``
with the counterexample, ``unsat``, ``unknown`` or ``timeout``) plus RESULT.json beside it
(verdict, seconds, method, assumptions, command). Prints the word. ``--device cuda`` bounds
and attacks on a GPU (certify.vnncomp.solve's ``device``; default the CPU); a counterexample
is confirmed by onnxruntime on the CPU in the model's own dtype either way.

The budget counts from the start of the ``softcert`` process (softcert.cli.wallclock: start-up
and imports included, as a harness times it); if the solver has not answered by then, a
watchdog writes the ``timeout`` result and ends the process. Called in-process through
softcert.cli.main, the clock starts with the call and no watchdog runs.

A 2.0 property that declares several networks is read when every network after the first is
``(equal-to FIRST)``: MODEL is each of them (one product graph). Otherwise each network needs
its own file, which one MODEL argument cannot give: exit 2 with an error naming the property
and the ``softcert vnnlib verify PROPERTY --network NAME=FILE ...`` command that takes them.
"""
from __future__ import annotations

import time

from softcert.cli import devices, wallclock
from softcert.cli.common import command_line, write_json


def configure(parser) -> None:
    # nothing heavy is imported here: the budget runs from the process start, and the watchdog
    # starts in run()
    parser.add_argument("model", help="the network (.onnx or .onnx.gz)")
    parser.add_argument("property", help="the VNN-LIB 1.0 or 2.0 property (.vnnlib or .vnnlib.gz)")
    parser.add_argument("--timeout", type=float, required=True, help="time budget in seconds, loading included")
    parser.add_argument("--out", required=True, help="the result file to write (VNN-COMP format)")
    parser.add_argument("--method", default="auto",
                        help="bounding method for the unsat proof, one of certify.vnncomp.SOLVE_METHODS: auto (vertex "
                             "where the network has a softmax, else crown), a bound method that needs no PyTorch "
                             "model (ibp, crown, vertex, alpha-crown, ...) or bab (default: auto)")
    parser.add_argument("--max-boxes", type=int, default=64,
                        help="input-bisection budget per region (default: 64 boxes)")
    devices.add_argument(parser, devices.ONNX_MOVED)


def verdict_json(verdict, args, name) -> dict:
    return {"result": verdict.result, "seconds": verdict.seconds, "method": verdict.method,
            "boxes": verdict.boxes, "assumptions": verdict.assumptions,
            "counterexample": None if verdict.counterexample is None else
            {"x": list(verdict.counterexample[0]), "y": list(verdict.counterexample[1])},
            "command": command_line(args, name)}


def _write(verdict, args) -> None:
    from softcert.certify.vnncomp import write_result

    write_result(verdict, args.out)
    write_json(f"{args.out}.json", verdict_json(verdict, args, "vnncomp"))
    print(verdict.result)


def _write_timeout(args, start) -> None:
    """The watchdog's answer: the VNN-COMP ``timeout`` result, written without importing
    certify (torch takes over a second to import, more than a short budget has left)."""
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("timeout\n")
    write_json(f"{args.out}.json", {"result": "timeout", "seconds": time.monotonic() - start, "method": args.method,
                                    "boxes": 0, "assumptions": "the solver had not answered at the deadline",
                                    "counterexample": None, "command": command_line(args, "vnncomp")})
    print("timeout")


def run(args) -> int:
    if not (args.timeout > 0 and args.timeout != float("inf")):
        raise ValueError(f"--timeout: expected a positive number of seconds, got {args.timeout!r}")
    start = time.monotonic()
    standalone = wallclock.standalone()
    deadline = wallclock.deadline_of(args.timeout, standalone)
    watchdog = wallclock.Watchdog(deadline, lambda: _write_timeout(args, start)) if standalone else None
    try:
        verdict = _decide(args, start, deadline)
        if watchdog is None or watchdog.claim():
            _write(verdict, args)
        else:
            time.sleep(60)  # the watchdog is writing the timeout result and ending the process
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if standalone:
        wallclock.finish(0)
    return 0


def _decide(args, start, deadline):
    from softcert.certify.vnncomp import SOLVE_METHODS
    from softcert.certify.vnnlib import read_vnnlib
    from softcert.certify.vnnlib_binding import check_bound, solve

    device = devices.device_of(args.device)  # refused by name before the files are read
    if args.method not in SOLVE_METHODS:
        raise ValueError(f"--method: expected one of {', '.join(SOLVE_METHODS)}, got {args.method!r}")
    prop = read_vnnlib(args.property)
    network = _network(args, prop)
    check_bound(prop, network, args.property)
    left = deadline - time.monotonic() - wallclock.MARGIN
    if left <= 0:
        from softcert.certify.vnncomp import Verdict

        return Verdict("timeout", None, time.monotonic() - start, args.method, "the budget ran out while loading")
    return solve(network, prop, left, args.method, max_boxes=args.max_boxes, device=device)


def _network(args, prop):
    """The graph of MODEL for ``prop``: its inputs, outputs and hidden values
    (``read_options``); a property that declares several networks only when every one after
    the first is ``(equal-to FIRST)`` (MODEL again, a product graph). Others need a model per
    network, which this command's one MODEL argument cannot give: ValueError naming the
    property file and the command that takes them."""
    from softcert.certify.onnx_graph import read_onnx, read_product
    from softcert.certify.vnnlib_binding import model_files, parts, read_options

    if len(prop.networks) <= 1:
        return read_onnx(args.model, **read_options(prop))  # several inputs, outputs, hidden values
    first = prop.networks[0][0]
    own = [n for n, rel, target in prop.networks[1:] if (rel, target) != ("equal-to", first)]
    if own:
        names = " ".join(f"--network {n}=FILE" for n, rel, _ in prop.networks if rel != "equal-to")
        raise ValueError(f"{args.property}: declares {len(prop.networks)} networks, and {', '.join(own)} "
                         f"{'is' if len(own) == 1 else 'are'} not (equal-to {first}); softcert vnncomp takes one model. "
                         f"Use: softcert vnnlib verify {args.property} {names} --timeout {args.timeout:g}")
    return read_product(parts(prop, model_files(prop, [(first, args.model)], "model")), prop.n_inputs)
