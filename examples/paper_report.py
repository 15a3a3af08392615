"""A checked paper report for your own model: certify, radii, top-k, FP bounds, appendix.

    python examples/paper_report.py [MODEL] [OUT]

MODEL: a zoo name (default digits-vit1), a checkpoint {'config', 'state_dict'} of the
certify.ViT family, or its ONNX export. Writes OUT/report.md, report.tex, figures,
results.json and manifest.json, then re-checks every certificate record independently.
"""
import sys

import softcert.cli

model = sys.argv[1] if len(sys.argv) > 1 else "digits-vit1"
out = sys.argv[2] if len(sys.argv) > 2 else "report"
rc = softcert.cli.main(["report", "--quick", "--model", model, "--out", out])
if rc == 0:
    rc = softcert.cli.main(["check", f"{out}/results.json"])
sys.exit(rc)
