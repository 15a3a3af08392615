"""``softcert ghosts``: the ghosts-of-softmax experiments on sklearn digits.

- ``sweep``: normalised-step sweep. At several training stages, along the descent direction
  and random unit directions v, step theta + r rho_a v and record L(after)/L(before) on a fixed
  batch; rho_a = pi / max_x Delta_a(x; v) (analysis.ghosts "pi" bound). "Failure" = the loss
  ratio exceeds ``--fail-ratio`` (default 2).
- ``spike``: Adam, batch 64, LR multiplied by a factor from step 50; plain vs gradient clipping
  (||g|| <= 1) vs SafeStep (r = 1); median final test accuracy over seeds.
- ``temperature``: logits z/T, T in {0.25, ..., 8}; onset of failure along the descent
  direction in raw step size tau* and in r* = tau*/rho_a; spread = std of log10 over T.
- ``bench``: step time of SafeStep-wrapped Adam over bare Adam (same run, interleaved).
Each writes <name>.json, <name>.md (with the regenerating command) and <name>.png to --out.
Data: sklearn digits, flattened, a quarter held out by a torch permutation
(``certify.data.digits(449, flat=True, split="torch")``: the split of the committed docs/ghosts).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from softcert.analysis.ghosts import batch_radius
from softcert.analysis.ghosts_models import ARCHITECTURES, make_model
from softcert.analysis.safestep import SafeStep, logit_slopes, measurement_mode
from softcert.certify.data import digits
from softcert.cli import common

EXPERIMENTS = ("sweep", "spike", "temperature", "bench")
R_GRID = (0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0)
TEMPERATURES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
SPIKES = (10.0, 100.0, 1000.0, 10000.0)
METHODS = ("plain", "clip", "controller")


def _progress(total, desc):
    return common.progress(total=total, desc=desc, leave=False)


GHOSTS_TEST = 449  # a quarter of the 1,797 digits held out: the split of the committed docs/ghosts


def load_digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test): float32 (N, 64) in [0, 1], int64 labels; the
    torch-permutation split of ``certify.data.digits`` under ``seed``."""
    return digits(GHOSTS_TEST, seed=seed, flat=True, split="torch")


def _train(model, data, steps, lr=1e-3, seed=0, spike=1.0, spike_at=50, method="plain"):
    x_tr, y_tr = data[0], data[1]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    if method == "controller":
        opt = SafeStep(opt, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: spike if s >= spike_at else 1.0)
    g = torch.Generator().manual_seed(1000 + seed)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(y_tr), (64,), generator=g)
        loss = F.cross_entropy(model(x_tr[idx]), y_tr[idx])
        opt.zero_grad()
        loss.backward()
        if method == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    if method == "controller":
        opt.remove_hook()
    return model


def _accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def _loss_at(model, names, theta, x, y, temperature=1.0):
    """Cross-entropy at parameters ``theta`` in training mode (batch statistics, no stat update)."""
    with torch.no_grad(), measurement_mode(model):
        out = torch.func.functional_call(model, dict(zip(names, theta)), (x,))
        return F.cross_entropy(out / temperature, y).item()


def _directions(model, x, y, n_random, gen, temperature=1.0):
    names = [n for n, _ in model.named_parameters()]
    model.zero_grad()
    with measurement_mode(model):
        F.cross_entropy(model(x) / temperature, y).backward()
    g = [p.grad.detach().clone() for p in model.parameters()]
    gn = math.sqrt(sum(float(t.pow(2).sum()) for t in g))
    dirs = {"gradient": [-t / gn for t in g]}
    for k in range(n_random):
        v = [torch.randn(p.shape, generator=gen) for p in model.parameters()]
        vn = math.sqrt(sum(float(t.pow(2).sum()) for t in v))
        dirs[f"random{k}"] = [t / vn for t in v]
    model.zero_grad()
    return names, dirs


def _rho(model, names, v, x, temperature=1.0):
    z, a = logit_slopes(model, dict(zip(names, v)), (x,))
    return batch_radius(z / temperature, a / temperature, "pi")


# ---------------------------------------------------------------- (a) sweep


