"""The report's bookkeeping: what compare records per claim, and the verdict each record
gets (parity/lab/report.py). The report run end to end: tests/test_report_runs.py."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from parity import compare
from parity.lab.report import parity_test_files, rows_of
from parity.tolerances import CLAIMS, TOPICS, claim

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_record() -> Iterator[dict[str, compare.Observed]]:
    """An empty RECORD for the test, the suite's own restored after it."""
    saved = dict(compare.RECORD)
    compare.RECORD.clear()
    yield compare.RECORD
    compare.RECORD.clear()
    compare.RECORD.update(saved)


def test_the_record_keeps_the_worst_case_the_count_and_whether_every_call_held(
        fresh_record: dict[str, compare.Observed]) -> None:
    c = claim("formats.decode")  # bits: 0 allowed
    compare.assert_claim(c, actual=np.zeros(3, np.float32), expected=np.zeros(3, np.float32))
    with pytest.raises(AssertionError):
        compare.assert_claim(c, actual=np.ones(4, np.float32), expected=np.zeros(4, np.float32))
    compare.assert_claim(c, actual=np.ones(2, np.float32), expected=np.ones(2, np.float32))
    seen = fresh_record["formats.decode"]
    assert (seen.worst, seen.n, seen.held, seen.calls) == (4.0, 9, False, 3)


def test_a_nan_observation_is_kept_as_the_worst(fresh_record: dict[str, compare.Observed]
                                                ) -> None:
    c = claim("formats.decode")
    compare.record(c, math.nan, 1)
    compare.record(c, 5.0, 1)
    assert math.isnan(fresh_record[c.id].worst) and not fresh_record[c.id].held


def test_an_eps_claim_records_the_raw_difference_beside_its_ratio(
        fresh_record: dict[str, compare.Observed]) -> None:
    c = next(x for x in CLAIMS if x.kind == "eps")
    a = np.array([1.0, 2.0], np.float32)
    compare.assert_claim(c, actual=a, expected=a + np.float32(2**-23),
                         scale=np.ones(2))  # within 1 eps
    assert fresh_record[c.id].raw == 2**-23  # 1 + 2^-23 is float32; 2 + 2^-23 ties to 2


def test_a_seeded_fault_must_break_its_claim_and_is_not_recorded(
        fresh_record: dict[str, compare.Observed]) -> None:
    c = claim("formats.decode")
    with compare.expect_broken(c.id):
        compare.assert_claim(c, actual=np.ones(2, np.float32), expected=np.zeros(2, np.float32))
    assert c.id not in fresh_record
    with pytest.raises(AssertionError, match="held where a seeded fault must break it"), \
            compare.expect_broken(c.id):
        compare.assert_claim(c, actual=np.ones(2, np.float32), expected=np.ones(2, np.float32))
    with pytest.raises(AssertionError, match="another"), compare.expect_broken(c.id):
        raise AssertionError("another assertion, not the claim's")


def _ran(claims: dict, tests: list) -> dict:
    return {"claims": claims, "tests": tests}


def test_each_verdict_follows_from_the_record_and_the_tests_outcomes() -> None:
    ids = [c.id for c in CLAIMS[:4]]
    held = {"worst": 0.0, "n": 5, "raw": None, "held": True, "calls": 1}
    broken = {**held, "worst": 2.0, "held": False}
    ran = _ran({ids[0]: held, ids[1]: broken, ids[2]: held},
               [{"nodeid": "t1", "outcome": "passed", "seconds": 2.0, "claims": [ids[0], ids[1]],
                 "message": ""},
                {"nodeid": "t2", "outcome": "failed", "seconds": 1.0, "claims": [ids[2]],
                 "message": "TypeError: boom"},
                {"nodeid": "t3", "outcome": "failed", "seconds": 1.0, "claims": [],
                 "message": "ValueError: nothing claimed"}])
    result = rows_of(CLAIMS[:4], ran)
    assert [r.verdict for r in result.rows] == ["ok", "FAIL", "ERROR", "NOT CHECKED"]
    assert [r.seconds for r in result.rows] == [1.0, 1.0, 1.0, 0.0]
    assert "t2: TypeError: boom" in result.rows[2].observation.note  # type: ignore[union-attr]
    assert result.unclaimed_failures == ["t3: ValueError: nothing claimed"]


def test_every_topic_has_test_files_and_every_file_one_topic() -> None:
    every = parity_test_files()
    owned = [p for t in TOPICS for p in parity_test_files(t)]
    assert sorted(owned) == sorted(every), "a parity test file no topic owns (or two do)"
    assert all(parity_test_files(t) for t in TOPICS)


def test_a_claim_named_in_a_parity_test_is_named_in_a_file_of_its_own_topic() -> None:
    """`report --topic T` runs T's files only: a claim of T asserted only in another topic's
    file would read NOT CHECKED there (resume.cross_impl_resume once did, from
    test_train.py). Ids built at run time (f-strings) are not literals and are not seen
    here."""
    from parity.tolerances import CLAIMS

    texts = {p: p.read_text(encoding="utf-8") for p in parity_test_files()}
    astray = []
    for c in CLAIMS:
        named_in = [p for p, t in texts.items() if f'"{c.id}"' in t]
        if named_in and not set(named_in) & set(parity_test_files(c.topic)):
            astray.append(f"{c.id}: only in {', '.join(p.name for p in named_in)}")
    assert not astray, astray


