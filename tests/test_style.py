"""softcert.cli.style and the report's figures: palette, sizes, markers, coincident curves, ticks."""
from __future__ import annotations

import math

import pytest

from softcert.cli import common, render, style

OKABE_ITO_HEX = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"}


def _rel_luminance(hex_colour):
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_palette_is_okabe_ito_and_first_colours_are_visible_on_white():
    assert set(style.PALETTE) == OKABE_ITO_HEX == set(style.OKABE_ITO.values())
    assert len(set(style.PALETTE)) == len(style.PALETTE) == len(set(style.MARKERS))
    # WCAG contrast against white: the first six series stay >= 2:1 (yellow is kept last)
    for c in style.PALETTE[:6]:
        assert (1.05) / (_rel_luminance(c) + 0.05) >= 2.0, c


def test_column_widths_and_bad_width_named():
    plt = common.pyplot()
    for width, inches in (("single", 3.3), ("double", 6.9)):
        fig, _ = style.figure(plt, width)
        assert fig.get_size_inches()[0] == pytest.approx(inches)
        plt.close(fig)
    with pytest.raises(ValueError, match="width"):
        style.figure(plt, "triple")


def test_coincident_groups_identical_series_only():
    g = style.coincident({"ibp": [0, 1], "crown": [2, 3], "vertex": [2, 3], "pgd": [2, 4]})
    assert [names for names, _ in g] == [["ibp"], ["crown", "vertex"], ["pgd"]]
    assert style.group_label(["crown", "vertex"]) == "crown = vertex (coincide)"
    assert style.group_label(["ibp"]) == "ibp"
    # tuples (k, n) compare exactly; a relative tolerance only for numbers
    assert len(style.coincident({"a": [(1, 6)], "b": [(1, 7)]})) == 2
    assert len(style.coincident({"a": [1.0], "b": [1.0 + 1e-12]}, rel=1e-9)) == 1


@pytest.mark.parametrize("values,log", [([1, 10], False), ([1, 11], True), ([0.001, 0.002], False),
                                        ([0, 1e-6, 1.0], True), ([5], False), ([None, math.inf, 3], False)])
def test_spans_decades(values, log):
    assert style.spans_decades(values) is log


def _res(methods=("ibp", "crown", "vertex"), eps=(0.01, 0.0125, 0.015, 0.0175, 0.02), same=True, spread=1e3):
    """A minimal results dict for render.figures: crown and vertex identical when ``same``."""
    from softcert.cli.records import clopper_pearson

    rows = []
    for i, e in enumerate(eps):
        for m in methods:
            k = {"ibp": 0, "crown": 5 - i % 2, "vertex": 5 - i % 2 if same else 6}[m]
            rows.append(dict(eps=e, method=m, n=6, certified_k=k, certified_acc=k / 6, certified_ci=clopper_pearson(k, 6),
                             pgd_k=6, pgd_acc=1.0, pgd_ci=clopper_pearson(6, 6)))
    heads = [[0.5, 0.7]]
    return {"model": {"spec": "zoo:digits-vit1"}, "certify": {"rows": rows},
            "radii": {"per_image_pi": [0.1, 0.2, 0.3], "per_image_root": [0.2, 0.4, 1.0],
                      "exact": [{"exact": 0.25}, {"exact": None}]},
            "topk": {"model": {"0.01": {"mean_k": heads, "mean_n": [[1.0, 1.0]]}}},
            "fp": {"table": [dict(n=n, algorithm=a, rel_in_u=f * (20 + n / 16)) for n in (16, 128) for a, f in
                             (("three_pass", 1.0), ("online", 3.0), ("tree", 1.0))],
                   "measured": [dict(n=16, source="model", max_measured_u=0.0),
                                dict(n=128, source="minilm", max_measured_u=16 / spread)]}}


def _labels_overlap(fig, ax, axis):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ticks = (ax.get_xticklabels() if axis == "x" else ax.get_yticklabels())
    boxes = [t.get_window_extent(r) for t in ticks if t.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), len(boxes)


def test_certified_accuracy_figure_markers_only_coincident_named_readable_ticks():
    plt = common.pyplot()
    style.apply(plt)
    res = _res()
    fig = render.certified_accuracy_figure(plt, res["certify"]["rows"])
    ax = fig.axes[0]
    assert fig.get_size_inches()[0] == pytest.approx(style.SINGLE)
    # no line joins two eps values: every data line is drawn without a line style
    data = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 5]
    assert data and all(ln.get_linestyle() == "None" for ln in data)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "crown = vertex (coincide)" in labels and "PGD (upper bound)" in labels and "ibp" in labels
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.01", "0.0125", "0.015", "0.0175", "0.02"]
    overlap, n = _labels_overlap(fig, ax, "x")
    assert n == 5 and not overlap
    plt.close(fig)
    fig = render.certified_accuracy_figure(plt, _res(same=False)["certify"]["rows"])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "crown" in labels and "vertex" in labels and not any("coincide" in s for s in labels)
    plt.close(fig)


@pytest.mark.parametrize("spread,log", [(1e3, True), (1.0, False)])
def test_fp_figure_log_only_across_decades(spread, log):
    plt = common.pyplot()
    fig = render.fp_figure(plt, _res(spread=spread)["fp"])
    ax = fig.axes[0]
    assert (ax.get_yscale() == "log") is log
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "three-pass bound = tree bound (coincide)" in labels  # equal bounds in this synthetic table
    assert any(s.startswith("measured") and ("0 drawn at" in s) is log for s in labels)
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and all("times" not in t and "^" not in t for t in ticks)  # plain numbers, not 6x10^1
    for axis in "xy":
        assert not _labels_overlap(fig, ax, axis)[0]
    plt.close(fig)


def test_report_figures_pdf_beside_png_and_vector(tmp_path):
    names = render.figures(tmp_path, _res())
    for stem, files in names.items():
        assert files == [f"{stem}.png", f"{stem}.pdf"]
        pdf = (tmp_path / f"{stem}.pdf").read_bytes()
        assert pdf.startswith(b"%PDF")
        if stem != "topk_heatmap":  # the heatmap is an image by nature; the others are paths
            assert b"/Subtype /Image" not in pdf
    from matplotlib.image import imread

    h, w = imread(tmp_path / "certified_accuracy.png").shape[:2]
    assert w == pytest.approx(style.SINGLE * style.RC["savefig.dpi"], abs=2)


def test_log_axis_labels_read_as_numbers():
    plt = common.pyplot()
    fig, ax = style.figure(plt)
    ax.plot([1, 10, 1000], [1e-3, 1, 1e2], marker="o", linestyle="none")
    style.log_axis(ax, "x")
    style.log_axis(ax, "y")
    fig.canvas.draw()
    xs = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "10" in xs and "1000" in xs
    plt.close(fig)
