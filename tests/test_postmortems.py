"""The mini-project's five fault postmortems: each guard fails on its seeded loop and passes on
the repaired one, each rejected hypothesis is rejected by the number its run measured, and
the rubric's fault row names the fault it graded."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from parity.lab.cli import miniproject as cli
from parity.lab.runners import postmortem as pmr
from parity.lab.runners import postmortem_amp as amp
from parity.lab.runners import postmortem_loop as loop
from parity.lab.runners import postmortem_record as record
from tests.test_cli import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent


def test_fp16_without_scaler_underflows_and_the_scaled_step_does_not() -> None:
    """fp16 at S = 1 gains exact zeros (the guard fails), S = 2^16 none (it passes); the
    forward stays finite and below float16's max, so forward overflow is rejected."""
    pm = amp.fp16_without_scaler()
    assert pm.numbers["zeros"]["fp16, S=1"]["0.weight"] > 0.05  # the fault is really there
    assert not pm.guard_before and pm.guard_after
    assert pm.numbers["forward_nonfinite"] == 0 and pm.numbers["forward_max"] < amp.FP16_MAX
    assert [h.holds for h in pm.hypotheses] == [True, False]


def test_the_underflow_guard_compares_zeros_per_parameter() -> None:
    fp32 = {"a": 0.0, "b": 0.25}
    assert amp.guard_no_underflow({"a": 0.0, "b": 0.25}, fp32)
    assert not amp.guard_no_underflow({"a": 0.0, "b": 0.26}, fp32)
    assert not amp.guard_no_underflow({"a": 0.01, "b": 0.0}, fp32)


def test_a_clip_before_unscale_sees_the_norm_times_s_and_no_step_is_skipped() -> None:
    """The clip before unscale_ measures exactly S times the unscaled norm (S a power of two:
    every product and the square root scale exactly); the ScalerGuard flags it, and not the
    repaired order; no step was skipped, so "skipped steps" is rejected."""
    pm = amp.clip_before_unscale()
    seeded, repaired = pm.numbers["seeded"], pm.numbers["repaired"]
    assert pm.numbers["norm_ratio"] == seeded["scale"][0] == 2.0**16
    assert seeded["skipped"] == 0 and 0 < seeded["moved"] < 1e-3 * repaired["moved"]
    assert not pm.guard_before and pm.guard_after
    assert [h.holds for h in pm.hypotheses] == [True, False]


def test_a_debug_item_in_the_forward_is_a_read_where_none_belongs() -> None:
    """One host read per forward in the seeded loop, none in the repaired one; the optimizer
    phase's own reads are the same in both, so the end-of-step read is rejected."""
    pm = loop.item_in_step()
    seeded, repaired = pm.numbers["seeded"], pm.numbers["repaired"]
    assert seeded["reads"]["forward"] == loop.SYNC_STEPS and repaired["reads"]["forward"] == 0
    assert seeded["reads"]["optimizer"] == repaired["reads"]["optimizer"] > 0
    assert not pm.guard_before and pm.guard_after
    assert [h.holds for h in pm.hypotheses] == [True, False]


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_the_one_graph_guard_fails_on_the_branch_and_passes_on_torch_where() -> None:
    """explain: the `if tensor:` forward is 2 graphs with 1 break, its torch.where repair 1
    graph, bit-identical in eager mode."""
    import torch

    from parity.drivers.compile_breaks import CATALOGUE

    entry = next(e for e in CATALOGUE if e.name == loop.BREAK)
    seeded, repaired = loop.compile_loop(entry.broken, 0), loop.compile_loop(entry.repaired, 0)
    assert (seeded["graphs"], seeded["breaks"]) == (2, 1), seeded
    assert not loop.guard_one_graph(seeded) and loop.guard_one_graph(repaired)
    assert torch.equal(seeded["output"], repaired["output"])


@pytest.mark.parametrize("drop", loop.CANDIDATES)
def test_an_incomplete_checkpoint_is_found_by_the_entry_it_lacks(drop: str) -> None:
    """Whichever candidate entry the writer drops, exactly its hypothesis holds (its leaves
    differ right after the resume, the others' do not), and the digest guard fails; with the
    complete checkpoint it passes."""
    pm = loop.incomplete_checkpoint(drop)
    assert pm.numbers["seeded"]["missing"] == [drop]
    assert [h.holds for h in pm.hypotheses] == [c == drop for c in loop.CANDIDATES]
    assert pm.numbers["repaired"]["differ_at_resume"] == dict.fromkeys(loop.CANDIDATES, 0)
    assert not pm.guard_before and pm.guard_after
    assert pm.numbers["repaired"]["max_param_difference"] == 0.0


