"""Throughput of Vertex-Softmax against torch.sort of the same tensor (same run).

    python examples/bench_vertex.py --out docs

Same as `softcert bench`; see softcert/cli/commands/bench.py.
"""
import sys

import softcert.cli

if __name__ == "__main__":
    raise SystemExit(softcert.cli.main(["bench", *sys.argv[1:]]))
