"""Sharded checkpoints that cannot tear: a DDP run saved with torch.distributed.checkpoint
into fresh step directories and committed by record resumes bit-exactly (ddp.ckpt_resume),
reshards from 2 ranks to 1 and 3 by the stated rule (ddp.ckpt_reshard), and survives a
SIGKILL at any point of a save with its previous checkpoint intact (ddp.ckpt_kill).
Driver parity/drivers/ddp_ckpt.py; the commit record's own contracts, bad input and the
torn-directory hazard of plain DCP: tests/test_ddp_ckpt.py.

Default cost: one launch of 3 processes (uninterrupted, saving, three resumes), one
2-process kill launch (rank 1 after its data), its directory read in-process, and three
3-rank launches of the train command's loop (a resume where the bucket layout shows); the
other kill points and the resumes from the killed runs' directories are slow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ckpt
from ckpt import commit as ckc
from parity.compare import assert_claim
from parity.drivers import ddp_ckpt as drv

pytest.importorskip("torch.distributed.checkpoint")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> drv.Measured:
    return drv.measure(tmp_path_factory.mktemp("ddp_ckpt"))


def _assert_states_equal(claim: str, got: dict, want: dict, context: str,
                         keys: list[str] | None = None) -> None:
    keys = sorted(want) if keys is None else keys
    assert keys and set(keys) <= set(got), f"{context}: keys {sorted(got)} lack {keys}"
    for k in keys:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, (context, k)
        assert_claim(claim, actual=got[k].numpy(), expected=want[k].numpy(),
                     context=f"{context}: {k}")


def test_resumed_on_the_same_world_size_every_rank_ends_with_the_uninterrupted_bits(
        measured: drv.Measured) -> None:
    """ddp.ckpt_resume: final state, per-rank draws and losses of the steps after the
    resume, against the uninterrupted run, every rank."""
    resumed = measured.resumed[2]
    saved = measured.saving[0]["saved"][drv.SAVE_AT]
    assert int(saved["scaler/growth_tracker"]) != 0, "guard: a growth tracker to restore"
    for r, (got, want) in enumerate(zip(resumed, measured.uninterrupted, strict=True)):
        assert got["loaded"] is not None and int(got["loaded"]["step"]) == drv.SAVE_AT
        _assert_states_equal("ddp.ckpt_resume", got["final"], want["final"], f"rank {r}")
        after = [s for s in want["steps"] if s["step"] > drv.SAVE_AT]
        assert [s["step"] for s in got["steps"]] == [s["step"] for s in after]
        for a, b in zip(got["steps"], after, strict=True):
            for name in ("draw", "loss"):
                assert_claim("ddp.ckpt_resume", actual=a[name].numpy(), expected=b[name].numpy(),
                             context=f"rank {r} step {a['step']} {name}")


def test_the_saving_run_saved_the_uninterrupted_runs_state_at_each_checkpoint(
        measured: drv.Measured) -> None:
    """Saving changes nothing: what the saving run saved at steps 2 and 4 is the state the
    uninterrupted run reached there (the replicated entries its final state shares)."""
    saved = measured.saving[0]["saved"]
    assert sorted(saved) == list(range(drv.EVERY, drv.SAVE_AT + 1, drv.EVERY))
    assert [p.name for p in ckc.records(measured.directory)] == [
        f"COMMITTED-{s:08d}.json" for s in sorted(saved, reverse=True)]
    assert ckc.uncommitted(measured.directory) == []
    for step in saved:  # the record covers every rank's file, and nothing else is there
        record = ckc.read_record(ckc.record_path(measured.directory, step))
        names = {p.name for p in ckc.step_dir(measured.directory, step).iterdir()}
        assert {f.name for f in record.files} == names == {
            "__0_0.distcp", "__1_0.distcp", ".metadata"}, names


def test_resharded_to_1_and_3_ranks_every_rank_holds_the_saved_state_and_derived_streams(
        measured: drv.Measured) -> None:
    """ddp.ckpt_reshard: replicated entries as saved by rank 0 of the 2-rank run at step 4;
    the per-rank generator re-derived by rank_seed(seed, rank, 4)."""
    saved = measured.saving[0]["saved"][drv.SAVE_AT]
    replicated = [k for k in saved if not k.startswith("rng/")]
    seed = drv.config().seed
    for ws in drv.RESHARD:
        ranks = measured.resumed[ws]
        assert len(ranks) == ws
        for r, res in enumerate(ranks):
            assert res["record_world_size"] == 2
            loaded = res["loaded"]
            _assert_states_equal("ddp.ckpt_reshard", loaded, saved, f"ws {ws} rank {r}",
                                 replicated)
            rule = torch.Generator().manual_seed(ckc.rank_seed(seed, r, drv.SAVE_AT))
            assert_claim("ddp.ckpt_reshard", actual=loaded[f"rng/rank{r}"].numpy(),
                         expected=rule.get_state().numpy(),
                         context=f"ws {ws} rank {r}: the derived stream")
    streams = [measured.saving[r]["saved"][drv.SAVE_AT][f"rng/rank{r}"] for r in range(2)]
    assert not torch.equal(streams[0], streams[1]), "the 2 ranks' streams differ"
    resumed3 = measured.resumed[3][0]["loaded"]["rng/rank0"]
    assert not torch.equal(resumed3, streams[0]), "re-derived, not rank 0's saved stream"


def test_the_reference_sharded_checkpoint_gives_each_rank_what_dcp_gave_the_torch_rank(
        measured: drv.Measured, tmp_path: Path) -> None:
    """ddp.ckpt_trees: the torch run's step-4 states through the reference's sharded
    checkpoint, against DCP's loads of them at 2, 3 and 1 ranks; each tree refuses the
    other's directory."""
    from reference import sharded_ckpt as ref

    states = [{k: v.numpy() for k, v in measured.saving[r]["saved"][drv.SAVE_AT].items()}
              for r in range(2)]
    ref.save_sharded(tmp_path, drv.SAVE_AT, states)
    for ws in (2, *drv.RESHARD):
        record, loaded = ref.load_sharded(tmp_path, ws, drv.config().seed)
        assert record.world_size == 2 and len(loaded) == ws
        for r, (mine, theirs) in enumerate(zip(loaded, measured.resumed[ws], strict=True)):
            keys = sorted(k for k in theirs["loaded"] if ws == 2 or not k.startswith("rng/"))
            assert keys == sorted(k for k in mine if ws == 2 or not k.startswith("rng/"))
            for k in keys:
                assert_claim("ddp.ckpt_trees", actual=theirs["loaded"][k].numpy(),
                             expected=np.asarray(mine[k]), context=f"ws {ws} rank {r}: {k}")
    with pytest.raises(ckpt.CheckpointDirectoryError, match="payload 'dcp'"):
        ref.load_sharded(measured.directory, 2, 0)
    with pytest.raises(ckpt.CheckpointDirectoryError, match="payload 'npy-records'"):
        _load_in_process(tmp_path, measured.saving[0]["saved"][drv.SAVE_AT])


