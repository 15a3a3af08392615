"""``softcert check results.json``: re-check a report's records and re-derive its tables.

The command only: reading the file and printing failures. The record format lives in
``softcert.cli.records``, the checks in ``softcert.cli.checker`` (see its docstring for what
each record kind and section is checked against). Exit code 0 iff everything checks;
otherwise each failure is printed with the record or section it concerns and the code is 1.
"""
from __future__ import annotations

import json
from pathlib import Path

from softcert.cli.checker import check_results
from softcert.cli.records import record_counts


def configure(parser) -> None:
    parser.add_argument("results", help="results.json written by `softcert report`")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    path = Path(args.results)
    if not path.exists():
        raise ValueError(f"results: no such file {path}")
    try:
        # JSON integers stay Python ints and floats are binary64: the checker reads both exactly
        results = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"results: not valid JSON ({exc})") from None
    failures = check_results(results, progress=not args.quiet)
    certs = results.get("certificates") if isinstance(results, dict) else None
    certs = [r for r in certs if isinstance(r, dict)] if isinstance(certs, list) else []
    if failures:
        for rid, why in failures:
            print(f"FAIL {rid}: {why}")
        print(f"{len(failures)} failure(s) among {len(certs)} records")
        return 1
    kinds = record_counts(certs)
    print(f"OK: {len(certs)} records re-checked ({', '.join(f'{v} {k}' for k, v in kinds.items())}); "
          f"{len(results['digests'])} sections match their digests and their re-derived tables")
    return 0
