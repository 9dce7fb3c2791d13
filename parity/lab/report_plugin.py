"""The pytest plugin behind `python -m parity report` (parity/lab/report.py starts pytest
with `-p parity.lab.report_plugin`, under pytest-xdist when it runs more than one worker).

While the parity tests run, parity.compare records what every claim assertion observed
(compare.RECORD). This plugin notes which claims each test asserted (the record's calls
before and after the test), the test's outcome and time, and writes one record:

    {"claims":  {id: {"worst", "n", "raw", "held", "calls"}},
     "tests":   [{"nodeid", "outcome", "seconds", "claims": [id, ...], "message"}],
     "missing": [the optional packages claims name (Claim.extra) that this process could
                 not find],
     "torch": its version, "versions": {library: version} (parity.claims.VERIFIED's)}

Under xdist each worker keeps its own record and hands it back through xdist's worker output
(`config.workeroutput`, read by the controller in pytest_testnodedown); the controller
merges them (report.merge) and writes the file named by $MIRRORTRAIN_REPORT_JSON. Without
xdist the one process writes its own. The controller also keeps every test report it was
sent: a test whose worker crashed has a report there (xdist's "worker crashed while running")
and none in any worker's record, and it enters the record as a failed test that asserted no
claim, naming the test, so the report fails instead of turning a crash into a green table.

A skipped test, or a test module pytest skipped whole (`pytest.importorskip` at its top),
is a "tests" entry with outcome "skipped" and pytest's skip reason as its message: the
report reads what pytest actually skipped, never what a claim says would be skipped.

A progress bar goes to stderr (one tick per test), drawn by the controller.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from parity import compare
from parity.claims import installed_versions

KEY = "mirrortrain_report"  # the record's key in xdist's worker output
_TESTS: list[dict[str, Any]] = []  # this process's tests (a worker's, or the only process's)
_SEEN: dict[str, dict[str, Any]] = {}  # the controller: every test report it was sent
_WORKERS: list[dict[str, Any]] = []  # the controller: each worker's record
_BEFORE: dict[str, int] = {}
_BAR: Any = None


def _number(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config: pytest.Config) -> bool:
    """The process that hands tests to xdist's workers (and runs none itself)."""
    return not _is_worker(config) and config.pluginmanager.getplugin("dsession") is not None


def pytest_collection_finish(session: pytest.Session) -> None:
    global _BAR
    if _is_worker(session.config) or _BAR is not None:
        return
    from tqdm import tqdm

    _BAR = tqdm(total=len(session.items) or None, unit="test", file=sys.stderr, leave=False,
                desc="report")


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: absent without it (-p no:xdist)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """The controller collects nothing itself: its bar's total is a worker's collection."""
    global _BAR
    if _BAR is None:
        from tqdm import tqdm

        _BAR = tqdm(total=len(ids), unit="test", file=sys.stderr, leave=False, desc="report")


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _BEFORE.clear()
    _BEFORE.update({cid: o.calls for cid, o in compare.RECORD.items()})


def _entry(report: pytest.TestReport, claims: list[str]) -> dict[str, Any]:
    message = ""
    if report.failed:
        message = str(report.longrepr).strip().splitlines()[-1][:300]
    elif report.skipped:
        message = skip_reason(report)
    return {"nodeid": report.nodeid, "outcome": report.outcome,
            "seconds": round(report.duration, 3), "claims": claims, "message": message}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    failed_setup = report.when == "setup" and report.outcome != "passed"
    crashed = report.when == "???"  # xdist's report for a test whose worker died
    if report.when != "call" and not failed_setup and not crashed:
        return
    if _BAR is not None:
        _BAR.update(1)
    _SEEN[report.nodeid] = _entry(report, [])  # (read only on the controller)
    if crashed:
        return
    asserted = sorted(cid for cid, o in compare.RECORD.items()
                      if o.calls != _BEFORE.get(cid, 0))
    _TESTS.append(_entry(report, asserted))


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """pytest's reason for a skip (its longrepr is (path, line, "Skipped: reason"))."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")[:300]


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped while importing (pytest.importorskip)
        _TESTS.append({"nodeid": report.nodeid, "outcome": "skipped", "seconds": 0.0,
                       "claims": [], "message": skip_reason(report)})


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


def own_record() -> dict[str, Any]:
    """This process's record (module docstring)."""
    claims = {cid: {"worst": _number(o.worst), "n": o.n, "raw": _number(o.raw),
                    "held": o.held, "calls": o.calls}
              for cid, o in compare.RECORD.items()}
    return {"claims": claims, "tests": list(_TESTS), "missing": missing_extras(),
            "torch": importlib.metadata.version("torch"), "versions": installed_versions()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """The controller: a worker ended; keep the record it handed back (none if it died)."""
    output = getattr(node, "workeroutput", {}) or {}
    if KEY in output:
        _WORKERS.append(json.loads(output[KEY]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _BAR is not None:
        _BAR.close()
    config = session.config
    if _is_worker(config):
        config.workeroutput[KEY] = json.dumps(own_record(), allow_nan=False)
        return
    path = os.environ.get("MIRRORTRAIN_REPORT_JSON")  # report.REPORTING
    if not path:
        return
    if _is_controller(config):
        from parity.lab.report import merge

        record = merge(_WORKERS) if _WORKERS else {**own_record(), "tests": []}
        # tests a worker ran but no record holds: its worker died (crashed) before handing
        # its record back: failed tests that asserted no claim the report can see
        recorded = {t["nodeid"] for t in record["tests"]}
        for nodeid, t in _SEEN.items():
            if nodeid not in recorded:
                record["tests"].append({**t, "outcome": "failed" if t["outcome"] != "skipped"
                                        else t["outcome"],
                                        "message": t["message"] or "its worker died"})
    else:
        record = own_record()
    Path(path).write_text(json.dumps(record, allow_nan=False), encoding="utf-8")
