"""One attack -> verify -> soundness-check loop over radii and methods.

For each eps: PGD (``certify.attack``) on the correctly classified images, then every method
(``certify.verify``) on the same images, then the cross-check: a certified image that PGD
breaks, or a PGD margin below a certified lower bound, is a soundness bug and raises
``SoundnessError``. Misclassified images count as neither robust nor certified (they are
their own counterexample at eps = 0). Records are per (image, eps, method).

With ``methods=Cascade(names)`` the methods run in the order given, each only on the images left open:
correctly classified, not broken by PGD (no method can certify those) and not certified by an
earlier method, as VNN-COMP verifiers run an attack, then incomplete bounds, then stronger ones.
A method's certified count is then that of the cascade up to it; an image it did not bound
carries ``skipped`` (why) and, when certified, the earlier method's margins.
"""
from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass

import torch

from softcert.certify.api import verify
from softcert.certify.attack import attack as run_attack
from softcert.certify.attack import logits
from softcert.certify.methods import METHODS
from softcert.certify.options import AttackOptions
from softcert.certify.spec import (
    DOMAIN,
    check_domain,
    check_eps,
    check_images,
    check_labels,
)

TOLERANCE = 1e-9  # PGD margins come from float64 forward passes: their own rounding error, not the bound's


class SoundnessError(RuntimeError):
    """A certificate contradicted by an attack: a bug, never a result."""


@dataclass(frozen=True)
class Record:
    """One image at one radius under one method. ``lower_margin``: certified lower bound of
    min_{j≠y} z_y - z_j (None: not verified, the image is misclassified); ``pgd_margin``: the
    smallest margin PGD found (None likewise); ``robust``: PGD found no counterexample;
    ``seconds``: the method's wall time on the batch divided evenly over its images;
    ``class_margins``: the certified lower bound of z_y - z_j for every class j (0 at j = y),
    so that methods can be compared per (image, target) pair; ``predicted``: the model's class
    at the clean image; ``peak_mb``: the growth of the process's resident memory during the
    method's run on the batch (``PeakMemory``; the whole batch's, not divided; None without psutil);
    ``skipped``: why a cascade did not run the method on this image ("" : it ran; SKIP_BROKEN:
    PGD broke it, no lower margin; "certified by M": margins and verdict are method M's)."""

    index: int
    eps: float
    method: str
    label: int
    correct: bool
    robust: bool
    certified: bool
    lower_margin: float | None
    pgd_margin: float | None
    seconds: float
    note: str = ""
    class_margins: tuple | None = None
    predicted: int | None = None
    peak_mb: float | None = None
    skipped: str = ""


SKIP_BROKEN = "counterexample"  # Record.skipped of an image PGD broke: no method can certify it


@dataclass(frozen=True)
class Cascade:
    """``evaluate``'s methods as a cascade: ``Cascade(("ibp", "crown"))`` runs them in this order,
    each only on the images still open (module docstring)."""

    methods: tuple

    def __post_init__(self):
        if isinstance(self.methods, str) or not isinstance(self.methods, (tuple, list)):
            raise ValueError(f"Cascade.methods: expected a sequence of method names, got {self.methods!r}")
        object.__setattr__(self, "methods", tuple(self.methods))


class PeakMemory:
    """Context manager: peak resident set size (RSS) of this process minus the RSS at entry, in
    MB (2**20 bytes), by polling psutil every ``interval`` seconds in a thread. ``mb`` is None
    when psutil is not installed (it is optional: it comes with the ``dist`` extra). Polling can
    miss a spike shorter than the interval; memory freed to the allocator but not to the OS
    still counts (RSS is what the OS charges), so a run after a bigger one can show little
    growth: compare runs each in a fresh process (``softcert depth`` does)."""

    def __init__(self, interval=0.005):
        self.interval = interval
        self.mb = None
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        try:
            import psutil
        except ImportError:
            return self
        proc = psutil.Process(os.getpid())
        self._start = self._peak = proc.memory_info().rss

        def poll():
            while not self._stop.wait(self.interval):
                self._peak = max(self._peak, proc.memory_info().rss)
        self._proc = proc
        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, self._proc.memory_info().rss)
            self.mb = (self._peak - self._start) / 2**20
        return False


def certified_accuracy(records, eps, method) -> tuple:
    """(k, n): certified images and images among the records of (eps, method)."""
    rs = [r for r in records if r.eps == eps and r.method == method]
    return sum(r.certified for r in rs), len(rs)


def robust_accuracy(records, eps) -> tuple:
    """(k, n): images PGD did not break at eps (counted once per image)."""
    seen = {r.index: r.robust for r in records if r.eps == eps}
    return sum(seen.values()), len(seen)


@dataclass(frozen=True)
class Evaluation:
    """Frozen per-image records plus the settings that produced them."""

    records: tuple
    n: int
    eps: tuple
    methods: tuple
    attack_steps: int
    restarts: int
    domain: tuple

    def certified_accuracy(self, eps, method) -> tuple:
        return certified_accuracy(self.records, eps, method)

    def robust_accuracy(self, eps) -> tuple:
        return robust_accuracy(self.records, eps)

    def clean_accuracy(self) -> tuple:
        seen = {r.index: r.correct for r in self.records}
        return sum(seen.values()), len(seen)


