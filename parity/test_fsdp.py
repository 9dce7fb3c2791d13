"""FSDP2 (fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=...)) over
gloo against the reference's simulated ranks replaying the torch ranks' local gradients:
the shards (fsdp.shards), the all-gathered bf16 parameters (fsdp.all_gather), the sharded
gradients (fsdp.reduce_scatter), the parameters after AdamW (fsdp.params), the optimizer
state against a single unsharded process (fsdp.unsharded_state), and what reducing in
bfloat16 costs against float32 (fsdp.reduce_dtype).

The default run makes ONE launch of 3 gloo processes (a 2-rank subgroup runs the ws = 2
job): ws 2 with reduce_dtype float32, ws 3 with float32 and with bfloat16, 3 steps each.
The full matrix (ws 2, 3, 4 x float32, bfloat16, 5 steps; ws 4 leaves a rank an empty
shard of the 5-row layer) is slow. Driver: parity/drivers/fsdp.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from parity.compare import as_numpy, assert_claim, bit_view
from parity.drivers import fsdp as drv
from reference import ddp as rddp
from reference import fsdp as rfsdp
from torch_impl import fsdp as tfsdp

if not tfsdp.RULE_STATED:
    pytest.skip(tfsdp.NOT_STATED, allow_module_level=True)

DEFAULT_RUNS = ((2, "float32"), (3, "float32"), (3, "bfloat16"))


def _replays(jobs: list[dict], results: list[list[dict]]) -> list[drv.Replay]:
    return [drv.replay(job, results, i) for i, job in enumerate(jobs) if job["kind"] == "fsdp"]


@pytest.fixture(scope="module")
def launched() -> tuple[list[dict], list[list[dict]]]:
    """The default launch: (jobs, results[rank][job])."""
    jobs = drv.reduce_scatter_jobs(drv.QUICK_REDUCE_SCATTER, (2, 3)) + drv.jobs(DEFAULT_RUNS)
    return jobs, drv.launch(jobs, 3)


@pytest.fixture(scope="module")
def replays(launched: tuple[list[dict], list[list[dict]]]) -> list[drv.Replay]:
    return _replays(*launched)


def test_two_fsdp_steps_match_the_simulated_ranks_bitwise() -> None:
    """Two gloo ranks take two FSDP2 steps of an MLP (bf16 parameters, float32 reduction);
    the reference's fsdp_step from the same weights, replaying each rank's local gradient,
    all-gathers the bf16 parameters each rank used, reduce-scatters to each rank's sharded
    gradient bits and steps AdamW to its shards' bits."""
    c, ws, steps = drv.config(), 2, 2
    # torch: 2 processes, each torch_impl.fsdp.fsdp_step twice (torch_impl.fsdp.run)
    runs = [rank[0] for rank in drv.launch(drv.jobs(((ws, "float32"),), steps=steps), ws)]
    # reference: 2 simulated ranks sharding torch's initial weights, rfsdp.fsdp_step twice
    sim = drv.simulated_ranks(c, ws, [as_numpy(p) for p in runs[0]["initial"]])
    for s in range(steps):
        local = [[as_numpy(g) for g in run["steps"][s]["local"]] for run in runs]
        ref = rfsdp.fsdp_step(sim.padded, sim.shards, sim.optimizers, local,
                              drv.groups(len(local[0])), param_dtype=ml_dtypes.bfloat16,
                              reduce_dtype=np.float32)
        for r, run in enumerate(runs):
            for k, torch_grad in enumerate(run["steps"][s]["grads"]):
                where = f"step {s + 1} rank {r} param {k}"
                assert_claim("fsdp.all_gather", actual=run["steps"][s]["gathered"][k],
                             expected=ref.gathered[k], context=where)
                assert_claim("fsdp.reduce_scatter", actual=torch_grad,
                             expected=ref.grads[r][k], context=where)
                assert_claim("fsdp.params", actual=run["steps"][s]["params"][k],
                             expected=sim.shards[r][k].data, context=where)
    rows = [run["steps"][0]["grads"][0].shape[0] for run in runs]
    assert rows == [17, 16], f"guard: the 33-row weight splits unevenly (padding): {rows}"


