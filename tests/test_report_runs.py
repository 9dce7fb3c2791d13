"""The report run end to end, each a pytest process of its own (parity/lab/report.py):
`report --topic mx --json` with a broken oracle, a run whose one file is skipped, the
Inductor cache of the compile modules, and the pictures drawn while the tests run. The
report's bookkeeping: tests/test_report.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.cli import EXIT_FAILED, EXIT_OK
from parity.lab.report import rows_of
from parity.tolerances import CLAIMS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def broken_oracle_report(tmp_path_factory: pytest.TempPathFactory
                         ) -> subprocess.CompletedProcess[str]:
    """`python -m parity report --topic mx --json --out ''` as a user runs it, with a torchao
    whose import raises (a package of that name first on PYTHONPATH): one run, read by the
    two tests below (a report of a topic is a pytest session of its own, ~10 s)."""
    fake = tmp_path_factory.mktemp("broken") / "torchao"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("a broken install of torchao")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(fake.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTEST_XDIST_AUTO_NUM_WORKERS": "1"}  # one process: the suite has the cores
    return subprocess.run([sys.executable, "-m", "parity", "report", "--topic", "mx", "--json",
                           "--out", ""], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_report_of_a_topic_with_a_broken_oracle_checks_what_needs_none_and_says_why(
        broken_oracle_report: subprocess.CompletedProcess[str]) -> None:
    """With a torchao whose import raises, the claims that need no torchao are checked (ok),
    the torchao ones read SKIPPED quoting the error, and the report exits 0; before, a
    collection error left all five NOT CHECKED, no reason."""
    done = broken_oracle_report
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    from parity.tolerances import topic_claims

    rows = {r["id"]: r for r in json.loads(done.stdout)}
    oracle = {c.id for c in topic_claims("mx") if c.extra == "torchao"}
    assert {"mx.torchao", "mx.nvfp4_torchao"} <= oracle  # the declared extras, read apart
    assert {cid for cid, r in rows.items() if r["verdict"] == "ok"} == set(rows) - oracle
    skipped = {cid for cid, r in rows.items() if r["verdict"] == "SKIPPED"}
    assert skipped == oracle
    assert all("a broken install of torchao" in rows[cid]["note"] for cid in skipped)


def test_report_json_has_one_object_per_claim_and_the_same_verdicts(
        broken_oracle_report: subprocess.CompletedProcess[str]) -> None:
    """--json prints a JSON array (one claim per line), nothing else on stdout; the summary
    goes to stderr, and the exit status is the table's (a SKIPPED claim fails nothing)."""
    from parity.tolerances import topic_claims

    out, err = broken_oracle_report.stdout, broken_oracle_report.stderr
    rows = json.loads(out)
    assert [r["id"] for r in rows] == [c.id for c in topic_claims("mx")]
    assert len(out.strip().splitlines()) == len(rows) + 2
    for r in rows:
        assert set(r) == {"id", "kind", "tolerance", "bound", "observed", "raw", "n", "verdict",
                          "note", "unverified", "seconds"}
        assert r["verdict"] in ("ok", "FAIL", "ERROR", "NOT CHECKED", "SKIPPED")
        if r["verdict"] == "ok":
            assert isinstance(r["observed"], float | int) and math.isfinite(r["observed"])
    held = sum(r["verdict"] == "ok" for r in rows)
    skipped = sum(r["verdict"] == "SKIPPED" for r in rows)
    assert broken_oracle_report.returncode == (
        EXIT_OK if held + skipped == len(rows) else EXIT_FAILED)
    assert f"{held}/{len(rows)} claims hold, {skipped} skipped" in err


@pytest.mark.slow  # a pytest process of its own: about 4 s on 2 cores
def test_without_torchao_the_plugin_records_the_skip_and_the_missing_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's own pytest run with torchao hidden (MIRRORTRAIN_WITHOUT, the root
    conftest): pytest skips the torchao module, the plugin records that skip with its reason
    and torchao as missing, and the module's claims read SKIPPED."""
    from parity.lab import report

    monkeypatch.setenv("MIRRORTRAIN_WITHOUT", "torchao")
    ran = report.run_tests([report.PARITY / "test_mx_torchao.py"])
    assert ran["missing"] == ["torchao"]
    assert [t["outcome"] for t in ran["tests"]] == ["skipped"], ran["tests"]
    claims = tuple(c for c in CLAIMS if c.id in ("mx.torchao", "mx.nvfp4_torchao"))
    assert [r.verdict for r in rows_of(claims, ran).rows] == ["SKIPPED", "SKIPPED"]


def test_compile_modules_share_the_report_runs_inductor_cache_and_else_get_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Outside the report every fresh_inductor_cache is a new empty directory; inside the
    report's run (its INDUCTOR_CACHE set) it is the run's one directory; both restore the
    caller's TORCHINDUCTOR_CACHE_DIR."""
    from parity.drivers import compile as dc
    from parity.lab import report

    assert report.INDUCTOR_CACHE == dc.RUN_CACHE
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "callers"))
    monkeypatch.delenv(dc.RUN_CACHE, raising=False)
    seen = []
    for _ in range(2):
        with dc.fresh_inductor_cache() as cache:
            assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == cache
            assert Path(cache).is_dir() and not any(Path(cache).iterdir())
            seen.append(cache)
    assert len(set(seen)) == 2 and str(tmp_path) not in seen[0]
    monkeypatch.setenv(dc.RUN_CACHE, str(tmp_path / "run"))
    for _ in range(2):
        with dc.fresh_inductor_cache() as cache:
            assert cache == os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "run")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "callers")


def _children() -> list[int]:
    """The pids of this process's living children (Linux /proc)."""
    me, found = str(os.getpid()), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[1] == me and fields[0] != "Z":  # (ppid, state)
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow  # two pytest processes of their own: about 8 s on 2 cores
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_the_pictures_draw_while_the_tests_run_and_a_failure_there_ends_them() -> None:
    """`meanwhile` (the report's pictures) runs once the test processes have started, the
    record comes back whole after it; when it raises, the processes are ended and its error
    is the one seen."""
    from parity.lab import report

    alive: list[list[int]] = []
    ran = report.run_tests([report.PARITY / "test_optim.py"],
                           meanwhile=lambda: alive.append(_children()))
    assert len(alive) == 1 and alive[0], "no test process was running during `meanwhile`"
    assert ran["tests"] and all(t["outcome"] == "passed" for t in ran["tests"]), ran["tests"]

    def broken() -> None:
        raise RuntimeError("a picture failed")

    with pytest.raises(RuntimeError, match="a picture failed"):
        report.run_tests([report.PARITY / "test_optim.py"], meanwhile=broken)
    assert _children() == [], "a test process outlived the report"
