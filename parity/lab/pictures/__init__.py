"""Every picture this project draws: one registry, drawn by `python -m parity docs` into
docs/img/ and by `python -m parity report --out DIR` into DIR.

Each topic registers its pictures in `parity/lab/pictures/<topic>.py`:

    @picture("formats_spacing.png")
    def _(path: Path) -> None: ...   # draw the picture into `path` (matplotlib, Agg)

A picture is a function of the code and of committed measurement files (docs/data/*.json),
like the generated docs; pictures of timings draw the spread over repeats, never one sample.
matplotlib is the optional extra `plot`: without it nothing is drawn and the commands say so.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

PICTURES: dict[str, Callable[[Path], None]] = {}
IMG = Path(__file__).resolve().parents[3] / "docs" / "img"


def picture(name: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    """Register a picture writer: fn(path) draws the file `name`."""

    def register(fn: Callable[[Path], None]) -> Callable[[Path], None]:
        if name in PICTURES:
            raise RuntimeError(f"two writers for the picture {name}")
        PICTURES[name] = fn
        return fn

    return register


def load() -> dict[str, Callable[[Path], None]]:
    """Import every module of parity.lab.pictures so that their registrations run."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"parity.lab.pictures.{info.name}")
    return PICTURES


def have_matplotlib() -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        return False
    return True


def draw_all(out: Path = IMG, only: Callable[[str], bool] = lambda name: True) -> list[Path]:
    """Draw every registered picture (whose name `only` accepts) into `out`; [] without
    matplotlib."""
    if not have_matplotlib():
        return []
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fn in sorted(load().items()):
        if only(name):
            fn(out / name)
            plt.close("all")
            written.append(out / name)
    return written


def place_labels(fig: Any, ax: Any, items: list[tuple[float, float, str]],
                 fontsize: float = 6) -> int:
    """Annotate each (x, y, text) at the first of four offsets (right, left, above, below)
    where it overlaps no label placed before; a label with no free place is left out (the
    count is returned), so no two labels ever print over each other."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    left_out = 0
    for x, y, text in dict.fromkeys(items):  # one label for the same text at the same point
        for dx, dy, ha, va in ((4, 0, "left", "center"), (-4, 0, "right", "center"),
                               (0, 5, "center", "bottom"), (0, -5, "center", "top")):
            label = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points",
                                fontsize=fontsize, ha=ha, va=va)
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()
        else:
            left_out += 1
    return left_out
