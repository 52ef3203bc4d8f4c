"""The report's figures: one colour and marker per arm in every figure,
legends outside the data, x tick labels that do not run into each other.

The page of docs/study.md is rebuilt from its committed runs.json in a
temporary copy (as `tools/compare.py report` does), and every figure the
page draws is inspected after matplotlib has laid it out.
"""
import os
import re
import shutil
from typing import Dict, List, Tuple

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = os.path.join(REPO, 'docs', 'study')


def marker_of(artist) -> str:
    """The marker of a line or a scatter (recognised by its path)."""
    from matplotlib.collections import PathCollection
    from matplotlib.markers import MarkerStyle
    if not isinstance(artist, PathCollection):
        return artist.get_marker()
    path = artist.get_paths()[0]
    for name in MarkerStyle.markers:
        style = MarkerStyle(name)
        reference = style.get_path().transformed(style.get_transform())
        if reference.vertices.shape == path.vertices.shape and np.allclose(
                reference.vertices, path.vertices):
            return name
    raise AssertionError('unrecognised scatter marker')


def style_of(handle) -> Tuple[tuple, str]:
    """(RGBA, marker) of a legend handle: an errorbar, line or scatter."""
    from matplotlib.collections import PathCollection
    from matplotlib.colors import to_rgba
    from matplotlib.container import ErrorbarContainer
    artist = handle[0] if isinstance(handle, ErrorbarContainer) else handle
    if isinstance(artist, PathCollection):
        colour = tuple(artist.get_facecolor()[0][:3])
    else:
        colour = to_rgba(artist.get_color())[:3]
    return tuple(round(c, 6) for c in colour), marker_of(artist)


def renderer_of(fig):
    """A renderer of ``fig`` laid out as saved (closing the figure took its
    canvas away: an Agg canvas is attached again and drawn)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def arm_label(legend_label: str) -> str:
    """``'MAE (n=5)'`` -> ``'MAE'``."""
    return re.sub(r' \(n=[^)]*\)$', '', legend_label)


@pytest.fixture(scope='module')
def figures(tmp_path_factory) -> Dict[str, object]:
    """Every figure of the study page, by file name, laid out."""
    from mmae_compare import report
    out_dir = tmp_path_factory.mktemp('study') / 'study'
    shutil.copytree(STUDY, out_dir, ignore=shutil.ignore_patterns('figures'))
    captured = {}
    original = report.save

    def keep(fig, path):
        captured[os.path.basename(path)] = fig
        return original(fig, path)

    patch = pytest.MonkeyPatch()
    patch.setattr(report, 'save', keep)
    try:
        report.write_report(str(out_dir), str(out_dir / 'page.md'))
    finally:
        patch.undo()
    return captured


def test_the_page_draws_the_study_figures(figures):
    assert {'paired_differences.png', 'learning_curves.png'} <= set(figures)
    assert len(figures) >= 3


def test_an_arm_has_one_style_in_every_figure(figures):
    seen: Dict[str, Dict[str, Tuple[tuple, str]]] = {}
    for name, fig in figures.items():
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(arm_label(label), {})[name] = \
                    style_of(handle)
    assert {'MAE', 'random init (control)', 'supervised (control)'} <= \
        set(seen)
    for arm, styles in seen.items():
        assert len(set(styles.values())) == 1, (arm, styles)
    # Different arms look different.
    one_each = [next(iter(styles.values())) for styles in seen.values()]
    assert len(set(one_each)) == len(one_each), seen
    # Every arm the learning curves show is drawn in the paired differences
    # too (all but the reference, MAE) with that same style.
    curves = {arm for arm, s in seen.items() if 'learning_curves.png' in s}
    diffs = {arm for arm, s in seen.items() if 'paired_differences.png' in s}
    assert diffs == curves - {'MAE'}


def overlap(a, b) -> bool:
    """Whether two display-space boxes share an area (not just an edge)."""
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5
            and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5)


def test_legends_are_outside_every_axes(figures):
    for name, fig in figures.items():
        renderer = renderer_of(fig)
        legends: List = list(fig.legends) + [
            ax.get_legend() for ax in fig.axes if ax.get_legend()
        ]
        assert legends, name
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                if ax.get_visible() and ax.axison:
                    assert not overlap(box, ax.get_window_extent(renderer)), \
                        (name, ax.get_title())


def test_x_tick_labels_do_not_run_into_each_other(figures):
    for name, fig in figures.items():
        renderer = renderer_of(fig)
        for ax in fig.axes:
            boxes = [
                label.get_window_extent(renderer)
                for label in ax.get_xticklabels()
                if label.get_visible() and label.get_text()
            ]
            for i, first in enumerate(boxes):
                for second in boxes[i + 1:]:
                    assert not overlap(first, second), (name, ax.get_title(), [
                        t.get_text() for t in ax.get_xticklabels()
                    ])
