"""``softcert report``: one command from a model to a checked report folder.

Stages (each with a progress bar, wall time recorded in manifest.json):
1. certify  — certified accuracy at several eps with the certify methods, PGD upper bound,
              one verdict record per (image, eps, method) from which the table is re-derived,
              and Vertex-Softmax proof records (score box, coefficients, bound) for sampled
              attention rows of the propagated model;
2. radii    — Taylor radii of the loss along the normalised gradient direction (one JVP):
              per-image lower bounds (pi, root), exact radii of the closest images;
3. topk     — certified top-k per layer/head on MiniLM attention and on the model's own
              (means beside their integer totals);
4. fp       — FP32 softmax error bounds for the sequence lengths of both models, beside the
              measured errors of their actual score rows;
5. feedback — stability thresholds of the heads' iterated attention p <- softmax(β W p),
              W = K Qᵀ/sqrt(d_h) (Hopfield-style retrieval with the attention-mixed query);
6. appendix — sympy derivations (softcert.cli.appendix);
then report.md / report.tex / figures / results.json / manifest.json (softcert.cli.render).
``--device cuda`` bounds the certify stage (its Dask workers too: softcert.cli.dataset), the
preflight, the Vertex-Softmax proof records' boxes and the bab stage on a GPU
(softcert.cli.devices); the radii, top-k, fp and feedback stages analyse on the CPU.
results.json follows softcert.cli.records (records, section digests, sealed manifest);
``softcert check`` re-checks every record and re-derives the tables from them.
Test data: the bundled split, or ``--data`` (softcert.cli.modelio.load_test_set).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from softcert import certify
from softcert.cli.records import CONFIDENCE, arrays_sha256, clopper_pearson, file_sha256, seal

SEED = 0


@dataclass(frozen=True)
class Settings:
    mode: str
    n_images: int
    eps: tuple
    methods: tuple
    vertex_rows: int  # proof records per eps
    radius_images: int
    exact_radii: int
    minilm_sentences: int | None  # None = the whole corpus
    topk_eps: tuple
    topk_records: int
    fp_algorithms: tuple = ("three_pass", "online", "tree")


FULL = Settings("full", 10, (0.01, 0.02, 0.03), tuple(m for m, meth in certify.METHODS.items() if not meth.complete),
                8, 360, 16, None, (0.001, 0.01, 0.05, 0.1), 24)
QUICK = Settings("quick", 6, (0.01, 0.03), ("ibp", "crown", "vertex"), 4, 120, 6, 8, (0.01, 0.05), 12)
# test-only: the same stages on the smallest inputs that still exercise each of them
TINY = Settings("tiny", 2, (0.02,), ("ibp", "crown", "vertex"), 2, 16, 2, 2, (0.01,), 4)


def configure(parser) -> None:
    from softcert.cli import dataset, devices, model_formats

    model_formats.add_arguments(parser, "digits-vit1", many=False)
    parser.add_argument("--out", default="report", help="output folder")
    parser.add_argument("--quick", action="store_true", help="few images, fast methods (2-4 min on 2 cores)")
    parser.add_argument("--tiny", action="store_true", help=argparse_suppress())
    parser.add_argument("--n", type=int, default=None, help="test images certified (default: 10; --quick 6)")
    parser.add_argument("--eps", nargs="+", type=float, default=None,
                        help="L-infinity radii (default: 0.01 0.02 0.03; --quick 0.01 0.03)")
    parser.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                        help="certify.METHODS to compare; bab and bab-vertex run per image within --timeout "
                             "(default: every bound-only method; --quick ibp crown vertex)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds per image for bab / bab-vertex (default: 30)")
    parser.add_argument("--minilm", action="store_true",
                        help="also measure top-k and FP bounds on the bundled MiniLM sentence model's attention")
    parser.add_argument("--no-minilm", action="store_true", help=argparse_suppress())  # the default since 2026-12-05
    dataset.add_arguments(parser, "OUT/certify-store.jsonl")  # the certify stage runs image by image
    devices.add_argument(parser, "the model and the images of the certify and bab stages (the radii, top-k, fp and "
                                 "feedback stages stay on the CPU)", workers=True)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


class Timer:
    def __init__(self):
        self.stages = {}

    def __call__(self, name):
        timer = self

        class _T:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.stages[name] = round(time.perf_counter() - self.t0, 2)

        return _T()


def _bar(total, desc):
    from softcert.cli import common

    return common.progress(total=total, desc=desc, unit="step")


# ----------------------------------------------------------------------------- 1. certify
def stage_certify(model, x, y, st: Settings, records: list, ev=None, device=None):
    """``ev``: the ``certify.Evaluation`` of (x, y) when a dataset run made it already
    (``softcert.cli.dataset``, as ``run`` does); None evaluates it here in one batch.
    ``device``: where to bound (``softcert.cli.devices``; None: the CPU); the tables are
    made on the CPU."""
    from softcert.cli import devices

    bar = _bar(len(st.eps) * (1 if ev is not None else len(st.methods) + 2), "certify")

    def advance(done, total, what):
        bar.set_postfix_str(what)
        bar.update(1)

    # attack -> verify -> cross-check; a PGD-contradicted certificate raises SoundnessError
    if ev is None:
        ev = certify.evaluate(*devices.on_device(model, x, y, device), st.eps, st.methods, progress=advance)
    by_image = {r.index: r.correct for r in ev.records}
    correct = torch.tensor([by_image[i] for i in range(len(y))])
    first = x[correct][:1] if bool(correct.any()) else x[:1]  # the box is a valid proof input either way
    rng = np.random.default_rng(SEED)
    rows, verdicts = [], []
    n = len(y)
    for eps in st.eps:
        k_rob, _ = ev.robust_accuracy(eps)
        for meth in st.methods:
            rs = [r for r in ev.records if r.eps == eps and r.method == meth]
            verified = [r for r in rs if r.correct]
            margins = [r.lower_margin for r in verified if math.isfinite(r.lower_margin)]
            k_cert, _ = ev.certified_accuracy(eps, meth)
            k_clean = sum(bool(r.correct) for r in rs)
            # int / int: correctly rounded, as `softcert check` re-derives it from the verdicts;
            # k/n with an exact 95 % interval, because 5/6 and 83/100 read the same as 0.83
            rows.append(dict(eps=eps, method=meth, n=n, clean_acc=k_clean / n,
                             pgd_acc=k_rob / n, certified_acc=k_cert / n,
                             clean_k=k_clean, pgd_k=int(k_rob), certified_k=int(k_cert),
                             clean_ci=clopper_pearson(k_clean, n), pgd_ci=clopper_pearson(int(k_rob), n),
                             certified_ci=clopper_pearson(int(k_cert), n), confidence=CONFIDENCE,
                             mean_lower_margin=math.fsum(margins) / len(margins) if margins else None,
                             seconds_per_image=math.fsum(r.seconds for r in verified) / max(1, len(verified)),
                             note=verified[0].note if verified else "no correctly classified image"))
            verdicts += [_verdict_record(r) for r in rs]
        bar.set_postfix_str(f"eps={eps} vertex records")
        _vertex_records(model, first, eps, st.vertex_rows, rng, records, device)
        bar.update(1)
    bar.close()
    records += verdicts
    return {"rows": rows, "images": n, "correct": int(correct.sum())}


def _verdict_record(r) -> dict:
    """One certify.Record as a sealed ``verdict`` record (``softcert.cli.checker.check_verdict``).

    Misclassified images are neither verified (lower_margin None) nor attacked (pgd_margin None).
    """
    return seal(dict(
        id=f"verdict/eps={r.eps}/{r.method}/image{r.index}", kind="verdict", image=r.index, eps=r.eps,
        method=r.method, label=r.label, predicted=r.predicted, certified=r.certified,
        lower_margin=r.lower_margin, pgd_margin=r.pgd_margin,
        pgd_counterexample=r.correct and not r.robust))


def _vertex_records(model, xb, eps, n_rows, rng, records, device):
    """Vertex-Softmax proof records for sampled rows of the first attention layer at image ``xb``.

    The score and value boxes are the verifier's own (``certify.attention_boxes``, method vertex),
    bounded on ``device``; the records' bounds are computed from them on the CPU.
    """
    from softcert.bounds import vertex_softmax
    from softcert.certify import attention_boxes
    from softcert.cli import devices

    box = attention_boxes(devices.model_on(model, device), xb.double().to(device or "cpu"), eps, method="vertex")[0]
    (yl, yu), (vl, vu) = (t.cpu() for t in box.shifted), (t.cpu() for t in box.values)
    H, N = yl.shape[1], yl.shape[2]
    for r in range(n_rows):
        h, q = int(rng.integers(H)), int(rng.integers(N))
        lo, hi = yl[0, h, q], yu[0, h, q]
        if r % 2 == 0:  # an attention-output coordinate: c = value bounds of coordinate d
            d = int(rng.integers(vl.shape[-1]))
            c, what = vu[0, h, :, d], f"output coord {d} (c = value upper bounds)"
        else:  # an attention probability: c = e_j
            j = int(rng.integers(N))
            c, what = torch.zeros(N, dtype=torch.float64).index_fill_(0, torch.tensor([j]), 1.0), f"probability p_{j}"
        vb = vertex_softmax(c, lo, hi)
        records.append(seal(dict(
            id=f"vertex/eps={eps}/head{h}/query{q}/{r}", kind="vertex", what=what,
            c=c.tolist(), lower=lo.tolist(), upper=hi.tolist(),
            min=float(vb.lower), max=float(vb.upper))))


def stage_bab(model, x, y, st: Settings, methods, timeout, ev, device=None) -> list:
    """Branch and bound (``certify.verify(..., "bab")``) per eps and complete method on the
    certify stage's images, ``timeout`` seconds per image, on ``device`` (None: the CPU): per
    image its status (certified / falsified / unknown), seconds and leaves. A bab certificate
    for an image that the certify stage's PGD broke raises SoundnessError."""
    from softcert.certify.options import BabOptions
    from softcert.cli import devices

    rows = []
    if not methods:
        return rows
    model, x, y = devices.on_device(model, x.double(), y, device)
    bar = _bar(len(st.eps) * len(methods), "bab")
    for eps in st.eps:
        broken = {r.index for r in ev.records if r.eps == eps and r.correct and not r.robust}
        for meth in methods:
            bar.set_postfix_str(f"eps={eps} {meth}")
            r = certify.verify(model, x, y, eps, meth, options=BabOptions(timeout=timeout))
            status = list(r.status)
            for b in broken:
                if status[b] == "certified":
                    raise certify.SoundnessError(f"bab: image {b} certified at eps {eps}, but PGD falsified it")
            rows.append(dict(eps=eps, method=meth, n=len(y), timeout=timeout, status=status,
                             seconds=[v.seconds for v in r.verdicts], leaves=[v.leaves for v in r.verdicts],
                             **{k: int(v) for k, v in r.counts().items()}))
            bar.update(1)
    bar.close()
    return rows


