"""One attack -> verify -> soundness-check loop over radii and methods.

For each eps: PGD (``certify.attack``) on the correctly classified images, then every method
(``certify.verify``) on the same images, then the cross-check: a certified image that PGD
breaks, or a PGD margin below a certified lower bound, is a soundness bug and raises
``SoundnessError``. Misclassified images count as neither robust nor certified (they are
their own counterexample at eps = 0). Records are per (image, eps, method).
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
    method's run on the batch (``PeakMemory``; the whole batch's, not divided; None without psutil)."""

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
    eps in ``eps_list`` and every method name in ``methods``. ``attack``: the PGD of
    ``certify.attack`` (a ``certify.options.AttackOptions``, enabled, at least one restart
    and one step); each method runs with ``certify.verify``'s default batch size. ``progress``:
    optional callable progress(done, total, what), called after each attack and each method
    run."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
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
    domain = check_domain(domain)
    x = check_images(model, x, domain)
    with torch.no_grad():
        z = logits(copy.deepcopy(model).eval(), x)
    y = check_labels(y, x.shape[0], z.shape[1], x.device)
    pred = z.argmax(1)
    correct = pred == y
    idx = torch.nonzero(correct).flatten().tolist()
    xc, yc = x[correct], y[correct]
    total, done = len(eps_list) * (1 + len(methods)), 0
    records = []
    for eps in eps_list:
        att = run_attack(model, xc, yc, eps, options=attack, domain=domain) if idx else None
        done += 1
        if progress is not None:
            progress(done, total, f"eps={eps} PGD")
        for meth in methods:
            res, peak = None, None
            if idx:
                with PeakMemory() as mem:
                    res = verify(model, xc, yc, eps, method=meth, domain=domain)
                peak = mem.mb
            if res is not None:
                _check_sound(att, res, meth, eps)
            per = res.seconds / len(idx) if idx else 0.0
            at = dict(zip(idx, range(len(idx))))
            for i in range(x.shape[0]):
                k = at.get(i)
                if k is None:
                    records.append(Record(i, eps, meth, int(y[i]), False, False, False, None, None, 0.0,
                                          predicted=int(pred[i])))
                    continue
                records.append(Record(i, eps, meth, int(y[i]), True, att.status[k] != "sat",
                                      bool(res.certified[k]), float(res.worst_margin[k]),
                                      float(att.min_margin[k]), per, res.note,
                                      tuple(res.lower_margin[k].tolist()), int(pred[i]), peak))
            done += 1
            if progress is not None:
                progress(done, total, f"eps={eps} {meth}")
    return Evaluation(tuple(records), x.shape[0], eps_list, methods, attack.steps, attack.restarts, domain)


def _check_sound(att, res, meth, eps):
    broken = res.certified & (att.min_margin < 0)
    if broken.any():
        raise SoundnessError(f"soundness violation: {meth} certified images {broken.nonzero().flatten().tolist()} "
                             f"at eps={eps} that PGD falsified")
    below = att.min_margin < res.worst_margin - TOLERANCE
    if below.any():
        gap = float((res.worst_margin - att.min_margin)[below].max())
        raise SoundnessError(f"soundness violation: a PGD margin lies {gap:.3g} below the {meth} bound at eps={eps}")