def run_sweep(archs, stages, n_random, fail_ratio, seed=0, progress=True, stale=0):
    """``stale=k > 0``: the radius of each direction is measured k training steps before the
    stage (the same random directions; the descent direction of that earlier point) and the
    sweep steps r * rho_stale along the current direction, as SafeStep(reuse_steps=k) may do
    for a step it does not measure; stages below k move to k."""
    data = load_digits_split(seed)
    x, y = data[0][:256], data[1][:256]
    gen = torch.Generator().manual_seed(seed)
    rows = []
    if stale:
        stages = sorted({max(s, stale) for s in stages})
    bar = _progress(len(archs) * len(stages), "sweep") if progress else None
    for arch in archs:
        model = make_model(arch, seed)
        done = 0
        for stage in stages:
            stale_rho = None
            if stale:
                _train(model, data, stage - stale - done, seed=seed)
                names, dirs = _directions(model, x, y, n_random, gen)
                stale_rho = {d: _rho(model, names, v, x) for d, v in dirs.items()}
                _train(model, data, stale, seed=seed + 1)
                randoms = {d: v for d, v in dirs.items() if d != "gradient"}
                names, dirs = _directions(model, x, y, 0, None)
                dirs.update(randoms)
            else:
                _train(model, data, stage - done, seed=seed)
                names, dirs = _directions(model, x, y, n_random, gen)
            done = stage
            theta0 = [p.detach().clone() for p in model.parameters()]
            base = _loss_at(model, names, theta0, x, y)
            for dname, v in dirs.items():
                rho = _rho(model, names, v, x)
                step_rho = rho if stale_rho is None else stale_rho[dname]
                ratios = []
                for r in R_GRID:
                    theta = [t + r * step_rho * d for t, d in zip(theta0, v)]
                    ratios.append(_loss_at(model, names, theta, x, y) / base)
                onset = next((r for r, q in zip(R_GRID, ratios) if not q <= fail_ratio), None)
                row = {"arch": arch, "stage": stage, "direction": dname, "rho_a": step_rho,
                       "loss": base, "ratios": ratios, "onset_r": onset,
                       "max_ratio_below_1": max(q for r, q in zip(R_GRID, ratios) if r < 1)}
                if stale_rho is not None:
                    row["rho_fresh"] = rho
                rows.append(row)
            if bar:
                bar.update()
    if bar:
        bar.close()
    return {"r_grid": list(R_GRID), "fail_ratio": fail_ratio, "stale": stale, "rows": rows}


# ---------------------------------------------------------------- (b) spike


def _spike_accuracy(arch, spike, method, seed, steps, threads=None):
    """Final test accuracy of one LR-spike run (a top-level function: it runs in worker
    processes too; each run seeds its own model and batch order, so the order of runs and the
    process they run in do not change the result)."""
    if threads is not None:
        torch.set_num_threads(threads)
    data = load_digits_split(0)
    torch.manual_seed(seed)
    model = _train(make_model(arch, seed), data, steps, seed=seed, spike=spike, method=method)
    acc = _accuracy(model, data[2], data[3])
    return acc if math.isfinite(acc) else 0.0


def run_spike(archs, spikes, seeds, steps, progress=True, jobs=1):
    """``jobs`` > 1: the runs are spread over that many worker processes (spawned, one torch
    thread each); the table is the same."""
    runs = [(arch, spike, method, seed) for arch in archs for spike in spikes for method in METHODS
            for seed in seeds]
    bar = _progress(len(runs), "spike") if progress else None
    accs = {}
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # fork after torch's thread pools start is unsafe
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            futures = {pool.submit(_spike_accuracy, *r, steps, torch.get_num_threads()): r for r in runs}
            for f in concurrent.futures.as_completed(futures):
                accs[futures[f]] = f.result()
                if bar:
                    bar.update()
    else:
        for r in runs:
            accs[r] = _spike_accuracy(*r, steps)
            if bar:
                bar.update()
    if bar:
        bar.close()
    out = []
    for arch in archs:
        for spike in spikes:
            for method in METHODS:
                a = [accs[(arch, spike, method, seed)] for seed in seeds]
                out.append({"arch": arch, "spike": spike, "method": method, "accuracies": a,
                            "median": statistics.median(a)})
    return {"steps": steps, "seeds": list(seeds), "rows": out}


# ---------------------------------------------------------------- (c) temperature


