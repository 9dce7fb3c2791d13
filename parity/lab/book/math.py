"""TeX math of the prose (`$...$` spans) as inline SVG, drawn by matplotlib's mathtext: glyphs
become paths, so the page needs no font, no script and no network to show them.

Without matplotlib (the optional extra `plot`) a span is shown as its TeX source in a <code>,
and the page says so once (render.py asks `available()`).
"""

from __future__ import annotations

import functools
import html
import io
import re

SIZE = 11.0  # points, near the prose's 15 px


@functools.cache
def available() -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        return False
    return True


@functools.cache
def _svg(tex: str) -> tuple[str, float]:
    """The SVG markup of `$tex$` (ids not yet made unique) and its depth below the baseline,
    in points."""
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.mathtext import MathTextParser

    depth = MathTextParser("path").parse(f"${tex}$", dpi=72, prop=FontProperties(size=SIZE))[2]
    fig = Figure(figsize=(0.01, 0.01))
    FigureCanvasSVG(fig)
    fig.text(0, 0, f"${tex}$", fontsize=SIZE)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.01, transparent=True,
                metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = re.sub(r"\s*<defs>\s*<style.*?</style>\s*</defs>", "", svg, flags=re.S)
    svg = re.sub(r"\s*<!--.*?-->", "", svg, flags=re.S)
    svg = re.sub(r' xmlns(:xlink)?="[^"]*"', "", svg)  # inline SVG in HTML needs neither
    return svg.strip(), float(depth)


def svg(tex: str, prefix: str) -> str:
    """`tex` as an inline <svg> element whose ids start with `prefix` (unique on the page);
    its TeX source in a <code> without matplotlib, or where mathtext cannot parse it."""
    if not available():
        return source(tex)
    try:
        markup, depth = _svg(tex)
    except ValueError:  # mathtext's parse error
        return source(tex)
    markup = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}\1"', markup)
    markup = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}\1"', markup)
    markup = re.sub(r'url\(#([^)]+)\)', rf'url(#{prefix}\1)', markup)
    label = html.escape(tex, quote=True)
    return markup.replace(
        "<svg ", f'<svg class="math" role="img" aria-label="{label}" '
                 f'style="vertical-align:-{depth + 0.5:.1f}pt" ', 1)


def source(tex: str) -> str:
    """The TeX source of a span, shown as code."""
    return f'<code class="tex">${html.escape(tex)}$</code>'
