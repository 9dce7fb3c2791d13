"""The numerics detector through the command line: `train --check-numerics --fault` stops at
the fault and its replay file names the same backward node from both trees
(numerics.replay_node); bad faults and files are one-line answers. The detector's own parity:
parity/test_numerics.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parity.lab import cli
from reference.faults import FAULTS


def test_train_command_stops_at_the_fault_and_replay_names_the_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`train --check-numerics --fault` exits 3 with `first-invalid:` last; the replay file it
    wrote replays (exit 3) naming the node, from both trees."""
    status = cli.main(["train", "--impl", "reference", "--steps", "5", "--checkpoint-dir",
                       str(tmp_path / "run"), "--precision", "fp16", "--check-numerics",
                       "--fault", "weight_overflow", "--fault-step", "2", "--quiet"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert status == cli.EXIT_FOUND and lines[-1].startswith("first-invalid: ")
    identity = json.loads(lines[-1].removeprefix("first-invalid: "))
    assert (identity["step"], identity["module"]) == (2, FAULTS["weight_overflow"].module)
    path = tmp_path / "run" / "first-invalid-step2.replay"
    nodes = []
    for impl in ("reference", "torch"):
        assert cli.main(["replay", str(path), "--impl", impl]) == cli.EXIT_FOUND
        nodes.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert nodes[0] == nodes[1] and nodes[0].startswith("replay-node: ")


def test_fault_list_bad_fault_and_a_checkpoint_given_to_replay_are_one_line_answers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--fault list prints the catalogue (exit 0); an unknown fault and a file that is not a
    replay file are one-line errors (exit 2)."""
    with pytest.raises(SystemExit) as listed:
        cli.main(["train", "--fault", "list"])
    out = capsys.readouterr().out
    assert listed.value.code == 0
    assert all(f"{n} (--model {f.model}): " in out for n, f in FAULTS.items())
    with pytest.raises(SystemExit) as bad:
        cli.main(["train", "--impl", "reference", "--steps", "2", "--checkpoint-dir",
                  str(tmp_path), "--fault", "nope"])
    err = capsys.readouterr().err.strip()
    assert bad.value.code == cli.EXIT_USAGE and len(err.splitlines()) == 1 and "nope" in err
    assert cli.main(["train", "--impl", "reference", "--steps", "1", "--checkpoint-dir",
                     str(tmp_path / "run"), "--quiet"]) == cli.EXIT_OK
    checkpoint = next((tmp_path / "run").glob("ckpt-*.ckpt"))
    assert cli.main(["replay", str(checkpoint), "--impl", "reference"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a replay file" in err


@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_a_fault_the_run_would_never_reach_is_refused(impl: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """--fault-step past the run's last step: one line, exit 2, not a clean run."""
    status = cli.main(["train", "--impl", impl, "--steps", "3", "--checkpoint-dir",
                       str(tmp_path), "--fault", "inf_weight", "--fault-step", "3"])
    err = capsys.readouterr().err.strip()
    assert status == cli.EXIT_USAGE and len(err.splitlines()) == 1 and "never strike" in err