def test_an_unknown_fault_is_refused_naming_the_five() -> None:
    with pytest.raises(ValueError, match="fp16_without_scaler, clip_before_unscale, "
                       "item_in_step, graph_break, incomplete_checkpoint"):
        pmr.fault_named("nan_loss")
    with pytest.raises(ValueError, match="drop must be one of"):
        loop.incomplete_checkpoint("model")


@pytest.mark.parametrize("args, words", [
    (["--fault", "nan_loss"], ["--fault", "nan_loss", *pmr.FAULTS]),
    (["--fault", "graph_break", "--all-faults"], ["--all-faults", "--fault"]),
])
def test_the_command_refuses_an_unknown_fault_in_one_line(
        args: list[str], words: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(["miniproject", "--out", str(tmp_path / "out"), *args], capsys)
    assert_one_line_error(status, err, *words)
    assert not (tmp_path / "out").exists()  # refused before anything was written


# ---------------------------------------------------------------- the rubric's fault row

def _postmortem(**spoil: object) -> record.Postmortem:
    """A postmortem earning Strong (the guard fails, then passes; one hypothesis confirmed,
    one rejected), with `spoil` replaced."""
    whole = record.Postmortem(
        "clip_before_unscale", "t", "s", "m", [["a"], ["1"]],
        [record.Hypothesis("cause", "c", "measured 1", True),
         record.Hypothesis("other", "o", "measured 0", False)], "r", "g", False, True)
    return replace(whole, **spoil)  # type: ignore[arg-type]


@pytest.mark.parametrize("spoil, grade", [
    ({}, "Strong"),
    ({"guard_before": True}, "FAIL"),  # the guard does not see the fault
    ({"guard_after": False}, "FAIL"),  # the repair does not repair
    ({"hypotheses": [record.Hypothesis("cause", "c", "1", True)]}, "Pass"),  # none rejected
    ({"hypotheses": [record.Hypothesis("other", "o", "0", False)]}, "Pass"),  # none confirmed
])
def test_the_fault_row_falls_a_grade_with_each_piece_of_evidence_spoiled(
        spoil: dict, grade: str) -> None:
    assert record.fault_repair_row(_postmortem(**spoil))[1] == grade


def test_the_fault_row_names_the_fault_it_graded_and_its_file() -> None:
    row = record.fault_repair_row(_postmortem(), "postmortems/clip_before_unscale.md")
    assert row[0] == "fault repair"
    assert row[2].startswith("postmortems/clip_before_unscale.md: fault clip_before_unscale;")
    assert "rejected by measurement: other" in row[3]
    failed = record.fault_repair_row(_postmortem(guard_after=False))
    assert "fault clip_before_unscale" in failed[2]


def test_one_fault_or_several_are_written_as_markdown_and_json(tmp_path: Path) -> None:
    """One fault: postmortem.md and .json; several: postmortems/NAME.md and .json each, one
    rubric row each naming its fault; the JSON holds the measured numbers."""
    (tmp_path / "one").mkdir()
    one = cli.write_postmortems(tmp_path / "one", ["incomplete_checkpoint"])
    assert [r[2].split(";")[0] for r in one] == ["postmortem.md: fault incomplete_checkpoint"]
    data = json.loads((tmp_path / "one" / "postmortem.json").read_text())
    assert data["fault"] == "incomplete_checkpoint" and not data["guard_before"]
    assert data["numbers"]["seeded"]["missing"] == ["scaler"]
    page = (tmp_path / "one" / "postmortem.md").read_text()
    assert "**H2 rejected**" in page and "On the seeded loop it FAILS" in page
    (tmp_path / "two").mkdir()
    two = cli.write_postmortems(tmp_path / "two", ["item_in_step", "incomplete_checkpoint"])
    assert [r[1] for r in two] == ["Strong", "Strong"]
    for name in ("item_in_step", "incomplete_checkpoint"):
        assert (tmp_path / "two" / "postmortems" / f"{name}.json").is_file()
        page = (tmp_path / "two" / "postmortems" / f"{name}.md").read_text()
        assert f"Fault `{name}`" in page


@pytest.mark.slow
def test_every_fault_s_postmortem_earns_strong() -> None:
    """All five investigations, in full (the graph break's recompile count included)."""
    for name in pmr.FAULTS:
        pm = pmr.investigate(name)
        assert record.fault_repair_row(pm)[1] == "Strong", (name, pm.hypotheses)


@pytest.mark.slow
def test_the_command_with_all_faults_grades_each_in_its_own_row(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "parity", "miniproject", "--out",
                           str(tmp_path), "--repeats", "3", "--all-faults"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    rubric = (tmp_path / "rubric.md").read_text()
    for name in pmr.FAULTS:
        assert (f"| fault repair | Strong | postmortems/{name}.md: fault {name};"
                in rubric), name
        assert (tmp_path / "postmortems" / f"{name}.json").is_file()
    assert not (tmp_path / "postmortem.md").exists()
