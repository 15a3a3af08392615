"""``softcert depth``: per-image CROWN time and peak memory against model depth.

Models mnist-vit1, -vit2 (dim 32), -vit4, -vit8 (dim 64) of the zoo; methods: ours
(``crown``: ``certify.crown.propagate``'s default intermediate bounds, "full"; ``crown-sparse``:
"sparse"; ``crown-dense``: "dense", the algorithm before) and
auto_LiRPA 0.3 CROWN (``lirpa-crown``). Each (model, method) runs in a fresh subprocess on one
CPU thread, with an address-space limit (RLIMIT_AS) and a timeout; peak memory is that
process's ``ru_maxrss`` (resource.getrusage, RUSAGE_SELF), which includes the Python, torch
and model footprint measured before the first image (reported beside it). A run that exceeds
the limit or the timeout is reported as such, never dropped. Also measured: the peak memory
of ours at batch 64 on mnist-vit1. Writes depth.md, depth.json and depth.png.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from softcert.cli import common

MODELS = ("mnist-vit1", "mnist-vit2", "mnist-vit4", "mnist-vit8")
METHODS = ("crown", "crown-sparse", "crown-dense", "lirpa-crown")
MODES = {"crown": "full", "crown-sparse": "sparse", "crown-dense": "dense"}
TARGETS = {"mnist-vit4": 10.0, "mnist-vit8": 60.0}  # s / image, issue 14
BATCH_TARGET_MB = 4096.0
CLASSES = 10


def configure(parser) -> None:
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="zoo models (default: %(default)s)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--n", type=int, default=3, help="first n correctly classified test images")
    parser.add_argument("--n-deep", type=int, default=None,
                        help="images for models deeper than --compare-max-blocks (default: --n)")
    parser.add_argument("--eps", type=float, default=0.005)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per (model, method) subprocess")
    parser.add_argument("--memory-gb", type=float, default=12.0, help="RLIMIT_AS of each subprocess")
    parser.add_argument("--compare-max-blocks", type=int, default=4,
                        help="run crown-sparse and crown-dense only on models with at most this many blocks")
    parser.add_argument("--batch", type=int, default=64, help="batch of the peak-memory run on mnist-vit1 (0: skip)")
    parser.add_argument("--out", default="docs/certify")


# ----------------------------------------------------------------------------- worker
def _bounds(model, method, x, y, eps):
    """Lower margins (B, K) of ``method`` on images x (B, ...) with labels y."""
    import torch

    from softcert import certify
    from softcert.certify import crown
    from softcert.certify.spec import input_box, margin_spec

    if method == "lirpa-crown":
        return certify.verify(model, x, y, eps, method="lirpa-crown",
                              options=certify.BoundOptions(batch_size=1)).lower_margin
    graph = certify.graph_of(model, x[:1])
    lo, hi = input_box(x, eps)
    mode = MODES[method]
    with torch.no_grad():
        state = crown.propagate(graph, lo.unsqueeze(1), hi.unsqueeze(1), centre=x.unsqueeze(1),
                                options=certify.PropagationOptions(intermediate=mode))
        C = margin_spec(y, CLASSES).reshape(x.shape[0], CLASSES, *graph.nodes[graph.output].shape)
        return crown.backward(state, graph.output, C)


def blocks_of(model: str) -> int:
    """Blocks of a zoo model: a natural recipe's, or a certifiably trained one's (its recipe's
    architecture, certify.train.CERTIFIED); ValueError naming an unknown one."""
    from softcert.certify.train import CERTIFIED, RECIPES

    recipe = CERTIFIED[model][0] if model in CERTIFIED else model
    if recipe not in RECIPES:
        raise ValueError(f"models: unknown zoo model {model!r} (choose from {', '.join([*RECIPES, *CERTIFIED])})")
    return RECIPES[recipe][1]["depth"]


def measure(cfg) -> dict:
    """Run one configuration in this process (called in a fresh subprocess): ``cfg`` has
    model, method, n, eps, batch (0: one image per call), memory_gb."""
    import resource
    import time

    limit = int(cfg["memory_gb"] * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    from softcert.certify import zoo

    torch.set_num_threads(1)
    model, X, y = zoo.load(cfg["model"])
    with torch.no_grad():
        correct = (model(X[: 4 * max(cfg["n"], cfg["batch"])]).argmax(1) == y[: 4 * max(cfg["n"], cfg["batch"])])
    idx = correct.nonzero().flatten()
    x, lab = X.to(torch.float64), y
    if cfg["method"] != "lirpa-crown":
        from softcert import certify

        certify.graph_of(model, x[idx[:1]])  # trace once, outside the timed calls (cached)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = dict(cfg, baseline_mb=base, seconds=[], cpu_seconds=[], min_margin=[])
    groups = [idx[: cfg["batch"]]] if cfg["batch"] else [idx[k: k + 1] for k in range(cfg["n"])]
    try:
        for g in groups:
            t, c = time.perf_counter(), time.process_time()
            lm = _bounds(model, cfg["method"], x[g], lab[g], cfg["eps"])
            out["seconds"].append(time.perf_counter() - t)
            out["cpu_seconds"].append(time.process_time() - c)
            m = lm.clone()
            m[torch.arange(len(g)), lab[g]] = torch.inf
            out["min_margin"].extend(m.min(1).values.tolist())
        out["status"] = "ok"
    except MemoryError as e:
        out["status"], out["error"] = "out of memory", repr(e)[:300]
    except RuntimeError as e:  # torch reports a failed allocation as RuntimeError
        alloc = "alloc" in str(e).lower() or "memory" in str(e).lower()
        out["status"], out["error"] = ("out of memory" if alloc else "error"), repr(e)[:300]
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _spawn(cfg, timeout) -> dict:
    root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    code = ("import json, sys; from softcert.cli.commands.depth import measure; "
            "print(json.dumps(measure(json.loads(sys.argv[1]))))")
    try:
        p = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(cfg, status="timeout", error=f"no result within {timeout:g} s")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1])
    return dict(cfg, **failure(p.returncode, p.stderr))


def failure(returncode, stderr) -> dict:
    """status and error of a subprocess that gave no result: killed by a signal (the kernel's
    OOM killer) or failing on an allocation is "out of memory", anything else "error"."""
    tail = (stderr.strip().splitlines() or [""])[-1][:300]
    text = stderr.lower()
    oom = returncode < 0 or "memoryerror" in text or "can't allocate memory" in text or "cannot allocate" in text
    return dict(status="out of memory" if oom else "error", error=f"exit {returncode}: {tail}")


# ----------------------------------------------------------------------------- command
def run(args) -> int:
    if args.n < 1:
        raise ValueError(f"n: expected >= 1, got {args.n}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = common.command_line(args, "depth", [("--models", args.models), ("--methods", args.methods),
                                                  ("--n", args.n), ("--n-deep", args.n_deep), ("--eps", args.eps),
                                                  ("--timeout", args.timeout), ("--memory-gb", args.memory_gb),
                                                  ("--compare-max-blocks", args.compare_max_blocks),
                                                  ("--batch", args.batch), ("--out", args.out)])
    for m in args.models:
        blocks_of(m)  # an unknown name fails here, before any job
    deep = lambda m: blocks_of(m) > args.compare_max_blocks  # noqa: E731
    n_deep = args.n if args.n_deep is None else args.n_deep

    def job(m, meth, batch=0):
        n = batch or (n_deep if deep(m) else args.n)
        return dict(model=m, method=meth, n=n, eps=args.eps, batch=batch, memory_gb=args.memory_gb)

    # most informative first (ours against depth, the batch-64 memory, the baseline, then the
    # comparisons of our modes); results are written after every job, so an interrupted run
    # keeps what it finished
    jobs = [job(m, "crown") for m in args.models if "crown" in args.methods]
    if args.batch:
        jobs.insert(min(2, len(jobs)), job("mnist-vit1", "crown", args.batch))
    jobs += [job(m, meth) for meth in args.methods if meth != "crown" for m in args.models
             if not (meth in ("crown-sparse", "crown-dense") and deep(m))]
    rows = []
    for spec in common.progress(jobs, desc="depth"):
        r = _spawn(spec, args.timeout)
        r["blocks"] = blocks_of(r["model"])
        rows.append(r)
        print(_line(r), flush=True)
        common.write_json(out / "depth.json", {"command": command, "rows": rows})
        _write(out, rows, command)
    return 0


def _mean(v):
    return sum(v) / len(v) if v else None


def _line(r):
    if r["status"] != "ok":
        return f"{r['model']} {r['method']} batch {r['batch']}: {r['status']} ({r.get('error', '')})"
    return (f"{r['model']} {r['method']} batch {r['batch']}: {_mean(r['seconds']):.3g} s / call, "
            f"peak {r['peak_mb']:.0f} MB")


def _write(out, rows, command):
    per = [r for r in rows if not r["batch"]]
    lines = ["# CROWN time and peak memory against depth", "",
             f"Regenerate: `{command}`", "",
             "Per-image wall and CPU time (one CPU thread, the first correctly classified test images, L∞",
             "eps clipped to [0, 1]) and peak resident memory of the process running the configuration",
             "(a fresh subprocess each: `ru_maxrss` of resource.getrusage(RUSAGE_SELF); `base MB` is the",
             "same measure just before the first image: Python, torch and the model). Ours, by",
             "`certify.crown.propagate(..., options=PropagationOptions(intermediate=...))`: `crown` = \"full\" (the default: every",
             "element not already exact, cache-sized chunks), `crown-sparse` = \"sparse\" (also skips",
             "elements whose relaxation IBP already decides, e.g. stable ReLUs), `crown-dense` = \"dense\"",
             "(the algorithm before: [I; -I] over every element). `lirpa-crown`: auto_LiRPA 0.3 CROWN",
             "(float32). Timings are from a",
             "shared 2-core machine: wall time includes waiting for the CPU (compare CPU time).", "",
             "| model | blocks | method | status | images | s / image (wall) | s / image (CPU) | max s | "
             "peak MB | base MB | min lower margin |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in per:
        if r["status"] == "ok":
            lines.append(f"| {r['model']} | {r['blocks']} | {r['method']} | ok | {len(r['seconds'])} | "
                         f"{_mean(r['seconds']):.3g} | {_mean(r['cpu_seconds']):.3g} | {max(r['seconds']):.3g} | "
                         f"{r['peak_mb']:.0f} | {r['baseline_mb']:.0f} | {min(r['min_margin']):.4g} |")
        else:
            lines.append(f"| {r['model']} | {r['blocks']} | {r['method']} | {r['status']} | – | – | – | – | – | – | "
                         f"– |")
    lines += ["", "## Targets (issue 14)", ""]
    for model, target in TARGETS.items():
        r = next((r for r in per if r["model"] == model and r["method"] == "crown"), None)
        got = "not run" if r is None else (r["status"] if r["status"] != "ok" else
                                           f"{_mean(r['seconds']):.3g} s wall, {_mean(r['cpu_seconds']):.3g} s CPU")
        lines.append(f"- CROWN on {model}: target <= {target:g} s / image; measured {got}")
    for r in rows:
        if r["batch"]:
            got = r["status"] if r["status"] != "ok" else f"{r['peak_mb']:.0f} MB ({r['peak_mb'] - r['baseline_mb']:.0f} " \
                                                            f"MB above the {r['baseline_mb']:.0f} MB base)"
            lines.append(f"- peak memory of ours at batch {r['batch']} on {r['model']}: target < "
                         f"{BATCH_TARGET_MB:g} MB; measured {got}")
    fails = [r for r in rows if r["status"] != "ok"]
    if fails:
        lines += ["", "## Runs without a result", ""]
        lines += [f"- {r['model']} {r['method']}: {r['status']}: {r.get('error', '')}" for r in fails]
    common.write_markdown(out / "depth.md", lines)
    plt = common.pyplot()
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 3.8))
    for meth in dict.fromkeys(r["method"] for r in per):
        rs = [r for r in per if r["method"] == meth]
        ok = [r for r in rs if r["status"] == "ok"]
        line, = ax_t.plot([r["blocks"] for r in ok], [_mean(r["seconds"]) for r in ok], marker="o", label=meth)
        ax_m.plot([r["blocks"] for r in ok], [r["peak_mb"] for r in ok], marker="o", label=meth, color=line.get_color())
        for r in rs:
            if r["status"] != "ok":
                ax_m.annotate(f"{meth}: {r['status']}", (r["blocks"], 0), textcoords="offset points",
                              xytext=(0, 10 + 12 * list(METHODS).index(meth)), fontsize=7, color=line.get_color(),
                              ha="center")
    for model, target in TARGETS.items():
        blocks = next((r["blocks"] for r in per if r["model"] == model), None)
        if blocks is not None:
            ax_t.plot([blocks], [target], "k_", markersize=14)
    ax_t.set_yscale("log")
    ax_t.set_xlabel("blocks")
    ax_t.set_ylabel("s / image (wall, 1 thread)")
    ax_t.set_title("CROWN time (black bars: targets)")
    ax_m.set_xlabel("blocks")
    ax_m.set_ylabel("peak RSS (MB)")
    ax_m.set_title("peak memory (ru_maxrss)")
    ax_m.set_ylim(bottom=0)
    ax_t.legend(fontsize=7)
    common.save_figure(fig, out / "depth.png", dpi=120)
