"""Dataset runs of ``certify.evaluate``: one task per test image, in-process or on Dask.

A run (``Job``) is models x the first n test images x radii x methods. Each image is an
independent task, ``certify_sample``: it loads the model by name (once per process, cached),
seeds torch from (model, image) and runs ``certify.evaluate`` (PGD, every method, the
PGD cross-check) on that one image, so its records do not depend on which process runs it
or in which order (PGD's own generator is seeded per call, and a one-image batch draws the
same restarts wherever it runs). ``run`` executes the tasks

- in this process, one after another, when neither ``workers`` nor ``scheduler`` is given
  (no Dask needed: the default of ``softcert certify`` and ``softcert report``);
- on a ``dask.distributed.LocalCluster`` of ``workers`` single-threaded worker processes
  on 127.0.0.1, started and stopped by ``run`` itself;
- on an existing Dask cluster at ``scheduler`` (its workers need softcert installed and the
  model files at the same paths);

with ``Job.device`` (``--device``) the device each task bounds on; with plain ``cuda`` each
Dask worker takes its own CUDA device (``task_device``: worker i on cuda:(i mod the count));
and appends every record to the results store (``softcert.cli.store``) as its task
completes, so a killed run loses no finished image; ``resume=True`` skips the
(image, eps, method) triples already stored. The evaluations returned are rebuilt from the
store in a fixed order, so an interrupted-and-resumed run and an uninterrupted one give
the same tables (timings aside).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import socket
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from softcert import certify
from softcert.certify.options import AttackOptions
from softcert.certify.spec import check_eps
from softcert.cli import common, devices, model_formats
from softcert.cli.store import Store
from softcert.cli.store import load as load_store

__all__ = ["Job", "RunResult", "add_arguments", "certify_sample", "load", "record_from_json", "record_to_json", "run",
           "task_device", "validate_result"]

_MODELS: dict = {}  # (spec, data, allow_pickle) -> (model, x_test, y_test, label): one load per process


def load(spec: str, data: str | None = None, allow_pickle: bool = False):
    """``softcert.cli.modelio.load_model(spec, data, allow_pickle=...)``, cached for the life
    of the process."""
    from softcert.cli.modelio import load_model

    key = (_where(spec), _where(data), allow_pickle)
    hit = _MODELS.get(key)
    if hit is None:
        hit = _MODELS[key] = load_model(key[0], data=key[1], allow_pickle=allow_pickle)
    return hit


def _digest(spec):
    """The content hash of the file a model or data spec reads (an entry point's .py file)."""
    if spec is None:
        return None
    path = Path(spec)
    entry = model_formats.entry_file(spec)
    if not path.is_file() and entry is not None:
        path = Path(entry[0])
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Job:
    """What a dataset run computes: ``certify.evaluate(model, x[:n], y[:n], eps, methods,
    attack=AttackOptions(steps=attack_steps, restarts=restarts))`` for each model spec (zoo
    name or file), image by image."""

    models: tuple
    eps: tuple
    methods: tuple
    n: int
    data: str | None = None
    attack_steps: int = 40
    restarts: int = 2
    allow_pickle: bool = False
    #: where each image is bounded (``--device``; None: the CPU). Not part of the store's key:
    #: a record is sound wherever it was computed
    device: str | None = None
    #: run each method only on the images earlier ones left open (``certify.Cascade``)
    cascade: bool = False

    def __post_init__(self):
        if not self.models or not all(isinstance(m, str) for m in self.models):
            raise ValueError(f"model: expected one or more model names, got {self.models!r}")
        bound = [m for m, meth in certify.METHODS.items() if not meth.complete]
        unknown = [m for m in self.methods if m not in bound]
        if unknown or not self.methods:
            complete = [m for m in unknown if m in certify.METHODS]
            hint = (f" ({', '.join(map(repr, complete))}: branch and bound, with a time budget per sample: "
                    f"`softcert bab`)") if complete else ""
            raise ValueError(f"--methods: unknown method(s) {', '.join(map(repr, unknown)) or '(none given)'}{hint}; "
                             f"choose from {', '.join(bound)}")
        if not self.eps:
            raise ValueError("--eps: expected at least one radius")
        for e in self.eps:  # before any model loads or bar starts (issue 32)
            try:
                check_eps(e)
            except ValueError as exc:
                raise ValueError(f"--eps: {exc}") from None
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"--n: must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.cascade, bool):
            raise ValueError(f"--cascade: expected True or False, got {self.cascade!r}")

    def key(self) -> dict:
        """The run key of the store: every parameter that decides a record (files by content too)."""
        return {"command": "certify.evaluate per image", "models": list(self.models),
                "model_sha256": [_digest(m) for m in self.models], "data": self.data,
                "data_sha256": _digest(self.data), "n": self.n, "eps": [float(e) for e in self.eps],
                "methods": list(self.methods), "attack_steps": self.attack_steps, "restarts": self.restarts,
                # only when set, so that the stores of runs before the option keep their key
                **({"cascade": True} if self.cascade else {})}


def _seed(spec: str, index: int) -> int:
    return zlib.crc32(f"{spec}/{index}".encode())


def record_to_json(model: str, r) -> dict:
    """A ``certify.Record`` as a store record: its fields plus the model, and the verdicts
    spelled out (``verdict``: certified / not certified; ``pgd``: counterexample / none found /
    misclassified)."""
    d = dataclasses.asdict(r)
    d["class_margins"] = None if r.class_margins is None else list(r.class_margins)
    pgd = "misclassified" if not r.correct else ("none found" if r.robust else "counterexample")
    return {"kind": "result", "model": model, **d, "verdict": "certified" if r.certified else "not certified",
            "pgd": pgd}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _nat(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# field -> (test, what it must be): the store form of certify.Record (record_to_json)
_FIELDS = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "index": (_nat, "an integer >= 0"),
    "eps": (lambda v: _num(v) and math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "method": (lambda v: isinstance(v, str) and v in certify.METHODS, "a name in certify.METHODS"),
    "label": (_nat, "an integer >= 0"),
    "correct": (lambda v: isinstance(v, bool), "a boolean"),
    "robust": (lambda v: isinstance(v, bool), "a boolean"),
    "certified": (lambda v: isinstance(v, bool), "a boolean"),
    "lower_margin": (lambda v: v is None or _num(v), "a number or null"),
    "pgd_margin": (lambda v: v is None or _num(v), "a number or null"),
    "seconds": (lambda v: _num(v) and v >= 0, "a number >= 0"),
    "note": (lambda v: isinstance(v, str), "a string"),
    "class_margins": (lambda v: v is None or (isinstance(v, list) and all(_num(x) for x in v)),
                      "a list of numbers or null"),
    "predicted": (lambda v: v is None or _nat(v), "an integer >= 0 or null"),
    "peak_mb": (lambda v: v is None or _num(v), "a number or null"),
}
#: fields of certify.Record that stores written before them lack (record_from_json then takes
#: the Record's default): (test, what it must be)
_OPTIONAL = {"skipped": (lambda v: isinstance(v, str), "a string")}


def validate_result(d: dict) -> str | None:
    """Why ``d`` is no usable result record of the store (None: it is one), field by field.

    Checks the kind, every field of ``certify.Record`` for presence and type, and the rules a
    record of ``certify.evaluate`` obeys: a misclassified image is neither verified nor attacked
    nor robust nor certified; a certified one is correct, robust and has a positive lower margin.
    """
    if d.get("kind") != "result":
        return f"kind {d.get('kind')!r} is not 'result'"
    for name, (ok, what) in _FIELDS.items():
        if name not in d:
            return f"field {name!r} is missing"
        if not ok(d[name]):
            return f"field {name!r} = {d[name]!r} is not {what}"
    for name, (ok, what) in _OPTIONAL.items():
        if name in d and not ok(d[name]):
            return f"field {name!r} = {d[name]!r} is not {what}"
    skipped = d.get("skipped", "")
    if not d["correct"] and (d["robust"] or d["certified"] or d["lower_margin"] is not None
                             or d["pgd_margin"] is not None):
        return "a misclassified image with a verdict, a margin or a PGD outcome"
    if d["correct"] and d["pgd_margin"] is None:
        return "a correctly classified image without its PGD margin"
    if d["correct"] and d["lower_margin"] is None and not (skipped == certify.SKIP_BROKEN and not d["robust"]):
        return "a correctly classified image without its lower margin (only a cascade skips one PGD broke)"
    if d["certified"] and not (d["robust"] and d["lower_margin"] > 0):
        return "certified without PGD robustness and a positive lower margin"
    return None


def record_from_json(d: dict):
    """The ``certify.Record`` of a store record (fields it does not know are ignored)."""
    names = {f.name for f in dataclasses.fields(certify.Record)}
    kw = {k: v for k, v in d.items() if k in names}
    if kw.get("class_margins") is not None:
        kw["class_margins"] = tuple(kw["class_margins"])
    return certify.Record(**kw)


def certify_sample(job: Job, spec: str, index: int, todo) -> list:
    """The task: records (store form) of image ``index`` of model ``spec`` for the
    (eps, methods) pairs in ``todo``; one ``certify.evaluate`` call per radius, because
    PGD is run per radius with the same seed whichever radii are asked for. Each record
    also names the process that ran it (``worker``: host:pid) and the task's wall time
    (``task_seconds``, model loading and PGD included)."""
    start = time.perf_counter()
    torch.set_num_threads(1)
    model, x, y, _ = load(spec, job.data, job.allow_pickle)
    model, x, y = devices.on_device(model, x[index:index + 1], y[index:index + 1], task_device(job))
    out = []
    for eps, methods in todo:
        # anything drawing from the global generator draws per image; the caller's state is kept
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_seed(spec, index))
            ev = certify.evaluate(model, x, y, [eps], certify.Cascade(methods) if job.cascade else list(methods),
                                  attack=AttackOptions(steps=job.attack_steps, restarts=job.restarts))
        out += [record_to_json(spec, dataclasses.replace(r, index=index)) for r in ev.records]
    # where and how long the whole task ran (PGD included): the scaling model's t_task
    where = {"worker": f"{socket.gethostname()}:{os.getpid()}", "task_seconds": time.perf_counter() - start}
    return [{**r, **where} for r in out]


def task_device(job: Job) -> torch.device:
    """Where this task bounds: ``job.device`` (``devices.device_of``), on a Dask worker
    spread over the CUDA devices by the worker's index (``devices.worker_device``)."""
    return devices.worker_device(devices.device_of(job.device), worker_index())


def worker_index() -> int | None:
    """The index of the Dask worker running this task: its name when that is an integer (a
    LocalCluster names its workers 0..N-1; ``dask worker --name 3``), else None (not on a Dask
    worker, or a worker named otherwise). Dask is looked up only where a worker imported it."""
    dd = sys.modules.get("distributed")
    if dd is None:
        return None
    try:
        name = dd.get_worker().name
    except ValueError:  # distributed's "No worker found": this process runs no task of a worker
        return None
    if isinstance(name, bool):
        return None
    try:
        return int(name)
    except (TypeError, ValueError):
        return None


def _where(spec):
    # a file spec (an entry point's file too) travels to other processes as an absolute path
    # (their cwd may differ)
    if spec is None:
        return None
    path = Path(spec)
    if path.exists():
        return str(path.resolve())
    entry = model_formats.entry_file(spec)
    if entry is not None and Path(entry[0]).is_file():
        return f"{Path(entry[0]).resolve()}:{entry[1]}"
    return spec


def add_arguments(parser, default_store: str) -> None:
    """The options of a dataset run (--workers/--scheduler/--store/--resume) on an argparse parser."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, default=None, metavar="N",
                       help="run the images on a local Dask cluster of N single-threaded worker processes "
                            "(needs the dist extra); default: one after another in this process")
    where.add_argument("--scheduler", default=None, metavar="ADDRESS",
                       help="run the images on an existing Dask cluster, e.g. tcp://10.0.0.5:8786")
    parser.add_argument("--store", default=None, metavar="PATH",
                        help=f"results store, one JSON record per line, appended as each image finishes "
                             f"(default: {default_store})")
    parser.add_argument("--resume", action="store_true",
                        help="keep the records already in --store (made with the same parameters) and "
                             "compute only the missing ones")


@dataclass(frozen=True)
class RunResult:
    """``evaluations``: model spec -> ``certify.Evaluation`` rebuilt from the store;
    ``ran``/``skipped``: images computed now / already complete in the store; ``store``: its path;
    ``mode``: "in-process", "local cluster (N workers) at ADDRESS" or "scheduler ADDRESS"
    (in-process also when nothing was left to compute)."""

    evaluations: dict
    ran: int
    skipped: int
    store: str
    mode: str


def _todo(job, done, spec, index):
    todo = []
    for eps in job.eps:
        missing = tuple(m for m in job.methods if (spec, index, float(eps), m) not in done)
        if missing:  # a cascade's later methods depend on the earlier ones: the whole chain again
            todo.append((eps, tuple(job.methods) if job.cascade else missing))
    return tuple(todo)


def _evaluation(job, spec, n, records):
    ours = {}
    for d in records:
        if d.get("kind") == "result" and d.get("model") == spec:
            ours.setdefault((d["index"], float(d["eps"]), d["method"]), d)  # first copy wins
    recs = []
    for eps in job.eps:
        for meth in job.methods:
            for i in range(n):
                d = ours.get((i, float(eps), meth))
                if d is None:
                    raise ValueError(f"--store: record of image {i}, eps {eps}, method {meth} of {spec} is missing")
                recs.append(record_from_json(d))
    from softcert.certify.spec import DOMAIN

    return certify.Evaluation(tuple(recs), n, tuple(float(e) for e in job.eps), tuple(job.methods),
                              job.attack_steps, job.restarts, DOMAIN)


def _distributed():
    try:
        import dask.distributed
    except ImportError as exc:
        raise ImportError("--workers/--scheduler run on Dask, which is not installed: "
                          "pip install 'softcert[dist]' (the dist extra)") from exc
    return dask.distributed


def _dask(workers, scheduler):
    dd = _distributed()
    if scheduler is not None:
        return dd.Client(scheduler, timeout="30s"), None
    # no dashboard, and the scheduler's HTTP routes on a free loopback port (not 8787, which
    # another cluster on this machine may hold)
    # dask's nanny gives its workers MALLOC_TRIM_THRESHOLD_=65536: glibc then hands freed memory
    # back to the OS at once, and the many short-lived tensors of a bound pay for fresh pages
    # every time (mnist-vit1, crown: 1.6 s per image in such a worker against 0.4 s without;
    # docs/certify/findings.md). None unsets it for the workers this run starts.
    import dask

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        cluster = dd.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                                  silence_logs=logging.ERROR)
    try:
        return dd.Client(cluster), cluster
    except BaseException:
        cluster.close()
        raise


def run(job: Job, store_path, *, workers: int | None = None, scheduler: str | None = None,
        resume: bool = False, progress: bool = True) -> RunResult:
    """Run ``job`` (see the module docstring); records stream into the store at ``store_path``."""
    if not isinstance(job, Job):
        raise ValueError(f"job: expected a dataset.Job, got {type(job).__name__}")
    if workers is not None and scheduler is not None:
        raise ValueError("--workers/--scheduler: give one of them (a local cluster or an existing one)")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"--workers: must be an integer >= 1, got {workers!r}")
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler):
        raise ValueError(f"--scheduler: expected an address such as tcp://host:8786, got {scheduler!r}")
    if workers is not None or scheduler is not None:
        _distributed()  # before any work: a missing extra is an error at once
    # the first n images, or the whole test set when it is smaller (as x[:n] gives)
    count = {spec: min(job.n, len(load(spec, job.data, job.allow_pickle)[2])) for spec in job.models}
    with Store(store_path, job.key(), resume=resume, validate=validate_result) as store:
        done = {(d.get("model"), d.get("index"), float(d.get("eps", "nan")), d.get("method"))
                for d in store.records if d.get("kind") == "result"}
        tasks = [(spec, i, _todo(job, done, spec, i)) for spec in job.models for i in range(count[spec])]
        pending = [t for t in tasks if t[2]]
        bar = common.progress(total=len(tasks), initial=len(tasks) - len(pending), desc="certify",
                              unit="image", disable=not progress)
        mode = "in-process"
        try:
            if workers is None and scheduler is None:
                for spec, i, todo in pending:
                    for rec in certify_sample(job, spec, i, todo):
                        store.append(rec)
                    bar.update(1)
            elif pending:
                address = _on_dask(job, pending, store, bar, workers, scheduler)
                mode = f"scheduler {address}" if scheduler else f"local cluster ({workers} worker{'s' if workers != 1 else ''}) at {address}"
        finally:
            bar.close()
    records = load_store(store_path, validate_result).records
    evaluations = {spec: _evaluation(job, spec, count[spec], records) for spec in job.models}
    return RunResult(evaluations, len(pending), len(tasks) - len(pending), str(store_path), mode)


def _on_dask(job, pending, store, bar, workers, scheduler):
    as_completed = _distributed().as_completed
    client, cluster = _dask(workers, scheduler)
    futures = []
    try:
        address = client.scheduler.address
        futures = [client.submit(certify_sample, job, spec, i, todo, pure=False) for spec, i, todo in pending]
        for fut in as_completed(futures):
            for rec in fut.result():  # re-raises a task's error (SoundnessError, ValueError) here
                store.append(rec)
            fut.release()
            bar.update(1)
        return address
    finally:
        for fut in futures:
            fut.cancel()
        client.close()
        if cluster is not None:
            cluster.close()
