"""The pytest plugin behind `python -m parity report` (parity/lab/report.py starts pytest
with `-p parity.lab.report_plugin`).

While the parity tests run, parity.compare records what every claim assertion observed
(compare.RECORD). This plugin notes which claims each test asserted (the record's calls
before and after the test), the test's outcome and time, and at the end writes one JSON
file, the path in $MIRRORTRAIN_REPORT_JSON:

    {"claims":  {id: {"worst", "n", "raw", "held", "calls"}},
     "tests":   [{"nodeid", "outcome", "seconds", "cpu", "claims": [id, ...], "message"}],
     "missing": [the optional packages claims name (Claim.extra) that this process could
                 not find],
     "torch": its version, "versions": {library: version} (parity.claims.VERIFIED's)}

A skipped test, or a test module pytest skipped whole (`pytest.importorskip` at its top),
is a "tests" entry with outcome "skipped" and pytest's skip reason as its message: the
report reads what pytest actually skipped, never what a claim says would be skipped.

"seconds" is the test call's wall clock (pytest's duration); "cpu" the CPU seconds, user and
system, of this process and of the children it waited for (the C++ compiler's builds, a
training subprocess) from the test's start, its setup included: on a shared machine the wall
clock counts the neighbours too, the CPU time does not (the report balances its processes
by it).

A progress bar goes to stderr (one tick per test).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import resource
import sys
from pathlib import Path
from typing import Any

import pytest

from parity import compare
from parity.claims import installed_versions

_TESTS: list[dict[str, Any]] = []
_BEFORE: dict[str, int] = {}
_CPU_AT_START: list[float] = [0.0]
_BAR: Any = None


def _number(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its waited-for children so far."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_collection_finish(session: pytest.Session) -> None:
    global _BAR
    from tqdm import tqdm

    position = int(os.environ.get("MIRRORTRAIN_REPORT_BAR", "0"))  # one bar per process
    _BAR = tqdm(total=len(session.items), unit="test", file=sys.stderr, leave=False,
                desc=f"report {position + 1}", position=position)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _BEFORE.clear()
    _BEFORE.update({cid: o.calls for cid, o in compare.RECORD.items()})
    _CPU_AT_START[0] = cpu_seconds()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    failed_setup = report.when == "setup" and report.outcome != "passed"
    if report.when != "call" and not failed_setup:
        return
    asserted = sorted(cid for cid, o in compare.RECORD.items()
                      if o.calls != _BEFORE.get(cid, 0))
    message = ""
    if report.failed:
        message = str(report.longrepr).strip().splitlines()[-1][:300]
    elif report.skipped:
        message = skip_reason(report)
    _TESTS.append({"nodeid": report.nodeid, "outcome": report.outcome,
                   "seconds": round(report.duration, 3),
                   "cpu": round(cpu_seconds() - _CPU_AT_START[0], 3), "claims": asserted,
                   "message": message})
    if _BAR is not None:
        _BAR.update(1)


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """pytest's reason for a skip (its longrepr is (path, line, "Skipped: reason"))."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")[:300]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped while importing (pytest.importorskip)
        _TESTS.append({"nodeid": report.nodeid, "outcome": "skipped", "seconds": 0.0,
                       "cpu": 0.0, "claims": [], "message": skip_reason(report)})


def missing_extras() -> list[str]:
    """The optional packages the claims name (Claim.extra) that cannot be imported here (a
    None in sys.modules, as the root conftest's MIRRORTRAIN_WITHOUT leaves, counts as
    missing, and so does an installed one whose import raised: parity.extras.BROKEN), or
    whose installed version is not the one EXTRAS pins (its tests skip)."""
    from parity.claims import EXTRAS
    from parity.extras import BROKEN
    from parity.tolerances import CLAIMS

    missing = []
    for name in sorted({c.extra for c in CLAIMS if c.extra}):
        hidden = name in BROKEN or (name in sys.modules and sys.modules[name] is None)
        try:
            found = not hidden and importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken spec
            found = False
        if found:
            try:
                found = importlib.metadata.version(name) == EXTRAS[name]
            except importlib.metadata.PackageNotFoundError:
                found = False
        if not found:
            missing.append(name)
    return missing


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _BAR is not None:
        _BAR.close()
    path = os.environ.get("MIRRORTRAIN_REPORT_JSON")  # report.REPORTING
    if not path:
        return
    claims = {cid: {"worst": _number(o.worst), "n": o.n, "raw": _number(o.raw),
                    "held": o.held, "calls": o.calls}
              for cid, o in compare.RECORD.items()}
    Path(path).write_text(json.dumps({"claims": claims, "tests": _TESTS,
                                      "missing": missing_extras(),
                                      "torch": importlib.metadata.version("torch"),
                                      "versions": installed_versions()},
                                     allow_nan=False),
                          encoding="utf-8")
