"""reference.ddp's ring all-reduce against its oracles: the docstring's per-element
pseudocode (compiled as it stands), gloo's segment arithmetic worked by hand, DDP's bucket
rule and the reference's N-rank loop held to it on 3 ranks (fresh and resumed: the resume
ends with the uninterrupted digest), and (slow) the real dist.all_reduce over world sizes
2-5, four dtypes and sizes 1 to 3,000,017 (claim ddp.ring_order; the default run's probes
are in parity/test_ddp.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from pseudocode import pseudocode

from common.train_config import TrainConfig
from common.train_loop import RanksResult
from parity.compare import assert_claim, bit_view
from parity.drivers import ddp as drv
from reference import ddp as rddp

RING_ELEMENT = pseudocode(rddp.__doc__, "ring_element")


@pytest.mark.parametrize("ws", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_ring_allreduce_is_the_docstring_pseudocode_element_by_element(ws: int, dtype: type
                                                                       ) -> None:
    """Each element: the pseudocode's sum over ranks for the chunk ring_chunks puts it in."""
    rng = np.random.default_rng(ws)
    n = 37
    x = [(rng.standard_normal(n) * 2.0 ** rng.integers(-8, 9, n)).astype(dtype)
         for _ in range(ws)]
    out = rddp.ring_allreduce(x)
    chunks = rddp.ring_chunks(n, np.dtype(dtype).itemsize, ws)
    expected = np.empty(n, dtype)
    for k, (lo, hi) in enumerate(chunks):
        for j in range(lo, hi):
            expected[j] = RING_ELEMENT([a[j] for a in x], k)
    assert sum(hi - lo for lo, hi in chunks) == n
    for r in range(ws):
        assert np.array_equal(bit_view(out[r]), bit_view(expected))
    if ws >= 3:  # guard: the order shows in these bits
        assert not np.array_equal(bit_view(rddp.naive_sum(x)), bit_view(expected))


def test_segments_follow_gloos_arithmetic_worked_by_hand() -> None:
    """3,000,017 float32 (12,000,068 bytes) on 5 ranks: ceil(B / 1 MiB) = 12 segments, up to
    15 (a multiple of 5), of roundUp(ceil(B / 15), 4) = 800,008 bytes = 200,002 elements;
    3 a chunk. Without the cap: 2 ws = 10 segments of 300,002 elements, other boundaries.
    Small buffers: 2 ws segments; 1 element on 3 ranks sits in chunk 0."""
    assert rddp.ring_chunks(3_000_017, 4, 5)[:2] == [(0, 600_006), (600_006, 1_200_012)]
    assert rddp.ring_chunks(3_000_017, 4, 5, max_segment_bytes=2**40)[1] == (600_004, 1_200_008)
    assert rddp.ring_chunks(1, 4, 3) == [(0, 1), (1, 1), (1, 1)]
    assert rddp.ring_chunks(7, 2, 2) == [(0, 4), (4, 7)]  # 4 segments of 2 elements


def test_bucket_plan_closes_a_bucket_at_its_limit_keeping_the_crossing_tensor() -> None:
    """compute_bucket_assignment_by_size: add, then close when size >= limit; the limits
    advance one per bucket and stay at the last."""
    mib = rddp.MIB
    assert rddp.bucket_plan([mib, 1, 1], [0, 1, 2]) == [[0], [1, 2]]
    assert rddp.bucket_plan([mib - 1, 1, 1], [2, 1, 0]) == [[2, 1, 0]]
    sizes = [mib // 2, mib // 2, 20 * mib, 5 * mib, 3 * mib]
    assert rddp.bucket_plan(sizes, range(5)) == [[0, 1], [2, 3], [4]]
    assert rddp.step_buckets([4, 8, 4, 8], 1, [3, 2, 1, 0]) == [[0, 1, 2, 3]]
    assert rddp.ready_order(4, "fp32") == [3, 2, 1, 0]
    assert rddp.ready_order(4, "bf16") == [2, 3, 0, 1]


# fp16 growing every 3 steps (the step-2 checkpoint holds growth tracker 2: a resume that
# drops it does not grow at step 3), dropout from every rank's own stream
REFERENCE_RUN = TrainConfig(seed=0, sizes=(8, 16, 3), precision="fp16", optimizer="SGD",
                            batch_size=12, num_samples=36, growth_interval=3, dropout=0.1)


@dataclass
class _Runs:
    """reference.ddp_train on 3 ranks (the fewest where the bucket layout changes the ring's
    sums): uninterrupted to step 3, and saved at step 2, then resumed to 3."""

    whole: RanksResult
    resumed: RanksResult
    whole_buckets: list[list[list[int]]]  # [step]: the buckets it was reduced in
    resumed_buckets: list[list[list[int]]]  # [step after the resume]
    saved: dict  # rank 0's state in the step-2 checkpoint


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    from ckpt import commit_policy
    from reference import ddp_train
    from reference import sharded_ckpt as rsc

    used: list[list[list[int]]] = []
    real = rddp.ddp_step

    def spy(*args: object, **kwargs: object) -> rddp.StepRecord:
        record = real(*args, **kwargs)  # type: ignore[arg-type]
        used.append(record.buckets)
        return record

    tmp, fresh = tmp_path_factory.mktemp("reference_ranks"), commit_policy.Start(None, None)

    def train(directory: Path, steps: int, start: commit_policy.Start) -> RanksResult:
        return ddp_train.train(REFERENCE_RUN, steps, 3, directory, 2, keep=2, start=start,
                               log=lambda _: None)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rddp, "ddp_step", spy)
        whole = train(tmp / "whole", 3, fresh)
        whole_buckets = used[:]
        train(tmp / "saved", 2, fresh)
        _, states = rsc.load_sharded(tmp / "saved", 3, REFERENCE_RUN.seed)
        used.clear()
        resumed = train(tmp / "saved", 3, commit_policy.start(
            tmp / "saved", ddp_train.PAYLOAD, resume=True, overwrite=False,
            notify=lambda _: None))
    return _Runs(whole, resumed, whole_buckets, used[:], states[0])