def evaluate(model, x, y, eps_list, methods, *, attack=AttackOptions(), domain=DOMAIN, progress=None) -> Evaluation:
    """Attack, verify and cross-check ``model`` on images ``x`` with labels ``y`` for every
    eps in ``eps_list`` and every method name in ``methods`` (a sequence, or a ``Cascade``: each
    method only on the images still open, module docstring). ``attack``: the PGD of
    ``certify.attack`` (a ``certify.options.AttackOptions``, enabled, at least one restart
    and one step); each method runs with ``certify.verify``'s default batch size. ``progress``:
    optional callable progress(done, total, what), called after each attack and each method
    run."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    cascade = isinstance(methods, Cascade)
    eps_list, methods = _checked_runs(eps_list, methods.methods if cascade else methods, attack, progress)
    domain = check_domain(domain)
    x = check_images(model, x, domain)
    with torch.no_grad():
        z = logits(copy.deepcopy(model).eval(), x)
    y = check_labels(y, x.shape[0], z.shape[1], x.device)
    pred = z.argmax(1)
    correct = pred == y
    idx = torch.nonzero(correct).flatten().tolist()
    pos = {i: k for k, i in enumerate(idx)}  # image -> its position among the correct ones
    xc, yc = x[correct], y[correct]
    total, done = len(eps_list) * (1 + len(methods)), 0
    records = []
    for eps in eps_list:
        att = run_attack(model, xc, yc, eps, options=attack, domain=domain) if idx else None
        done += 1
        if progress is not None:
            progress(done, total, f"eps={eps} PGD")
        # per correctly classified image: why it is closed to the next method ("" while open)
        closed = [SKIP_BROKEN if cascade and att.status[k] == "sat" else "" for k in range(len(idx))]
        earlier = {}  # position -> the Record of the method that certified it (cascade only)
        for meth in methods:
            run = [k for k in range(len(idx)) if not closed[k]]
            res, peak = None, None
            if run:
                with PeakMemory() as mem:
                    res = verify(model, xc[run], yc[run], eps, method=meth, domain=domain)
                peak = mem.mb
                _check_sound(att, run, res, meth, eps)
            mr = _MethodRun(eps, meth, res, dict(zip(run, range(len(run)))), res.seconds / len(run) if run else 0.0,
                            peak)
            mine = [_record(i, pos.get(i), int(y[i]), int(pred[i]), att, mr, closed, earlier) for i in range(x.shape[0])]
            records += mine
            if cascade:
                for k, j in mr.ran.items():
                    if res.certified[j]:
                        closed[k], earlier[k] = f"certified by {meth}", mine[idx[k]]
            done += 1
            if progress is not None:
                progress(done, total, f"eps={eps} {meth}")
    return Evaluation(tuple(records), x.shape[0], eps_list, methods, attack.steps, attack.restarts, domain)


def _checked_runs(eps_list, methods, attack, progress):
    """(radii, method names) of ``evaluate``, each argument checked by name."""
    eps_list = tuple(check_eps(e) for e in eps_list)
    methods = tuple(methods)
    for m in methods:
        if not isinstance(m, str) or m not in METHODS:
            raise ValueError(f"methods: expected names from {', '.join(METHODS)}, got {m!r}")
    if not eps_list:
        raise ValueError("eps_list: expected at least one radius")
    if not methods:
        raise ValueError("methods: expected at least one method")
    if not isinstance(attack, AttackOptions):
        raise ValueError(f"attack: expected a certify.options.AttackOptions, got {type(attack).__name__}")
    if not attack.enabled or attack.steps < 1 or attack.restarts < 1:  # the cross-check needs the attack
        raise ValueError(f"attack: expected enabled, steps >= 1 and restarts >= 1, got {attack}")
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected a callable or None, got {type(progress).__name__}")
    return eps_list, methods


@dataclass(frozen=True)
class _MethodRun:
    """One method's verify call at one radius: ``res`` on the positions ``ran`` (position among
    the correct images -> row of ``res``), ``per`` seconds per image, ``peak`` MB."""

    eps: float
    method: str
    res: object
    ran: dict
    per: float
    peak: float | None


def _record(i, k, label, predicted, att, mr, closed, earlier):
    """The Record of image ``i`` (position ``k`` among the correct images, None if misclassified)
    under ``mr``: bounded by it, or skipped by the cascade (``closed``), with the certifying
    method's margins (``earlier``)."""
    eps, meth = mr.eps, mr.method
    if k is None:
        return Record(i, eps, meth, label, False, False, False, None, None, 0.0, predicted=predicted)
    robust, pgd = att.status[k] != "sat", float(att.min_margin[k])
    if k in mr.ran:
        j, res = mr.ran[k], mr.res
        return Record(i, eps, meth, label, True, robust, bool(res.certified[j]), float(res.worst_margin[j]), pgd,
                      mr.per, res.note, tuple(res.lower_margin[j].tolist()), predicted, mr.peak)
    if k in earlier:
        e = earlier[k]
        return Record(i, eps, meth, label, True, robust, True, e.lower_margin, pgd, 0.0, "", e.class_margins,
                      predicted, None, closed[k])
    return Record(i, eps, meth, label, True, robust, False, None, pgd, 0.0, "", None, predicted, None, closed[k])


def _check_sound(att, run, res, meth, eps):
    """No image certified by ``res`` (the method's run on positions ``run`` of the attacked
    images) may have a PGD counterexample or a PGD margin below its lower bound."""
    pgd = att.min_margin[run]
    broken = res.certified & (pgd < 0)
    if broken.any():
        where = [run[j] for j in broken.nonzero().flatten().tolist()]
        raise SoundnessError(f"soundness violation: {meth} certified images {where} at eps={eps} that PGD falsified")
    below = pgd < res.worst_margin - TOLERANCE
    if below.any():
        gap = float((res.worst_margin - pgd)[below].max())
        raise SoundnessError(f"soundness violation: a PGD margin lies {gap:.3g} below the {meth} bound at eps={eps}")
