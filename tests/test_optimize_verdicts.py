"""`python -m parity optimize`'s verdict, on stand-in parts: each check alone turns PASS into
FAIL, the printed interval is the one at the stated level, and the statistics behind the
words (tests/test_optimize.py holds the parts themselves against real runs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parity.lab.cli import main
from parity.lab.runners import optimize as drv

ROOT = Path(__file__).resolve().parent.parent


# Seconds per step, 7 repeats a side: a sample whose 95% bootstrap interval of the speedup
# contains 1 while its 90% interval does not (seed 0), so the interval's level shows in the
# printed verdict.
BORDERLINE = (np.array([0.998, 0.937, 1.129, 1.024, 1.032, 0.990, 1.003]),
              np.array([0.987, 0.980, 0.940, 1.001, 0.995, 0.964, 0.934]))


def _bootstrap_interval(base: np.ndarray, fast: np.ndarray, percent: float
                        ) -> tuple[float, float]:
    """The central `percent`% interval of the ratio of medians, resampled as speedup's
    docstring says (seed 0, base then fast, drv.BOOTSTRAP resamples), written out here."""
    rng = np.random.default_rng(0)
    b = rng.choice(base, (drv.BOOTSTRAP, base.size))
    f = rng.choice(fast, (drv.BOOTSTRAP, fast.size))
    ratios = np.median(b, axis=1) / np.median(f, axis=1)
    tail = (100 - percent) / 2
    return float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))


def _learning(first: float = 2.0, last: float = 0.1, accuracy: float = 1.0) -> drv.Learning:
    return drv.Learning(first, last, accuracy)


def _gauntlet(samples: tuple[np.ndarray, np.ndarray] = BORDERLINE, **parts: object
              ) -> drv.Gauntlet:
    """A gauntlet that passes every check, with `parts` replaced."""
    base, fast = samples
    timing = drv.Timing(list(base), list(fast), list(base), list(fast), 1,
                        {"baseline": 0.01, "optimized": 0.01})
    whole = {"opt": drv.parse("autocast-bf16"),
             "claims": [("amp.stand_in", 0.0, "<= 0", True)],
             "distance": {"loss": 0.0, "gradients": 0.0, "bitwise": 1.0},
             "timing": timing, "speedup": drv.speedup(base, fast),
             "learning": {"baseline": _learning(), "optimized": _learning()},
             "resume": (0.0, 100, True)}
    return drv.Gauntlet(**{**whole, **parts})  # type: ignore[arg-type]


SPOILED = {
    "the resumed state digest differs": {"resume": (0.0, 100, False)},
    "resumed values differ": {"resume": (1.0, 100, True)},
    "a claim fails": {"claims": [("amp.stand_in", 0.0, "<= 0", True),
                                 ("compile.eager (this model)", 2.0, "<= 1", False)]},
    "the optimized run leaves the loss band": {
        "learning": {"baseline": _learning(), "optimized": _learning(last=2.0)}},
    "the baseline misses the accuracy": {
        "learning": {"baseline": _learning(accuracy=0.0), "optimized": _learning()}},
}


@pytest.mark.parametrize("spoiled", SPOILED)
def test_the_gauntlet_fails_and_the_command_exits_1_when_any_one_check_fails(
        spoiled: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check alone decides the verdict: one spoiled part, the rest passing, prints FAIL
    and exits 1 (and the unspoiled stand-in PASS and 0, so it is the part that did it)."""
    from parity.lab.cli import optimize as cli

    monkeypatch.setattr(cli, "draw", lambda g, path: None)
    for g, word, status in ((_gauntlet(), "PASS", 0), (_gauntlet(**SPOILED[spoiled]), "FAIL", 1)):
        assert g.passed is (word == "PASS")
        monkeypatch.setattr(drv, "run_gauntlet", lambda *a, g=g, **k: g)
        code = main(["optimize", "--what", "autocast-bf16", "--out", str(tmp_path)])
        out, _ = capsys.readouterr()
        assert code == status
        assert out.strip().splitlines()[-1].startswith(f"optimize: autocast-bf16 {word}, ")
        record = json.loads((tmp_path / "optimize-autocast-bf16.json").read_text())
        assert record["passed"] is (word == "PASS")


def test_the_printed_interval_is_the_95_percent_bootstrap_interval() -> None:
    """speedup's bounds are the 2.5th and 97.5th percentiles of the seeded bootstrap, the
    report says 95%, and on BORDERLINE the 95% interval holds 1 where the 90% does not: the
    verdict is null, and a 90% interval would have printed "faster"."""
    from parity.lab.cli import optimize as cli

    g = _gauntlet()
    low, high = _bootstrap_interval(*BORDERLINE, 95)
    assert g.speedup[1:] == (low, high)
    assert _bootstrap_interval(*BORDERLINE, 90)[0] > 1.0 >= low  # the sample tells them apart
    assert g.null and cli.verdict(g) == f"{g.speedup[0]:.3f} [{low:.3f}, {high:.3f}] (null)"
    assert "speedup = median baseline / median optimized, 95% bootstrap interval" in " ".join(
        cli.markdown(g, None).split())


