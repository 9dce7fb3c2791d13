"""reference.train against its own contract: the loop's bookkeeping, the CLI's output, and
restores that are all-or-nothing."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reference import resume, train

SMALL = {"sizes": (8, 16, 3), "batch_size": 8, "num_samples": 40}
ROOT = Path(__file__).resolve().parents[1]


def test_a_mismatched_checkpoint_leaves_the_run_untouched(tmp_path: Path) -> None:
    """Loading a wider model's checkpoint raises CheckpointMismatchError naming the changed
    field, then (config forged) the key and shapes; the run's parameters are unchanged."""
    train.train(train.TrainConfig(**{**SMALL, "sizes": (8, 32, 3)}), 3, tmp_path, 3)
    state = resume.load_checkpoint(resume.CheckpointManager(tmp_path).path(3))
    run = train.Run(train.TrainConfig(**SMALL))
    before = run.model.state_dict()
    with pytest.raises(resume.CheckpointMismatchError,
                       match=r"sizes: \[8, 32, 3\] in the checkpoint, \[8, 16, 3\] now"):
        run.load_state_dict(state)
    state = {**state, "config": run.config.to_dict(), "fingerprint": run.config.fingerprint()}
    with pytest.raises(resume.CheckpointMismatchError, match=r"model/0\.weight.*\(32, 8\)"):
        run.load_state_dict(state)
    for k, v in run.model.state_dict().items():
        assert np.array_equal(v, before[k])


def test_resume_skips_a_corrupt_newest_checkpoint_and_says_so(tmp_path: Path) -> None:
    """A torn newest file is reported, the run resumes from the one before it, and the torn
    file is renamed aside (kept), not overwritten, when the run writes its name again."""
    config = train.TrainConfig(**SMALL)
    train.train(config, 6, tmp_path, 3)
    newest = resume.CheckpointManager(tmp_path).path(6)
    torn = newest.read_bytes()[:100]
    newest.write_bytes(torn)
    lines: list[str] = []
    run = train.train(config, 6, tmp_path, 3, resume_from_latest=True, log=lines.append)
    assert lines[0].startswith("skipped ckpt-00000006.ckpt: ")
    assert lines[1] == "resumed from ckpt-00000003.ckpt at step 3"
    assert (tmp_path / "ckpt-00000006.ckpt.unreadable").read_bytes() == torn
    expected = train.train(config, 6)
    assert train.state_digest(run.state_dict()) == train.state_digest(expected.state_dict())


def test_a_skipped_step_does_not_advance_the_schedule() -> None:
    """fp16 with a huge scale: skipped steps leave lr and optimizer state where they were."""
    run = train.Run(train.TrainConfig(**SMALL, precision="fp16", init_scale=2.0**40))
    lr = run.scheduler.get_last_lr()
    result = run.train_step()
    assert result.skipped and run.skipped == 1 and run.step == 1
    assert run.scheduler.get_last_lr() == lr and run.optimizer.state == {}


def test_state_digest_orders_and_prefixes_records_as_documented() -> None:
    """The digest equals SHA-256 of the NOTE's records, rebuilt here by hand."""
    import hashlib
    import struct

    state = train.train(train.TrainConfig(**SMALL, optimizer="SGD"), 2).state_dict()

    def rec(body: bytes) -> bytes:
        return struct.pack("<Q", len(body)) + body

    h = hashlib.sha256()
    for k, v in state["model"].items():
        h.update(rec(f"model/{k}\0<f4\0{','.join(map(str, v.shape))}\0".encode() + v.tobytes()))
    for i in sorted(state["optimizer"]["state"]):
        buf = state["optimizer"]["state"][i]["momentum_buffer"]
        h.update(rec(f"optimizer/{i}/momentum_buffer\0<f4\0"
                     f"{','.join(map(str, buf.shape))}\0".encode() + buf.tobytes()))
    h.update(rec(f"data/epoch\0py\0{state['data']['epoch']}".encode()))
    h.update(rec(f"data/position\0py\0{state['data']['position']}".encode()))
    assert state["scaler"] == {}  # fp32: a disabled scaler has no entries
    assert train.state_digest(state) == h.hexdigest()