def _check_collective(jobs: list[dict], results: list[list[dict]]) -> int:
    """fsdp.reduce_scatter for the collective alone; returns how many jobs were checked."""
    seen = 0
    for i, job in enumerate(jobs):
        if job["kind"] != "reduce_scatter":
            continue
        outputs, mirror = drv.reduce_scatter_case(job, results, i)
        for r in range(job["world_size"]):
            assert_claim("fsdp.reduce_scatter", actual=outputs[r], expected=mirror[r],
                         context=f"ws {job['world_size']} {job['dtype']} {job['op']} n={job['n']} "
                                 f"rank {r}")
        seen += 1
    return seen


def test_gloo_reduce_scatter_is_the_ring_of_the_whole_buffer_then_a_slice(
        launched: tuple) -> None:
    """dist.reduce_scatter_single on gloo, alone: reference.fsdp.gloo_reduce_scatter's bits."""
    assert _check_collective(*launched) == 4


def _context(rp: drv.Replay) -> str:
    return f"ws {rp.job['world_size']} reduce {rp.job['reduce_dtype']}"


def _check_shards(rp: drv.Replay, results_sharded: list[list[np.ndarray]]) -> None:
    ws = rp.job["world_size"]
    for r in range(ws):
        for k, p in enumerate(rp.initial):
            mine = rfsdp.unpadded(rfsdp.shard(p, r, ws), p.shape[0], r, ws)
            assert_claim("fsdp.shards", actual=results_sharded[r][k], expected=mine,
                         context=f"{_context(rp)} rank {r} param {k}")


def _check_steps(rp: drv.Replay) -> None:
    ws = rp.job["world_size"]
    for s in range(rp.job["steps"]):
        for r in range(ws):
            for k in range(len(rp.initial)):
                where = f"{_context(rp)} step {s + 1} rank {r} param {k}"
                assert_claim("fsdp.all_gather", actual=rp.torch_gathered[s][r][k],
                             expected=rp.reference_gathered[s][k], context=where)
                assert_claim("fsdp.reduce_scatter", actual=rp.torch_grads[s][r][k],
                             expected=rp.reference_grads[s][r][k], context=where)
                assert_claim("fsdp.params", actual=rp.torch_params[s][r][k],
                             expected=rp.reference_params[s][r][k], context=where)


def _check_state(rp: drv.Replay) -> None:
    ws = rp.job["world_size"]
    for r in range(ws):
        for k, state in enumerate(rp.torch_state[r]):
            assert set(state) == {"step", "exp_avg", "exp_avg_sq"}, state.keys()
            for name, value in state.items():
                assert_claim("fsdp.unsharded_state", actual=value,
                             expected=rp.reference_state[r][k][name],
                             context=f"{_context(rp)} rank {r} param {k} {name}")
    for k, entries in enumerate(rp.unsharded_state):
        for name, (ref, torch_full, joined) in entries.items():
            where = f"{_context(rp)} param {k} {name}"
            assert_claim("fsdp.unsharded_state", actual=joined, expected=torch_full,
                         context=where + " torch.optim")
            assert_claim("fsdp.unsharded_state", actual=joined, expected=ref,
                         context=where + " reference")
        ref, torch_full, joined = rp.unsharded_params[k]
        assert_claim("fsdp.unsharded_state", actual=joined, expected=torch_full,
                     context=f"{_context(rp)} param {k}")
        assert_claim("fsdp.unsharded_state", actual=joined, expected=ref,
                     context=f"{_context(rp)} param {k}")


def _check_reduce_dtype(f32: drv.Replay, bf16: drv.Replay) -> tuple[float, int]:
    """fsdp.reduce_dtype at step 1; returns (worst bf16 ulps of the float32 result, how many
    elements differ)."""
    ws = f32.job["world_size"]
    worst, differ = 0.0, 0
    for k in range(len(f32.initial)):
        local = [f32.torch_local[0][r][k] for r in range(ws)]
        for r in range(ws):  # guard: the same inputs to both reductions
            assert np.array_equal(bit_view(local[r]), bit_view(bf16.torch_local[0][r][k]))
        a = np.concatenate([bf16.torch_grads[0][r][k] for r in range(ws)])
        b = np.concatenate([f32.torch_grads[0][r][k] for r in range(ws)])
        bound = drv.reduce_dtype_bound(local)
        assert_claim("fsdp.reduce_dtype", actual=a, expected=b, context=f"ws {ws} param {k}",
                     scale=bound / np.finfo(np.float32).eps)
        worst = max(worst, float(drv.bf16_ulps(a, b).max()))
        differ += int(np.count_nonzero(a != b))
    return worst, differ


