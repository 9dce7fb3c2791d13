"""The page's frame and its code: highlighting (Pygments), the style sheet, anchors, the
topics' bar."""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parity.claims import TOPICS

STYLE = Path(__file__).with_name("style.css")


@functools.cache
def _pygments() -> tuple[Any, Any, Any, frozenset[str]]:
    from pygments import highlight as pyg
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    formatter = HtmlFormatter(nowrap=True)
    # the token classes the style colours (names and punctuation it leaves plain; whitespace
    # shows no colour): a span of any other class is dropped, which halves a page's weight
    styled = frozenset(c for c, s in formatter.class2style.items() if s[0] and c != "w")
    return pyg, PythonLexer(), formatter, styled


_SPAN = re.compile(r'<span class="([\w-]+)">([^<]*)</span>')


def highlight(code: str) -> str:
    """Python source as Pygments' HTML spans, in a <pre>."""
    pyg, lexer, formatter, styled = _pygments()
    spans = _SPAN.sub(lambda m: m.group(0) if m.group(1) in styled else m.group(2),
                      pyg(code, lexer, formatter))
    return f'<pre class="code hl"><code>{spans.rstrip()}</code></pre>'


def style_sheet() -> str:
    """style.css and Pygments' colours for its spans."""
    from pygments.formatters import HtmlFormatter

    return (STYLE.read_text(encoding="utf-8") + "\n/* Pygments (style 'default') */\n"
            + HtmlFormatter(style="default").get_style_defs(".hl"))


def slug(text: str) -> str:
    """An anchor-safe form of a name: lower case, runs of other characters as '-'."""
    return re.sub(r"[^a-z0-9_.]+", "-", text.lower()).strip("-")


def document(title: str, body: str, here: str, built: Sequence[str]) -> str:
    """A whole page: head (the local style sheet only), the topics' bar, `body`."""
    links = ['<a href="index.html">index</a>' if here != "index" else
             '<span class="here">index</span>']
    for t in TOPICS:
        if t == here:
            links.append(f'<span class="here">{t}</span>')
        elif t in built:
            links.append(f'<a href="{t}.html">{t}</a>')
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{html.escape(title)}</title>\n"
            "<link rel=\"stylesheet\" href=\"style.css\">\n</head>\n<body>\n"
            f"<nav class=\"topics\">{' '.join(links)}</nav>\n<main>\n{body}\n</main>\n"
            "</body>\n</html>\n")
