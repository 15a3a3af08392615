"""``softcert vnnlib``: the VNN-LIB 2.0 solver command line, for standard harnesses.

The standard: VNNLIB-Standard, ``document/chapters/cli_solver.tex`` ("Solver Command-line
Interface"); the theory names are those of its chapter "Theories and Logics". Here
``<solver>`` is ``softcert vnnlib``:

- ``softcert vnnlib --name`` / ``--version``: the solver's name and version.
- ``softcert vnnlib verify QUERY.vnnlib --network NAME=MODEL.onnx ... [--timeout S]
  [--serialise-assignments DIR]`` (one --network per declared network not marked
  ``equal-to``; certify.vnnlib_binding binds inputs, outputs and hidden values) prints ``sat`` / ``unsat`` / ``unknown`` / ``timed-out``;
  for ``sat`` the assignment follows (certify.solver_interface: every declared variable as
  ``NAME TYPE [DIMS]`` and its values one a line), or is written to DIR as ONNX TensorProto
  files. The timeout counts from the start of the process (interpreter start-up, imports and
  loading included); a watchdog prints ``timed-out`` at the deadline if the solver has not
  answered, and the process ends as soon as the answer is out (called in-process through
  softcert.cli.main instead, the clock starts with the call and no watchdog runs). Errors (on stderr, exit 2): ONNX files that do not match the query's networks,
  element types other than ``real`` (softcert's ``unsat`` is proved in real arithmetic, so
  the standard requires the query to consent with ``real``; ``--float-as-real``, not
  standard, gives that consent for a query written with float32/float64), and anything
  softcert does not read. ``--device cuda`` (not standard) bounds and attacks on a GPU, as
  ``softcert vnncomp --device`` does (default: the CPU).
- ``softcert vnnlib supports --CAPABILITY`` answers one capability query of the standard
  (``CAPABILITIES``), from what softcert reads. Nothing heavy is imported on this path.

``softcert vnncomp`` keeps the VNN-COMP result file (``timeout``, ``((X_0 v) ...)``).
"""
from __future__ import annotations

import sys
import time

from softcert.cli import devices, wallclock

