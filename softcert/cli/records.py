"""The record format of a report's results.json: canonical JSON, digests, seals, the sealed manifest.

A *record* is a JSON object with an ``id``, a ``kind`` (one of ``KINDS``) and the numbers of
one claim; ``seal`` adds the SHA-256 of its canonical JSON. A report's results.json holds the
summary sections (``SECTIONS``), the records (``certificates``), a ``digests`` table (one
SHA-256 per section), the ``inputs`` (``INPUTS``: the model file and the test data by SHA-256,
the corpus of image ids) and a sealed manifest (``manifest``): record counts per kind, the
digest of the sorted record ids, the settings, the inputs and the list of sections.

Digests are unkeyed: anyone can recompute them. They catch an accidental edit, not a forger;
``softcert.cli.checker`` therefore re-derives every number it can instead of trusting a digest.
Shared by ``softcert report`` (writes) and ``softcert check`` (reads).
"""
from __future__ import annotations

import hashlib
import json

FORMAT = "softcert-results/3"  # 3: inputs (model, data, corpus by SHA-256) in the sealed manifest
SECTIONS = ("model", "settings", "certify", "radii", "topk", "fp", "feedback", "appendix")
KINDS = ("verdict", "vertex", "radius", "topk", "fp", "feedback")
CONFIDENCE = 0.95  # of the Clopper-Pearson intervals beside every k/n


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> list:
    """The exact (Clopper-Pearson 1934) two-sided interval [lo, hi] for a binomial proportion k/n.

    lo solves P(X >= k | lo) = α/2 (lo = 0 when k = 0), hi solves P(X <= k | hi) = α/2 (hi = 1
    when k = n), α = 1 - confidence; computed by ``scipy.stats.binomtest(k, n).proportion_ci(
    method="exact")``. ``softcert.cli.checker.check_proportion_interval`` re-decides both
    equations with exact rational binomial sums.
    """
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or n < 1 or not 0 <= k <= n:
        raise ValueError(f"k, n: need integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must lie in (0, 1), got {confidence!r}")
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return [float(ci.low), float(ci.high)]

__all__ = ["FORMAT", "SECTIONS", "KINDS", "CONFIDENCE", "INPUTS", "clopper_pearson", "canonical", "sha256", "digest", "seal",
           "section_digests", "record_counts", "ids_digest", "sealed_manifest", "assemble", "file_sha256", "arrays_sha256"]

# results.json["inputs"]: what `softcert check --reverify` reloads, each by SHA-256
#   model:  {"spec": as given, "zoo": zoo name or null, "file": the file loaded, "sha256": of its bytes}
#   data:   {"spec": --data as given or null (the bundled split), "file": its path or null,
#            "file_sha256": of its bytes or null, "size": test-set images, "sha256": arrays_sha256(x, y)}
#   corpus: {"images": the image ids of the certify stage, 0..min(n_images, size) - 1}
INPUTS = ("model", "data", "corpus")


def canonical(obj) -> str:
    """Sorted keys, no spaces, NaN/Infinity allowed (Python's JSON spelling of them)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)


def sha256(obj) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def digest(record: dict) -> str:
    """SHA-256 of the record's canonical JSON without its own ``sha256`` field."""
    return sha256({k: v for k, v in record.items() if k != "sha256"})


def seal(record: dict) -> dict:
    """A copy of ``record`` with its ``sha256`` field set."""
    record = dict(record)
    record["sha256"] = digest(record)
    return record


def section_digests(results: dict, sections=SECTIONS) -> dict:
    return {k: sha256(results[k]) for k in sections}


def file_sha256(path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def arrays_sha256(*arrays) -> str:
    """SHA-256 of arrays exactly as held in memory: per array its dtype (byte order included),
    shape and C-order bytes, so equal digests mean bit-identical inputs."""
    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(canonical([a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def record_counts(records) -> dict:
    counts: dict = {}
    for r in records:
        counts[r.get("kind")] = counts.get(r.get("kind"), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: str(kv[0])))


def ids_digest(records) -> str:
    return sha256(sorted(str(r.get("id")) for r in records))


def sealed_manifest(results: dict, records, sections=SECTIONS) -> dict:
    """What the report contains: sections, record counts per kind, the ids' digest, settings, inputs."""
    return seal({"format": FORMAT, "sections": list(sections), "record_counts": record_counts(records),
                 "record_ids_sha256": ids_digest(records), "settings": results["settings"],
                 "inputs": results.get("inputs")})


def assemble(res: dict, records: list, command: str) -> dict:
    """results.json as written by ``softcert report``: sections, inputs, records, digests, sealed manifest."""
    results = {k: res[k] for k in SECTIONS}
    results["inputs"] = res["inputs"]
    results["command"] = command
    results["certificates"] = records
    results["digests"] = section_digests(results)
    results["manifest"] = sealed_manifest(results, records)
    return results
