"""``softcert <subcommand>``: the command-line entry point.

Each subcommand is one module of softcert.cli.commands (``report`` and ``check`` included;
the record format and the checker they share are softcert.cli.records and
softcert.cli.checker); this file only maps names to modules, which
expose ``configure(parser)`` and ``run(args) -> int``. Modules are imported lazily so that
``softcert --help`` stays fast and a missing optional dependency only affects its own
subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "tightness": ("softcert.cli.commands.tightness", "Vertex-Softmax vs baseline bounds on synthetic score boxes"),
    "bench": ("softcert.cli.commands.bench", "throughput of Vertex-Softmax against torch.sort"),
    "vertex": ("softcert.cli.commands.vertex", "bound c·softmax(s) over a score box given on the command line"),
    "topk": ("softcert.cli.commands.topk", "certified top-k truncation on a real model's attention (MiniLM)"),
    "topk-bench": ("softcert.cli.commands.topk_bench", "throughput of the top-k certificate kernels vs torch.sort"),
    "ghosts": ("softcert.cli.commands.ghosts", "Taylor-radius experiments on sklearn digits: sweep, LR spike, temperature, SafeStep overhead"),
    "fp": ("softcert.cli.commands.fp", "proven FP softmax error bounds vs worst measured errors, thresholds"),
    "stability": ("softcert.cli.commands.stability", "softmax feedback stability thresholds and sharpness demos"),
    "certify": ("softcert.cli.commands.certify", "certified accuracy of zoo attention models (IBP/CROWN/Vertex/auto_LiRPA)"),
    "usermodels": ("softcert.cli.commands.usermodels", "certified accuracy of user-style attention models (torch.nn, Hugging Face) on digits"),
    "train": ("softcert.cli.commands.train", "retrain the zoo checkpoints from their recipes, or train any model for certificates (--certified: IBP, CROWN-IBP)"),
    "report": ("softcert.cli.commands.report", "one command from a model to a checked report folder (md, tex, figures, JSON)"),
    "check": ("softcert.cli.commands.check", "re-check every certificate of a report's results.json independently"),
    "vnncomp": ("softcert.cli.commands.vnncomp", "decide one VNN-COMP instance (ONNX model + VNN-LIB property), write the result file"),
    "widths": ("softcert.cli.commands.widths", "where a model's interval bounds grow: the IBP box of every node, the boxes certified training builds on"),
    "depth": ("softcert.cli.commands.depth", "CROWN time and peak memory against model depth (1-8 blocks), ours vs auto_LiRPA"),
    "bab": ("softcert.cli.commands.bab", "three-valued verdicts (certified/falsified/unknown) by branch and bound, cactus plot, ingredients table"),
    "vnnlib": ("softcert.cli.commands.vnnlib", "the VNN-LIB 2.0 solver command line: verify a property, list supported ONNX operators"),
    "gpu-check": ("softcert.cli.commands.gpu_check", "on a GPU: exp accuracy sweeps, kernel soundness against oracles, timings (docs/gpu/kernels.md)"),
    "scaling": ("softcert.cli.commands.scaling", "time of a dataset run in-process and on local Dask clusters of N workers, with T(N) = overhead + n·t_task/N"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="softcert",
        description="Formal verification and analysis of softmax operators.",
    )
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("softcert")
    except PackageNotFoundError:  # running from a source tree
        ver = "unknown"
    parser.add_argument("--version", action="version", version=f"softcert {ver}")
    sub = parser.add_subparsers(dest="command", metavar="<subcommand>")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        # configure() is looked up only for the chosen subcommand (see main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        sub = argparse.ArgumentParser(
            prog=f"softcert {argv[0]}", description=SUBCOMMANDS[argv[0]][1]
        )
        module.configure(sub)
        args = sub.parse_args(argv[1:])
        # the command as typed, for the "Regenerate:" line of the outputs (common.command_line)
        args.invocation = ["softcert", *argv]
        try:
            return int(module.run(args) or 0)
        except ValueError as exc:
            print(f"softcert {argv[0]}: error: {exc}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0

