"""Docstrings and NOTE blocks as HTML prose: the plain text this project writes them in, read
as it is written.

- A paragraph is a run of lines at the text's own indent; blank lines part paragraphs.
- A line starting "- " begins a list item; lines indented under it continue the item.
- Lines indented by 4 or more (pseudocode, a formula laid out, a quoted line of C++) are
  preformatted, as written.
- `code` is code; `$tex$` is math (math.py: inline SVG); `[ Name ]`, where the page shows
  NOTE [ Name ], links to it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from parity.lab.book import math

_INLINE = re.compile(r"`([^`]+)`|(?<![\w$])\$([^\s$](?:[^$]*?[^\s$\\])?)\$(?![\w$])")
_NOTE = re.compile(r"\[ ([^\[\]]+?) \]")
_ITEM = re.compile(r"^[-*] ")


class Prose:
    """Renders prose for one page: knows the page's NOTE anchors, numbers its formulas' ids,
    and remembers whether a formula was shown as TeX source (no matplotlib)."""

    def __init__(self, notes: dict[str, str] | None = None, key: str = "m") -> None:
        self.notes = dict(notes or {})  # NOTE name -> the anchor id it has on this page
        self.key = key
        self.formulas = 0
        self.tex_shown = False

    def _text(self, text: str) -> str:
        """Escaped text, NOTE names linked."""
        out = html.escape(text, quote=False)

        def link(m: re.Match[str]) -> str:
            name = html.unescape(m.group(1))
            anchor = self.notes.get(name)
            return m.group(0) if anchor is None else f'<a href="#{anchor}">{m.group(0)}</a>'

        return _NOTE.sub(link, out)

    def inline(self, text: str) -> str:
        """One run of prose: code spans, math spans, the rest escaped."""
        out, at = [], 0
        for m in _INLINE.finditer(text):
            out.append(self._text(text[at:m.start()]))
            if m.group(1) is not None:
                out.append(f"<code>{self._text(m.group(1))}</code>")
            else:
                self.formulas += 1
                if not math.available():
                    self.tex_shown = True
                out.append(math.svg(m.group(2), f"{self.key}{self.formulas}-"))
            at = m.end()
        out.append(self._text(text[at:]))
        return "".join(out)

    def block(self, text: str) -> str:
        """A docstring's or a NOTE's text (cleaned: its own indent is 0) as HTML blocks."""
        return "\n".join(_html(b, self.inline) for b in _blocks(text.splitlines()))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


@dataclass
class _Block:
    kind: str  # "p", "ul" or "pre"
    lines: list[str] = field(default_factory=list)  # p, pre: its lines; ul: one per item


def _blocks(lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    open_kind = None

    def start(kind: str) -> _Block:
        nonlocal open_kind
        if open_kind != kind:
            blocks.append(_Block(kind))
            open_kind = kind
        return blocks[-1]

    for i, line in enumerate(lines):
        indent = _indent(line)
        if not line.strip():
            following = next((ln for ln in lines[i + 1:] if ln.strip()), "")
            if open_kind == "pre" and _indent(following) >= 4:
                blocks[-1].lines.append("")  # a blank line inside a preformatted run
            else:
                open_kind = None
        elif open_kind == "ul" and indent > 0:
            blocks[-1].lines[-1] += "\n" + line.strip()
        elif indent >= 4:
            start("pre").lines.append(line)
        elif _ITEM.match(line):
            start("ul").lines.append(line[2:])
        else:
            start("p").lines.append(line.strip())
    return blocks


def _html(block: _Block, inline: Callable[[str], str]) -> str:
    if block.kind == "pre":
        width = min(_indent(ln) for ln in block.lines if ln.strip())
        text = "\n".join(ln[width:] for ln in block.lines)
        return f'<pre class="pseudo">{html.escape(text, quote=False)}</pre>'
    if block.kind == "ul":
        return "<ul>" + "".join(f"<li>{inline(item)}</li>" for item in block.lines) + "</ul>"
    return f"<p>{inline(chr(10).join(block.lines))}</p>"
