"""The book (`python -m parity book`, parity/lab/book/): every page is there, every internal link
and anchor lands, nothing is loaded from outside, each topic's page shows every row of its
manifest with both sides and every claim of the topic with its recorded n, and the command
refuses a folder it did not write and a topic that does not exist.

The site is built once, by the command itself, into a temporary folder, and read back with the
standard library's html.parser; what a page must show is computed here from the manifests,
the claims, docs/data/report.json and the source files, not from the renderer.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from parity.claims import TOPICS
from parity.lab.book import math, source
from parity.lab.book.prose import Prose
from parity.lab.book.render import build, manifest
from parity.tolerances import CLAIMS
from tests.book_site import built_site
from tests.test_cli import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
RECORD = json.loads((ROOT / "docs" / "data" / "report.json").read_text(encoding="utf-8"))
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
LINKS = ("href", "src", "xlink:href", "srcset", "poster", "data", "action")


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self) -> list[Element]:
        out = [self]
        for c in self.children:
            if isinstance(c, Element):
                out += c.walk()
        return out

    def find(self, tag: str = "", cls: str = "") -> list[Element]:
        return [e for e in self.walk() if (not tag or e.tag == tag) and
                (not cls or cls in e.classes)]


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        e = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(e)
        if tag not in VOID:
            self.stack.append(e)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if any(e.tag == tag for e in self.stack[1:]):
            while self.stack.pop().tag != tag:
                pass

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(path: Path) -> Element:
    tree = _Tree()
    tree.feed(path.read_text(encoding="utf-8"))
    tree.close()
    assert len(tree.stack) == 1, f"{path.name}: unclosed {[e.tag for e in tree.stack[1:]]}"
    return tree.root


def site_problems(site: Path, pages: dict[str, Element] | None = None) -> list[str]:
    """Every internal link or anchor of the site's pages (file name -> parsed page, parsed
    here when not given) that does not land, and every reference to anything outside the site
    (a URL with a scheme or a host, a script, a CSS import or remote url())."""
    if pages is None:
        pages = {p.name: parse(p) for p in sorted(site.glob("*.html"))}
    ids = {name: [e.attrs["id"] for e in page.walk() if "id" in e.attrs]
           for name, page in pages.items()}
    problems = [f"{name}: id {i!r} twice" for name, found in ids.items()
                for i in set(found) if found.count(i) > 1]
    css = (site / "style.css").read_text(encoding="utf-8")
    problems += [f"style.css loads {u}" for u in re.findall(r"@import|url\(\s*['\"]?[a-z]+:", css)]
    for name, page in pages.items():
        for e in page.walk():
            if e.tag == "script":
                problems.append(f"{name}: a <script>")
            for attr in LINKS:
                target = e.attrs.get(attr)
                if target is None:
                    continue
                if re.match(r"[a-z][a-z0-9+.-]*:|//", target, re.I):
                    problems.append(f"{name}: <{e.tag} {attr}={target!r}> leaves the site")
                    continue
                file, _, anchor = target.partition("#")
                into = name if not file else file
                if not (site / into).is_file() or not (site / into).resolve().is_relative_to(
                        site.resolve()):
                    problems.append(f"{name}: <{e.tag} {attr}={target!r}>: no such file")
                elif anchor and anchor not in ids.get(into, []):
                    problems.append(f"{name}: <{e.tag} {attr}={target!r}>: no such anchor")
    return problems


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole book, built once per run (tests/book_site.py); read, never written."""
    return built_site(tmp_path_factory)


@pytest.fixture(scope="module")
def parsed(site: Path) -> dict[str, Element]:
    """Each page of the site by file name, parsed."""
    return {p.name: parse(p) for p in sorted(site.glob("*.html"))}


@pytest.fixture(scope="module")
def pages(parsed: dict[str, Element]) -> dict[str, Element]:
    """Each topic's page, parsed."""
    return {t: parsed[f"{t}.html"] for t in TOPICS}


def test_the_book_has_an_index_a_page_per_topic_and_each_topics_pictures(site: Path) -> None:
    """index.html, <topic>.html for every topic, style.css, and docs/img/<topic>_*.png copied
    into img/ for every topic, byte for byte."""
    assert (site / "index.html").is_file() and (site / "style.css").is_file()
    assert sorted(p.name for p in site.glob("*.html")) == sorted(
        ["index.html", *(f"{t}.html" for t in TOPICS)])
    drawn = [p for t in TOPICS for p in sorted((ROOT / "docs" / "img").glob(f"{t}_*.png"))]
    assert drawn, "no topic pictures in docs/img"
    assert sorted(p.name for p in (site / "img").iterdir()) == sorted(p.name for p in drawn)
    assert all((site / "img" / p.name).read_bytes() == p.read_bytes() for p in drawn)


def test_every_link_and_anchor_lands_and_nothing_comes_from_outside(
        site: Path, parsed: dict[str, Element]) -> None:
    """Parsed with html.parser: each href/src is a file of the site and each #anchor an id of
    its page; no URL with a scheme or host, no script, no CSS import or remote url()."""
    assert site_problems(site, parsed) == []


def _path(spec: str) -> str:
    return spec.split(":")[0].replace(".", "/") + ".py"


def _sides(section: Element) -> list[Element]:
    twin = next(e for e in section.find("div", "twin"))
    return [c for c in twin.children if isinstance(c, Element) and "side" in c.classes]


