"""Reproduce the synthetic tightness sweep: Vertex-Softmax vs naive IA, Shi 2020, Wei 2023.

    python examples/tightness.py            # full sweep (200 trials per cell), writes docs/
    python examples/tightness.py --trials 20 --out /tmp/tightness

Same as `softcert tightness`; see analysis/tightness.py for the setup.
"""
import sys

import softcert.cli

if __name__ == "__main__":
    raise SystemExit(softcert.cli.main(["tightness", *sys.argv[1:]]))