def test_two_workers_records_merge_to_the_worse_case_and_the_sum() -> None:
    from parity.lab.report import merge

    a = {"claims": {"x": {"worst": 1.0, "n": 3, "raw": 0.5, "held": True, "calls": 1},
                    "y": {"worst": 0.0, "n": 1, "raw": None, "held": True, "calls": 1}},
         "tests": [{"nodeid": "a"}]}
    b = {"claims": {"x": {"worst": "nan", "n": 2, "raw": 0.25, "held": False, "calls": 2}},
         "tests": [{"nodeid": "b"}]}
    m = merge([a, b])
    assert math.isnan(m["claims"]["x"]["worst"])
    assert (m["claims"]["x"]["n"], m["claims"]["x"]["raw"], m["claims"]["x"]["held"],
            m["claims"]["x"]["calls"]) == (5, 0.5, False, 3)
    assert m["claims"]["y"] == a["claims"]["y"]
    assert [t["nodeid"] for t in m["tests"]] == ["a", "b"]


def test_a_statistical_claims_merged_worst_case_is_the_smaller_p_value() -> None:
    from parity.lab.report import merge

    cid = next(c.id for c in CLAIMS if c.kind == "statistical")
    seen = {"n": 1, "raw": None, "held": True, "calls": 1}
    m = merge([{"claims": {cid: {**seen, "worst": 0.5}}, "tests": []},
               {"claims": {cid: {**seen, "worst": 0.01}}, "tests": []}])
    assert m["claims"][cid]["worst"] == 0.01


def _skip(nodeid: str, reason: str) -> dict:
    return {"nodeid": nodeid, "outcome": "skipped", "seconds": 0.0, "claims": [],
            "message": reason}


def test_a_claim_skipped_for_its_missing_extra_is_skipped_and_any_other_unasserted_is_not(
        ) -> None:
    """SKIPPED needs all three: the claim names the package, the run found it missing, and
    pytest skipped a test of the claim's topic; otherwise an unasserted claim is NOT CHECKED."""
    needs = claim("mx.torchao")
    plain = next(c for c in CLAIMS if c.topic == "mx" and c.extra is None)
    skipped = _skip("parity/test_mx_torchao.py", "torchao is the MX oracle")
    elsewhere = _skip("parity/test_formats.py::test_x", "torchao is the MX oracle")

    def verdicts(missing: list[str], tests: list[dict]) -> list[str]:
        return [r.verdict for r in rows_of((needs, plain),
                                           {"claims": {}, "tests": tests, "missing": missing}
                                           ).rows]

    assert verdicts(["torchao"], [skipped]) == ["SKIPPED", "NOT CHECKED"]
    assert verdicts([], [skipped]) == ["NOT CHECKED", "NOT CHECKED"]  # installed: not a skip
    assert verdicts(["torchao"], []) == ["NOT CHECKED", "NOT CHECKED"]  # pytest skipped none
    assert verdicts(["torchao"], [elsewhere]) == ["NOT CHECKED", "NOT CHECKED"]  # not its topic
    row = rows_of((needs,), {"claims": {}, "tests": [skipped], "missing": ["torchao"]}).rows[0]
    assert "torchao 0.18.0 cannot be imported here" in row.skipped
    assert "the MX oracle" in row.skipped


def test_a_claim_older_torch_lacks_is_skipped_only_below_its_version_and_after_a_skip(
        ) -> None:
    """A claim with torch_since reads SKIPPED when the run's torch is older and pytest skipped
    a test of its topic; on that torch or a newer one, or without a skip, NOT CHECKED."""
    needs = claim("fsdp.params")
    assert needs.torch_since == (2, 8)
    skipped = _skip("parity/test_fsdp.py", "FSDP2 on CPU needs torch >= 2.8")

    def verdict(torch: str | None, tests: list[dict]) -> str:
        ran = {"claims": {}, "tests": tests, "missing": [], "torch": torch}
        return rows_of((needs,), ran).rows[0].verdict

    assert verdict("2.6.0", [skipped]) == "SKIPPED"
    assert verdict("2.7.1+cpu", [skipped]) == "SKIPPED"
    assert verdict("2.8.0", [skipped]) == "NOT CHECKED"  # it has the feature: a real gap
    assert verdict("2.13.0+cpu", [skipped]) == "NOT CHECKED"
    assert verdict("2.6.0", []) == "NOT CHECKED"  # pytest skipped nothing of the topic
    assert verdict(None, [skipped]) == "NOT CHECKED"  # a record without the torch version
    row = rows_of((needs,), {"claims": {}, "tests": [skipped], "missing": [],
                             "torch": "2.6.0"}).rows[0]
    assert row.skipped.startswith("torch 2.6.0 lacks it (from 2.8, measured)")


