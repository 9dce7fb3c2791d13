"""`python -m parity report`: every claim, as the parity tests observe it, in one table.

The report is a quick run of the parity tests themselves (parity/test_*.py, or one topic's
files with --topic), not checks of its own: the tests and the report measure the same thing
on the same inputs. Every `compare.assert_claim` records what it observed; the run uses the
hypothesis profile `report` (conftest.py: derandomized, a few examples per test, so the
table is the same on every run) and the plugin parity/lab/report_plugin.py, which writes the
record and each test's outcome to a JSON file this module reads back:

    verdict      when
    ok           every assertion of the claim held and every test asserting it passed
    FAIL         an assertion of the claim broke its bound
    ERROR        a test asserting the claim failed for another reason
    SKIPPED      no test asserted the claim because an optional package it needs is not
                 installed, or not in the version the claims read (EXTRAS): the claim
                 names the package (Claim.extra, e.g. torchao, the `oracles` extra), the
                 run found it missing, and pytest skipped a test of the claim's topic (the
                 plugin records each skip and its reason, which the row shows); or the
                 installed torch is older than the one that brought what the claim checks
                 (Claim.torch_since, measured) and pytest skipped a test of its topic; the
                 report does not fail for it
    NOT CHECKED  no test asserted the claim in this run for any other reason: the report
                 fails, since the table must never claim more than the tests check

A test that fails without having asserted any claim is listed under the table and fails the
report too, and so does a test whose pytest-xdist worker crashed (report_plugin.py). The tests
run in one pytest session spread over the cores by pytest-xdist (`--dist loadfile`: a test
file's tests run on one worker, so a module-scoped fixture, a compiled model or a launch of
gloo processes, is made once; workers), with one Inductor cache made empty for the run
(INDUCTOR_CACHE), in the
setting the claims state (conftest.py: one intra-op thread for torch, one for NumPy's BLAS),
whatever the caller's environment; each worker hands its record back through xdist.
Pictures are registered in parity/lab/pictures/ and drawn into --out while the tests run
(run's `meanwhile`): they are functions of the code and the committed measurements, not of
the run, and drawn after it they were a serial tail of about 12 s on one core.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parity.lab import pictures, report_skips
from parity.tolerances import CLAIMS, TOPICS, Claim

ROOT = Path(__file__).resolve().parents[2]
PARITY = ROOT / "parity"


@dataclass(frozen=True)
class Observation:
    """What the tests observed of one claim: the worst case in the claim's unit, over n
    compared values."""

    observed: float
    n: int
    note: str = ""
    # eps claims: the raw max |a - b| behind `observed` (compare.max_abs_difference),
    # printed next to the bound so a ratio is never read as an absolute difference
    raw: float | None = None


@dataclass(frozen=True)
class Row:
    claim: Claim
    observation: Observation | None
    verdict: str  # "ok", "FAIL", "ERROR", "SKIPPED", "NOT CHECKED"
    seconds: float
    tests: tuple[str, ...] = ()  # the node ids of the tests that asserted the claim
    skipped: str = ""  # SKIPPED: the missing package and what pytest skipped, with its reason
    # the libraries the claim states the behaviour of, at a version it was never verified on
    # (Claim.library, parity.claims.VERIFIED): ("torch 2.15.0",), named beside the verdict
    unverified: tuple[str, ...] = ()


@dataclass(frozen=True)
class Result:
    """The rows, one per claim in the registry's order, and the failed tests that asserted
    no claim (each a line: nodeid and the last line of its failure)."""

    rows: list[Row]
    unclaimed_failures: list[str]
    seconds: float


def topic_of(stem: str) -> str | None:
    """The claim topic a parity test file (its stem, `test_...`) belongs to: the longest topic
    its name starts with, as `test_TOPIC` or `test_TOPIC_...` (test_gpt_amp is gpt's, there
    being no topic gpt_amp; topics hold underscores: test_loss_scaling is loss_scaling's);
    None when no topic matches."""
    name = stem.removeprefix("test_")
    matches = [t for t in TOPICS if name == t or name.startswith(t + "_")]
    return max(matches, key=len, default=None)


def parity_test_files(topic: str | None = None) -> list[Path]:
    """The parity test files of one topic (parity/test_TOPIC.py and test_TOPIC_*.py: topic_of),
    or all; `report --topic` and `fuzz --topic` run these."""
    files = sorted(PARITY.glob("test_*.py"))
    return files if topic is None else [p for p in files if topic_of(p.stem) == topic]


REPORTING = "MIRRORTRAIN_REPORT_JSON"  # set in the report's pytest process (report_plugin.py)


def _number(x: float | str) -> float:
    """A number the plugin wrote: JSON has no infinity or NaN, so those come as strings."""
    return float(x)


TOLERANCE_COLUMN, MIN_TOLERANCE_WIDTH = 2, 24  # the column folded to fit the terminal
SELECTION = "not slow or report"  # the default suite, and the slow tests marked `report`
# The run's one empty Inductor cache, named to every worker (parity/drivers/compile.py's
# RUN_CACHE): the run is cold, and what Inductor builds once per cache (its probes of the
# CPU's vector instructions, about 9 s of CPU) is built once per run. Its folder is named
# `tests` on purpose: Inductor loads the code it generates as modules from there, and
# hypothesis draws literal constants from every module of local source it has seen, but
# not from a folder named tests (NOTE [ A claim's n is the claim's ] in conftest.py).
INDUCTOR_CACHE = "MIRRORTRAIN_REPORT_INDUCTOR_CACHE"


def workers(files: int) -> int:
    """pytest-xdist workers for a run of `files` test files: one per core, no more than files;
    0 (no xdist: one process) for a single file or a single core. The cores are xdist's own
    `-n auto` count: PYTEST_XDIST_AUTO_NUM_WORKERS when set (a report run inside a test
    whose suite already has every core busy sets 1), else the cores this process may use."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    cpus = int(given) if given.isdigit() else (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1))
    n = min(cpus, files)
    return n if n > 1 else 0


# pytest-xdist's loadfile hands the files to the workers in the order they are given, so a
# long file handed out last is the run's tail on one core: the longest of a run, the
# transformer's compile module (Inductor compiling cold: 34 s of one worker's ~60 s,
# measured), is given first, the rest in their order.
FIRST = "test_compile_gpt"


def _command(files: list[Path] | list[str], extra: tuple[str, ...]) -> list[str]:
    files = sorted(files, key=lambda f: Path(str(f).split("::")[0]).stem != FIRST)  # type: ignore[assignment]
    n = workers(len({str(f).split("::")[0] for f in files}))
    spread = ["-n", str(n), "--dist", "loadfile"] if n else ["-p", "no:xdist"]
    return [sys.executable, "-m", "pytest", *map(str, files), "-q", "-p",
            "parity.lab.report_plugin", "--hypothesis-profile=report", "-p", "no:cacheprovider",
            "-p", "no:benchmark",  # (pyproject.toml's addopts say why)
            "-o", "addopts=", "-m", SELECTION, "--strict-markers", "--no-header", "-rN",
            "--tb=line", *spread, *extra]


CLAIM_KIND = {c.id: c.kind for c in CLAIMS}


def merge(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from several processes' (xdist's workers': a claim asserted in two: the
    worse case, the counts added, held only if it held in both)."""
    claims: dict[str, Any] = {}
    for r in records:
        for cid, o in r["claims"].items():
            if cid not in claims:
                claims[cid] = dict(o)
                continue
            c = claims[cid]
            # the worse case: the larger, a statistical claim's smaller p-value; NaN worst
            low = CLAIM_KIND.get(cid) == "statistical"
            c["worst"] = max(_number(c["worst"]), _number(o["worst"]), key=lambda x: (
                x != x, -x if low else x))
            c["n"] += o["n"]
            if o["raw"] is not None:
                c["raw"] = o["raw"] if c["raw"] is None else max(_number(c["raw"]),
                                                                  _number(o["raw"]))
            c["held"] = c["held"] and o["held"]
            c["calls"] += o["calls"]
    return {"claims": claims, "tests": [t for r in records for t in r["tests"]],
            "missing": sorted({m for r in records for m in r.get("missing", ())}),
            "torch": next((r["torch"] for r in records if "torch" in r), None),
            "versions": next((r["versions"] for r in records if "versions" in r), {})}


class TestsDidNotRun(RuntimeError):
    """pytest itself failed: the report has no record of the run to show (run_tests)."""


def run_tests(files: list[Path] | list[str], extra: tuple[str, ...] = (),
              meanwhile: Callable[[], object] | None = None) -> dict[str, Any]:
    """Run the parity tests in `files` (paths or node ids) under the report profile, spread
    over the cores by pytest-xdist (workers); return the record the plugin wrote
    ({"claims": ..., "tests": ...}, module docstring). `meanwhile` runs in this process once
    they have started (the pictures, which depend on no test: drawn after the tests, they
    were a serial tail of about 12 s on one core)."""
    if not files:
        raise ValueError("run_tests: no test files given (pytest would run every test path)")
    if REPORTING in os.environ:  # a test inside the report's run asked for a report
        raise RuntimeError("the report cannot run inside its own pytest run: a test that "
                           "calls report.run must not be among the parity tests it runs")
    with tempfile.TemporaryDirectory(prefix="mirrortrain-report-") as tmp:
        out = Path(tmp) / "report.json"
        cache = Path(tmp) / "tests" / "inductor"  # (INDUCTOR_CACHE: why `tests`)
        cache.mkdir(parents=True)
        env = {**os.environ, REPORTING: str(out), INDUCTOR_CACHE: str(cache)}
        # pytest's output to a file, not a pipe: nobody reads a pipe while `meanwhile`
        # runs, and a full one would stop the process
        # a session of its own: its xdist workers are its children, and ending the run ends
        # the whole group (killing pytest alone left its workers running)
        with open(Path(tmp) / "report.out", "w", encoding="utf-8") as log:
            process = subprocess.Popen(_command(files, extra), cwd=ROOT, env=env, stdout=log,
                                       text=True, start_new_session=True)
        try:
            if meanwhile is not None:
                meanwhile()
            process.wait()
        finally:  # an error or Ctrl-C here ends the run, workers included
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # pytest's own failure (a collection error, a bad option, an internal error such as
        # xdist's when a worker ends in the middle of a test): exit 2 to 5, and what the
        # record holds then is not the run's; but exit 5 (no test collected) with a record of
        # skips is a run whose every file was skipped (its extra missing): that is its record
        if not out.exists() or (process.returncode not in (0, 1) and not (
                process.returncode == 5 and _only_skips(out))):
            stdout = (Path(tmp) / "report.out").read_text(encoding="utf-8")
            tail = "\n".join(stdout.strip().splitlines()[-15:])
            raise TestsDidNotRun("the parity tests did not run to their end (pytest exit "
                                 f"{process.returncode}):\n{tail}")
        return json.loads(out.read_text(encoding="utf-8"))


def _only_skips(out: Path) -> bool:
    """Whether a run's record holds tests, every one of them skipped."""
    tests = json.loads(out.read_text(encoding="utf-8")).get("tests", [])
    return bool(tests) and all(t["outcome"] == "skipped" for t in tests)


def rows_of(claims: tuple[Claim, ...], ran: dict[str, Any]) -> Result:
    """The table's rows from one run's record (see the module docstring for the verdicts)."""
    seconds: dict[str, float] = {}
    errors: dict[str, str] = {}
    asserted_by: dict[str, list[str]] = {}
    unclaimed = []
    for t in ran["tests"]:
        for cid in t["claims"]:
            seconds[cid] = seconds.get(cid, 0.0) + t["seconds"] / len(t["claims"])
            asserted_by.setdefault(cid, []).append(t["nodeid"])
        if t["outcome"] == "failed":
            if not t["claims"]:
                unclaimed.append(f"{t['nodeid']}: {t['message']}")
            for cid in t["claims"]:
                errors.setdefault(cid, f"{t['nodeid']}: {t['message']}")
    rows = []
    versions = ran.get("versions", {})
    for c in claims:
        seen = ran["claims"].get(c.id)
        unverified = tuple(c.unverified(versions))
        if seen is None:
            files = {p.relative_to(ROOT).as_posix() for p in parity_test_files(c.topic)}
            why = report_skips.why_skipped(c, ran, files)
            rows.append(Row(c, None, "SKIPPED" if why else "NOT CHECKED", 0.0, skipped=why))
            continue
        raw = None if seen["raw"] is None else _number(seen["raw"])
        verdict = "ok" if seen["held"] else "FAIL"
        if verdict == "ok" and c.id in errors:
            verdict = "ERROR"
        note = errors.get(c.id, "")
        rows.append(Row(c, Observation(_number(seen["worst"]), int(seen["n"]), note, raw),
                        verdict, seconds.get(c.id, 0.0), tuple(asserted_by.get(c.id, ())),
                        unverified=unverified))
    return Result(rows, unclaimed, sum(t["seconds"] for t in ran["tests"]))


def recorded_tests(claim_ids: tuple[str, ...]) -> list[str] | None:
    """The node ids of the tests that asserted these claims in the last recorded report
    (docs/data/report.json, `report --record`), or None when a claim has none recorded."""
    from parity.lab.gendocs.claims import OBSERVED_JSON

    if not OBSERVED_JSON.exists():
        return None
    recorded = json.loads(OBSERVED_JSON.read_text(encoding="utf-8"))
    nodes = [recorded.get(cid, {}).get("tests") for cid in claim_ids]
    if not all(nodes):
        return None
    return sorted({n for ns in nodes for n in ns})  # type: ignore[union-attr]


def run(topic: str | None = None, only: tuple[str, ...] | None = None,
        meanwhile: Callable[[], object] | None = None) -> Result:
    """Run the parity tests (of one topic, if given) and tabulate every claim (of that topic;
    `only`: just these claim ids, checked by the tests the last recorded report saw assert
    them, or else by their topics' files); `meanwhile` runs while the tests do (run_tests)."""
    if only is not None and not only:
        return Result([], [], 0.0)
    if only is not None:
        topics = sorted({cid.split(".", 1)[0] for cid in only})
        nodes = recorded_tests(only)
        files = (nodes if nodes is not None  # type: ignore[assignment]
                 else sorted({p for t in topics for p in parity_test_files(t)}))
        claims = tuple(c for c in CLAIMS if c.id in only)
    else:
        files = parity_test_files(topic)
        claims = tuple(c for c in CLAIMS if topic is None or c.topic == topic)
    start = time.perf_counter()
    ran = run_tests(files, meanwhile=meanwhile)
    result = rows_of(claims, ran)
    return Result(result.rows, result.unclaimed_failures, time.perf_counter() - start)


def render(result: Result, width: int | None = None) -> str:
    """A plain-text table: claim / tolerance / observed worst case in the claim's unit (a
    count, ulps, or eps units) / the raw max |a-b| where the claim has one / n / verdict /
    seconds of the tests that asserted it. The tolerance text is folded onto more lines so
    that the table fits `width` columns (default: the terminal's, or $COLUMNS, or 120)."""
    head = ("claim", "kind", "tolerance", "observed", "max |a-b|", "n", "verdict", "s")
    body = []
    for r in result.rows:
        obs = r.observation
        observed = "-" if obs is None else f"{obs.observed:.3g}"
        raw = "-" if obs is None or obs.raw is None else f"{obs.raw:.3g}"
        n = "-" if obs is None else f"{obs.n:,}"
        body.append((r.claim.id, r.claim.kind, r.claim.tolerance, observed, raw, n, r.verdict,
                     f"{r.seconds:.1f}"))
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    width = shutil.get_terminal_size((120, 24)).columns if width is None else width
    fold = TOLERANCE_COLUMN
    rest = sum(widths) - widths[fold] + 2 * (len(head) - 1)
    longest_word = max((len(w) for row in body for w in row[fold].split()), default=0)
    narrowest = max(MIN_TOLERANCE_WIDTH, longest_word)  # a word is never cut
    widths[fold] = max(narrowest, min(widths[fold], width - rest))
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        parts = textwrap.wrap(row[fold], widths[fold], break_on_hyphens=False) or [""]
        for k, part in enumerate(parts):
            cells = [part if i == fold else (v if k == 0 else "") for i, v in enumerate(row)]
            lines.append("  ".join(v.ljust(w) for v, w in zip(cells, widths, strict=True))
                         .rstrip())
    notes = [f"{r.claim.id}: {r.observation.note}" for r in result.rows
             if r.observation is not None and r.observation.note and r.verdict != "ok"]
    notes += [f"{r.claim.id}: SKIPPED, {r.skipped}" for r in result.rows if r.skipped]
    notes += [f"{r.claim.id}: {'held' if r.verdict == 'ok' else r.verdict} on "
              f"{', '.join(r.unverified)}, a version this claim was not verified on "
              f"({verified_versions(r.unverified)})" for r in result.rows if r.unverified]
    if notes:
        lines += ["", *notes]
    if result.unclaimed_failures:
        lines += ["", "failed tests that asserted no claim:",
                  *(f"  {line}" for line in result.unclaimed_failures)]
    return "\n".join(lines)


def verified_versions(unverified: tuple[str, ...]) -> str:
    """The verified versions of the libraries named in `unverified` ("torch 2.15.0", ...)."""
    from parity.claims import VERIFIED

    libs = sorted({u.split(" ", 1)[0] for u in unverified})
    return "verified: " + "; ".join(f"{lib} {', '.join(VERIFIED[lib])}" for lib in libs)


def write_pictures(out: Path, topic: str | None = None) -> list[Path]:
    """Draw every registered picture (of `topic`'s module, parity/lab/pictures/<topic>.py,
    if given) into `out`; [] when matplotlib is not installed or the topic has none."""
    registry = pictures.load()
    return pictures.draw_all(out, lambda name: topic is None or (
        registry[name].__module__.rsplit(".", 1)[-1] == topic))
