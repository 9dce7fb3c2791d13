"""The book in a real browser: Debian's Chromium (/usr/bin/chromium), headless, driven by
playwright's Python package (the `book` extra; never `playwright install`, which downloads a
browser of its own), every page served from 127.0.0.1 and opened at 1440x900 and 800x900.

At 1440 px each manifest row's two columns sit side by side (the same top, reference left of
torch, both inside the viewport); at 800 px they stack (torch under reference, each nearly the
full width); at neither does the page scroll sideways. Every link and anchor of every page
lands in the browser's own resolution of it against that page's address (each page fetched
and parsed once, in one test, for all the pages linking to it), every image loads, nothing is
requested outside the site and the console shows no error.

The test also takes a screenshot of the loss_scaling page at 1440x900 (compared with nothing);
with MIRRORTRAIN_BOOK_SCREENSHOT=1 it writes it to docs/img/book/loss_scaling.png, the
committed picture docs/book.md shows:

    MIRRORTRAIN_BOOK_SCREENSHOT=1 pytest -p no:cacheprovider -n 0 tests/test_book_browser.py
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from parity.claims import TOPICS
from tests.book_site import built_site

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDE, NARROW, HEIGHT = 1440, 800, 900
SCREENSHOT = ROOT / "docs" / "img" / "book" / "loss_scaling.png"
REFRESH = "MIRRORTRAIN_BOOK_SCREENSHOT"
PAGES = ("index", *TOPICS)

# Each two-column block (.twin holding two .side) as [label, left, right, top, bottom] of its
# reference side then its torch side; the page's scroll width and the viewport's width.
_LAYOUT = """() => {
  const boxes = [];
  for (const twin of document.querySelectorAll('.twin')) {
    const sides = [...twin.children].filter(e => e.classList.contains('side'));
    if (sides.length !== 2) continue;
    const label = twin.closest('section') ? twin.closest('section').dataset.row : 'files';
    const [a, b] = sides.map(e => e.getBoundingClientRect());
    boxes.push([label, sides[0].className, sides[1].className,
                a.left, a.right, a.top, a.bottom, b.left, b.right, b.top, b.bottom]);
  }
  return {boxes, scroll: document.documentElement.scrollWidth, width: window.innerWidth};
}"""

# Every link and SVG reference of every page, as the browser resolves it against that page's
# own address: a same-page anchor must be an element of it, another page must load and hold
# the anchor. Each page is fetched and parsed once, for all the pages that link to it.
_LINKS = """async (names) => {
  const bad = [], docs = {};
  const load = async (path) => {
    if (!(path in docs)) {
      const r = await fetch(path);
      docs[path] = !r.ok ? null : r.headers.get('content-type').includes('html')
        ? new DOMParser().parseFromString(await r.text(), 'text/html') : 'file';
    }
    return docs[path];
  };
  for (const name of names) {
    const here = new URL(name + '.html', location.href);
    const page = await load(here.pathname);
    const refs = [...page.querySelectorAll('a[href], link[href]')].map(
        e => [e.getAttribute('href'), new URL(e.getAttribute('href'), here).href]);
    for (const u of page.querySelectorAll('use')) {
      const h = u.getAttribute('xlink:href') || u.getAttribute('href');
      refs.push([h, new URL(h, here).href]);
    }
    for (const [written, full] of refs) {
      const url = new URL(full);
      if (url.origin !== location.origin) {
        bad.push(name + ': leaves the site: ' + written);
        continue;
      }
      const doc = await load(url.pathname);
      if (doc === null) { bad.push(name + ': no such file: ' + written); continue; }
      const id = decodeURIComponent(url.hash.slice(1));
      if (id && (doc === 'file' || !doc.getElementById(id))) {
        bad.push(name + ': no anchor: ' + written);
      }
    }
  }
  return bad;
}"""

# Every image of the open page has loaded.
_IMAGES = """() => [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(
    i => 'image: ' + i.getAttribute('src'))"""


def _why_not() -> str | None:
    if not CHROMIUM.is_file():
        return (f"{CHROMIUM} is missing (Debian: apt-get update && apt-get install -y "
                "chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return 'playwright is not installed (pip install -e ".[book]")'
    return None


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The whole book, built by the command and served on a free port of 127.0.0.1 from a
    thread, shut down at the end: its base URL."""
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    site = built_site(tmp_path_factory)  # shared with tests/test_book.py
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(served: str) -> Iterator[Any]:
    """Chromium with a new empty profile, every request outside the site refused."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True, args=ARGS,
            viewport={"width": WIDE, "height": HEIGHT})
        context.outside = []  # type: ignore[attr-defined]

        def route(r: Any) -> None:
            if r.request.url.startswith(served):
                r.continue_()
            else:
                context.outside.append(r.request.url)  # type: ignore[attr-defined]
                r.abort()

        context.route("**/*", route)
        try:
            yield context
        finally:
            context.close()


def _layout_problems(layout: dict[str, Any], wide: bool) -> list[str]:
    problems = []
    if layout["scroll"] > layout["width"]:
        problems.append(f"the page scrolls sideways: {layout['scroll']} > {layout['width']} px")
    for label, ref, tor, *box in layout["boxes"]:
        al, ar, at, ab, bl, br, bt, _ = box
        if "reference" not in ref or "torch" not in tor:
            problems.append(f"{label}: columns {ref!r} | {tor!r}")
        if min(al, bl) < 0 or max(ar, br) > layout["width"]:
            problems.append(f"{label}: a column outside the viewport ({al}..{ar}, {bl}..{br})")
        if wide and not (abs(at - bt) < 1 and ar <= bl and ar - al > 300 and br - bl > 300):
            problems.append(f"{label}: not side by side at {WIDE} px: {box}")
        if not wide and not (bt >= ab - 1 and abs(al - bl) < 1
                             and min(ar - al, br - bl) > 0.8 * layout["width"]):
            problems.append(f"{label}: not stacked full width at {NARROW} px: {box}")
    return problems


@pytest.mark.parametrize("name", PAGES)
def test_each_page_reads_side_by_side_wide_and_stacked_narrow(
        name: str, served: str, browser: Any, tmp_path: Path) -> None:
    """Two columns side by side at 1440 px and stacked at 800 px, no sideways scroll at
    either, every image loaded, no request outside the site, no console error."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
    page.on("response", lambda r: errors.append(f"{r.status}: {r.url}")
            if r.status >= 400 else None)
    try:
        page.goto(f"{served}{name}.html", wait_until="load")
        wide = page.evaluate(_LAYOUT)
        assert name == "index" or len(wide["boxes"]) > 1, "no two-column rows"
        problems = _layout_problems(wide, wide=True)
        problems += page.evaluate(_IMAGES)
        if name == "loss_scaling":
            page.goto(f"{served}{name}.html#row-step_skipped", wait_until="load")
            shot = page.screenshot()
            assert shot[:8] == b"\x89PNG\r\n\x1a\n"
            if os.environ.get(REFRESH) == "1":
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                SCREENSHOT.write_bytes(shot)
        page.set_viewport_size({"width": NARROW, "height": HEIGHT})
        problems += _layout_problems(page.evaluate(_LAYOUT), wide=False)
    finally:
        page.close()
    assert problems == []
    assert errors == [] and browser.outside == []


def test_every_link_and_anchor_of_every_page_lands_as_the_browser_resolves_it(
        served: str, browser: Any) -> None:
    """Each page's links, anchors and SVG references, resolved by the browser against the
    page's own address: each lands on a file of the site and, with a #fragment, on an element
    of that id; nothing leaves the site."""
    page = browser.new_page()
    try:
        page.goto(f"{served}index.html", wait_until="load")
        problems = page.evaluate(_LINKS, list(PAGES))
    finally:
        page.close()
    assert problems == []
    assert browser.outside == []
