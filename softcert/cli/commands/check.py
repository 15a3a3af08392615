"""``softcert check results.json``: re-check a report's records and re-derive its tables.

The command only: reading the file and printing failures. The record format lives in
``softcert.cli.records``, the checks in ``softcert.cli.checker`` (see its docstring for what
each record kind and section is checked against). Exit code 0 iff everything checks;
otherwise each failure is printed with the record or section it concerns and the code is 1.

``--reverify`` also re-decides the verdicts, which no digest can vouch for (a forger can
rewrite a verdict, its eps or the model's name and recompute every digest): it reloads the
model file and the test data that results.json names, refuses them (ValueError, exit 2) unless
their SHA-256 equal the recorded ones, and re-runs ``certify.verify`` (the record's method and
eps, the report's input domain) on the image of every certified verdict record. A record fails
when its label or prediction is not the model's on that image, when the re-run does not certify
it, or when its recorded lower margin exceeds the re-run's.
"""
from __future__ import annotations

import json
from pathlib import Path

from softcert.cli.checker import check_results
from softcert.cli.records import arrays_sha256, file_sha256, record_counts

MARGIN_TOL = 1e-6  # relative: the same bound re-run on another machine may round differently


def configure(parser) -> None:
    parser.add_argument("results", help="results.json written by `softcert report`")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--reverify", action="store_true",
                        help="also re-run the verifier on every certified verdict record, with the model and the "
                             "data results.json names (refused unless their SHA-256 match the recorded ones)")
    parser.add_argument("--reverify-limit", type=int, default=None, metavar="N",
                        help="with --reverify: re-run the first N certified records only (default: all)")
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="with --reverify: the model file, when it no longer lies where results.json says "
                             "(its SHA-256 must still match)")
    parser.add_argument("--data", default=None, metavar="PATH",
                        help="with --reverify: the test-set file, likewise")


def _options(args) -> None:
    if not args.reverify and (args.reverify_limit is not None or args.model or args.data):
        raise ValueError("--reverify-limit/--model/--data: only with --reverify")
    if args.reverify_limit is not None and args.reverify_limit < 1:
        raise ValueError(f"--reverify-limit: must be an integer >= 1, got {args.reverify_limit}")


def run(args) -> int:
    _options(args)
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
        return _failed(failures, f"{len(failures)} failure(s) among {len(certs)} records")
    kinds = record_counts(certs)
    print(f"OK: {len(certs)} records re-checked ({', '.join(f'{v} {k}' for k, v in kinds.items())}); "
          f"{len(results['digests'])} sections match their digests and their re-derived tables")
    if not args.reverify:
        return 0
    failures, done = reverify(results, model=args.model, data=args.data, limit=args.reverify_limit,
                              progress=not args.quiet)
    if failures:
        return _failed(failures, f"{len(failures)} failure(s) re-verifying {done} certified records")
    print(f"OK: {done} certified verdict records re-verified on {results['inputs']['model']['file']} "
          f"(sha256 {results['inputs']['model']['sha256'][:16]}...)")
    return 0


def _failed(failures, summary) -> int:
    for rid, why in failures:
        print(f"FAIL {rid}: {why}")
    print(summary)
    return 1


# ----------------------------------------------------------------------------- --reverify
def _same_file(option, path: Path, want: str) -> None:
    """Refuse a file that is missing or whose bytes are not the ones results.json names."""
    if not path.is_file():
        raise ValueError(f"{option}: {path}, named by results.json, does not exist; pass {option} PATH "
                         f"(a file with sha256 {want})")
    got = file_sha256(path)
    if got != want:
        raise ValueError(f"{option}: {path} has sha256 {got}, but results.json names sha256 {want}; "
                         "re-verify with the file the report was made from")


def load_inputs(inputs, model=None, data=None):
    """(model, x_test, y_test) of results.json["inputs"], each file checked by its SHA-256.

    ``model``/``data``: paths that replace the recorded ones (the hashes must still match).
    """
    from softcert.certify.train import ZOO_DIR
    from softcert.cli.modelio import load_model

    m, d = inputs["model"], inputs["data"]
    mpath = Path(model) if model else (ZOO_DIR / f"{m['zoo']}.pt" if m["zoo"] else Path(m["file"]))
    _same_file("--model", mpath, m["sha256"])
    if d["file"] is None and data:
        raise ValueError("--data: the report used a bundled test split, not a file")
    dpath = None if d["file"] is None else Path(data or d["file"])
    if dpath is not None:
        _same_file("--data", dpath, d["file_sha256"])
    spec = m["zoo"] if m["zoo"] and not model else _spec_at(m["spec"], mpath)
    # a bundled split named by --data (d["spec"]) is loaded by that name again
    net, xte, yte, _ = load_model(spec, data=d["spec"] if dpath is None else str(dpath))
    got = arrays_sha256(xte, yte)
    if got != d["sha256"] or len(yte) != d["size"]:
        raise ValueError(f"--data: the test set loaded for {spec} ({len(yte)} images, arrays sha256 {got}) is not "
                         f"the one results.json names ({d['size']} images, sha256 {d['sha256']})")
    return net, xte, yte


def _spec_at(spec: str, path: Path) -> str:
    """The recorded --model spec with its file at ``path``: an entry point keeps its function."""
    from softcert.cli.model_formats import entry_file

    if ":" not in spec or Path(spec).exists():
        return str(path)
    entry = entry_file(spec)
    if entry is not None:
        return f"{path}:{entry[1]}"
    return spec  # an installed module's entry point: imported by name again


def _config(net) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in net.config.items()}


def reverify(results, *, model=None, data=None, limit=None, progress=False):
    """([(record id or section, reason)], records re-run): the certified verdicts of a results.json
    that passed ``check_results``, re-decided by ``certify.verify`` on the hash-checked inputs."""
    import torch

    from softcert import certify
    from softcert.certify.spec import DOMAIN
    from softcert.cli import common

    net, xte, yte = load_inputs(results["inputs"], model, data)
    if getattr(net, "config", None) is not None and _config(net) != results["model"]["config"]:
        return [("section model", "config differs from the model results.json names by hash")], 0
    torch.set_num_threads(1)  # as the report ran
    todo = [r for r in results["certificates"] if r.get("kind") == "verdict" and r["certified"]][:limit]
    fails = []
    for rec in common.progress(todo, desc="reverify", unit="record", disable=not progress):
        why = _reverify_one(certify, net, xte, yte, rec, DOMAIN)
        if why:
            fails.append((rec["id"], why))
    return fails, len(todo)


def _reverify_one(certify, net, xte, yte, rec, domain) -> str | None:
    """Why one certified verdict does not stand on the model (None: it does)."""
    import torch

    from softcert.certify.attack import logits

    i = rec["image"]
    x, y = xte[i:i + 1], yte[i:i + 1]
    if rec["label"] != int(y[0]):
        return f"label {rec['label']} but image {i} of the data has label {int(y[0])}"
    with torch.no_grad():
        pred = int(logits(net, x).argmax(1)[0])
    if rec["predicted"] != pred:
        return f"predicted {rec['predicted']} but the model predicts {pred} on image {i}"
    res = certify.verify(net, x, y, rec["eps"], method=rec["method"], domain=domain)
    margin = float(res.worst_margin[0])
    if not bool(res.certified[0]):
        return f"re-running {rec['method']} at eps={rec['eps']} does not certify image {i} (lower margin {margin!r})"
    if rec["lower_margin"] > margin + MARGIN_TOL * (1 + abs(margin)):
        return f"recorded lower margin {rec['lower_margin']!r} exceeds the re-run's {margin!r}"
    return None
