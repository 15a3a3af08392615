"""``softcert scaling``: wall time of one dataset run (softcert.cli.dataset) in this process
and on local Dask clusters of N workers, and the model T(N) = overhead + n·t_task/N.

Each configuration certifies the same n images from a fresh results store (in a scratch
folder). t_task is the mean wall time of one image's task as the worker measured it
(``task_seconds`` in the store: PGD, every method and the cross-check); the overhead of a run
is T(N) - Σ task_seconds / N (cluster start-up, worker imports, scheduling, the client's
store appends and table, shutdown). The model takes t_task and the overhead from the 1-worker
run; it assumes N free cores. Writes scaling.md, scaling.json and scaling.png.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path

import torch

from softcert.cli import common, dataset, model_formats
from softcert.cli.store import load

MODEL_UP_TO = 8  # workers drawn for the model curve


def configure(parser):
    model_formats.add_arguments(parser, "mnist-vit1", many=False)
    parser.add_argument("--eps", type=float, default=0.01)
    parser.add_argument("--methods", nargs="+", default=["crown"], metavar="METHOD")
    parser.add_argument("--n", type=int, default=200, help="first n test images")
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2], metavar="N",
                        help="local cluster sizes to time (besides the in-process run)")
    parser.add_argument("--out", default="docs/certify")
    parser.add_argument("--note", default="", help="a remark printed under the tables (e.g. about the machine's load)")


def _timed(job, store, workers):
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    res = dataset.run(job, store, workers=workers)
    wall = time.perf_counter() - start
    records = load(store).records
    tasks = {}
    for r in records:  # every record of a task carries the task's time
        tasks.setdefault((r["model"], r["index"]), r["task_seconds"])
    busy = math.fsum(tasks.values())
    procs = len({r["worker"] for r in records})
    ev = res.evaluations[job.models[0]]
    return dict(workers=workers or 0, mode=res.mode.split(" at ")[0], wall_seconds=wall,
                tasks=len(tasks), mean_task_seconds=busy / len(tasks), busy_seconds=busy,
                overhead_seconds=wall - busy / (workers or 1), processes_used=procs,
                load_before=load_before, load_after=os.getloadavg()[0],
                certified={m: ev.certified_accuracy(job.eps[0], m)[0] for m in job.methods},
                pgd_robust=ev.robust_accuracy(job.eps[0])[0])


def run(args) -> int:
    torch.set_num_threads(1)
    if any(w < 1 for w in args.workers):
        raise ValueError("--workers: every cluster size must be >= 1")
    job = dataset.Job((args.model,), (args.eps,), tuple(args.methods), args.n, data=args.data,
                      allow_pickle=args.allow_pickle)
    dataset.load(args.model, args.data, args.allow_pickle)  # the model and its data load (or fail) first
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "scaling", [
        ("--model", args.model), ("--data", args.data), ("--allow-pickle", args.allow_pickle), ("--eps", args.eps),
        ("--methods", args.methods), ("--n", args.n), ("--workers", args.workers), ("--out", args.out)])
    runs = []
    with tempfile.TemporaryDirectory(prefix="softcert-scaling-") as scratch:
        for workers in [None, *args.workers]:
            runs.append(_timed(job, Path(scratch) / f"w{workers or 0}.jsonl", workers))
    if len({str(r["certified"]) + str(r["pgd_robust"]) for r in runs}) != 1:
        raise RuntimeError(f"the runs disagree on the results: {runs}")  # scheduling must not change a verdict
    one = next((r for r in runs if r["workers"] == 1), None)
    model = None
    if one is not None:
        t, o = one["mean_task_seconds"], one["overhead_seconds"]
        model = dict(t_task=t, overhead=o, from_run="1 worker",
                     predicted={n: o + job.n * t / n for n in range(1, MODEL_UP_TO + 1)})
    res = dict(command=command, note=args.note, model_spec=args.model, eps=args.eps, methods=list(args.methods), n=args.n,
               cores=os.cpu_count(), runs=runs, model=model, torch=torch.__version__)
    common.write_json(out / "scaling.json", res)
    _markdown(out / "scaling.md", res)
    _figure(out / "scaling.png", res)
    return 0


def _markdown(path, res):
    lines = ["# Dataset runs on Dask: time against workers", "",
             f"`{res['command']}`", "",
             f"{res['n']} test images of {res['model_spec']}, eps {res['eps']}, methods {', '.join(res['methods'])} "
             "(each image: PGD 40 steps x 2 restarts, every method, the PGD cross-check), from a fresh results "
             f"store each time; {res['cores']} cores, torch {res['torch']}, one thread per worker.", "",
             "| run | wall time T (s) | mean task t_task (s) | Σ tasks / N (s) | overhead T - Σ/N (s) | processes | load before → after |",
             "|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        n = max(1, r["workers"])
        lines.append(f"| {r['mode']} | {r['wall_seconds']:.1f} | {r['mean_task_seconds']:.3f} | "
                     f"{r['busy_seconds'] / n:.1f} | {r['overhead_seconds']:.1f} | {r['processes_used']} | "
                     f"{r['load_before']:.1f} → {r['load_after']:.1f} |")
    m = res["model"]
    if m:
        lines += ["", f"Model (from the 1-worker run): T(N) = {m['overhead']:.1f} s + {res['n']} x "
                      f"{m['t_task']:.3f} s / N, valid while N workers have N free cores.", "",
                  "| N | " + " | ".join(str(k) for k in m["predicted"]) + " |",
                  "|---|" + "---|" * len(m["predicted"]),
                  "| T(N) model (s) | " + " | ".join(f"{v:.0f}" for v in m["predicted"].values()) + " |"]
    lines += ["", "The overhead is what does not shrink with N: starting the cluster (worker processes importing "
              "torch and softcert, each loading the model once), scheduling, the client's store appends (one "
              "write and fsync per record) and the table, and shutting the cluster down. The load average "
              f"is the machine's 1-minute load; above {res['cores'] - 1} on these {res['cores']} cores the workers "
              "share cores with other processes and t_task grows with N."]
    if res["note"]:
        lines += ["", res["note"]]
    common.write_markdown(path, lines)


def _figure(path, res):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    cl = [r for r in res["runs"] if r["workers"] >= 1]
    ax.plot([r["workers"] for r in cl], [r["wall_seconds"] for r in cl], "o", label="measured (local cluster)")
    inproc = [r for r in res["runs"] if r["workers"] == 0]
    if inproc:
        ax.axhline(inproc[0]["wall_seconds"], color="k", ls=":", label="in-process, no Dask")
    if res["model"]:
        ns = list(res["model"]["predicted"])
        ax.plot(ns, list(res["model"]["predicted"].values()), "-", label="model overhead + n·t_task/N")
    ax.set_xlabel("workers N")
    ax.set_ylabel(f"seconds for {res['n']} images")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    common.save_figure(fig, path, dpi=120)
