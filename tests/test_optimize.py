"""`python -m parity optimize`: the gauntlet's parts each fail when their property fails.

The equivalence claims it runs are the parity claims' own checks (tested in parity/); here:
the spec parser, the speedup statistics against an independent computation, and runs of the
gauntlet whose learning or resume is broken on purpose.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity.lab.runners import optimize as drv

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("bad", ["compile-ish", "compile:max", "autocast-fp8", "loader-workers:0",
                                 "loader-workers:x", "recompute"])
def test_unknown_or_malformed_optimizations_are_refused_naming_the_accepted_ones(bad: str
                                                                                 ) -> None:
    with pytest.raises(ValueError, match=r"accepted|needs a whole N"):
        drv.parse(bad)


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The command line in this process (tests/test_cli.py runs `python -m parity` itself)."""
    from parity.lab.cli import main

    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def test_the_cli_refuses_a_bad_spec_in_one_line_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _main(["optimize", "--what", "turbo", "--out", str(tmp_path)], capsys)
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and "turbo" in err


def test_speedup_is_the_ratio_of_medians_and_its_interval_brackets_it() -> None:
    rng = np.random.default_rng(1)
    base = 2.0 + rng.random(15) * 0.1
    fast = 1.0 + rng.random(15) * 0.1
    ratio, low, high = drv.speedup(base, fast)
    assert ratio == pytest.approx(statistics.median(base) / statistics.median(fast), rel=1e-12)
    assert 1.0 < low <= ratio <= high
    same, low, high = drv.speedup(base, base.copy())
    assert same == 1.0 and low <= 1.0 <= high  # identical samples: a null result


def test_an_optimization_that_stops_learning_fails_the_learning_control() -> None:
    broken = drv.Optimization("lr-1e-7", {"lr": 1e-7})  # learns nothing
    g = drv.run_gauntlet(broken, repeats=3, steps=1, learn_steps=30)
    assert not g.learning["optimized"].in_band and not g.passed
    assert g.resume[0] == 0 and g.resume[2]  # it is the learning control that failed


def test_a_resume_that_drops_the_optimizer_state_fails_the_resume_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_impl import train as torch_train

    load = torch_train.Run.load_state_dict
    monkeypatch.setattr(torch_train.Run, "load_state_dict",
                        lambda self, state, omit=(): load(self, state, ("optimizer",)))
    mismatches, n, same = drv.resume_check(drv.parse("autocast-bf16"))
    assert mismatches > 0 and n > 0 and not same


