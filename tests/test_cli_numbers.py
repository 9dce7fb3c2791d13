"""Numbers that would run away are bounded by what the machine can do, or said: closed forms
do not build the model, a sample cannot exceed the inputs there are, workers cannot exceed the
CPUs, and a run of years says so on stderr."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest

from parity.lab.runners import train_output
from reference import accounting_gpt as ragpt
from reference.accounting import held_bytes
from tests.test_cli import assert_one_line_error, run_cli


def test_a_billion_layers_are_predicted_without_building_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    """10^6 layers once took 7.8 GB and 158 s; 10^9 now take what 3 layers take. The held
    activations are checked against an enumeration of 2 and 3 blocks made here."""
    tracemalloc.start()
    shape = {"d_model": 96, "n_head": 4, "seq_len": 64, "vocab": 1000, "batch": 3}
    status, out, _ = run_cli(["account", "--model", "gpt", "--n-layer", str(10**9), "--json",
                              *(f"--{k.replace('_', '-')}={v}" for k, v in shape.items())],
                             capsys)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert status == 0
    assert peak < 64 << 20, f"{peak:,} bytes traced: something grows with depth"
    rows = {r["name"]: r["predicted"] for r in json.loads(out)["rows"]}

    def enumerated(n: int) -> int:
        saved, _ = ragpt.gpt_saved(n_layer=n, **shape)
        return held_bytes(s for s in saved if s.layer != "")  # the model's, not the loss's

    per_block = enumerated(3) - enumerated(2)
    assert rows["activations: model"] == enumerated(3) + (10**9 - 3) * per_block


def test_a_sample_above_every_input_points_to_exhaustive(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(["sweep", "float16", "--sample", str(2**32 + 1)], capsys)
    assert_one_line_error(status, err, "--sample", "--exhaustive")


def test_more_sweep_workers_than_cpus_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    status, _, err = run_cli(["sweep", "float16", "--workers", str(cpus + 1)], capsys)  # type: ignore[operator]
    assert_one_line_error(status, err, "--workers", f"1 to {cpus}")


def test_a_run_of_years_says_how_long_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 2.5, 3.0, 4.0])
    monkeypatch.setattr(train_output.time, "perf_counter", lambda: next(clock))
    said: list[str] = []
    eta = train_output.RunLength(10**12, said.append)
    for step in (1, 2, 6, 7, 8):  # 5 steps in 2.5 s: 0.5 s a step
        eta.step(f"step {step} loss 1 scale 1 skipped 0 (total 0)")
    years = (10**12 - 6) * 0.5 / (365.25 * 86400)
    assert said == [f"train: {10**12 - 6:,} steps to go at 500 ms a step: about {years:,.1f} "
                    "years; Ctrl-C stops it in one line, keeping the checkpoints written so far"]
    short = train_output.RunLength(100, said.append)
    clock = iter([0.0, 3.0])
    for step in (1, 2):
        short.step(f"step {step} loss 1")
    assert len(said) == 1, "a run under an hour is not worth a line"