def test_an_extra_in_another_version_than_the_pinned_one_counts_as_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's missing_extras: torchao installed at another version than EXTRAS pins is
    missing (its tests skip, as at torch 2.6's torchao 0.9.0), at the pinned one it is not."""
    import importlib.metadata

    from parity.claims import EXTRAS
    from parity.lab import report_plugin

    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed: the version check needs it importable")
    real = importlib.metadata.version
    for version, missing in ((EXTRAS["torchao"], []), ("0.9.0", ["torchao"])):
        monkeypatch.setattr(importlib.metadata, "version",
                            lambda name, v=version: v if name == "torchao" else real(name))
        assert report_plugin.missing_extras() == missing


def test_skipped_claims_do_not_fail_the_report_and_unasserted_ones_do(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m parity report` exits 0 with SKIPPED rows beside ok ones, 1 with a NOT
    CHECKED row, and --record writes nothing while a claim is skipped."""
    import argparse

    from parity.lab import report
    from parity.lab.cli import report as cli_report

    ok = report.Row(claim("formats.decode"), report.Observation(0.0, 3), "ok", 0.1)
    skipped = report.Row(claim("mx.torchao"), None, "SKIPPED", 0.0, skipped="torchao cannot "
                         "be imported here (an optional extra): pytest skipped x: y")
    unchecked = report.Row(claim("mx.torchao"), None, "NOT CHECKED", 0.0)
    args = argparse.Namespace(topic=None, out="", json=False, record=False)
    for rows, status in (([ok, skipped], 0), ([ok, unchecked], 1)):
        monkeypatch.setattr(report, "run", lambda topic, rows=rows, meanwhile=None:
                            report.Result(rows, [], 1.0))
        assert cli_report.run(args) == status
    monkeypatch.setattr(report, "run", lambda topic, meanwhile=None:
                        report.Result([ok, skipped], [], 1.0))
    assert cli_report.run(argparse.Namespace(topic=None, out="", json=False, record=True)) == 1
    out = capsys.readouterr().out
    assert "1 skipped" in out and "not recorded" in out and "SKIPPED, torchao" in out


def test_an_extra_whose_import_raises_is_a_skip_naming_the_error_and_counts_as_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken install (the package is there, its import raises ImportError) skips the
    module with the error and the reinstall command, never a collection error, and the
    plugin counts the package as missing, so its claims read SKIPPED with that reason."""
    import importlib

    from parity import extras
    from parity.lab import report_plugin

    def broken(name: str) -> None:
        raise ImportError("cannot import name '_C' (a broken install)")

    monkeypatch.setattr(extras, "BROKEN", {})
    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(pytest.skip.Exception) as skipped:
        extras.import_extra("torchao", "the MX oracle")
    reason = str(skipped.value)
    assert "installed but its import fails" in reason and "'_C'" in reason
    assert "pip install --force-reinstall torchao==0.18.0" in reason
    monkeypatch.undo()
    monkeypatch.setattr(extras, "BROKEN", {"torchao": "ImportError: x"})
    assert report_plugin.missing_extras() == ["torchao"]


def test_a_claim_on_a_library_version_never_verified_runs_and_names_the_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim stating torch's own behaviour (Claim.library), run on a torch outside
    parity.claims.VERIFIED, keeps its verdict, held or failed, and the table's notes name the
    version beside it; on a verified torch (local part ignored) nothing is added. A failed
    assertion's message names the version too."""
    from parity import claims as claims_module
    from parity.lab.report import render

    c = claim("formats.e8m0_torch")
    assert "torch" in c.library
    seen = {c.id: {"worst": 0.0, "n": 7, "raw": None, "held": True, "calls": 1}}

    def rows(torch: str, held: bool = True) -> list:
        ran = {"claims": {c.id: {**seen[c.id], "held": held}}, "tests": [], "missing": [],
               "torch": torch, "versions": {"torch": torch, "ml_dtypes": "0.7.0"}}
        return rows_of((c,), ran).rows

    verified = claims_module.VERIFIED["torch"][-1]
    assert rows(verified + "+cpu")[0].unverified == ()
    new = rows("2.99.0")
    assert new[0].verdict == "ok" and new[0].unverified == ("torch 2.99.0",)
    from parity.lab.report import Result
    text = render(Result(new, [], 0.0))
    assert f"{c.id}: held on torch 2.99.0, a version this claim was not verified on" in text
    assert verified in text
    failed = rows("2.99.0", held=False)
    assert failed[0].verdict == "FAIL" and "FAIL on torch 2.99.0" in render(
        Result(failed, [], 0.0))
    monkeypatch.setattr(claims_module, "installed_versions",
                        lambda: {"torch": "2.99.0", "ml_dtypes": "0.7.0"})
    with pytest.raises(AssertionError, match=r"on torch 2\.99\.0: not a version this claim"):
        compare.assert_claim(c, actual=np.array([1.0]), expected=np.array([2.0]))
    with pytest.raises(AssertionError) as plain:  # a claim of the math names no version
        compare.assert_claim("formats.decode", actual=np.array([1.0]), expected=np.array([2.0]))
    assert "not a version" not in str(plain.value)