# ----------------------------------------------------------------------------- 2. radii
def stage_radii(model, x, y, st: Settings, records: list):
    from softcert.analysis import RadiusNotVerified, ghosts
    from softcert.analysis.safestep import logit_slopes

    bar = _bar(4 + st.exact_radii, "radii")
    m64 = copy.deepcopy(model).double().eval()
    xb, yb = x[: st.radius_images].double(), y[: st.radius_images]
    loss = torch.nn.functional.cross_entropy(m64(xb), yb)
    names = [n for n, _ in m64.named_parameters()]
    grads = torch.autograd.grad(loss, [p for _, p in m64.named_parameters()])
    norm = torch.sqrt(sum((gr ** 2).sum() for gr in grads))
    v = {n: gr / norm for n, gr in zip(names, grads)}  # unit direction (descent: minus this)
    bar.update(1)
    z, a = logit_slopes(m64, {n: -t for n, t in v.items()}, args=(xb,))
    bar.update(1)
    lb_pi = ghosts.radius_lower_bound_batch(z, a, "pi")
    lb_root = ghosts.radius_lower_bound_batch(z, a, "root")
    bar.update(2)
    order = torch.argsort(lb_root)[: st.exact_radii]
    exact = []
    for i in order.tolist():
        lb_i = ghosts.radius_lower_bound(z[i].numpy(), a[i].numpy(), "root")
        try:
            ex = ghosts.radius_exact(z[i].numpy(), a[i].numpy())
            radius, zero, note = ex.radius, [ex.zero.real, ex.zero.imag], None
        except RadiusNotVerified as err:  # no exact radius is claimed; the lower bound still stands
            radius, zero, note = None, None, f"exact radius not verified: {err}"[:300]
        exact.append(dict(index=i, lower_root=lb_i, exact=radius,
                          top2=ghosts.top2_estimate(z[i].numpy(), a[i].numpy()), note=note))
        records.append(seal(dict(
            id=f"radius/image{i}", kind="radius", z=z[i].tolist(), a=a[i].tolist(), lower_bound=lb_i,
            exact=radius, zero=zero, note=note)))
        bar.update(1)
    bar.close()
    return {"images": len(yb), "grad_norm": float(norm.detach()), "loss": float(loss.detach()),
            "rho_batch_pi": float(lb_pi.min()), "rho_batch_root": float(lb_root.min()),
            "median_pi": float(lb_pi.median()), "median_root": float(lb_root.median()),
            "per_image_pi": lb_pi.tolist(), "per_image_root": lb_root.tolist(), "exact": exact,
            "direction": "minus the normalised gradient of the mean cross-entropy over the images "
                         "(all parameters), float64"}


