"""Loss scaling across ranks: with a plain GradScaler per rank, a non-finite gradient on one
rank after DDP's reduction parts the ranks at exactly that step, the same in both trees
(ddp.scaler_divergence); with found_inf all-reduced before step (by hand, ReduceOp.MAX, or
torch's ShardedGradScaler) every rank skips together and the run stays bit-identical across
ranks and trees (ddp.scaler_repair). NOTE [ found_inf is per rank ] in
reference/ddp_scaler.py; driver parity/drivers/ddp_scaler.py.

The default run makes ONE launch of 3 gloo processes (a 2-rank subgroup for ws = 2): the
unrepaired and the MAX-repaired loop at ws 2 and 3, the SUM-repaired one at ws 2, and
ShardedGradScaler at ws 3; the
repaired jobs run the cross-rank check set to raise, so they prove it silent in-process. A
second, tiny launch shows the check ending an unrepaired run with an error. The full
matrix (ws 2, 3, 4 x no repair, MAX, SUM, ShardedGradScaler x three faults, 6 steps) is
slow; the check's and the reference all-reduce's own contracts: tests/test_ddp_scaler.py.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from parity.compare import assert_claim
from parity.drivers import ddp_scaler as drv

UNREPAIRED, REPAIRED = drv.UNREPAIRED, drv.REPAIRED + drv.REPAIRED_UNTABLED


@pytest.fixture(scope="module")
def replays() -> dict[tuple[int, str], drv.Replay]:
    """{(world size, repair): the run in both trees}, from one launch (drv.measure)."""
    return drv.measure()


def assert_ranks_agree(run: drv.Run, context: str) -> None:
    """The regression guard of a data-parallel loop: after every step every rank holds rank
    0's scale and parameters (its digest), and the final parameters are the same bits."""
    for s, digests in enumerate(run.digests):
        assert len(set(digests)) == 1, (f"{context}: the ranks' states differ after step "
                                        f"{s + 1}: {run.divergence[s]}")
        assert run.divergence[s] is None, context
    for r, params in enumerate(run.final[1:], 1):
        for k, (a, b) in enumerate(zip(params, run.final[0], strict=True)):
            assert_claim("ddp.scaler_repair", actual=a, expected=b,
                         context=f"{context}: rank {r} param {k} vs rank 0")


def _digest_bits(digests: list[str]) -> np.ndarray:
    return np.frombuffer(b"".join(bytes.fromhex(d) for d in digests), dtype=np.uint8)


def _check_trees_agree(claim: str, rp: drv.Replay) -> None:
    """Every rank's scaler and state per step, torch against the reference replaying its
    local gradients (bits); the reference's own run: the same skips, scales and verdicts."""
    context = f"ws {rp.job['world_size']} repair {rp.job['repair']}"
    t, ref, own = rp.torch, rp.replayed, rp.own
    for name in ("found_inf", "scale", "after"):
        for s in range(len(t.scale)):
            assert_claim(claim, actual=np.array(getattr(t, name)[s], dtype=np.float32),
                         expected=np.array(getattr(ref, name)[s], dtype=np.float32),
                         context=f"{context} step {s + 1} {name}")
    for s in range(len(t.scale)):
        assert_claim(claim, actual=_digest_bits(t.digests[s]),
                     expected=_digest_bits(ref.digests[s]),
                     context=f"{context} step {s + 1} digests")
    assert ref.skipped == t.skipped and ref.divergence == t.divergence, context
    for r, (a_rank, b_rank) in enumerate(zip(ref.final, t.final, strict=True)):
        for k, (a, b) in enumerate(zip(a_rank, b_rank, strict=True)):
            assert_claim(claim, actual=b, expected=a, context=f"{context} rank {r} param {k}")
    if own is None:
        return
    assert (own.skipped, own.found_inf, own.scale, own.after) == (
        t.skipped, t.found_inf, t.scale, t.after), f"{context}: the reference's own run"
    assert own.divergence == t.divergence, f"{context}: the reference's own verdicts"


def test_without_the_repair_the_ranks_part_at_the_seeded_step_in_both_trees(
        replays: dict) -> None:
    """Rank ws - 1 alone skips step 2 and backs off while the others step and grow; both
    trees hold every rank's state bit for bit, and the check names step 2 and that rank."""
    for ws, repair in UNREPAIRED:
        rp = replays[ws, repair]
        _check_trees_agree("ddp.scaler_divergence", rp)
        assert rp.own is not None, "guard: the reference's own run was compared"
        t, bad = rp.torch, ws - 1
        assert len(set(t.digests[0])) == 1, "step 1: the ranks still agree"
        assert all(len(set(d)) > 1 for d in t.digests[1:]), "from step 2 on they differ"
        assert t.divergence[0] is None
        assert t.divergence[1].startswith(f"ranks diverge at step 2: rank {bad} found inf/NaN "
                                          "alone and skipped its step"), t.divergence[1]
        assert t.skipped[1] == [r == bad for r in range(ws)]
        assert t.after[1] == [2.0**15 if r == bad else 2.0**17 for r in range(ws)]
        assert t.max_param_difference() > 0, "guard: the parameters parted"


