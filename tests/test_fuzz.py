"""`python -m parity fuzz` is a front for pytest under the fuzz profile (parity/lab/fuzz.py,
parity/fuzz_plugin.py), and keeps what it promised: a topic's @given tests and only those run,
each with examples, within the time budget; a failure exits 1 and shows hypothesis'
falsifying example and its reproduction line; a budget spent before a test is reached skips
it and exits 4; bad input is one line and exit 2.

The command runs as a user runs it (`python -m parity fuzz ...` in a subprocess); a test file
seeded to fail is added to its pytest run through pytest's own PYTEST_ADDOPTS, so nothing
failing lies in parity/. The time slice itself is driven on real hypothesis tests in-process.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parity import fuzz_plugin
from parity.lab import report
from parity.lab.cli import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, EXIT_USAGE, main

ROOT = Path(__file__).resolve().parent.parent
# a summary row: "     65 examples    0.8 s  (time slice)  parity/test_data.py::test_x"
ROW = re.compile(r"^\s*([\d,]+) examples\s+([\d.]+) s  \(([^)]*)\)  (\S+)$", re.M)


def fuzz(args: list[str], tmp_path: Path, addopts: str = "",
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m parity fuzz ARGS` as a user runs it (hypothesis' example database in
    tmp_path, not the checkout's; PYTEST_ADDOPTS given to its pytest)."""
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis"),
           "PYTEST_ADDOPTS": addopts}
    env.pop("CI", None)
    return subprocess.run([sys.executable, "-m", "parity", "fuzz", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


def given_tests(path: Path) -> set[str]:
    """The names of the @given test functions in a file the default suite runs (not marked
    slow), read from its source: the targets a fuzz run of it must list."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        if any(d.startswith("given(") for d in decorators) and "pytest.mark.slow" not in (
                decorators):
            names.add(node.name)
    return names


def test_a_topic_run_fuzzes_each_of_its_given_tests_within_the_budget(
        tmp_path: Path) -> None:
    """`fuzz --topic data --seconds 3` exits 0; its summary lists each @given test of
    parity/test_data.py with at least one example, and no other test ran; the tests' time
    adds up to the budget, overrun by no more than about one example each. (`-n 0`, one
    process: pytest-xdist's workers, a start of their own each, are the next test's.)"""
    budget = 3.0
    done = fuzz(["--topic", "data", "--seconds", f"{budget:g}", "--seed", "11"], tmp_path,
                addopts="-n 0")
    assert done.returncode == EXIT_OK, done.stdout[-3000:] + done.stderr[-3000:]
    rows = ROW.findall(done.stdout)
    listed = {nodeid.split("::")[1].split("[")[0] for *_, nodeid in rows}
    assert listed == given_tests(report.PARITY / "test_data.py")
    assert all(int(n.replace(",", "")) >= 1 and why in ("time slice", "all examples")
               for n, _, why, _ in rows), rows
    assert re.search(rf"\b{len(rows)} passed\b", done.stdout), "only the @given tests ran"
    assert f"fuzz: {len(rows)}/{len(rows)} @given tests ran" in done.stdout
    assert "(seed 11), 0 failing, complete" in done.stdout
    spent = sum(float(s) for _, s, _, _ in rows)
    one_example_each = sum(float(s) / int(n.replace(",", "")) for n, s, _, _ in rows)
    noise = 1.0  # s: a process on a busy 2-core machine can stall about this long
    assert spent <= budget + one_example_each + noise, rows


SEEDED = '''
from hypothesis import given, strategies as st

@given(st.integers(0, 1000))
def test_seeded_to_fail(x):
    assert x < 500, "seeded failure"
'''


def test_a_failing_given_test_exits_1_showing_its_falsifying_example(tmp_path: Path) -> None:
    """A @given test seeded to fail, added to the run (PYTEST_ADDOPTS: the file, `-k` for it
    alone, one process), makes `fuzz` exit 1 with hypothesis' shrunk falsifying example and
    its @reproduce_failure line in the output, and the summary says it failed."""
    seeded = tmp_path / "seeded" / "test_seeded.py"
    seeded.parent.mkdir()
    seeded.write_text(SEEDED, encoding="utf-8")
    done = fuzz(["--topic", "data", "--seconds", "5", "--seed", "3"], tmp_path,
                addopts=f"-n 0 {seeded} -k test_seeded_to_fail")
    assert done.returncode == EXIT_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
    # (hypothesis 6.170 on calls it a "Failing test case", before a "Falsifying example")
    assert re.search(r"(Falsifying example|Failing test case): test_seeded_to_fail\(",
                     done.stdout), done.stdout[-3000:]
    assert re.search(r"^E\s+x=500,$", done.stdout, re.M), "shrunk to the boundary"
    assert "@reproduce_failure(" in done.stdout
    assert re.search(r"\(FAILED\)\s+\S*test_seeded_to_fail$", done.stdout, re.M)
    assert ", 1 failing, complete" in done.stdout


TWO_SLOW = '''
import time
from hypothesis import given, strategies as st

@given(st.integers())
def test_first(x):
    time.sleep(0.3)

@given(st.integers())
def test_second(x):
    time.sleep(0.3)
'''


def test_a_test_reached_after_the_budget_is_skipped_and_the_run_exits_4(
        tmp_path: Path) -> None:
    """The plugin on its own (`-p parity.fuzz_plugin`, in a folder without the project's
    conftest): with 0.2 s in all and 0.3 s per example, the first test runs its one example
    (a slice always does) and the second is not reached: skipped, listed as such, exit 4."""
    (tmp_path / "test_two.py").write_text(TWO_SLOW, encoding="utf-8")
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_two.py", "-p", "parity.fuzz_plugin",
         "--hypothesis-profile=fuzz", "--fuzz-total=0.2", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-rs"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == fuzz_plugin.EXIT_INCOMPLETE == EXIT_INCOMPLETE, done.stdout
    rows = {nodeid: (int(n), why) for n, _, why, nodeid in ROW.findall(done.stdout)}
    assert rows == {"test_two.py::test_first": (1, "time slice"),
                    "test_two.py::test_second": (0, "not reached")}
    assert "1 passed, 1 skipped" in done.stdout
    assert "INCOMPLETE: the budget ran out before 1 tests" in done.stdout


SLEEPY_TEST = '''
@given(st.integers())
def test_{name}(x):
    time.sleep(0.05)
'''


def test_under_xdist_every_worker_is_reached_and_reports_its_tallies(tmp_path: Path) -> None:
    """Two workers, `--dist loadfile`: a file of three @given tests on one, a file of one on
    the other. A test's share is also bounded by what is left over the tests still to come in
    its own file, so the worker with three tests reaches all of them within the 1.5 s (taking
    the other worker's idle time for its own would leave its last test unreached), and the
    controller lists the four tests of both workers."""
    head = "import time\nfrom hypothesis import given, strategies as st\n"
    (tmp_path / "test_three.py").write_text(
        head + "".join(SLEEPY_TEST.format(name=n) for n in ("a", "b", "c")), encoding="utf-8")
    (tmp_path / "test_one.py").write_text(head + SLEEPY_TEST.format(name="d"), encoding="utf-8")
    env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "parity.fuzz_plugin", "--hypothesis-profile=fuzz",
         "--fuzz-total=1.5", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_OK, done.stdout
    rows = {nodeid: (int(n), float(s), why) for n, s, why, nodeid in ROW.findall(done.stdout)}
    assert set(rows) == {"test_three.py::test_a", "test_three.py::test_b",
                         "test_three.py::test_c", "test_one.py::test_d"}, done.stdout
    assert all(n >= 1 and why == "time slice" for n, _, why in rows.values()), rows
    three = sum(s for nodeid, (_, s, _) in rows.items() if nodeid.startswith("test_three"))
    assert three <= 1.5 + 3 * 0.05 + 0.5, rows  # the budget, one example each, a stall


@pytest.mark.parametrize(("args", "words"), [
    (["--topic", "bogus"], ["--topic", "bogus", "data"]),
    (["--seconds", "0"], ["--seconds", "0"]),
    (["--seconds", "-5"], ["--seconds", "-5"]),
    (["--seconds", "nan"], ["--seconds", "nan", "finite"]),
    (["--seconds", "inf"], ["--seconds", "inf", "finite"]),
    (["--seed", "abc"], ["--seed", "'abc' is not an integer"]),
    (["--seed", "-1"], ["--seed", "-1"]),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by the command line's parser, before pytest starts."""
    try:
        status = main(["fuzz", *args])
    except SystemExit as e:  # argparse's errors exit from inside parse_args
        status = e.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert status == EXIT_USAGE and "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert all(w in err for w in words), (words, err)


@pytest.mark.slow  # a pytest start for nothing: ~10 s on 2 cores
def test_a_topic_without_given_tests_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """fsdp's claims run fixed cases: nothing to fuzz, said in one line (pytest's "no tests
    ran" turned into the command line's usage error)."""
    assert not given_tests(report.PARITY / "test_fsdp.py")
    done = fuzz(["--topic", "fsdp", "--seconds", "1"], tmp_path)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip().splitlines() == [
        "python -m parity fuzz: error: --topic fsdp: its tests have no @given test, nothing "
        "to fuzz"]


def test_a_topic_spans_its_test_files_and_the_longest_topic_name_wins() -> None:
    """report.topic_of, the one rule `report --topic` and `fuzz --topic` share:
    parity/test_<topic>_<part>.py belongs to <topic>; topics contain underscores, so
    test_loss_scaling.py is loss_scaling's (not a part of a topic "loss"), and a module that
    names no topic belongs to none."""
    from parity.claims import TOPICS

    assert report.topic_of("test_numerics_gpt") == "numerics"
    assert report.topic_of("test_numerics") == "numerics"
    assert report.topic_of("test_loss_scaling") == "loss_scaling"
    assert report.topic_of("test_train_kill") == "train"
    assert report.topic_of("test_trainer") is None  # a prefix without the underscore
    assert report.topic_of("test_elsewhere") is None
    with pytest.MonkeyPatch.context() as mp:  # the longest of two matching topics wins
        mp.setattr(report, "TOPICS", (*TOPICS, "loss"))
        assert report.topic_of("test_loss_scaling_gpt") == "loss_scaling"
        assert report.topic_of("test_loss_x") == "loss"
    names = {p.name for p in report.parity_test_files("numerics")}
    assert names == {p.name for p in report.PARITY.glob("test_numerics*.py")}


# -- the time slice, on real hypothesis tests ------------------------------------------------

@settings(max_examples=1_000, database=None)  # >= 2 s, had the slice not ended it
@given(data=st.data())
def _drawing_test(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 5))
    for _ in range(n):
        data.draw(st.floats())
    time.sleep(0.002)


@settings(max_examples=10_000, database=None)
@given(x=st.integers(0, 1000))
def _failing_test(x: int) -> None:
    if x:
        time.sleep(0.15)  # two failing calls (the find and hypothesis' final replay) outlast
    assert x == 0, "falsified"  # the slice below


def test_a_time_slice_ends_a_real_hypothesis_run_without_a_false_failure() -> None:
    """A run allowed 1,000 examples stops after its 0.3 s slice, passing; interactive draws
    (st.data) are not mistaken for flaky generation; the test's own inner function is back
    afterwards."""
    inner = _drawing_test.hypothesis.inner_test
    began = time.monotonic()
    with fuzz_plugin.time_slice(_drawing_test, 0.3) as state:
        with pytest.raises(fuzz_plugin.TimeUp):
            _drawing_test()
    assert state.stopped and 1 <= state.count < 1_000 and not state.failed
    assert time.monotonic() - began < 5
    assert _drawing_test.hypothesis.inner_test is inner


def test_a_failure_found_as_the_slice_ends_is_still_shrunk_and_reported() -> None:
    """Shrinking outlasts the 0.25 s slice, yet the failure is shrunk to the end (x=1) and
    raised with hypothesis' falsifying example. (The slice may end only after the passing
    x=0 that hypothesis tries first and before the first failure: 0.25 s, not less, so that
    a pause of a busy machine there does not end it.)"""
    began = time.monotonic()
    with fuzz_plugin.time_slice(_failing_test, 0.25) as state:
        with pytest.raises(AssertionError, match="falsified") as caught:
            try:
                _failing_test()
            except fuzz_plugin.TimeUp:  # a KeyboardInterrupt: would end the whole session
                pytest.fail("the slice ended the run while a failure was being shrunk")
    assert time.monotonic() - began > 0.25 and state.failed and state.count > 2
    assert "x=1," in "\n".join(getattr(caught.value, "__notes__", []))


def test_the_front_runs_pytest_with_the_options_mapped() -> None:
    """--topic -> the topic's files, --seconds -> --fuzz-total, --seed -> --hypothesis-seed,
    --device -> --device, under the fuzz profile and the project's own pytest settings."""
    from parity.lab import fuzz as front

    command = front.pytest_command(7.5, "numerics", "cuda", 42)
    assert command[:3] == [sys.executable, "-m", "pytest"]
    files = [a for a in command[3:] if not a.startswith("-")]
    assert files == sorted(f"parity/{p.name}" for p in report.PARITY.glob("test_numerics*.py"))
    assert set(command[3 + len(files):]) == {"--hypothesis-profile=fuzz", "--fuzz-total=7.5",
                                             "--hypothesis-seed=42", "--device=cuda"}
    assert front.pytest_command(1.0, None, "cpu", 0)[3] == "parity"
    assert not any(a in ("-n", "-p", "-o") for a in command), "xdist's addopts kept"