def _load_in_process(directory: Path, like: dict) -> tuple[ckc.Commit, dict]:
    from torch_impl import sharded_ckpt as sc

    template = {k: torch.zeros_like(v) for k, v in like.items()}
    record, _ = sc.load_sharded(directory, template)
    return record, template


def _check_previous_intact(directory: Path, measured: drv.Measured) -> None:
    """ddp.ckpt_kill: the newest commit is step 2, step 4 is uncommitted, and step 2 loads
    (in this process, both ranks' files) the bits the unkilled saving run saved."""
    previous = drv.SAVE_AT - drv.EVERY
    assert ckc.uncommitted(directory) == [ckc.step_dir(directory, drv.SAVE_AT)]
    for r in range(2):
        want = measured.saving[r]["saved"][previous]
        record, got = _load_in_process(directory, want)
        assert record.step == previous and record.world_size == 2
        _assert_states_equal("ddp.ckpt_kill", got, want, f"step {previous} rank {r}")


@pytest.mark.parametrize(("where", "victim"), [
    drv.KILLS[0], *(pytest.param(*k, marks=pytest.mark.slow) for k in drv.KILLS[1:])])
def test_a_kill_at_any_point_of_a_save_leaves_the_previous_checkpoint_loadable(
        measured: drv.Measured, tmp_path: Path, where: str, victim: int) -> None:
    """ddp.ckpt_kill: rank 1 SIGKILLed after writing its step-4 file, the coordinator before
    the .metadata and before the commit record: step 2 intact and loadable."""
    error = drv.kill(tmp_path, where, victim)
    assert f"rank {victim} was killed by SIGKILL" in error, error
    directory = tmp_path / "saves"
    _check_previous_intact(directory, measured)
    names = {p.name for p in ckc.step_dir(directory, drv.SAVE_AT).iterdir()}
    assert (".metadata" in names) == (where == "before_commit"), names


def test_the_train_loop_resumed_on_3_ranks_ends_with_the_uninterrupted_digest(
        tmp_path: Path) -> None:
    """ddp.cli_kill_resume's resume at 3 ranks (torch_impl.ddp_train, the train command's
    loop): saved at step 2, resumed, step 3 reduced in the rebuilt buckets' order as the
    uninterrupted run's is, the same digest."""
    whole, resumed, lines = drv.train_resume(tmp_path)
    assert lines[0].startswith(f"step {drv.TRAIN_SAVE_AT + 1} "), "guard: it resumed"
    assert resumed.step == whole.step == drv.TRAIN_STEPS
    assert whole.skipped == resumed.skipped == 0, "guard: step 3's reduction is not skipped"
    assert_claim("ddp.cli_kill_resume",
                 actual=np.frombuffer(bytes.fromhex(resumed.digest), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(whole.digest), np.uint8),
                 context="3 ranks, from step 2")


@pytest.mark.slow
@pytest.mark.parametrize(("where", "victim"), drv.KILLS)
def test_a_kill_at_any_point_of_a_save_resumes_to_the_uninterrupted_bits(
        measured: drv.Measured, tmp_path: Path, where: str, victim: int) -> None:
    """ddp.ckpt_kill: a 2-rank resume from the killed run's directory ends with the
    uninterrupted run's bits."""
    drv.kill(tmp_path, where, victim)
    for r, res in enumerate(drv.resume(tmp_path / "saves", 2)):
        assert int(res["loaded"]["step"]) == drv.SAVE_AT - drv.EVERY
        _assert_states_equal("ddp.ckpt_kill", res["final"], measured.uninterrupted[r]["final"],
                             f"{where}: resumed rank {r}")
