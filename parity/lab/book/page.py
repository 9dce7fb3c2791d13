"""One topic's page: its introduction, its files, its manifest's rows side by side (reference |
torch, each row's claims under it), its pictures, and the source of the tests behind its
claims."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from parity.claims import Manifest, Twin
from parity.lab.book import source
from parity.lab.book.markup import document, highlight, slug
from parity.lab.book.prose import Prose
from parity.tolerances import CLAIMS

_CLAIMS = {c.id: c for c in CLAIMS}


@dataclass(frozen=True)
class Picture:
    name: str  # the file's name under docs/img
    caption: str


@dataclass
class _Test:
    nodeid: str  # file::function, its parameters dropped
    claims: list[str] = field(default_factory=list)
    nodeids: set[str] = field(default_factory=set)  # its cases (parameters) recorded


def test_anchor(nodeid: str) -> str:
    return "test-" + slug(nodeid.split("[", 1)[0].replace("::", "-").replace("/", "-"))


def _place_notes(m: Manifest) -> tuple[dict[int, list[source.Note]], dict[str, str]]:
    """The twin modules' NOTE blocks, each set before the first row whose entry in the same
    file comes after it (row len(m.rows): after the last row), and each NOTE's anchor."""
    placed: dict[int, list[source.Note]] = {}
    anchors: dict[str, str] = {}
    for module in m.modules:
        lines = source.top_level_lines(module)
        entry_lines = sorted(
            (lines[q], i) for i, row in enumerate(m.rows) for side in row.sides
            for mod, q in [side.split(":")] if mod == module and q in lines)
        for note in source.notes(module):
            at = next((i for line, i in entry_lines if line > note.line), len(m.rows))
            placed.setdefault(at, []).append(note)
            anchor = f"note-{slug(note.name)}"
            while anchor in anchors.values():
                anchor += "-"
            anchors.setdefault(note.name, anchor)
    return placed, anchors


class _Page:
    def __init__(self, m: Manifest, built: Sequence[str],
                 recorded: dict[str, dict[str, Any]]) -> None:
        self.m, self.built, self.recorded = m, built, recorded
        self.notes_at, anchors = _place_notes(m)
        self.prose = Prose(anchors, key=f"{m.topic}-")
        self.note_ids = dict(anchors)
        self.ids: set[str] = set()
        self.tests: dict[str, _Test] = {}

    def unique(self, anchor: str) -> str:
        while anchor in self.ids:
            anchor += "-"
        self.ids.add(anchor)
        return anchor

    def note(self, note: source.Note) -> str:
        anchor = self.note_ids[note.name]
        first = anchor not in self.ids
        self.ids.add(anchor)
        return (f'<aside class="note"{f" id={anchor!r}" if first else ""}>'
                f'<h4>NOTE [ {html.escape(note.name)} ] <span class="where">{note.where}'
                f"</span></h4>\n{self.prose.block(note.text)}</aside>")

    def side(self, spec: str | None, row: Twin, tree: str) -> str:
        if spec is None:
            alias = row.alias if tree == "torch" else None
            inner = (f'<p class="why">{self.prose.inline(row.why)}</p>' if alias is None
                     else self.alias(alias))
            return f'<div class="side {tree} {"none" if alias is None else "alias"}">{inner}</div>'
        s = source.side(spec)
        parts = [f'<div class="where">{s.where} <code>{html.escape(s.qualname)}</code></div>']
        if s.doc:
            parts.append(f'<div class="prose">{self.prose.block(s.doc)}</div>')
        parts.append(highlight(s.code))
        if tree == "torch" and row.alias is not None:
            parts.append(self.alias(row.alias))
        return f'<div class="side {tree}">{"".join(parts)}</div>'

    def alias(self, name: str) -> str:
        line = source.docs_line(source.resolve(name))
        said = f'<p class="docline">{html.escape(line)}</p>' if line else ""
        return (f'<p class="alias">torch IS <code>{html.escape(name)}</code></p>{said}')

    def claim(self, cid: str) -> str:
        c = _CLAIMS[cid]
        rec = self.recorded.get(cid)
        anchor = f"claim-{cid}"
        own = anchor not in self.ids
        self.ids.add(anchor)
        home = ""
        if c.topic != self.m.topic:
            home = (f' <a class="home" href="{c.topic}.html#{anchor}">({c.topic})</a>'
                    if c.topic in self.built else f" ({c.topic})")
        if rec is None:
            seen = '<span class="obs none">not recorded</span>'
        else:
            raw = "" if rec.get("raw") is None else f" · max |a-b| {rec['raw']:.3g}"
            seen = (f'<span class="obs">observed {rec["observed"]:.3g}{raw} · '
                    f'<span class="n">n = {rec["n"]:,}</span> · {rec["verdict"]}</span>')
        tests: dict[str, None] = {}
        for nodeid in (rec or {}).get("tests", []):
            key = nodeid.split("[", 1)[0]
            t = self.tests.setdefault(key, _Test(key))
            t.nodeids.add(nodeid)
            if cid not in t.claims:
                t.claims.append(cid)
            tests[key] = None
        links = ", ".join(f'<a href="#{test_anchor(k)}">{html.escape(k.split("::")[-1])}</a>'
                          for k in tests)
        reason = html.escape(c.reason, quote=True)
        return (f'<div class="claim"{f" id={anchor!r}" if own else ""} data-claim="{cid}">'
                f'<div class="head"><a class="cid" href="#{anchor}">{cid}</a>{home} '
                f'<span class="kind">{c.kind}</span> '
                f'<span class="bound" title="{reason}">{html.escape(c.tolerance)}</span> '
                f"{seen}</div>"
                + (f'<div class="tests">tests: {links}</div>' if links else "")
                + f"<details><summary>statement and reason</summary>"
                f"<p>{self.prose.inline(c.statement)}</p>"
                f'<p class="reason">{self.prose.inline(c.reason)}</p></details></div>')

    def row(self, row: Twin) -> str:
        anchor = self.unique(f"row-{slug(row.name)}")
        head = [f'<h3 id="{anchor}"><a href="#{anchor}">{html.escape(row.name)}</a></h3>']
        lone = row.reference is None or (row.torch is None and row.alias is None)
        if row.why and not lone:
            head.append(f'<p class="why">{self.prose.inline(row.why)}</p>')
        if row.disorder:
            head.append(f'<p class="disorder">order: {self.prose.inline(row.disorder)}</p>')
        claims = "".join(self.claim(cid) for cid in row.claims)
        return (f'<section class="row" data-row="{html.escape(row.name)}">{"".join(head)}'
                f'<div class="twin">{self.side(row.reference, row, "reference")}'
                f'{self.side(row.torch, row, "torch")}</div>'
                + (f'<div class="claims">{claims}</div>' if claims else "") + "</section>")

    def files(self, intro_module: str) -> str:
        cols = {"reference": [], "torch": []}
        for module in self.m.modules:
            path = source.rel(source.module_file(module))
            doc = ("<p>Its docstring is the introduction above.</p>" if module == intro_module
                   else self.prose.block(source.module_doc(module)))
            tree = "reference" if module.startswith("reference.") else "torch"
            cols[tree].append(f'<details class="module" open><summary><code>{path}</code>'
                              f"</summary>{doc}</details>")
        return (f'<div class="twin files"><div class="side reference">{"".join(cols["reference"])}'
                f'</div><div class="side torch">{"".join(cols["torch"])}</div></div>')

    def test(self, t: _Test) -> str:
        anchor = self.unique(test_anchor(t.nodeid))
        found = source.test_source(t.nodeid)
        body = (highlight(found[1]) if found else
                "<p>The file no longer defines it (renamed since the report was recorded).</p>")
        where = f'<span class="where">{found[0]}</span>' if found else ""
        cases = f" · {len(t.nodeids)} cases" if len(t.nodeids) > 1 else ""
        claims = ", ".join(f'<a href="#claim-{c}">{c}</a>' for c in t.claims)
        return (f'<details class="test" id="{anchor}"><summary><code>{html.escape(t.nodeid)}'
                f"</code>{cases}{' · ' + claims if claims else ''}</summary>{where}{body}"
                "</details>")