NAME = "softcert"
#: VNN-LIB versions certify.vnnlib reads: 1.0 (declare-const X_i Real) and 2.0 (vnnlib-version <2.0>)
VNNLIB_VERSIONS = ("1.0", "2.0")
#: ONNX opsets the ONNX reader was tested on (docs/certify/vnncomp.md: 9 to 20; its rules
#: follow the opset where the semantics changed: Softmax at 13, Slice at 10, Dropout and
#: BatchNormalization training mode, Squeeze/Unsqueeze/ReduceSum axes as inputs)
ONNX_OPSET_VERSIONS = (9, 20)
#: only ``real``: an ``unsat`` bounds the model in real arithmetic (float32/float64 rounding
#: inside the model is not enclosed: certify.vnncomp.ASSUMPTIONS), which the standard's
#: element-type theories call unsound for every ONNX float type
ONNX_ELEMENT_TYPES = ("real",)
#: the ONNX operators certify.onnx_graph reads on the perturbed path: a copy of
#: certify.onnx_graph.ONNX_OPERATORS (importing that module loads onnx and torch, seconds;
#: tests/test_vnnlib_interface.py checks that the copy is equal)
ONNX_OPERATORS_READ = (
    "Add", "And", "BatchNormalization", "Cast", "Concat", "Constant", "ConstantOfShape", "Conv", "Div", "Dropout",
    "Equal", "Erf", "Exp", "Expand", "Flatten", "Gather", "Gelu", "Gemm", "Greater", "GreaterOrEqual", "Identity",
    "LayerNormalization", "Less", "LessOrEqual", "MatMul", "MaxPool", "Mul", "Neg", "Not", "Or", "Pow", "Reciprocal",
    "ReduceMean", "ReduceSum", "Relu", "Reshape", "Shape", "Sigmoid", "Slice", "Softmax", "Split", "Sqrt", "Squeeze",
    "Sub", "Tanh", "Transpose", "Unsqueeze", "Where", "Xor",
)
#: operators read only in part: not reported by ``supports --onnx-operators`` (the standard's
#: list can restrict an operator by element type only); ``supports --onnx-operators-partial``
#: (not standard) prints them with what is read
PARTIAL_OPERATORS = {
    "BatchNormalization": "inference mode only (training mode, batch statistics, is refused)",
    "Cast": "float casts that lose no precision, float to integer (truncation) or bool (x != 0), integers moved "
            "or cast again (to float16 or bfloat16, float64 to float32 and integer arithmetic refused)",
    "Conv": "1-D, 2-D and 3-D, every auto_pad (4-D and more refused)",
    "Div": "by a constant, or by a perturbed divisor whose bounds exclude 0",
    "Dropout": "inference mode only (training mode draws random numbers)",
    "Erf": "only inside the exporters' GELU pattern x * 0.5 * (1 + erf(x / sqrt(2)))",
    "LayerNormalization": "over the last axis only",
    "MaxPool": "the values only (a second output, Indices, is refused)",
    "Pow": "constant scalar exponent: integers on any bounds (negative ones on bounds that exclude 0), other values on "
           "positive bounds (an input-dependent exponent is refused)",
    "Reciprocal": "on bounds that exclude 0",
    "Where": "a constant condition, or a perturbed one (a comparison, a cast to bool, Not/And/Or of them), with "
             "finite constant branches (an -inf mask is refused)",
}
#: ``supports --onnx-operators``: every read operator not read in part (no element types
#: after a name: all of ONNX_ELEMENT_TYPES)
ONNX_OPERATORS = tuple(op for op in ONNX_OPERATORS_READ if op not in PARTIAL_OPERATORS)
#: the theory sets of the standard's chapter "Theories and Logics", each answered with every
#: theory of the set softcert handles (the downward-closed list, weakest first): hidden nodes
#: (NH, H: declare-hidden values are extra outputs, their constraints extra rows), several
#: input and output tensors (SIO, MIO: concatenated, bound by order or by ONNX name;
#: certify.vnnlib_binding), several networks (SNET, MENET, MINET, MNET: a product graph;
#: inputs equated across networks by top-level (== A[i] X[i]) share one variable), no assertion
#: relating an input and an output (SNC: comparisons of outputs and hidden values with each
#: other are read, but MNC also admits inputs against outputs, which is refused as MNC by
#: name; so is, under several networks, a constraint relating one network's inputs to
#: another's outputs), bounds on single inputs, linear constraints over the outputs and over
#: several inputs (BND, OUTC, LIN: an input polytope, certify.vnnlib.Region.input_rows; an
#: equality of two inputs inside a disjunct makes them one variable of that disjunct's region,
#: Region.merged and vnnlib_binding.solve; in every disjunct each input needs bounds of its own
#: or an equality with an input that has them). tests/test_vnnlib_theories.py answers a query
#: of every theory listed here and checks that nothing else is claimed
THEORIES = {
    "hidden-node-theories": ("NH", "H"),
    "multiple-input-output-theories": ("SIO", "MIO"),
    "multiple-network-theories": ("SNET", "MENET", "MINET", "MNET"),
    "multiple-node-comparison-theories": ("SNC",),
    "arithmetic-complexity-theories": ("BND", "OUTC", "LIN"),
}
#: the boolean capabilities: disjunctions are put in disjunctive normal form
#: (certify.vnnlib), assignments can be serialised (certify.solver_interface), no UNSAT proofs
BOOLEANS = {"optimised-disjunctive-reasoning": False, "serialise-assignments": True, "unsat-proofs": False}


def capability_lines(name: str) -> list[str]:
    """The answer to ``supports --NAME`` (lines, no newlines); KeyError for an unknown name."""
    if name in THEORIES:
        return list(THEORIES[name])
    if name in BOOLEANS:
        return ["true" if BOOLEANS[name] else "false"]
    return {
        "vnnlib-versions": list(VNNLIB_VERSIONS),
        "onnx-opset-versions": [str(v) for v in ONNX_OPSET_VERSIONS],
        "onnx-element-types": list(ONNX_ELEMENT_TYPES),
        "onnx-operators": list(ONNX_OPERATORS),
        # only required of solvers that produce UNSAT proofs; softcert produces none: empty
        "onnx-operators-unsat-proofs": [],
        "onnx-operators-partial": [f"{op}: {why}" for op, why in sorted(PARTIAL_OPERATORS.items())],
    }[name]