def test_the_reports_level_is_the_constant_the_interval_is_computed_at(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With CONFIDENCE at 90%, speedup's bounds are the 90% ones, BORDERLINE reads faster, and
    the report's text says 90%: the level is one constant, not a number typed twice."""
    from parity.lab.cli import optimize as cli
    from parity.lab.runners import optimize_timing

    monkeypatch.setattr(optimize_timing, "CONFIDENCE", 0.90)
    g = _gauntlet()
    assert g.speedup[1:] == _bootstrap_interval(*BORDERLINE, 90) and not g.null
    assert cli.verdict(g).endswith("(faster)")
    assert "90% bootstrap interval" in " ".join(cli.markdown(g, None).split())


def test_identical_samples_are_a_null_result_even_at_the_intervals_edge() -> None:
    """Two sides of one constant step time give the interval [1, 1]: 1 is in it, so null,
    not slower."""
    from parity.lab.cli import optimize as cli

    g = _gauntlet((np.full(7, 1e-3), np.full(7, 1e-3)))
    assert g.speedup == (1.0, 1.0, 1.0) and g.null and cli.verdict(g).endswith("(null)")


def test_spread_is_the_median_and_the_quartiles() -> None:
    assert drv.spread(np.arange(1.0, 10.0)) == (5.0, 3.0, 7.0)  # 1..9: quartiles 3 and 7


@pytest.mark.parametrize("shift, word", [(0.5, "faster"), (2.0, "slower")])
def test_an_interval_clear_of_1_is_printed_faster_or_slower(shift: float, word: str) -> None:
    from parity.lab.cli import optimize as cli

    base, _ = BORDERLINE
    g = _gauntlet((base, base * shift))
    assert not g.null and cli.verdict(g).endswith(f"({word})")


def _stand_in_report(monkeypatch: pytest.MonkeyPatch, compiled_holds: bool,
                     verdict: str = "ok") -> list[str]:
    """report.run answers one claim with `verdict`; compiled_equivalence answers
    `compiled_holds` and logs its calls."""
    from types import SimpleNamespace

    from parity.lab import report

    calls: list[str] = []
    row = SimpleNamespace(claim=SimpleNamespace(id="compile.eager", tolerance="<= 1"),
                          observation=SimpleNamespace(observed=0.5), verdict=verdict)
    monkeypatch.setattr(report, "run", lambda only=None: SimpleNamespace(rows=[row]))

    def own(opt: drv.Optimization) -> tuple[str, float, str, bool]:
        calls.append(opt.what)
        return ("compile.eager (this model)", 0.5 if compiled_holds else 3.0, "<= 1",
                compiled_holds)

    monkeypatch.setattr(drv, "compiled_equivalence", own)
    return calls


def test_a_compiled_model_failing_only_its_own_equivalence_fails_the_gauntlet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The claims' small cases hold; the gauntlet's own compiled model does not: the claims
    the gauntlet records end with that failure and it fails. An uncompiled optimization
    never runs the compiled check."""
    calls = _stand_in_report(monkeypatch, compiled_holds=False)
    claims = drv.equivalence(drv.parse("compile"))
    assert calls == ["compile"] and [c[3] for c in claims] == [True, False]
    assert not _gauntlet(claims=claims).passed
    assert drv.equivalence(drv.parse("autocast-bf16"))[-1][3] and calls == ["compile"]


@pytest.mark.parametrize("verdict", ["FAIL", "ERROR", "NOT CHECKED"])
def test_a_claim_the_report_did_not_find_ok_does_not_hold(
        monkeypatch: pytest.MonkeyPatch, verdict: str) -> None:
    """Only the report's "ok" holds: a claim that errored or that no test checked fails the
    gauntlet as surely as one that failed."""
    _stand_in_report(monkeypatch, compiled_holds=True, verdict=verdict)
    claims = drv.equivalence(drv.parse("autocast-bf16"))
    assert [c[3] for c in claims] == [False] and not _gauntlet(claims=claims).passed


def test_run_gauntlet_records_what_each_part_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_gauntlet on stand-in parts: each part's answer lands in its field, the speedup is
    speedup() of the optimization's own clock (CPU here; the wall samples are set apart),
    and a resume whose digest differs fails it."""
    base, fast = BORDERLINE
    timing = drv.Timing(list(base), list(fast), list(fast), list(base), 1)  # wall: reversed
    made = _gauntlet(timing=timing, resume=(0.0, 100, False))
    monkeypatch.setattr(drv, "make_run", lambda *a, **k: None)
    monkeypatch.setattr(drv, "time_interleaved", lambda runs, r, s: made.timing)
    monkeypatch.setattr(drv, "equivalence", lambda opt, progress: made.claims)
    monkeypatch.setattr(drv, "distance_from_fp32", lambda opt: made.distance)
    monkeypatch.setattr(drv, "learn", lambda opt, steps=None, model="mlp": _learning())
    monkeypatch.setattr(drv, "resume_check", lambda opt: made.resume)
    g = drv.run_gauntlet(made.opt, repeats=7, steps=1)
    assert (g.claims, g.distance, g.timing, g.resume) == (made.claims, made.distance,
                                                          made.timing, made.resume)
    assert made.opt.timer == "cpu" and g.speedup == drv.speedup(base, fast)
    assert set(g.learning) == {"baseline", "optimized"}
    assert not g.passed
