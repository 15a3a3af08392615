"""What every ``softcert`` subcommand repeats: the regenerating command line, figures,
the Markdown + JSON writers, timing and progress bars.

Figures are reproducible: matplotlib's Agg backend, PNG without a Software chunk, PDF with
CreationDate from SOURCE_DATE_EPOCH (or none) and a fixed Producer. Library packages never
import this module (they take an optional progress callback instead).
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

__all__ = [
    "Stopwatch", "best_seconds", "command_line", "median_seconds", "progress", "pyplot",
    "save_figure", "share", "spelled_out", "write_json", "write_markdown",
]


# ----------------------------------------------------------------------------- command line
def spelled_out(name: str, options: Iterable[tuple[str, object]]) -> str:
    """``softcert <name> --flag value ...`` with every option written out.

    A value of None or False drops the flag, True keeps it bare, a list or tuple gives one
    argument per item; arguments are shell-quoted so the line can be pasted back.
    """
    parts = ["softcert", *name.split()]
    for flag, value in options:
        if value is None or value is False:
            continue
        parts.append(flag)
        if value is True:
            continue
        parts += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return shlex.join(parts)


def command_line(args, name: str, fallback: Iterable[tuple[str, object]] = ()) -> str:
    """The command line that produced ``args``, as typed (``softcert.cli.main`` records it in
    ``args.invocation``); when ``run`` was called without it, ``spelled_out(name, fallback)``."""
    invocation = getattr(args, "invocation", None)
    if invocation:
        return shlex.join(invocation)
    return spelled_out(name, fallback)


# ----------------------------------------------------------------------------- writers
def share(fraction: float, n: int) -> str:
    """A fraction of ``n`` images as ``k/n (0.xxx)``: the count, so that a table never rounds
    a result across a threshold (179 of 200 printed "0.90" with two decimals, not 0.895)."""
    k = round(fraction * n)
    return f"{k}/{n} ({fraction:.3f})"


def write_json(path: Path | str, obj) -> Path:
    """``obj`` as indented JSON (numpy scalars and other number-likes through float)."""
    path = Path(path)
    path.write_text(json.dumps(obj, indent=1, default=float))
    return path


def write_markdown(path: Path | str, lines: str | Sequence[str]) -> Path:
    """Lines joined by newlines, ending in exactly one newline."""
    path = Path(path)
    text = lines if isinstance(lines, str) else "\n".join(lines)
    path.write_text(text.rstrip("\n") + "\n")
    return path


# ----------------------------------------------------------------------------- figures
def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display; deterministic output), with the
    colours, grid and embedded fonts of ``softcert.cli.style`` (sizes: see ``style.apply``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from softcert.cli import style

    style.apply(plt, sizes=False)
    plt.rcParams["svg.hashsalt"] = "softcert"
    return plt


def _metadata(fmt: str) -> dict:
    if fmt == "png":
        return {"Software": None}
    if fmt == "pdf":
        epoch = os.environ.get("SOURCE_DATE_EPOCH")
        date = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
                if epoch else None)
        return {"Creator": "softcert", "Producer": "matplotlib (softcert)", "CreationDate": date}
    return {}


def save_figure(fig, path: Path | str, *, dpi: int = 120, formats: Sequence[str] = ("png",),
                layout: bool = True, tight_bbox: bool = False) -> list[str]:
    """Write ``fig`` as ``path`` with each suffix in ``formats`` (reproducible metadata), then
    close it. ``layout`` runs tight_layout first; ``tight_bbox`` crops to the drawn content
    instead (for figures whose colorbar spans several axes). Returns the file names."""
    plt = pyplot()
    path = Path(path)
    if layout:
        fig.tight_layout()
    names = []
    for fmt in formats:
        target = path.with_suffix(f".{fmt}")
        fig.savefig(target, dpi=dpi, metadata=_metadata(fmt),
                    bbox_inches="tight" if tight_bbox else None)
        names.append(target.name)
    plt.close(fig)
    return names


# ----------------------------------------------------------------------------- timing
class Stopwatch:
    """Wall time since construction (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def _timings(fn: Callable[[], object], repeat: int) -> list[float]:
    if repeat < 1:
        raise ValueError(f"repeat: must be >= 1, got {repeat}")
    fn()  # warm-up: JIT compilation and allocator, not part of the figure
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Fastest of ``repeat`` timed calls after one warm-up call."""
    return min(_timings(fn, repeat))


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Median of ``repeat`` timed calls after one warm-up call."""
    return statistics.median(_timings(fn, repeat))


# ----------------------------------------------------------------------------- progress
def progress(iterable=None, *, total: int | None = None, desc: str = "", disable: bool = False,
             **kwargs):
    """A tqdm bar on stderr; its ``update`` is the progress callback library calls take."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True, **kwargs)