#: every ``supports`` query (the standard's, then softcert's own ``onnx-operators-partial``)
CAPABILITIES = ("onnx-opset-versions", "onnx-element-types", "onnx-operators", "onnx-operators-unsat-proofs",
                "vnnlib-versions", *THEORIES, "optimised-disjunctive-reasoning", "serialise-assignments",
                "unsat-proofs", "onnx-operators-partial")
#: other spellings: the standard's own example writes --multiple-inputs-output-theories
ALIASES = {"multiple-inputs-output-theories": "multiple-input-output-theories"}

def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    try:
        return _version("softcert")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def configure(parser) -> None:
    parser.add_argument("--name", action="store_true", help="print the solver's name")
    parser.add_argument("--version", action="store_true", help="print the solver's version")
    sub = parser.add_subparsers(dest="action", metavar="<command>")
    v = sub.add_parser("verify", help="decide a VNN-LIB query on ONNX networks",
                       description="decide a VNN-LIB query on ONNX networks; prints sat / unsat / unknown / timed-out, "
                                   "for sat the assignment")
    v.add_argument("property", help="the VNN-LIB 1.0 or 2.0 query (.vnnlib or .vnnlib.gz)")
    v.add_argument("--network", required=True, action="append", metavar="NAME=MODEL.onnx",
                   help="a network the query declares (declare-network NAME) and its ONNX file; once for each "
                        "network not marked equal-to")
    v.add_argument("--timeout", type=float, default=None,
                   help="seconds, counted from the start of the process (start-up and loading included); "
                        "default: none")
    v.add_argument("--serialise-assignments", metavar="DIR", default=None,
                   help="for sat, write DIR/NAME.pb (ONNX TensorProto) per variable instead of printing the values")
    v.add_argument("--unsat-proofs", metavar="PATH", default=None,
                   help="not supported (supports --unsat-proofs: false); given, it is an error")
    v.add_argument("--method", default="auto",
                   help="not standard: the bounding method of the unsat proof, one of certify.vnncomp.SOLVE_METHODS "
                        "(default: auto, vertex where the network has a softmax, else crown)")
    v.add_argument("--float-as-real", action="store_true",
                   help="not standard: read float32/float64 declarations as real (consent to a proof in real "
                        "arithmetic, which the standard asks to be written as `real` in the query)")
    devices.add_argument(v, devices.ONNX_MOVED, prefix="not standard: ")
    s = sub.add_parser("supports", help="what softcert reads: one capability query of the standard",
                       description="answer one capability query of the VNN-LIB 2.0 solver interface")
    group = s.add_mutually_exclusive_group(required=True)
    for name in CAPABILITIES:
        flags = [f"--{name}"] + [f"--{a}" for a, n in ALIASES.items() if n == name]
        group.add_argument(*flags, dest="capability", action="store_const", const=name,
                           help="not standard: the operators read in part, with what is read"
                           if name == "onnx-operators-partial" else None)


def _networks(args):
    """(name, path) of each --network NAME=PATH."""
    pairs = []
    for item in args.network:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--network: expected NAME=MODEL.onnx, got {item!r}")
        pairs.append((name, path))
    return pairs


def _element_types(args, variables):
    """The standard's element-type errors: a declared ONNX type is a request for sound
    analysis in that type, which softcert does not give (only ``real``) unless
    --float-as-real."""
    from softcert.certify.solver_interface import is_real

    typed = [v for v in variables if not is_real(v.etype)]
    if typed and not args.float_as_real:
        v = typed[0]
        raise ValueError(f"{args.property}: {v.name} is declared {v.etype}; softcert proves unsat in real arithmetic, "
                         f"not in {v.etype} rounding, so it answers queries over the element type real only "
                         f"(supports --onnx-element-types). Declare the variables real, or pass --float-as-real")
    return typed