@pytest.mark.parametrize("topic", TOPICS)
def test_every_row_of_the_manifest_shows_both_sides_in_order(
        topic: str, pages: dict[str, Element]) -> None:
    """The page's rows are the manifest's, in its order, each with a reference side and a torch
    side: the object's file and first line (that line of the file is the first line shown),
    the torch object it IS, or the one line saying why there is none."""
    rows = [s for s in pages[topic].find("section", "row")]
    m = manifest(topic)
    assert [s.attrs["data-row"] for s in rows] == [r.name for r in m.rows]
    for row, section in zip(m.rows, rows, strict=True):
        ref, tor = _sides(section)
        assert "reference" in ref.classes and "torch" in tor.classes, row.name
        for spec, side in ((row.reference, ref), (row.torch, tor)):
            if spec is None:
                continue
            where = side.find("div", "where")[0].text()
            file, line = where.split()[0].split(":")
            assert file == _path(spec) and spec.split(":")[1] in where, (row.name, where)
            shown = side.find("pre", "code")[0].text().splitlines()[0].strip()
            written = (ROOT / file).read_text(encoding="utf-8").splitlines()[int(line) - 1]
            assert written.strip() == shown, (row.name, written, shown)
        if row.alias is not None:
            assert row.alias in tor.text(), row.name
        for spec, side in ((row.reference, ref), (row.torch or row.alias, tor)):
            if spec is None:
                assert " ".join(row.why.split()) in " ".join(side.text().split()), row.name


@pytest.mark.parametrize("topic", TOPICS)
def test_every_claim_of_the_topic_shows_its_bound_and_recorded_n(
        topic: str, pages: dict[str, Element]) -> None:
    """Each claim of the topic has its anchor, its tolerance and the n of docs/data/report.json,
    inside a row that names it; every claim a row names is shown in that row; each test the
    record names is on the page, with its source."""
    page = pages[topic]
    by_id = {e.attrs["id"]: e for e in page.walk() if "id" in e.attrs}
    m = manifest(topic)
    named = {cid for row in m.rows for cid in row.claims}
    for claim in (c for c in CLAIMS if c.topic == topic):
        shown = by_id[f"claim-{claim.id}"]
        text = " ".join(shown.text().split())
        assert claim.tolerance in text, claim.id
        assert f"n = {RECORD[claim.id]['n']:,}" in text, (claim.id, text)
        assert claim.id in named
    for row, section in zip(m.rows, page.find("section", "row"), strict=True):
        assert [e.attrs["data-claim"] for e in section.find("div", "claim")] == list(row.claims)
    tests = {e.attrs["id"]: " ".join(e.text().split()) for e in page.find("details", "test")}
    for cid in named:
        for nodeid in RECORD[cid]["tests"]:
            base = nodeid.split("[")[0]
            found = [t for t in tests.values() if base in t]
            assert found and f"def {base.split('::')[-1]}(" in found[0], nodeid


def test_a_side_is_the_source_inspect_gives_for_a_class_or_function() -> None:
    """source.side finds an object's statement with ast; for a class or function it spans the
    lines inspect.getsourcelines gives (decorators included)."""
    checked = 0
    for topic in ("loss_scaling", "nn"):
        for row in manifest(topic).rows:
            for spec in row.sides:
                obj = source.resolve(spec)
                if not (inspect.isclass(obj) or inspect.isfunction(obj)) or \
                        inspect.getsourcefile(obj) != str(source.module_file(spec.split(":")[0])):
                    continue
                lines, first = inspect.getsourcelines(obj)
                assert source.side(spec).span == (first, first + len(lines) - 1), spec
                checked += 1
    assert checked > 30


def test_math_is_inline_svg_and_tex_source_without_matplotlib(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`$...$` in prose becomes an <svg> of paths (its TeX as its label, ids of its own on the
    page); without matplotlib, the TeX in a <code>, and the page knows to say so."""
    if not math.available():
        pytest.skip("matplotlib (the plot extra) is not installed")
    prose = Prose()
    text = prose.block("The bound $|a - b| \\leq 2^{-23} S$ and again $x^2$, but not `$x$`.")
    assert text.count("<svg") == 2 and 'aria-label="|a - b| \\leq 2^{-23} S"' in text
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert ids and len(ids) == len(set(ids))
    assert "<code>$x$</code>" in text and "http" not in text and not prose.tex_shown
    monkeypatch.setattr(math, "available", lambda: False)
    bare = Prose()
    assert bare.block("a $x^2$ b") == '<p>a <code class="tex">$x^2$</code> b</p>'
    assert bare.tex_shown


def test_a_hand_written_introduction_comes_before_the_docstring(tmp_path: Path) -> None:
    """docs/book/<topic>.md, where a topic has one, is shown above the module docstring."""
    (tmp_path / "intros").mkdir()
    (tmp_path / "intros" / "fp8_gemm.md").write_text("Read `this` first.\n", encoding="utf-8")
    build(tmp_path / "site", ["fp8_gemm"], intros=tmp_path / "intros")
    text = (tmp_path / "site" / "fp8_gemm.html").read_text(encoding="utf-8")
    doc = source.module_doc("reference.fp8_gemm").splitlines()[0]
    assert "<p>Read <code>this</code> first.</p>" in text
    assert text.index("Read <code>this</code>") < text.index(doc[:40])
    assert site_problems(tmp_path / "site") == []


def test_book_refuses_a_folder_it_did_not_write_and_an_unknown_topic(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One line on stderr and exit 2, before anything is written: a non-empty folder without
    the output mark (the user's file left as it was), and a topic that is not one."""
    mine = tmp_path / "notes.txt"
    mine.write_text("mine\n", encoding="utf-8")
    status, out, err = run_cli(["book", "--out", str(tmp_path)], capsys)
    assert_one_line_error(status, err, "--out", "notes.txt", "new or empty folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"] and out == ""
    status, out, err = run_cli(["book", "--out", str(tmp_path / "new"), "--topic", "nope"],
                               capsys)
    assert_one_line_error(status, err, "--topic", "nope", *TOPICS)
    assert not (tmp_path / "new").exists() and out == ""