@pytest.mark.slow  # ~8 s; the gauntlet's parts run in the default suite in-process
def test_the_command_writes_its_report_and_ends_with_the_verdict(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "parity", "optimize", "--what",
                           "recompute:uniform:2", "--repeats", "3", "--steps", "1", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("optimize: recompute:uniform:2 PASS, speedup ")
    record = json.loads((tmp_path / "optimize-recompute-uniform-2.json").read_text())
    assert len(record["timing"]["baseline_cpu"]) == 3 and record["passed"] is True
    assert record["resume"][0] == 0 and record["resume"][1] > 0 and record["resume"][2]
    assert all(r["accuracy"] >= drv.ACCURACY for r in record["learning"].values())
    assert "## Resume" in (tmp_path / "optimize-recompute-uniform-2.md").read_text()


@pytest.mark.parametrize("what", ["autocast-fp16", "loader-workers:2"])
def test_the_transformer_refuses_what_it_does_not_support_naming_what_it_does(what: str
                                                                              ) -> None:
    with pytest.raises(ValueError, match=r"with --model gpt; supported there: autocast-bf16, "
                                         r"recompute:SPEC, compile$"):
        drv.parse(what, "gpt")
    assert drv.parse(what).model == "mlp"  # the MLP takes every one of them


@pytest.mark.parametrize("what, model", [("recompute:uniform:5", "gpt"),  # 4 blocks
                                         ("recompute:selective", "mlp"),  # a transformer's
                                         ("recompute:uniform:6", "mlp"),  # 5 layers
                                         ("recompute:sqrt+sqrt", "gpt")])
def test_a_recompute_spec_the_model_cannot_take_is_refused_before_anything_runs(
        what: str, model: str) -> None:
    with pytest.raises(ValueError, match=r"uniform:K needs|unknown schedule|expected SPEC"):
        drv.parse(what, model)


def test_the_cli_refuses_an_unsupported_model_combination_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = _main(["optimize", "--model", "gpt", "--what", "autocast-fp16", "--out",
                            str(tmp_path)], capsys)
    assert status == 2, err
    line, = err.strip().splitlines()
    assert ("'autocast-fp16'" in line
            and "supported there: autocast-bf16, recompute:SPEC, compile" in line)


class _Clocked:
    """A stand-in Run whose first step takes `first` seconds and every later one `later`;
    each step appends the run's name to the shared `log`."""

    def __init__(self, first: float, later: float, name: str = "", log: list | None = None
                 ) -> None:
        self.first, self.later, self.calls = first, later, 0
        self.name, self.log = name, [] if log is None else log

    def train_step(self) -> None:
        import time

        time.sleep(self.first if self.calls == 0 else self.later)
        self.calls += 1
        self.log.append(self.name)


def test_the_first_call_is_timed_apart_and_the_repeats_run_abba() -> None:
    """Each side's first call and warm-up block come first, outside every sample; then the
    repeats alternate AB, BA, AB, ... (blocks of `steps` steps), as the docstring says."""
    log: list[str] = []
    runs = {"baseline": _Clocked(0.0, 0.001, "B", log),
            "optimized": _Clocked(0.3, 0.001, "O", log)}
    t = drv.time_interleaved(runs, repeats=3, steps=2)
    assert t.first_call_wall["optimized"] >= 0.3 > t.first_call_wall["baseline"]
    assert max(t.optimized_wall) < 0.1, "the slow first call leaked into a sample"
    assert len(t.optimized_wall) == len(t.baseline_wall) == 3
    warm = "BBB" + "OOO"  # each side: its first call, then an unrecorded block of 2 steps
    repeats = "BBOO" + "OOBB" + "BBOO"  # ABBA: repeat r's order flips with r's parity
    assert "".join(log) == warm + repeats


@pytest.mark.parametrize("what", ["autocast-bf16", "recompute:sqrt+selective"])
def test_the_transformers_optimized_run_resumes_to_its_twins_digest(what: str) -> None:
    mismatches, n, same = drv.resume_check(drv.parse(what, "gpt"))
    assert mismatches == 0 and n > 0 and same


def test_a_transformer_that_stops_learning_fails_its_learning_control() -> None:
    broken = drv.Optimization("lr-1e-7", {"lr": 1e-7}, model="gpt")
    r = drv.learn(broken, steps=30)
    assert not r.in_band and not r.accurate and r.loss_band == drv.CONTROLS["gpt"].loss_band


@pytest.mark.slow
def test_the_transformers_gauntlet_passes_for_bf16_and_recompute(tmp_path: Path) -> None:
    for what in ("autocast-bf16", "recompute:uniform:2"):
        g = drv.run_gauntlet(drv.parse(what, "gpt"), repeats=3, steps=1)
        assert g.passed, (what, g.claims, g.learning, g.resume)
        assert all(r.accuracy >= drv.CONTROLS["gpt"].threshold for r in g.learning.values())


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:Skipping serialization of skipfiles_inline_module")
def test_compiled_training_passes_the_gauntlet_and_resumes_compiled_to_compiled() -> None:
    g = drv.run_gauntlet(drv.parse("compile"), repeats=3, steps=2)
    assert g.passed, (g.claims, g.learning, g.resume)
    assert [c[0] for c in g.claims][:2] == ["compile.eager", "compile.reference"]
    assert g.claims[2][0].startswith("compile.eager (the gelu MLP")  # this very model
    assert g.distance["bitwise"] == 0.0  # compiled != eager bitwise: resume is compiled-only
    assert g.timing.first_call_wall["optimized"] > 10 * g.timing.first_call_wall["baseline"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:Skipping serialization of skipfiles_inline_module")
def test_a_compiled_forward_that_drops_a_bias_fails_the_gauntlets_equivalence(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def dropped_bias(model: torch.nn.Module) -> torch.nn.Module:
        last = model[-1]
        forward = model.forward

        def without(x: torch.Tensor) -> torch.Tensor:
            return forward(x) - last.bias  # the last Linear's bias lost
        model.forward = torch.compile(without, fullgraph=True)
        return model

    monkeypatch.setattr(drv, "compiled_forward", dropped_bias)
    name, worst, _, ok = drv.compiled_equivalence(drv.parse("compile"))
    assert not ok and worst > 1, (name, worst)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:Skipping serialization of skipfiles_inline_module")
def test_the_compiled_transformer_passes_the_gauntlet_and_resumes_compiled_to_compiled() -> None:
    from parity.drivers import compile_gpt as cg

    g = drv.run_gauntlet(drv.parse("compile", "gpt"), repeats=3, steps=2)
    if cg.TORCH < cg.WTE_GRAD_RIGHT:  # NOTE [ torch 2.6's compiled token-embedding gradient ]
        assert not g.claims[2][3], "the gauntlet's own compiled transformer held under a torch " \
                                   "whose token-embedding gradient is wrong"
        return
    assert g.passed, (g.claims, g.learning, g.resume)
    assert [c[0] for c in g.claims][:2] == ["compile.gpt_eager", "compile.gpt_reference"]
    assert g.claims[2][0].startswith("compile.gpt_eager (this transformer")  # this very model
    assert g.distance["bitwise"] == 0.0  # compiled != eager bitwise: resume is compiled-only
    assert g.timing.first_call_wall["optimized"] > 10 * g.timing.first_call_wall["baseline"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:Skipping serialization of skipfiles_inline_module")
def test_a_compiled_transformer_with_a_layer_norm_eps_changed_fails_the_gauntlets_equivalence(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(A float16 round trip x.half().float() would not do: Inductor elides a downcast-upcast
    pair inside a fused loop unless emulate_precision_casts is set; nor an exact GELU for
    the tanh form: at initialization the pre-activations are ~0.1, where the two agree to
    within the bound. docs/compile.md.)"""
    import torch

    from torch_impl.compile import compile_gpt_forward

    def other_eps(model: torch.nn.Module) -> torch.nn.Module:
        model.transformer.h[2].ln_2.eps = 1e-6  # 1e-5 in eager
        return compile_gpt_forward(model)

    monkeypatch.setattr(drv, "compiled_forward", other_eps)
    name, worst, _, ok = drv.compiled_equivalence(drv.parse("compile", "gpt"))
    assert not ok and worst > 1, (name, worst)


# ---------------------------------------------------------------- the verdict, on stand-in parts

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
        code, out, _ = _main(["optimize", "--what", "autocast-bf16", "--out", str(tmp_path)],
                             capsys)
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