def run_temperature(archs, temps, stage, fail_ratio, seed=0, progress=True):
    data = load_digits_split(seed)
    x, y = data[0][:256], data[1][:256]
    taus = np.logspace(-3, 3, 73)
    rows = []
    bar = _progress(len(archs) * len(temps), "temperature") if progress else None
    for arch in archs:
        model = _train(make_model(arch, seed), data, stage, seed=seed)
        theta0 = [p.detach().clone() for p in model.parameters()]
        for T in temps:
            names, dirs = _directions(model, x, y, 0, None, temperature=T)
            v = dirs["gradient"]
            rho = _rho(model, names, v, x, temperature=T)
            base = _loss_at(model, names, theta0, x, y, T)
            onset = None
            for tau in taus:
                theta = [t + float(tau) * d for t, d in zip(theta0, v)]
                if not _loss_at(model, names, theta, x, y, T) / base <= fail_ratio:
                    onset = float(tau)
                    break
            rows.append({"arch": arch, "T": T, "rho_a": rho, "onset_tau": onset,
                         "onset_r": None if onset is None else onset / rho})
            if bar:
                bar.update()
    if bar:
        bar.close()
    spread = {}
    for arch in archs + ["all"]:
        sel = [r for r in rows if (arch == "all" or r["arch"] == arch) and r["onset_tau"]]
        if len(sel) >= 2:
            spread[arch] = {"std_log10_tau": float(np.std([math.log10(r["onset_tau"]) for r in sel])),
                            "std_log10_r": float(np.std([math.log10(r["onset_r"]) for r in sel]))}
    return {"stage": stage, "fail_ratio": fail_ratio, "tau_grid": [float(taus[0]), float(taus[-1]), len(taus)],
            "rows": rows, "spread": spread}


# ---------------------------------------------------------------- bench


BENCH_VARIANTS = {"bare": None, "safestep": {}, "reuse": {"reuse_steps": 4}}


def run_bench(archs, steps, progress=True, previous=None):
    """Median step time of Adam, SafeStep(Adam) (every step measured) and
    SafeStep(Adam, reuse_steps=4) (the weaker variant), interleaved in one run (the order
    rotates every step). Each step is timed in process CPU time (what the step costs; other
    jobs on a shared machine inflate wall time, not this) and in wall time.
    ``previous``: arch -> ratio of an earlier run, shown beside the new."""
    data = load_digits_split(0)
    rows = []
    bar = _progress(len(archs), "bench") if progress else None
    for arch in archs:
        times = {k: [] for k in BENCH_VARIANTS}
        walls = {k: [] for k in BENCH_VARIANTS}
        models = {k: make_model(arch, 0) for k in BENCH_VARIANTS}
        opts = {}
        for k, kw in BENCH_VARIANTS.items():
            opts[k] = torch.optim.Adam(models[k].parameters(), 1e-3)
            if kw is not None:
                opts[k] = SafeStep(opts[k], models[k], **kw)
        order = list(BENCH_VARIANTS)
        g = torch.Generator().manual_seed(0)
        for i in range(steps + 5):
            idx = torch.randint(0, len(data[1]), (64,), generator=g)
            for k in order[i % 3:] + order[:i % 3]:
                w0, t0 = time.perf_counter(), time.process_time()
                loss = F.cross_entropy(models[k](data[0][idx]), data[1][idx])
                opts[k].zero_grad()
                loss.backward()
                opts[k].step()
                if i >= 5:  # warm-up excluded
                    times[k].append(time.process_time() - t0)
                    walls[k].append(time.perf_counter() - w0)
        med = {k: statistics.median(v) for k, v in times.items()}
        wall = {k: statistics.median(v) for k, v in walls.items()}
        rows.append({"arch": arch, "bare_ms": 1e3 * med["bare"], "safestep_ms": 1e3 * med["safestep"],
                     "ratio": med["safestep"] / med["bare"], "reuse_ms": 1e3 * med["reuse"],
                     "reuse_ratio": med["reuse"] / med["bare"],
                     "wall_ratio": wall["safestep"] / wall["bare"], "wall_reuse_ratio": wall["reuse"] / wall["bare"],
                     "previous_ratio": (previous or {}).get(arch)})
        for o in opts.values():
            if isinstance(o, SafeStep):
                o.remove_hook()
        if bar:
            bar.update()
    if bar:
        bar.close()
    return {"steps": steps, "batch": 64, "threads": torch.get_num_threads(), "rows": rows}


# ---------------------------------------------------------------- reports