def test_with_found_inf_all_reduced_every_rank_skips_together_and_stays_bit_identical(
        replays: dict) -> None:
    """MAX or SUM by hand, or ShardedGradScaler's SUM: every rank skips step 2 and halves
    its scale; every rank's state equals every other's and the reference's, bit for bit;
    by hand with SUM, the found_inf step read is the count of ranks that found one."""
    for ws, repair in REPAIRED:
        rp = replays[ws, repair]
        _check_trees_agree("ddp.scaler_repair", rp)
        assert rp.torch.skipped[1] == [True] * ws, "guard: the fault was seen by every rank"
        assert rp.torch.after[1] == [2.0**15] * ws
        assert_ranks_agree(rp.torch, f"torch ws {ws} {repair}")
        assert_ranks_agree(rp.replayed, f"reference ws {ws} {repair}")
    assert replays[2, "sum"].torch.found_inf[1] == [1.0, 1.0], "guard: SUM over 2 ranks"


def test_the_rank_guard_fails_on_the_unrepaired_loop_and_passes_on_the_repaired_one(
        replays: dict) -> None:
    """assert_ranks_agree, the guard a DDP + GradScaler loop should keep, sees the fault."""
    for ws in (2, 3):
        with pytest.raises(AssertionError, match="differ after step 2: ranks diverge"):
            assert_ranks_agree(replays[ws, "none"].torch, f"ws {ws}")
        assert_ranks_agree(replays[ws, "max"].torch, f"ws {ws}")


def test_the_cross_rank_check_set_to_raise_ends_an_unrepaired_run_naming_step_and_rank(
) -> None:
    """Every rank raises RankDivergence at step 2; the launch ends with it, nothing left."""
    from ranks import DDPError

    with pytest.raises(DDPError, match=r"RankDivergence: ranks diverge at step 2: rank 2 "
                                       r"found inf/NaN alone"):
        drv.launch(drv.jobs(((3, "none"),), check="raise"), 3)
    assert multiprocessing.active_children() == []


def _check_parting(rp: drv.Replay) -> None:
    """The ranks agree before the fault's step and, unrepaired, differ from it on (the
    check naming that step and rank); repaired, or with no fault, agree throughout."""
    t, f = rp.torch, rp.job["fault"]
    context = f"ws {rp.job['world_size']} {rp.job['repair']} fault {f}"
    if f is None or rp.job["repair"] != "none":
        assert_ranks_agree(t, context)
        return
    rank, step = f
    assert all(len(set(d)) == 1 for d in t.digests[:step - 1]), context
    assert all(len(set(d)) > 1 for d in t.digests[step - 1:]), context
    assert t.divergence[step - 1].startswith(
        f"ranks diverge at step {step}: rank {rank} found inf/NaN alone"), t.divergence


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_full_matrix_of_faults_and_repairs_parts_or_holds_in_both_trees(world_size: int) -> None:
    """ws 2, 3, 4 x no repair, MAX, SUM, ShardedGradScaler, 6 steps; the fault on rank 0 at
    step 1, on the last rank at step 4, or none: the trees agree bit for bit every time."""
    runs = tuple((world_size, r) for r in ("none", "max", "sum", "sharded"))
    cases = [{world_size: (0, 1)}, {world_size: (world_size - 1, 4)}, {world_size: None}]
    jobs = [j for faults in cases for j in drv.jobs(runs, steps=6, faults=faults)]
    results = drv.launch(jobs, world_size)
    for i, job in enumerate(jobs):
        rp = drv.replay(job, results, i)
        claim = "ddp.scaler_divergence" if job["repair"] == "none" else "ddp.scaler_repair"
        _check_trees_agree(claim, rp)
        _check_parting(rp)


def test_bad_scaler_jobs_are_refused_before_any_process_starts() -> None:
    from torch_impl import ddp_scaler as tds

    c = drv.config()
    with pytest.raises(ValueError, match=r"fault must be None or \(rank, step\)"):
        tds.scaler_job(c, 3, 2, (2, 1), "none")
    with pytest.raises(ValueError, match="repair must be one of"):
        tds.scaler_job(c, 3, 2, None, "psum")
    with pytest.raises(ValueError, match="precision must be 'fp16'"):
        tds.scaler_job(drv.TrainConfig(optimizer="SGD", batch_size=12), 3, 2, None, "none")


def test_the_docs_figures_are_what_the_runs_measure(replays: dict) -> None:
    """docs/data/ddp_scaler.json (docs/distributed.md's table) == the figures of this run
    (python -m parity.drivers.ddp_scaler rewrites it)."""
    import json

    committed = json.loads(drv.DATA.read_text(encoding="utf-8"))
    committed.pop("torch")
    assert committed == json.loads(json.dumps(drv.figures(replays))), \
        "stale: python -m parity.drivers.ddp_scaler"
