"""``softcert bench``: throughput of Vertex-Softmax as a ratio to ``torch.sort`` of the same tensor.

Sorting each row is the floor of the O(n log n) threshold sweep, so the ratio
time(Vertex-Softmax, both bounds) / time(torch.sort of c) is the figure of merit; both are
measured in the same run, same threads, median of ``repeats`` timings after a warm-up.
Backends: "numba" and "torch" through ``bounds.vertex_softmax`` (validation, scaling and the
kernel); "numba-kernel" and "numba-sweep" call ``kernels.vertex.vertex_bounds`` directly with
the sort-free Dinkelbach route (the default) and with the sort-and-sweep route, to separate
the kernel from the wrapper; "triton" needs a CUDA device (on a CPU Triton only interprets,
which checks correctness and says nothing about speed), and is skipped with a message there.
"""
from __future__ import annotations

import os
import platform
from functools import partial
from pathlib import Path

import torch

from softcert import bounds
from softcert.cli import common

SHAPES = ((4096, 16), (4096, 128), (1024, 1024), (64, 65536))
BACKENDS = ("numba", "torch", "numba-kernel", "numba-sweep", "triton")
NO_GPU = ("triton: timing needs a GPU and no CUDA device is present; on a CPU Triton only "
          "interprets (TRITON_INTERPRET=1), which tests correctness, not speed. Skipped.")


def _runner(backend, c, lo, hi):
    if backend in ("numba-kernel", "numba-sweep"):
        from softcert.kernels.vertex import vertex_bounds

        cn, ln, hn = c.numpy(), lo.numpy(), hi.numpy()
        method = "dinkelbach" if backend == "numba-kernel" else "sweep"
        return partial(vertex_bounds, cn, ln, hn, method=method)
    return partial(bounds.vertex_softmax, c, lo, hi, backend=backend)


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:  # not available on this platform
        return "unknown"


def _numba_threads() -> int:
    import numba

    from softcert.kernels.threads import caller_threads

    with caller_threads():  # starting Numba's layer must not change torch's count
        return numba.get_num_threads()


def gpu_available() -> bool:
    return torch.cuda.is_available()


def set_threads(n: int) -> None:
    """One thread count for torch (the sort, the torch backend) and Numba (the kernel), so the
    ratio compares like with like. ValueError beyond the CPUs Numba was started with."""
    import numba

    if not 1 <= n <= numba.config.NUMBA_NUM_THREADS:
        raise ValueError(f"--threads: expected 1..{numba.config.NUMBA_NUM_THREADS} (the CPUs Numba "
                         f"may use; set NUMBA_NUM_THREADS for more), got {n}")
    torch.set_num_threads(n)
    numba.set_num_threads(n)


def measure(shapes=SHAPES, repeats: int = 5, backends=("numba", "torch"), seed: int = 0):
    """One dict per (shape, backend): seconds, rows·n per second, ratio to torch.sort."""
    g = torch.Generator().manual_seed(seed)
    results = []
    for rows, n in shapes:
        c = torch.randn(rows, n, generator=g, dtype=torch.float64)
        lo = torch.randn(rows, n, generator=g, dtype=torch.float64) * 2
        hi = lo + torch.rand(rows, n, generator=g, dtype=torch.float64)
        t_sort = common.median_seconds(partial(torch.sort, c, dim=-1), repeats)
        for backend in backends:
            reps = repeats if backend != "torch" or rows * n <= 2**18 else max(1, repeats // 2)
            t = common.median_seconds(_runner(backend, c, lo, hi), reps)
            results.append({
                "rows": rows, "n": n, "backend": backend, "seconds": t, "sort_seconds": t_sort,
                "elements_per_second": rows * n / t, "ratio_to_sort": t / t_sort,
            })
    return results


def to_markdown(results, command: str) -> str:
    lines = [
        "# Vertex-Softmax throughput",
        "",
        f"Regenerate with `{command}` (median of repeated runs; both bounds, lower and upper,",
        "per row; float64). The ratio divides by one `torch.sort` of the same (rows, n) tensor",
        "in the same run; sorting is the floor of the O(n log n) sweep. The Numba kernel",
        "runs the sort-free Dinkelbach route (a few O(n) passes, each bound proved by the",
        "certificate g(λ) <= 0; the sweep as fallback). Targets: <= 1.0x at n >= 128 and",
        "<= 2.0x at n = 16. numba-kernel / numba-sweep: the kernel alone",
        "(kernels.vertex.vertex_bounds), Dinkelbach / sort-and-sweep, without the validation",
        "and scaling of bounds.vertex_softmax.",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
        f"threads, {_numba_threads()} Numba threads, torch {torch.__version__}; load average {_load()} when the table was written "
        "(other jobs on a shared machine slow multi-threaded torch calls most, so ratios move "
        "with it).",
        "",
        "| rows | n | backend | seconds | rows·n / s | torch.sort seconds | ratio to sort |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['rows']} | {r['n']} | {r['backend']} | {r['seconds']:.4f} | "
            f"{r['elements_per_second']:.3g} | {r['sort_seconds']:.4f} | {r['ratio_to_sort']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def configure(parser) -> None:
    parser.add_argument("--out", default=None, help="folder for benchmark.md/.json (default: print only)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch and Numba threads for every timing, the sort included (default: as started)")
    parser.add_argument("--backends", "--backend", nargs="+", default=["numba", "torch"],
                        choices=list(BACKENDS))


def run(args) -> int:
    if args.repeats < 1:
        raise ValueError("--repeats: must be >= 1")
    if args.threads is not None:
        set_threads(args.threads)
    backends = list(args.backends)
    if "triton" in backends and not gpu_available():
        print(NO_GPU)
        backends.remove("triton")
        if not backends:
            return 0
    results = measure(repeats=args.repeats, backends=tuple(backends))
    command = common.spelled_out("bench", [("--repeats", args.repeats), ("--threads", args.threads),
                                           ("--backends", args.backends), ("--out", args.out)])
    md = to_markdown(results, command)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        common.write_markdown(out / "benchmark.md", md)
        common.write_json(out / "benchmark.json", {"command": command, "results": results})
    return 0