def _md_sweep(res):
    k = res.get("stale", 0)
    lines = [f"Failure = loss ratio L(theta + r rho_a v)/L(theta) > {res['fail_ratio']} on a fixed batch "
             "of 256 training images."]
    if k:
        lines += ["", f"Stale radius: rho_a of each direction measured {k} Adam steps before the stage (the "
                  "descent direction of that point; the same random directions), then the sweep steps "
                  f"r rho_stale along the current direction: what SafeStep(reuse_steps={k}) assumes for "
                  "the steps it does not measure (it skips the JVP only when r <= reuse_margin = 0.5)."]
    lines += ["", "| model | stage | direction | rho_a | max ratio, r < 1 | failure onset r |"
              + (" rho_fresh / rho_stale |" if k else ""),
              "|---|---|---|---|---|---|" + ("---|" if k else "")]
    for r in res["rows"]:
        onset = "none <= 32" if r["onset_r"] is None else f"{r['onset_r']:g}"
        extra = f" {r['rho_fresh'] / r['rho_a']:.3g} |" if k else ""
        lines.append(f"| {r['arch']} | {r['stage']} | {r['direction']} | {r['rho_a']:.3g} | "
                     f"{r['max_ratio_below_1']:.3f} | {onset} |" + extra)
    if k:
        q = [r["rho_fresh"] / r["rho_a"] for r in res["rows"]]
        half = [r for r in res["rows"] if r["onset_r"] is not None and r["onset_r"] <= 0.5]
        lines += ["", f"Runs failing at r <= 0.5 (a step reuse_steps would skip): {len(half)} of "
                  f"{len(res['rows'])}. rho_fresh / rho_stale: min {min(q):.3g}, median "
                  f"{statistics.median(q):.3g}; below 0.5 in {sum(v < 0.5 for v in q)} of {len(q)} runs."]
    fails = [r for r in res["rows"] if r["onset_r"] is not None and r["onset_r"] < 1]
    onsets = [r["onset_r"] for r in res["rows"] if r["onset_r"] is not None]
    lines += ["", f"Runs failing at r < 1: {len(fails)} of {len(res['rows'])}. "
              f"Smallest failure onset: {min(onsets) if onsets else 'none'}; "
              f"median onset (over runs that fail at all): "
              f"{statistics.median(onsets) if onsets else 'none'}."]
    return lines


def _md_spike(res):
    spikes = sorted({r["spike"] for r in res["rows"]})
    lines = [f"Median final test accuracy (%) over seeds {res['seeds']}, {res['steps']} Adam steps "
             "(lr 1e-3, batch 64), LR x factor from step 50. Cells: plain / clip / controller.", "",
             "| model | " + " | ".join(f"x{s:g}" for s in spikes) + " |", "|---|" + "---|" * len(spikes)]
    for arch in dict.fromkeys(r["arch"] for r in res["rows"]):
        cells = []
        for s in spikes:
            med = {r["method"]: r["median"] for r in res["rows"] if r["arch"] == arch and r["spike"] == s}
            cells.append(" / ".join(f"{100 * med[m]:.1f}" for m in METHODS))
        lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    return lines


def _md_temperature(res):
    lines = [f"Onset = smallest step tau on a log grid (1e-3..1e3, 73 points) along the descent "
             f"direction with loss ratio > {res['fail_ratio']}; models trained {res['stage']} steps.", "",
             "| model | T | rho_a | onset tau* | onset r* = tau*/rho_a |", "|---|---|---|---|---|"]
    for r in res["rows"]:
        tau = "none" if r["onset_tau"] is None else f"{r['onset_tau']:.3g}"
        rr = "none" if r["onset_r"] is None else f"{r['onset_r']:.3g}"
        lines.append(f"| {r['arch']} | {r['T']:g} | {r['rho_a']:.3g} | {tau} | {rr} |")
    lines += ["", "| model | std log10 tau* over T | std log10 r* over T |", "|---|---|---|"]
    for arch, s in res["spread"].items():
        lines.append(f"| {arch} | {s['std_log10_tau']:.3f} | {s['std_log10_r']:.3f} |")
    return lines