def topic_page(m: Manifest, built: Sequence[str], recorded: dict[str, dict[str, Any]],
               pictures: list[Picture], intro: str) -> str:
    p = _Page(m, built, recorded)
    intro_module = source.page_module(m)
    rows = []
    for i, row in enumerate(m.rows):
        rows += [p.note(n) for n in p.notes_at.get(i, [])]
        rows.append(p.row(row))
    rows += [p.note(n) for n in p.notes_at.get(len(m.rows), [])]
    headline = m.headline.split("::")[0] + "::" + m.headline.split("::")[1]
    p.tests.setdefault(headline, _Test(headline))
    tests = [p.test(t) for t in sorted(p.tests.values(), key=lambda t: t.nodeid)]
    figures = "".join(f'<figure><img src="img/{pic.name}" '
                      f'alt="{html.escape(pic.caption or pic.name)}"><figcaption>'
                      f"{html.escape(pic.caption)} <code>{pic.name}</code></figcaption></figure>"
                      for pic in pictures)
    helpers = "".join(f"<li><code>{h.module}</code>: {p.prose.inline(h.why)}</li>"
                      for h in m.helpers)
    top = [f"<h1>{m.topic}</h1>"]
    if intro:
        top.append(f'<div class="prose handwritten">{p.prose.block(intro)}</div>')
    where = source.rel(source.module_file(intro_module))
    top.append(f'<div class="prose intro"><p class="where">{where}</p>'
               f"{p.prose.block(source.module_doc(intro_module))}</div>")
    top.append(f'<p class="meta">{len(m.rows)} rows · headline test: '
               f'<a href="#{test_anchor(headline)}"><code>{html.escape(headline)}</code></a></p>')
    body = [f'<h2 id="files">The files</h2>{p.files(intro_module)}',
            '<h2 id="rows">Side by side</h2><div class="twin columns"><div>reference (NumPy)'
            "</div><div>torch (PyTorch)</div></div>" + "\n".join(rows)]
    if figures:
        body.append(f'<h2 id="pictures">Pictures</h2><div class="figures">{figures}</div>')
    if helpers:
        body.append(f'<h2 id="helpers">Helpers: not twins</h2><ul>{helpers}</ul>')
    body.append(f'<h2 id="tests">Tests</h2>{"".join(tests)}')
    if p.prose.tex_shown:
        top.append('<p class="notice">matplotlib is not installed: formulas are shown as '
                   "their TeX source.</p>")
    return document(f"{m.topic}: mirrortrain book", "\n".join(top + body), m.topic, built)
