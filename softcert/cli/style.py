"""One figure style for the report and the commands: palette, sizes, markers, log scales.

- Palette: Okabe & Ito's eight colour-blind-safe colours ("Color Universal Design", 2008),
  black first; every series also differs by marker, so the figure survives greyscale.
- Sizes: ``SINGLE`` = 3.3 in (one column of a two-column paper), ``DOUBLE`` = 6.9 in (full
  width); fonts 8 pt so that text at 100 % width matches a 9-10 pt body.
- Markers sit on measured points only; a quantity measured at a few isolated x values (two eps
  values) is drawn as markers without a joining line, which would claim values in between.
- Series with identical values are drawn once and labelled "a = b (coincide)" (``coincident``).
- A log axis when the positive values span more than ``DECADES`` decades (``spans_decades``).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["OKABE_ITO", "PALETTE", "MARKERS", "SINGLE", "DOUBLE", "DECADES", "RC", "SIZES", "apply", "figure",
           "coincident", "group_label", "spans_decades", "colour", "marker", "measured_ticks", "log_axis",
           "legend_below"]

OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7"}
# yellow last: it is hard to see on white, so only the eighth series gets it
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
SINGLE = 3.3  # in
DOUBLE = 6.9  # in
DECADES = 1.0  # wider than this (max/min of the positive values) and the axis is logarithmic

RC = {
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "legend.fontsize": 7,
    "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.2, "lines.markersize": 4.5,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.linewidth": 0.4,
    "grid.alpha": 0.5, "legend.frameon": False, "savefig.dpi": 200, "pdf.fonttype": 42,
    "ps.fonttype": 42, "axes.prop_cycle": None,  # set in apply (needs matplotlib's cycler)
    "image.cmap": "viridis",  # perceptually uniform and colour-blind safe
}


SIZES = ("font.size", "axes.titlesize", "axes.labelsize", "legend.fontsize", "xtick.labelsize",
         "ytick.labelsize", "lines.linewidth", "lines.markersize")


def apply(plt, sizes: bool = True) -> None:
    """Set ``RC`` (with the palette as colour cycle) on a pyplot module. ``sizes=False`` keeps
    matplotlib's font and line sizes, for figures drawn larger than a paper column (the other
    commands' multi-panel figures), whose 8 pt text would shrink below legibility."""
    from cycler import cycler

    rc = {k: v for k, v in RC.items() if sizes or k not in SIZES}
    plt.rcParams.update({**rc, "axes.prop_cycle": cycler(color=list(PALETTE))})


def figure(plt, width: str = "single", aspect: float = 0.72, **kwargs):
    """``plt.subplots`` at a column width (``"single"`` 3.3 in or ``"double"`` 6.9 in); height =
    aspect x width."""
    if width not in ("single", "double"):
        raise ValueError(f"width: 'single' or 'double', got {width!r}")
    w = SINGLE if width == "single" else DOUBLE
    apply(plt)
    return plt.subplots(figsize=(w, w * aspect), **kwargs)


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def marker(i: int) -> str:
    return MARKERS[i % len(MARKERS)]


def coincident(series: dict, rel: float = 0.0) -> list[tuple[list[str], object]]:
    """Group series whose y values agree (exactly, or within ``rel`` relative): [(labels, ys)].

    Order follows the first appearance; a group of several labels is drawn once and labelled
    with all of them, so that a line hidden under another is named in the legend.
    """
    groups: list[tuple[list[str], object]] = []
    for label, ys in series.items():
        ys = list(ys)
        for names, ref in groups:
            if len(ref) == len(ys) and all(_close(a, b, rel) for a, b in zip(ref, ys)):
                names.append(label)
                break
        else:
            groups.append(([label], ys))
    return groups


def _close(a, b, rel) -> bool:
    if a == b:
        return True
    if not all(isinstance(v, (int, float)) for v in (a, b)):
        return False
    return abs(a - b) <= rel * max(abs(a), abs(b))


def group_label(names: Sequence[str]) -> str:
    """The legend entry of a ``coincident`` group."""
    return names[0] if len(names) == 1 else " = ".join(names) + " (coincide)"


def spans_decades(values: Iterable[float], decades: float = DECADES) -> bool:
    """True when the positive finite values span more than ``decades`` powers of ten."""
    pos = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return len(pos) >= 2 and math.log10(max(pos) / min(pos)) > decades


def measured_ticks(ax, xs: Sequence[float], axis: str = "x") -> None:
    """Ticks at the measured values only, labelled with ``%g`` (no crowded 0.0100 0.0125 ...)."""
    xs = sorted(set(xs))
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    setter(xs, [f"{v:g}" for v in xs])
    (ax.xaxis if axis == "x" else ax.yaxis).set_minor_locator(_null())


def _null():
    from matplotlib.ticker import NullLocator

    return NullLocator()


def log_axis(ax, axis: str = "y", values: Iterable[float] = ()) -> None:
    """A log axis whose labels read as plain numbers (0.01, 10, 1e+04), minor labels off; when
    ``values`` span at most 2.5 decades the labels sit at 1, 2 and 5 per decade, so that a
    short log axis still carries several labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    a = ax.yaxis if axis == "y" else ax.xaxis
    pos = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if pos and math.log10(max(pos) / min(pos)) <= 2.5:
        a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def legend_below(fig, ax, ncol: int = 2) -> None:
    """The legend under the axes (never over measured points); lays the figure out for it, so
    save it with ``layout=False``."""
    handles, labels = ax.get_legend_handles_labels()
    rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False)
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, min(0.5, (0.06 + 0.15 * rows) / height), 1, 1))
