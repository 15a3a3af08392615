"""``softcert <subcommand>``: the command-line entry point.

Each subcommand lives in the module that owns its computation; this file only maps names to
modules, which expose ``configure(parser)`` and ``run(args) -> int``. Modules are imported
lazily so that ``softcert --help`` stays fast and a missing optional dependency only affects
its own subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "tightness": ("analysis.tightness", "Vertex-Softmax vs baseline bounds on synthetic score boxes"),
    "bench": ("kernels.bench", "throughput of Vertex-Softmax against torch.sort"),
    "vertex": ("bounds.cli", "bound c·softmax(s) over a score box given on the command line"),
    "topk": ("analysis.topk_study", "certified top-k truncation on a real model's attention (MiniLM)"),
    "topk-bench": ("kernels.bench_topk", "throughput of the top-k certificate kernels vs torch.sort"),
    "ghosts": ("analysis.ghosts_experiments", "Taylor-radius experiments on sklearn digits: sweep, LR spike, temperature, SafeStep overhead"),
    "fp": ("analysis.fp_report", "proven FP softmax error bounds vs worst measured errors, thresholds"),
    "stability": ("analysis.stability_report", "softmax feedback stability thresholds and sharpness demos"),
    "certify": ("certify.cli", "certified accuracy of zoo attention models (IBP/CROWN/Vertex/auto_LiRPA)"),
    "report": ("softcert_cli.report", "one command from a model to a checked report folder (md, tex, figures, JSON)"),
    "check": ("softcert_cli.check", "re-check every certificate of a report's results.json independently"),
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