def test_reference_shards_are_fully_shards_local_rows(replays: list[drv.Replay]) -> None:
    """Each torch rank's DTensor shard at init is reference.fsdp.shard's rows."""
    for rp in replays:
        _check_shards(rp, rp.torch_sharded)
    assert any(rp.initial[0].shape[0] % rp.job["world_size"] for rp in replays), \
        "guard: a layer whose rows do not divide by ws (padding)"


def test_gathered_params_grads_and_adamw_steps_match_bitwise(
        replays: list[drv.Replay]) -> None:
    """Every step, every rank: the bf16 all-gather, the reduce-scatter, AdamW on the shards."""
    for rp in replays:
        _check_steps(rp)
    moved = replays[0]
    assert any(not np.array_equal(a, b[:a.shape[0]]) for a, b in
               zip(moved.torch_params[-1][0], moved.initial, strict=True)), "guard: steps taken"


def test_reduce_scatter_order_and_division_are_what_the_mirror_says(
        replays: list[drv.Replay]) -> None:
    """The guard behind fsdp.reduce_scatter: at ws 3 a left-to-right sum (bf16) and a
    multiplication by f32(1/3) (float32) would each change bits of these very gradients."""
    bf16 = next(r for r in replays if r.job["reduce_dtype"] == "bfloat16")
    local = bf16.torch_local[0]
    buffers = [rfsdp.copy_in(local[r][2:4], 3, ml_dtypes.bfloat16) for r in range(3)]
    assert np.any(rddp.naive_sum(buffers) != rddp.ring_allreduce(buffers)[0])
    buffers = [rfsdp.copy_in(local[r][2:4], 3, np.float32) for r in range(3)]
    total = rddp.ring_allreduce(buffers)[0]
    assert np.any(total / np.float32(3) != total * np.float32(1 / 3))


def test_sharded_adamw_state_is_the_unsharded_single_process_state(
        replays: list[drv.Replay]) -> None:
    """Joined along dim 0, the ranks' AdamW state and parameters are a single process's."""
    for rp in replays:
        _check_state(rp)


def test_reducing_in_bf16_stays_within_the_derived_bound_of_fp32(
        replays: list[drv.Replay]) -> None:
    """reduce_dtype bfloat16 against float32 at ws 3, step 1: within B; and it costs."""
    f32 = next(r for r in replays if r.job["world_size"] == 3
               and r.job["reduce_dtype"] == "float32")
    bf16 = next(r for r in replays if r.job["reduce_dtype"] == "bfloat16")
    worst, differ = _check_reduce_dtype(f32, bf16)
    assert differ > 0 and worst > 0.5, "guard: bf16 reduction must cost somewhere"


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_full_matrix_of_world_sizes_and_reduce_dtypes_is_bit_exact(world_size: int) -> None:
    """ws 2, 3, 4 x reduce float32, bfloat16, 5 steps: every claim above; the collective
    alone over sizes up to ws x 600,001 elements (past 2 ws MiB: the 1 MiB segment cap)."""
    cases = tuple((d, n, op) for d in ("float32", "bfloat16") for n in drv.REDUCE_SCATTER_SIZES
                  for op in ("sum", "avg"))
    jobs = (drv.reduce_scatter_jobs(cases, (world_size,))
            + drv.jobs(((world_size, "float32"), (world_size, "bfloat16")), 5))
    results = drv.launch(jobs, world_size, timeout=300)
    assert _check_collective(jobs, results) == len(cases)
    f32, bf16 = _replays(jobs, results)
    for rp in (f32, bf16):
        _check_shards(rp, rp.torch_sharded)
        _check_steps(rp)
        _check_state(rp)
    _check_reduce_dtype(f32, bf16)