def test_cli_prints_progress_and_the_digest_last(tmp_path: Path) -> None:
    """`python -m parity train --impl reference`: one line per step, digest line last."""
    done = subprocess.run([sys.executable, "-m", "parity", "train", "--impl", "reference",
                           "--steps", "4", "--checkpoint-dir", str(tmp_path),
                           "--checkpoint-every", "2", "--horizon", "200"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.strip().splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [["step", str(i)] for i in (1, 2, 3, 4)]
    assert all(" loss " in line and " scale " in line and " skipped " in line
               for line in lines[:4])
    assert lines[-1].startswith("state-sha256: ") and len(lines[-1].split()[1]) == 64
    expected = train.state_digest(train.train(train.TrainConfig(), 4).state_dict())
    assert lines[-1].split()[1] == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000002.ckpt",
                                                          "ckpt-00000004.ckpt"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_recompute_under_autocast_steps_to_the_bits_of_no_recompute(precision: str) -> None:
    """Dropout on, every schedule: the same losses, scales and final state digest as without
    recomputation (a checkpointed segment holding a Dropout is re-run under autocast)."""
    from reference.nn import Dropout
    from reference.recompute import Segment

    config = {**SMALL, "sizes": (8, 16, 16, 16, 3), "dropout": 0.3, "precision": precision}
    runs = {}
    for spec in ("none", "uniform:2", "sqrt", "optimal:2"):
        run = train.Run(train.TrainConfig(**config, recompute=spec))
        if run.schedule is not None:  # the edge: a checkpointed Dropout
            assert any(isinstance(run.model[i], Dropout) for seg in run.schedule.plan
                       if isinstance(seg, Segment) for i in seg.body if isinstance(i, int))
        results = [run.train_step() for _ in range(3)]
        runs[spec] = ([(r.loss, r.scale, r.skipped) for r in results],
                      train.state_digest(run.state_dict()))
    assert all(v == runs["none"] for v in runs.values()), runs


@pytest.mark.parametrize(("field", "value", "phrase"), [
    ("seed", -1, "seed must be an int >= 0 and < 4294967296"),
    ("seed", 2**32, "seed must be an int >= 0"),
    ("dropout", 1.0, "dropout must be a finite number in [0, 1)"),
    ("init_scale", 0.0, "init_scale must be a finite number in (0, 3.40282e+38]"),
    ("init_scale", -2.0, "init_scale"),
    ("init_scale", float("nan"), "init_scale"),
    ("init_scale", 1e39, "init_scale"),  # finite in float64, inf in float32
    ("growth_interval", 0, "growth_interval must be an int >= 1"),
    ("horizon", 0, "horizon must be an int >= 1"),
    ("num_samples", 4, "num_samples must be an int >= 8"),  # fewer than one batch
    ("lr", float("inf"), "lr must be a finite number in (0, inf]"),
    ("max_grad_norm", 0.0, "max_grad_norm"),
    ("sizes", (8,), "sizes needs (d_in, ..., d_out)"),
    ("optimizer", "LBFGS", "optimizer must be one of"),
])
def test_train_config_refuses_each_bad_field_by_name(field: str, value: object,
                                                     phrase: str) -> None:
    """One configuration for both trees (torch_impl.train.TrainConfig is this class): a bad
    value is a ValueError naming the field and what is accepted, never a later surprise
    (an epoch of zero batches would loop forever)."""
    from torch_impl import train as torch_train

    assert torch_train.TrainConfig is train.TrainConfig
    with pytest.raises(ValueError, match=re.escape(phrase)):
        train.TrainConfig(**{**SMALL, "batch_size": 8, field: value})


def test_train_refuses_steps_past_the_schedule_horizon() -> None:
    """A cosine schedule run past its horizon would climb back: refused."""
    with pytest.raises(ValueError, match=r"horizon = 3"):
        train.train(train.TrainConfig(**SMALL, horizon=3), 4)


@pytest.mark.parametrize("tree", ["reference", "torch"])
@pytest.mark.parametrize("horizon", [6, 12])
def test_the_cosine_schedule_reaches_its_minimum_at_the_horizon_and_never_climbs(
        tree: str, horizon: int) -> None:
    """lr(step) follows cos over exactly `horizon` applied updates: non-increasing, and at
    the horizon the minimum (0) up to rounding; a schedule of another length would not."""
    import importlib

    from parity.drivers.train import one_thread

    m = importlib.import_module("reference.train" if tree == "reference" else "torch_impl.train")
    run = m.Run(m.TrainConfig(**SMALL, horizon=horizon))
    lrs = [run.scheduler.get_last_lr()[0]]
    with one_thread():  # a tiny model: more threads only contend
        while run.step < horizon:
            run.train_step()
            lrs.append(run.scheduler.get_last_lr()[0])
    assert all(b <= a for a, b in itertools.pairwise(lrs)), lrs
    assert lrs[-1] <= 1e-12 * lrs[0] < lrs[-2]
