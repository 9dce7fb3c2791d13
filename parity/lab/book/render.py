"""The site: the index, one page per topic (page.py), the style sheet, the pictures.

Everything a page shows is read here or in source.py: the manifests and claims (parity.claims),
the last recorded observations (docs/data/report.json, written by `python -m parity report
--record`), the pictures (docs/img/<topic>_*.png, each captioned by the docstring of the
function that draws it in parity/lab/pictures/), and the optional introductions
(docs/book/<topic>.md).
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.claims import TOPICS, Manifest
from parity.lab.book.markup import document, style_sheet
from parity.lab.book.page import Picture, topic_page
from parity.lab.book.prose import Prose
from parity.lab.book.source import ROOT, module_doc, page_module
from parity.tolerances import CLAIMS

DOCS = ROOT / "docs"
RECORD = DOCS / "data" / "report.json"
IMG = DOCS / "img"
INTROS = DOCS / "book"  # docs/book/<topic>.md: a topic's one hand-written introduction
PICTURES = ROOT / "parity" / "lab" / "pictures"


def manifest(topic: str) -> Manifest:
    return importlib.import_module(f"parity.claims.{topic}").MANIFEST


def records(path: Path = RECORD) -> dict[str, dict[str, Any]]:
    """{claim id: {"observed", "raw", "n", "verdict", "tests"}} as last recorded ({} where
    nothing was)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@functools.cache
def _captions() -> dict[str, str]:
    """Each registered picture's name -> the first paragraph of its drawing function's
    docstring (read off parity/lab/pictures/ with ast: nothing is imported or drawn)."""
    found = {}
    for path in sorted(PICTURES.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "picture" and \
                        d.args and isinstance(d.args[0], ast.Constant):
                    doc = ast.get_docstring(node) or ""
                    found[str(d.args[0].value)] = " ".join(doc.split("\n\n")[0].split())
    return found


def pictures(topic: str, img: Path = IMG) -> list[Picture]:
    """docs/img/<topic>_*.png, by name."""
    return [Picture(p.name, _captions().get(p.name, ""))
            for p in sorted(img.glob(f"{topic}_*.png"))]


def intro(topic: str, intros: Path = INTROS) -> str:
    """The topic's hand-written introduction ("" where there is none)."""
    path = intros / f"{topic}.md"
    return path.read_text(encoding="utf-8").strip() if path.is_file() else ""


def index_page(built: Sequence[str], recorded: dict[str, dict[str, Any]]) -> str:
    rows = []
    for t in built:
        m = manifest(t)
        claims = [c for c in CLAIMS if c.topic == t]
        held = sum(recorded.get(c.id, {}).get("verdict") == "ok" for c in claims)
        doc = module_doc(page_module(m)).split("\n\n")[0]
        rows.append(f'<tr><td><a href="{t}.html">{t}</a></td>'
                    f"<td>{Prose(key=f'i{t}-').inline(doc)}</td>"
                    f"<td>{len(m.rows)}</td><td>{len(claims)}</td><td>{held}</td></tr>")
    body = (
        "<h1>mirrortrain: the book</h1>\n"
        "<p>Each page sets one topic's twins side by side, row by row as its manifest lists "
        "them (<code>parity/claims/&lt;topic&gt;.py</code>): the NumPy reference on the "
        "left, its PyTorch counterpart on the right, and under them the claims that hold the "
        "two equal, with the worst case and the number of cases observed when the report was "
        "last recorded. Rendered from the code by <code>python -m parity book</code>.</p>\n"
        "<div class=\"scroll\"><table class=\"index\"><thead><tr><th>topic</th>"
        "<th>what it is (the reference module's docstring)</th><th>rows</th><th>claims</th>"
        "<th>held at the last record</th></tr></thead>\n<tbody>\n" + "\n".join(rows)
        + "\n</tbody></table></div>")
    return document("mirrortrain: the book", body, "index", built)


@dataclass(frozen=True)
class Book:
    pages: list[Path]  # index.html first, then one page per topic
    tex_shown: bool  # some formula is shown as its TeX source (no matplotlib)


def build(out: Path, topics: Sequence[str] = TOPICS, img: Path = IMG,
          intros: Path = INTROS, record: Path = RECORD) -> Book:
    """Write the book into the folder `out` (which the caller has made its own): index.html,
    <topic>.html for each of `topics`, style.css, img/."""
    recorded = records(record)
    built = [t for t in TOPICS if t in topics]
    out.mkdir(parents=True, exist_ok=True)
    (out / "style.css").write_text(style_sheet(), encoding="utf-8")
    (out / "img").mkdir(exist_ok=True)
    texts = {out / "index.html": index_page(built, recorded)}
    for t in built:
        pics = pictures(t, img)
        for p in pics:
            shutil.copyfile(img / p.name, out / "img" / p.name)
        texts[out / f"{t}.html"] = topic_page(manifest(t), built, recorded, pics,
                                              intro(t, intros))
    for path, text in texts.items():
        path.write_text(text, encoding="utf-8")
    return Book(list(texts), any('<code class="tex">' in text for text in texts.values()))
