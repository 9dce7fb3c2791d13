"""The pictures a learner reads: no label clipped at the figure's edge, no two labels over
each other."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="pictures need the 'plot' extra")


def test_the_tape_picture_has_a_clear_margin_on_every_side(tmp_path: Path) -> None:
    """No label touches the saved picture's edge: its outer 4 pixels are all background."""
    import matplotlib.image
    import numpy as np

    from parity.lab.pictures.gpt import draw_tape

    draw_tape(tmp_path / "tape.png")
    rgb = matplotlib.image.imread(tmp_path / "tape.png")[..., :3]
    edges = np.concatenate([rgb[:, :4].reshape(-1, 3), rgb[:, -4:].reshape(-1, 3),
                            rgb[:4].reshape(-1, 3), rgb[-4:].reshape(-1, 3)])
    assert (edges == 1.0).all(), f"{int((edges != 1.0).any(axis=1).sum())} inked edge pixels"


def test_the_tradeoff_pictures_labels_never_overlap() -> None:
    import matplotlib.pyplot as plt

    from parity.lab.pictures.recompute import tradeoff_figure

    fig = tradeoff_figure()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    try:
        for ax in fig.axes:
            boxes = [t.get_window_extent(renderer) for t in ax.texts]
            assert len(boxes) >= 5, "the labels were not drawn"
            for a, b in itertools.combinations(boxes, 2):
                assert not a.overlaps(b), (a, b)
    finally:
        plt.close(fig)