def _md_bench(res):
    lines = [f"Median step time (forward + backward + step) in process CPU time, batch {res['batch']}, "
             f"{res['steps']} interleaved steps, {res['threads']} thread(s); ratios over Adam measured in this "
             "run (wall-time ratios in brackets). \"before\": the ratio of the report this one replaced "
             "(its own run, wall time).", "",
             "| model | Adam (ms) | SafeStep(Adam) (ms) | ratio | ratio before | reuse_steps=4 (ms) | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        before = "" if r.get("previous_ratio") is None else f"{r['previous_ratio']:.2f}"
        wall = f" ({r['wall_ratio']:.2f})" if "wall_ratio" in r else ""
        reuse = (f"{r['reuse_ms']:.2f} | {r['reuse_ratio']:.2f} ({r['wall_reuse_ratio']:.2f})"
                 if "reuse_ms" in r else " | ")
        lines.append(f"| {r['arch']} | {r['bare_ms']:.2f} | {r['safestep_ms']:.2f} | {r['ratio']:.2f}{wall} | "
                     f"{before} | {reuse} |")
    return lines


def _plot(name, res, path):
    plt = common.pyplot()
    if name == "sweep":
        archs = list(dict.fromkeys(r["arch"] for r in res["rows"]))
        fig, axes = plt.subplots(2, 3, figsize=(12, 7), sharex=True)
        for ax, arch in zip(axes.ravel(), archs):
            for r in (q for q in res["rows"] if q["arch"] == arch):
                ax.loglog(res["r_grid"], r["ratios"], color="C0" if r["direction"] == "gradient" else "C1",
                          alpha=0.7)
            ax.axvline(1.0, color="k", ls="--", lw=1)
            ax.axhline(res["fail_ratio"], color="r", ls=":", lw=1)
            ax.set_title(arch)
            ax.set_xlabel("r = step / rho_a")
        axes[0, 0].set_ylabel("loss ratio")
        fig.suptitle("Normalised-step sweep (blue: descent, orange: random directions)")
    elif name == "spike":
        archs = list(dict.fromkeys(r["arch"] for r in res["rows"]))
        spikes = sorted({r["spike"] for r in res["rows"]})
        fig, axes = plt.subplots(2, 3, figsize=(12, 7), sharey=True)
        for ax, arch in zip(axes.ravel(), archs):
            for k, m in enumerate(METHODS):
                med = [next(r["median"] for r in res["rows"] if r["arch"] == arch and r["spike"] == s
                            and r["method"] == m) for s in spikes]
                ax.bar(np.arange(len(spikes)) + 0.27 * (k - 1), [100 * v for v in med], 0.27, label=m)
            ax.set_xticks(range(len(spikes)), [f"x{s:g}" for s in spikes])
            ax.set_title(arch)
        axes[0, 0].set_ylabel("median test accuracy (%)")
        axes[0, 0].legend()
        fig.suptitle("LR-spike test")
    elif name == "temperature":
        archs = list(dict.fromkeys(r["arch"] for r in res["rows"]))
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for arch in archs:
            sel = [r for r in res["rows"] if r["arch"] == arch and r["onset_tau"]]
            axes[0].loglog([r["T"] for r in sel], [r["onset_tau"] for r in sel], "o-", label=arch)
            axes[1].loglog([r["T"] for r in sel], [r["onset_r"] for r in sel], "o-", label=arch)
        axes[0].set_title("onset in raw step tau*")
        axes[1].set_title("onset in r* = tau*/rho_a")
        for ax in axes:
            ax.set_xlabel("temperature T")
        axes[1].axhline(1.0, color="k", ls="--", lw=1)
        axes[0].legend(fontsize=7)
    else:
        fig, ax = plt.subplots(figsize=(8, 4))
        pos = np.arange(len(res["rows"]))
        series = [("ratio before", "previous_ratio"), ("SafeStep", "ratio"), ("reuse_steps=4", "reuse_ratio")]
        for k, (label, key) in enumerate(series):
            ax.bar(pos + 0.27 * (k - 1), [r.get(key) or 0.0 for r in res["rows"]], 0.27, label=label)
        ax.set_xticks(pos, [r["arch"] for r in res["rows"]])
        ax.axhline(1.3, color="r", ls="--", lw=1, label="target 1.3")
        ax.set_ylabel("SafeStep / Adam step time")
        ax.legend()
    common.save_figure(fig, path, dpi=110)


def write_report(name, res, out: Path, command: str, seconds: float):
    out.mkdir(parents=True, exist_ok=True)
    res = dict(res, command=command, seconds=round(seconds, 1))
    common.write_json(out / f"{name}.json", res)
    body = {"sweep": _md_sweep, "spike": _md_spike, "temperature": _md_temperature, "bench": _md_bench}[name](res)
    title = {"sweep": "(a) Normalised-step sweep", "spike": "(b) LR-spike test",
             "temperature": "(c) Temperature scaling", "bench": "SafeStep overhead"}[name]
    text = [f"# {title}", "", f"Regenerate: `{command}` ({seconds:.0f} s on this machine).", ""] + body
    text += ["", f"![{name}]({name}.png)"]
    common.write_markdown(out / f"{name}.md", text)
    _plot(name, res, out / f"{name}.png")


# ---------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", choices=EXPERIMENTS + ("all",), help="which experiment to run")
    parser.add_argument("--out", default="docs/ghosts", help="output directory (JSON, Markdown, PNG)")
    parser.add_argument("--archs", default=",".join(ARCHITECTURES), help="comma-separated architectures")
    parser.add_argument("--seeds", type=int, default=5, help="seeds for the spike test")
    parser.add_argument("--steps", type=int, default=200, help="training steps in the spike test")
    parser.add_argument("--spikes", default="10,100,1000,10000", help="LR factors from step 50")
    parser.add_argument("--stages", default="0,50,200", help="training stages for the sweep")
    parser.add_argument("--random-dirs", type=int, default=2, help="random directions per stage")
    parser.add_argument("--fail-ratio", type=float, default=2.0, help="loss ratio counted as failure")
    parser.add_argument("--stale", type=int, default=0,
                        help="sweep: measure each radius this many training steps before the stage (0: fresh)")
    parser.add_argument("--bench-steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes for the spike test (same table; 2 on a 2-core machine)")
    parser.add_argument("--no-progress", action="store_true")


def _command(args) -> str:
    """The explicit command line that regenerates a report (every option spelled out)."""
    opts = {"sweep": ["archs", "stages", "random_dirs", "fail_ratio"] + (["stale"] if args.stale else []),
            "spike": ["archs", "seeds", "steps", "spikes"] + (["jobs"] if args.jobs > 1 else []),
            "temperature": ["archs", "fail_ratio"], "bench": ["archs", "bench_steps"]}
    keys = ["archs", "stages", "random_dirs", "fail_ratio", "seeds", "steps", "spikes", "bench_steps"] \
        + (["stale"] if args.stale else []) + (["jobs"] if args.jobs > 1 else []) \
        if args.experiment == "all" else opts[args.experiment]
    return common.spelled_out(f"ghosts {args.experiment}", [("--out", args.out)] + [
        ("--" + k.replace("_", "-"), str(getattr(args, k))) for k in keys + ["threads"]])


def _previous_ratios(path: Path):
    """arch -> SafeStep/Adam ratio of the bench report about to be replaced (None if absent)."""
    import json

    if not path.exists():
        return None
    return {r["arch"]: r["ratio"] for r in json.loads(path.read_text()).get("rows", [])}


def run(args) -> int:
    torch.set_num_threads(args.threads)
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    for a in archs:
        if a not in ARCHITECTURES:
            raise ValueError(f"--archs: unknown architecture {a!r} (choose from {sorted(ARCHITECTURES)})")
    if args.fail_ratio <= 1:
        raise ValueError(f"--fail-ratio must be > 1, got {args.fail_ratio}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.stale < 0:
        raise ValueError(f"--stale must be >= 0, got {args.stale}")
    if args.seeds < 1 or args.steps < 1:
        raise ValueError("--seeds and --steps must be >= 1")
    out = Path(args.out)
    command = _command(args)
    todo = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    progress = not args.no_progress
    for name in todo:
        clock = common.Stopwatch()
        if name == "sweep":
            stages = sorted(int(s) for s in args.stages.split(","))
            res = run_sweep(archs, stages, args.random_dirs, args.fail_ratio, progress=progress, stale=args.stale)
        elif name == "spike":
            spikes = [float(s) for s in args.spikes.split(",")]
            res = run_spike(archs, spikes, list(range(args.seeds)), args.steps, progress=progress, jobs=args.jobs)
        elif name == "temperature":
            res = run_temperature(archs, TEMPERATURES, 200, args.fail_ratio, progress=progress)
        else:
            res = run_bench(archs, args.bench_steps, progress=progress, previous=_previous_ratios(out / "bench.json"))
        write_report(name, res, out, command, clock.seconds)
        print(f"{name}: wrote {out / name}.{{json,md,png}} in {clock.seconds:.0f} s")
    return 0