def _verify(args, deadline, watchdog) -> int:
    if args.unsat_proofs is not None:
        raise ValueError("--unsat-proofs: softcert produces no UNSAT proofs (supports --unsat-proofs: false)")
    from softcert.certify import solver_interface as si
    from softcert.certify.onnx_graph import read_product
    from softcert.certify.vnncomp import SOLVE_METHODS, Verdict
    from softcert.certify.vnnlib import read_vnnlib
    from softcert.certify.vnnlib_binding import check_bound, model_dtypes, model_files, parts, positions, solve

    device = devices.device_of(args.device)  # refused by name before the files are read

    if args.method not in SOLVE_METHODS:
        raise ValueError(f"--method: expected one of {SOLVE_METHODS}, got {args.method!r}")
    prop = read_vnnlib(args.property)
    variables = si.declarations(si.read_text(args.property))
    typed = _element_types(args, variables)
    network = read_product(parts(prop, model_files(prop, _networks(args))), prop.n_inputs)
    check_bound(prop, network, args.property)
    types = model_dtypes(prop, network)
    for v in typed:  # declared ONNX types must be the model's (the standard's second error)
        t = types.get(v.name, types.get(v.role))
        if t is not None and v.etype.lower() != t.name:
            kind = {"X": "input", "Y": "output"}.get(v.role, "hidden value")
            raise ValueError(f"{args.property}: {v.name} is declared {v.etype}, the ONNX model's {kind} is {t.name}")
    lo, hi = ONNX_OPSET_VERSIONS
    if not lo <= network.opset <= hi:
        print(f"softcert vnnlib: warning: the model's opset {network.opset} is outside the opsets softcert was "
              f"tested on ({lo}-{hi}, supports --onnx-opset-versions)", file=sys.stderr)
    left = (deadline - time.monotonic() - wallclock.MARGIN) if deadline is not None else 1e9
    if left <= 0:
        verdict = Verdict("timeout", None, 0.0, args.method, "the budget ran out while loading")
    else:
        verdict = solve(network, prop, left, args.method, device=device)
    if watchdog is not None and not watchdog.claim():
        time.sleep(60)  # the watchdog is printing timed-out and ending the process
    if verdict.result == "sat" and args.serialise_assignments is not None:
        si.write_assignment(args.serialise_assignments, variables, *verdict.counterexample, types,
                            positions(prop) or None)
        print(si.result_text(verdict), end="")
    else:
        print(si.result_text(verdict, variables, positions(prop) or None), end="")
    return 0


def run(args) -> int:
    if args.name or args.version:
        if args.action is not None:
            raise ValueError("--name / --version: give them without a command")
        print(NAME if args.name else version())
        return 0
    if args.action == "supports":
        lines = capability_lines(args.capability)
        print("".join(line + "\n" for line in lines), end="")
        return 0
    if args.action != "verify":
        raise ValueError("give a command: verify or supports (or --name / --version)")
    if args.timeout is not None and not (args.timeout > 0 and args.timeout != float("inf")):
        raise ValueError(f"--timeout: expected a positive number of seconds, got {args.timeout!r}")
    deadline = watchdog = None
    standalone = wallclock.standalone()
    if args.timeout is not None:
        deadline = wallclock.deadline_of(args.timeout, standalone)
        watchdog = wallclock.Watchdog(deadline, lambda: sys.stdout.write("timed-out\n")) if standalone else None
    try:
        rc = _verify(args, deadline, watchdog)
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if standalone:
        wallclock.finish(rc)
    return rc


def entry() -> int:
    """``softcert vnnlib`` as one executable, for harnesses that take the solver as a single
    path (a console script ``softcert-vnnlib = "softcert.cli.commands.vnnlib:entry"``):
    ``softcert-vnnlib supports --onnx-operators`` = ``softcert vnnlib supports --onnx-operators``."""
    from softcert.cli import main

    return main(["vnnlib", *sys.argv[1:]])