# ----------------------------------------------------------------------------- 3. top-k
def _topk_records(prefix, scores_list, eps_list, n_rec, rng, records):
    from softcert.analysis import topk

    for r in range(n_rec):
        si = int(rng.integers(len(scores_list)))
        s = scores_list[si]
        L, H, T = s.shape[0], s.shape[1], s.shape[2]
        li, hi, qi = int(rng.integers(L)), int(rng.integers(H)), int(rng.integers(T))
        e = eps_list[r % len(eps_list)]
        row = s[li, hi, qi].double()
        c = topk.certify_topk(row, e)
        records.append(seal(dict(
            id=f"topk/{prefix}/seq{si}/layer{li}/head{hi}/query{qi}/eps={e}", kind="topk",
            scores=row.tolist(), k=int(c.k), eps=e, tail_upper=float(c.tail_upper),
            tail_lower_prev=float(c.tail_lower_prev), minimal_proved=bool(c.minimal_proved))))


def load_minilm(st: Settings):
    from softcert.analysis import attention

    sentences = attention.load_corpus()
    if st.minilm_sentences is not None:
        sentences = sentences[: st.minilm_sentences]
    at = attention.extract_attention(sentences=sentences, max_length=128)
    return at


def stage_topk(vit_scores, minilm, st: Settings, records: list):
    rng = np.random.default_rng(SEED + 1)
    bar = _bar(2, "topk")
    out = {}
    vs = [vit_scores[i] for i in range(vit_scores.shape[0])]
    out["model"] = _topk_tables_var(vs, st.topk_eps)
    _topk_records("model", vs, st.topk_eps, max(2, st.topk_records // 3), rng, records)
    bar.update(1)
    if minilm is not None:
        ms = list(minilm.scores)
        out["minilm"] = _topk_tables_var(ms, st.topk_eps)
        out["minilm_sequences"] = len(ms)
        out["minilm_lengths"] = minilm.lengths
        _topk_records("minilm", ms, st.topk_eps, st.topk_records, rng, records)
    bar.update(1)
    bar.close()
    return out


def _topk_tables_var(scores_list, eps_list):
    """_topk_tables over sequences of different lengths: accumulate row sums per (L, H)."""
    from softcert.analysis import topk

    L, H = scores_list[0].shape[:2]
    acc = {e: dict(k=np.zeros((L, H)), n=np.zeros((L, H)), proved=np.zeros((L, H)), rows=0) for e in eps_list}
    for s in scores_list:
        for e in eps_list:
            c = topk.certify_topk(s.double(), e)
            acc[e]["k"] += c.k.double().sum(-1).numpy()
            acc[e]["n"] += c.n_valid.double().sum(-1).numpy()
            acc[e]["proved"] += c.minimal_proved.double().sum(-1).numpy()
            acc[e]["rows"] += s.shape[2]
    # the integer totals let `softcert check` re-derive every mean (the sums of ints are exact)
    return {str(e): {"mean_k": (d["k"] / d["rows"]).tolist(), "mean_n": (d["n"] / d["rows"]).tolist(),
                     "proved_minimal": (d["proved"] / d["rows"]).tolist(), "rows": d["rows"],
                     "k_sum": d["k"].astype(np.int64).tolist(), "n_sum": d["n"].astype(np.int64).tolist(),
                     "proved_count": d["proved"].astype(np.int64).tolist()}
            for e, d in acc.items()}


# ----------------------------------------------------------------------------- 4. fp
FP_WIDEN = 1e-9  # see stage_fp


def stage_fp(vit_scores, minilm, st: Settings, records: list):
    """FP32 bounds per sequence length and algorithm (analysis.fp.error_bound), measured errors.

    analysis.fp rounds its constants up by a relative 2^-40, which does not cover the float64
    cancellation in B⁺ - 1 (observed: 6e-12 relative below the 40-digit value); the report
    states those bounds widened by a relative FP_WIDEN, which ``softcert check`` re-evaluates.
    """
    from softcert.analysis import fp
    from softcert.kernels import fp_rows

    sources = [("model", vit_scores.reshape(-1, vit_scores.shape[-1]).float().numpy())]
    if minilm is not None:
        for s in minilm.scores:
            sources.append(("minilm", s.reshape(-1, s.shape[-1]).float().numpy()))
    lengths = sorted({src.shape[-1] for _, src in sources})
    bar = _bar(len(lengths) + len(sources), "fp")
    table = []
    for n in lengths:
        for alg in st.fp_algorithms:
            b = fp.error_bound(n, alg, "float32")
            rel = float(np.nextafter(b.rel * (1 + FP_WIDEN), np.inf))
            floor = float(np.nextafter(b.abs_floor * (1 + FP_WIDEN), np.inf))
            table.append(dict(n=n, algorithm=alg, rel=rel, abs_floor=floor, rel_in_u=rel / b.u))
            records.append(seal(dict(
                id=f"fp/n={n}/{alg}", kind="fp", n=n, algorithm=alg, dtype="float32", block=128,
                exp_ulps=b.exp_ulps, score_range=None, rel=rel, abs_floor=floor,
                formula="|p̂_i - p_i| <= rel·p_i + abs_floor (analysis.fp.error_bound, float32)")))
        bar.update(1)
    measured = {}
    for name, rows in sources:
        rep = fp_rows.rows_report(rows, "three_pass")
        n = rows.shape[-1]
        d = measured.setdefault(n, dict(n=n, source=name, rows=0, max_measured_u=0.0, max_bound_u=0.0,
                                         max_ratio=0.0))
        d["rows"] += int(rows.shape[0])
        d["max_measured_u"] = max(d["max_measured_u"], float(rep.measured.max()) / 2**-24)
        d["max_bound_u"] = max(d["max_bound_u"], float(rep.bound.max()) / 2**-24)
        d["max_ratio"] = max(d["max_ratio"], float((rep.measured / rep.bound).max()))
        bar.update(1)
    bar.close()
    return {"table": table, "measured": [measured[n] for n in sorted(measured)], "lengths": lengths,
            "widen": FP_WIDEN}


# ----------------------------------------------------------------------------- 5. feedback
def stage_feedback(kq, records: list):
    from softcert.analysis import feedback as fb

    L, H = kq.shape[1], kq.shape[2]
    bar = _bar(L * H + 1, "feedback")
    rows = []
    cases = [(f"layer{l}/head{h}", kq[0, l, h].numpy()) for l in range(L) for h in range(H)]
    cases.append(("example W = 5·11ᵀ + 0.3I", fb.example_matrix()))
    for name, W in cases:
        cert = fb.stability_threshold(W, beta=1.0)
        rows.append(dict(case=name, n=cert.n, beta_star=cert.beta_star, beta_classical=cert.beta_classical,
                         proj_norm=cert.proj_norm.value, norm=cert.full_norm.value,
                         contraction_at_1=cert.contraction, unique_at_1=bool(cert.unique_fixed_point),
                         method=cert.proj_norm.method))
        records.append(seal(dict(
            id=f"feedback/{name}", kind="feedback", W=np.asarray(W, dtype=np.float64).tolist(),
            proj_norm_upper=cert.proj_norm.value, norm_upper=cert.full_norm.value,
            beta_star=cert.beta_star, beta_classical=cert.beta_classical, beta=1.0,
            contraction=cert.contraction)))
        bar.update(1)
    bar.close()
    return {"rows": rows, "system": "p <- softmax(β W p), W = K Qᵀ / sqrt(d_h) of the first test image "
                                    "(query = attention-weighted mix of the token queries); β = 1 is the model"}


# ----------------------------------------------------------------------------- inputs
def model_file(spec: str) -> tuple:
    """(the file whose content decides the model, zoo name or None): the file ``spec`` names
    (an entry point's .py file; an installed module's source), or a zoo model's checkpoint
    certify/zoo/NAME.pt."""
    import importlib.util

    from softcert.cli import model_formats

    source = model_formats.parse(spec)
    if source.kind == "zoo":
        from softcert.certify.train import ZOO_DIR

        return ZOO_DIR / f"{spec}.pt", spec
    if source.file is not None:
        return source.file.resolve(), None
    found = importlib.util.find_spec(source.target)  # an entry point in an installed module
    return Path(found.origin).resolve(), None


def inputs_of(spec: str, data: str | None, xte, yte, n: int) -> dict:
    """results.json["inputs"] (``softcert.cli.records.INPUTS``): the model file and the test set
    by SHA-256, and the image ids the certify stage ran on (the first n)."""
    from softcert.cli.modelio import BUNDLED

    path, zoo = model_file(spec)
    bundled = data is None or (data in BUNDLED and not Path(data).exists())
    dpath = None if bundled else Path(data).resolve()
    return {"model": {"spec": spec, "zoo": zoo, "file": str(path), "sha256": file_sha256(path)},
            "data": {"spec": data, "file": None if dpath is None else str(dpath),
                     "file_sha256": None if dpath is None else file_sha256(dpath), "size": len(yte),
                     "sha256": arrays_sha256(xte, yte)},
            "corpus": {"images": list(range(n))}}


# ----------------------------------------------------------------------------- driver
def model_config(model, att) -> dict:
    """results.json["model"]["config"]: a certify.ViT's own config, else what the report's
    sections read off the traced attention (``att``: ``certify.attention_scores``): its
    layers (depth) and heads, the image shape and the class count."""
    from softcert.cli.modelio import classes_of

    cfg = getattr(model, "config", None)
    if isinstance(cfg, dict):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    s = att.scores
    return {"architecture": type(model).__name__, "image": list(model.image), "classes": classes_of(model),
            "depth": int(s.shape[1]), "heads": math.prod(s.shape[2:-2]), "tokens": int(s.shape[-1])}


def preflight(model, x, y, methods, device=None) -> tuple:
    """(the methods that bound one image, {method: why} for those that raise): a baseline
    that cannot handle the model becomes a row saying why, never an aborted report. Bounded
    on ``device`` (None: the CPU), where the certify stage bounds."""
    from softcert.cli import devices

    model, x, y = devices.on_device(model, x[:1], y[:1], device)
    ran, failed = [], {}
    for m in methods:
        if certify.METHODS[m].complete:
            ran.append(m)  # bab runs per image in its own stage, with its own failures
            continue
        try:
            certify.verify(model, x, y, 1e-3, method=m)
        except certify.SoundnessError:
            raise
        except Exception as exc:  # noqa: BLE001  (a baseline's own bug: reported in the table)
            failed[m] = f"{type(exc).__name__}: {str(exc)[:160]}"
            continue
        ran.append(m)
    return tuple(ran), failed


@contextlib.contextmanager
def _mha_fastpath(enabled: bool):
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def settings_for(args) -> Settings:
    """The preset (--tiny, --quick, else full) with --n, --eps and --methods put in."""
    import dataclasses

    st = TINY if args.tiny else QUICK if args.quick else FULL
    if args.n is not None:
        if isinstance(args.n, bool) or args.n < 1:
            raise ValueError(f"--n: must be an integer >= 1, got {args.n!r}")
        st = dataclasses.replace(st, n_images=args.n)
    if args.eps is not None:
        from softcert.certify.spec import check_eps

        for e in args.eps:
            try:
                check_eps(e)
            except ValueError as exc:
                raise ValueError(f"--eps: {exc}") from None
        st = dataclasses.replace(st, eps=tuple(args.eps))
    if args.methods is not None:
        unknown = [m for m in args.methods if m not in certify.METHODS]
        if unknown or not args.methods:
            raise ValueError(f"--methods: unknown {', '.join(map(repr, unknown)) or '(none given)'}; "
                             f"choose from {', '.join(certify.METHODS)}")
        if all(certify.METHODS[m].complete for m in args.methods):
            raise ValueError("--methods: give at least one bound-only method besides bab (e.g. crown): the table "
                             "of certified accuracy and its checks are built from them")
        st = dataclasses.replace(st, methods=tuple(dict.fromkeys(args.methods)))
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise ValueError(f"--timeout: expected a positive number of seconds, got {args.timeout!r}")
    return st


def run(args) -> int:
    from softcert.cli import appendix, common, dataset, devices, render
    from softcert.cli.modelio import load_model

    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(SEED)
    st = settings_for(args)
    device = devices.device_of(args.device)  # refused by name before anything loads
    out = Path(args.out)
    timer = Timer()
    t_all = time.perf_counter()
    with timer("load"):
        model, xte, yte, label = load_model(args.model, data=args.data, allow_pickle=args.allow_pickle)
        x, y = xte[: max(st.n_images, st.radius_images)], yte[: max(st.n_images, st.radius_images)]
        att = certify.attention_scores(model, x[: max(8, st.n_images)])
        methods, failed = preflight(model, x, y, st.methods, device)
        st = dataclasses.replace(st, methods=tuple(m for m in methods if not certify.METHODS[m].complete))
        complete = tuple(m for m in methods if certify.METHODS[m].complete)
        minilm = load_minilm(st) if args.minilm and not args.no_minilm else None
    torch.set_num_threads(1)  # loading transformers may have reset it
    out.mkdir(parents=True, exist_ok=True)
    records: list = []
    res = {"model": {"spec": label, "data": "bundled test split" if args.data is None else str(args.data),
                     "config": model_config(model, att), "parameters": sum(p.numel() for p in model.parameters())},
           "settings": asdict(st)}
    with timer("certify"):
        # image by image into the results store (in this process, or on Dask with --workers/--scheduler)
        job = dataset.Job((args.model,), st.eps, st.methods, st.n_images, data=args.data,
                          allow_pickle=args.allow_pickle, device=args.device)
        ev = dataset.run(job, Path(args.store) if args.store else out / "certify-store.jsonl",
                         workers=args.workers, scheduler=args.scheduler, resume=args.resume).evaluations[args.model]
        res["certify"] = stage_certify(model, x[: st.n_images], y[: st.n_images], st, records, ev=ev, device=device)
        res["certify"]["failed"] = [{"method": m, "error": why} for m, why in failed.items()]
        res["certify"]["bab"] = stage_bab(model, x[: st.n_images], y[: st.n_images], st, complete, args.timeout, ev,
                                          device)
        res["inputs"] = inputs_of(args.model, args.data, xte, yte, res["certify"]["images"])
    with timer("radii"), _mha_fastpath(False):
        # nn.MultiheadAttention's inference fast path (one fused kernel) has no forward-mode AD,
        # which the radii's JVP needs; the composite path computes the same function
        res["radii"] = stage_radii(model, x, y, st, records)
    vit_scores, kq = att.scores, att.keys_by_queries
    with timer("topk"):
        res["topk"] = stage_topk(vit_scores, minilm, st, records)
    with timer("fp"):
        res["fp"] = stage_fp(vit_scores, minilm, st, records)
    with timer("feedback"):
        res["feedback"] = stage_feedback(kq, records)
    with timer("appendix"):
        ders = appendix.all_derivations()
        res["appendix"] = {d.key: d.verify() for d in ders}
    with timer("render"):
        cmd = common.command_line(args, "report", [
            ("--model", None if args.model == "digits-vit1" else args.model), ("--data", args.data),
            ("--allow-pickle", args.allow_pickle), ("--out", str(args.out)), ("--quick", args.quick),
            ("--tiny", args.tiny), ("--n", args.n), ("--eps", args.eps), ("--methods", args.methods),
            ("--timeout", args.timeout if complete else None), ("--minilm", args.minilm),
            ("--workers", args.workers), ("--scheduler", args.scheduler), ("--store", args.store),
            ("--resume", args.resume), ("--device", args.device)])
        render.write_all(out, res, records, ders, cmd, timer, t_all, st)
    print(f"wrote {out}/report.md, report.tex, results.json ({len(records)} certificate records), "
          f"manifest.json in {time.perf_counter() - t_all:.0f} s; re-check: softcert check {out}/results.json")
    return 0
