"""Data parallel: gloo's ring all-reduce against its NumPy mirror (ddp.ring_order), DDP's
buckets (ddp.buckets), its reduced gradients (ddp.reduced_grads) and the parameters after
3 steps (ddp.params) against the reference's simulated ranks replaying the torch ranks'
local gradients; the reference's own local gradients reduced, within the bound their
difference implies (ddp.own_reduced); and how far a different
summation order (NCCL's) can move a sum (ddp.order_bound).

The default run makes ONE launch of 3 gloo processes (a 2-rank subgroup runs the ws = 2
jobs): ring probes, and DDP runs at ws 2 (fp32) and 3 (fp32, fp16 with the GradScaler, fp32
with gradient_as_bucket_view=True).
The full matrix (ws 2, 3, 4 x fp32, bf16, fp16) is slow. The ring's sweep over sizes and
dtypes is tests/test_ddp_ring.py; the launcher's failure handling tests/test_ddp_launch.py.
Driver: parity/drivers/ddp.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import event, given, settings

from parity.compare import as_numpy, assert_claim, bit_view
from parity.drivers import ddp as drv
from parity.strategies import examples, rank_values

# (world size, precision, gradient_as_bucket_view)
DEFAULT_RUNS = ((2, "fp32", False), (3, "fp32", False), (3, "fp16", False), (3, "fp32", True))


def _jobs(runs: tuple[tuple[int, str, bool], ...], ring_world_sizes: tuple[int, ...]
          ) -> list[dict]:
    jobs = drv.ring_jobs(drv.QUICK_RING, ring_world_sizes)
    for w, p, as_view in runs:
        jobs += drv.train_jobs((w,), (p,), as_view)
    return jobs


@pytest.fixture(scope="module")
def launched() -> tuple[list[dict], list[list[dict]]]:
    """The default launch: (jobs, results[rank][job])."""
    jobs = _jobs(DEFAULT_RUNS, (2, 3))
    return jobs, drv.launch(jobs, 3)


def _runs(jobs: list[dict], results: list[list[dict]]) -> Iterator[drv.Replay]:
    for i, job in enumerate(jobs):
        if job["kind"] == "train":
            yield drv.replay(job, results, i)


@pytest.fixture(scope="module")
def replays(launched: tuple[list[dict], list[list[dict]]]) -> list[drv.Replay]:
    return list(_runs(*launched))


def test_two_ddp_steps_match_the_simulated_ranks_bitwise() -> None:
    """Two gloo ranks take two DDP steps of an MLP; the reference's ddp_step from the same
    weights on the same batches, replaying each rank's local gradient (nn.linear: not
    bit-equal), takes each rank's shard, reduces to DDP's .grad bits and steps to its
    parameters."""
    c, ws, steps = drv.config("fp32"), 2, 2
    # torch: 2 processes, each torch_impl.ddp.ddp_step twice (torch_impl/ddp_jobs.py's run)
    runs = [rank[0] for rank in drv.launch(drv.train_jobs((ws,), ("fp32",), steps=steps), ws)]
    # reference: 2 simulated ranks from torch's initial weights, reference.ddp.ddp_step twice
    sim = drv.simulated_ranks(c, ws, runs[0]["initial"])
    for s in range(steps):
        x, y = next(sim.data)
        local = [[as_numpy(g) for g in runs[r]["steps"][s]["local"]] for r in range(ws)]
        ref = drv.rddp.ddp_step(sim.replicas, sim.loss_fn, sim.optimizers, sim.scalers, x, y,
                                step=s + 1, precision=c.precision, local_grads=local.__getitem__)
        for r, run in enumerate(runs):
            torch_step, where = run["steps"][s], f"step {s + 1} rank {r}"
            assert_claim("ddp.shards", actual=torch_step["x"], expected=ref.rows[r][0],
                         context=where)
            for k, (t, a) in enumerate(zip(torch_step["reduced"], ref.reduced, strict=True)):
                assert_claim("ddp.reduced_grads", actual=t, expected=a,
                             context=f"{where} param {k}")
    for r, run in enumerate(runs):
        for k, (t, p) in enumerate(zip(run["final"], sim.replicas[r].parameters(),
                                       strict=True)):
            assert_claim("ddp.params", actual=t, expected=p.data, context=f"rank {r} param {k}")
    assert len(runs[0]["steps"][1]["buckets"]) == 2, "guard: step 2 reduces two buckets"


def test_ring_mirror_gives_every_rank_gloos_bits(launched: tuple) -> None:
    """Every rank's dist.all_reduce result equals reference.ddp.ring_allreduce's, bit for
    bit, and from three ranks on a left-to-right sum differs (the order is what is mirrored)."""
    jobs, results = launched
    naive_differs = {}
    for i, job in enumerate(jobs):
        if job["kind"] != "allreduce":
            continue
        inputs, outputs, mirror = drv.ring_case(job, results, i)
        context = f"ws {job['world_size']} {job['dtype']} n={job['n']}"
        for r in range(job["world_size"]):
            assert_claim("ddp.ring_order", actual=outputs[r], expected=mirror[r],
                         context=f"{context} rank {r}")
        naive = drv.rddp.naive_sum(inputs)
        differs = not np.array_equal(bit_view(naive), bit_view(outputs[0]))
        naive_differs[job["world_size"]] = naive_differs.get(job["world_size"], False) or differs
    assert naive_differs == {2: False, 3: True}, naive_differs  # two ranks commute


def _check_buckets(rp: drv.Replay) -> None:
    context = f"ws {rp.job['world_size']} {rp.job['config']['precision']}"
    assert len(rp.torch_buckets[-1]) == 2, "guard: the rebuilt buckets must be two"
    for s, (a, b) in enumerate(zip(rp.reference_buckets, rp.torch_buckets, strict=True)):
        assert [len(x) for x in a] == [len(x) for x in b], f"{context} step {s + 1}: {a} vs {b}"
        assert_claim("ddp.buckets", actual=np.concatenate(b), expected=np.concatenate(a),
                     context=f"{context} step {s + 1}")


def _check_reduced(rp: drv.Replay) -> None:
    ws, precision = rp.job["world_size"], rp.job["config"]["precision"]
    for s, step in enumerate(rp.torch_reduced):
        for r in range(ws):
            for k, (a, b) in enumerate(zip(rp.reference_reduced[s], step[r], strict=True)):
                assert_claim("ddp.reduced_grads", actual=b, expected=a,
                             context=f"ws {ws} {precision} step {s + 1} rank {r} param {k}")


def _check_params(rp: drv.Replay) -> None:
    ws, precision = rp.job["world_size"], rp.job["config"]["precision"]
    for r in range(ws):
        for k, (a, b) in enumerate(zip(rp.reference_final[r], rp.torch_final[r], strict=True)):
            assert_claim("ddp.params", actual=b, expected=a,
                         context=f"ws {ws} {precision} rank {r} param {k}")
    assert any(not np.array_equal(a, b) for a, b in
               zip(rp.torch_final[0], rp.torch_initial, strict=True)), "guard: steps were taken"


def _check_shards(rp: drv.Replay) -> None:
    ws, precision = rp.job["world_size"], rp.job["config"]["precision"]
    for s, step in enumerate(rp.torch_rows):
        for r, ((tx, ty), (rx, ry)) in enumerate(zip(step, rp.reference_rows[s], strict=True)):
            context = f"ws {ws} {precision} step {s + 1} rank {r}"
            assert_claim("ddp.shards", actual=tx, expected=rx, context=context + " inputs")
            assert_claim("ddp.shards", actual=ty, expected=ry, context=context + " targets")
    for s, step in enumerate(rp.outputs):
        for r, (torch_out, ref_out, bound) in enumerate(step):
            assert_claim("nn.mlp.forward", actual=torch_out, expected=ref_out,
                         context=f"ws {ws} step {s + 1} rank {r}", scale=bound)


def _check_own_reduced(rp: drv.Replay) -> int:
    """ddp.own_reduced at every step; returns how many elements differ at all."""
    ws, precision = rp.job["world_size"], rp.job["config"]["precision"]
    differs = 0
    for s, step in enumerate(rp.torch_reduced):
        for k, (a, b) in enumerate(zip(rp.reference_own_reduced[s], step[0], strict=True)):
            bound = drv.own_reduced_bound([rp.torch_local[s][r][k] for r in range(ws)],
                                          [rp.reference_local[s][r][k] for r in range(ws)])
            assert_claim("ddp.own_reduced", actual=b, expected=a,
                         context=f"ws {ws} {precision} step {s + 1} param {k}",
                         scale=bound / np.finfo(np.float32).eps)
            differs += int(np.count_nonzero(a != b))
    return differs


def test_each_rank_trains_on_its_strided_shard_of_the_global_batch(
        replays: list[drv.Replay]) -> None:
    """Rows r::ws in both trees; in fp32 the reference's own forward on them is within
    nn.mlp.forward's bound of the output DDP's rank computed."""
    for rp in replays:
        _check_shards(rp)
    assert any(rp.outputs for rp in replays), "guard: an fp32 run checks the forward"


def test_reference_bucket_plan_is_ddps_at_every_step(replays: list[drv.Replay]) -> None:
    """Step 1: one bucket in parameter order; then the rebuilt ones, in ready order."""
    for rp in replays:
        _check_buckets(rp)


def test_reduced_gradients_match_ddp_bitwise_on_every_rank(replays: list[drv.Replay]) -> None:
    """The reference reducer on the torch ranks' local gradients gives DDP's .grad bits."""
    for rp in replays:
        _check_reduced(rp)
    # guard: at ws 3 a true division for f32(1/3)'s product, and a left-to-right sum for the
    # ring, would each change bits of these very gradients; with gradient_as_bucket_view
    # the reducer does divide from step 2 on, so the product would change them there
    view = next(r for r in replays if r.job["gradient_as_bucket_view"])
    multiplied = drv.rddp.reduce_gradients(view.torch_local[1], view.reference_buckets[1])
    assert any(np.any(a != b) for a, b in zip(multiplied, view.torch_reduced[1][0], strict=True))
    rp = next(r for r in replays if r.job["world_size"] == 3)
    flat = [np.concatenate([g.reshape(-1) for g in rank]) for rank in rp.torch_local[1]]
    assert np.any(flat[0] / np.float32(3) != flat[0] * np.float32(1 / 3))
    divided = [f * np.float32(1 / 3) for f in flat]
    assert np.any(drv.rddp.naive_sum(divided) != drv.rddp.ring_allreduce(divided)[0])


def test_parameters_after_ddp_steps_match_the_simulated_ranks_bitwise(
        replays: list[drv.Replay]) -> None:
    """After 3 steps every torch rank's parameters are the reference ranks' bits."""
    for rp in replays:
        _check_params(rp)
    fp16 = next(r for r in replays if r.job["config"]["precision"] == "fp16")
    assert float(np.abs(fp16.torch_local[0][0][0]).max()) > 1.0, "guard: fp16 grads are scaled"


def test_own_local_gradients_reduce_within_the_bound_they_imply(
        replays: list[drv.Replay]) -> None:
    """The reference's own local gradients (not bit-equal to torch's) reduced: within B."""
    differs = sum(_check_own_reduced(rp) for rp in replays)
    assert differs > 0, "guard: the trees' own local gradients must differ somewhere"


def test_a_different_summation_order_stays_within_the_order_bound(launched: tuple) -> None:
    """gloo's ring and a left-to-right sum (two orders, as NCCL's is another) differ by at
    most eps (ws - 1) sum|x_r| / (1 - (ws - 1) u)."""
    jobs, results = launched
    seen = 0
    for i, job in enumerate(jobs):
        if job["kind"] != "allreduce" or job["world_size"] < 3:
            continue
        inputs, outputs, _ = drv.ring_case(job, results, i)
        naive = drv.rddp.naive_sum(inputs)
        assert_claim("ddp.order_bound", actual=naive, expected=outputs[0],
                     context=f"{job['dtype']} n={job['n']}", scale=drv.order_scale(inputs))
        seen += int(np.count_nonzero(bit_view(naive) != bit_view(outputs[0])))
    assert seen > 0, "guard: the two orders must differ somewhere"


@given(case=rank_values())
@settings(examples(30))
def test_any_two_summation_orders_stay_within_the_order_bound(case: tuple[str, list]) -> None:
    """For any ranks' values (subnormals, cancellation, 30 binades apart): the ring mirror,
    a left-to-right sum and torch's sum over a rank axis (three orders; NCCL's is another)
    pairwise within ddp.order_bound."""
    import torch

    from torch_impl.format_spec import DTYPES

    dtype, inputs = case
    ring = drv.rddp.ring_allreduce(inputs)[0]
    naive = drv.rddp.naive_sum(inputs)
    stacked = torch.from_numpy(np.stack([bit_view(x) for x in inputs]))
    summed = stacked.view(DTYPES[dtype]).sum(0)
    torch_sum = as_numpy(summed)
    scale = drv.order_scale(inputs)
    event(f"{dtype}, orders differ: {not np.array_equal(bit_view(ring), bit_view(naive))}")
    assert_claim("ddp.order_bound", actual=naive, expected=ring, context=f"{dtype} naive vs ring",
                 scale=scale)
    assert_claim("ddp.order_bound", actual=torch_sum, expected=ring,
                 context=f"{dtype} torch.sum vs ring", scale=scale)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_full_matrix_of_world_sizes_and_precisions_is_bit_exact(world_size: int) -> None:
    """ws 2, 3, 4 x fp32, bf16, fp16: shards, buckets, reduced gradients (replayed and
    own) and parameters."""
    jobs = (drv.train_jobs((world_size,), ("fp32", "bf16", "fp16"))
            + drv.train_jobs((world_size,), ("bf16",), gradient_as_bucket_view=True))
    for rp in _runs(jobs, drv.launch(jobs, world_size)):
        _check_shards(rp)
        _check_own_reduced(rp)
        _check_buckets(rp)
        _check_reduced(rp)
        _check_params(rp)


@pytest.mark.cuda
def test_nccl_all_reduce_stays_within_the_order_bound_of_the_gloo_mirror(device: str) -> None:
    """On CUDA (one GPU per rank): NCCL's sums against the mirror, within ddp.order_bound."""
    import torch

    if device != "cuda" or torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs --device cuda and at least 2 GPUs (one per rank)")
    ws = min(torch.cuda.device_count(), 4)
    jobs = drv.ring_jobs(drv.QUICK_RING, (ws,))
    results = drv.launch(jobs, ws, backend="nccl")
    for i, job in enumerate(jobs):
        inputs, outputs, mirror = drv.ring_case(job, results, i)
        for r in range(ws):
            assert_claim("ddp.order_bound", actual=outputs[r], expected=mirror[r],
                         context=f"nccl {job['dtype']}", scale=drv.order_scale(inputs))