def test_the_reference_loop_reduces_step_1_in_parameter_order_and_every_later_step_rebuilt(
        reference_runs: _Runs) -> None:
    """Step 1 in one parameter-order bucket, steps 2 and 3 in the ready order, and the first
    step after a resume in the ready order too, as a resumed torch rank's rebuilt buckets
    are (NOTE [ DDP's buckets after a resume ])."""
    n = 2 * (len(REFERENCE_RUN.sizes) - 1)  # (W, b) per layer
    in_order, ready = [list(range(n))], [rddp.ready_order(n, REFERENCE_RUN.precision)]
    assert in_order != ready, "guard: the two layouts differ"
    assert reference_runs.whole_buckets == [in_order, ready, ready]
    assert reference_runs.resumed_buckets == [ready], "the first step after a resume"


def test_the_reference_loop_resumed_on_3_ranks_ends_with_the_uninterrupted_digest(
        reference_runs: _Runs) -> None:
    """ddp.cli_kill_resume's resume, the reference tree, 3 ranks, in this process: every
    entry the step-2 checkpoint holds (a growth tracker of 2 among them) is restored."""
    runs = reference_runs
    assert int(runs.saved["scaler/growth_tracker"]) == 2, "guard: a growth tracker to restore"
    assert runs.whole.skipped == runs.resumed.skipped == 0, "guard: step 3 is not skipped"
    assert_claim("ddp.cli_kill_resume",
                 actual=np.frombuffer(bytes.fromhex(runs.resumed.digest), np.uint8),
                 expected=np.frombuffer(bytes.fromhex(runs.whole.digest), np.uint8),
                 context="from step 2")


def test_bad_input_is_refused_with_one_line() -> None:
    with pytest.raises(ValueError, match="one array per rank"):
        rddp.ring_allreduce([np.zeros(3, np.float32), np.zeros(3, np.float64)])
    with pytest.raises(ValueError, match="equal shards"):
        rddp.shard(np.zeros((10, 2)), 0, 3)
    with pytest.raises(ValueError, match="world_size >= 1"):
        rddp.ring_chunks(4, 4, 0)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_ring_mirror_matches_gloo_all_reduce_over_sizes_and_dtypes(world_size: int) -> None:
    """dist.all_reduce on world_size gloo processes, every dtype and size: the mirror's bits
    on every rank; at 3,000,017 float32 elements the 1 MiB segment cap is what sets them."""
    cases = tuple((d, n) for d in drv.RING_DTYPES for n in drv.RING_SIZES)
    jobs = drv.ring_jobs(cases, (world_size,))
    results = drv.launch(jobs, world_size, timeout=300.0)
    for i, job in enumerate(jobs):
        inputs, outputs, mirror = drv.ring_case(job, results, i)
        for r in range(world_size):
            assert_claim("ddp.ring_order", actual=outputs[r], expected=mirror[r],
                         context=f"ws {world_size} {job['dtype']} n={job['n']} rank {r}")
        if job["n"] == 3_000_017 and job["dtype"] == "float32" and world_size in (3, 5):
            uncapped = rddp.ring_allreduce(inputs, max_segment_bytes=2**40)[0]
            assert not np.array_equal(bit_view(uncapped), bit_view(outputs[0]))
