"""The book built once per test run, for every test file that reads it.

tests/test_book.py parses the site and tests/test_book_browser.py serves it to Chromium;
under pytest-xdist the two files may run on different workers, and each built the whole
book (about 3 s of CPU). `built_site` builds it under the run's shared temporary folder (the
parent of each worker's own, as pytest-xdist documents for data shared between workers),
the first caller holding a lock while the others wait, and returns the same folder to all.
A build that failed leaves no folder behind, so the next caller builds (and fails) again.
"""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import pytest

from parity.lab.cli import main


def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder `python -m parity book --out` wrote, built once per run."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base
    site = shared / "book-site"
    with open(shared / "book-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (site / "index.html").is_file():
                shutil.rmtree(site, ignore_errors=True)
                building = shared / "book-site.building"
                shutil.rmtree(building, ignore_errors=True)
                assert main(["book", "--out", str(building)]) == 0
                building.rename(site)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return site
