"""The cross-rank check (common/rank_check.py) and the reference's found_inf all-reduce
(reference/ddp_scaler.py) against what they state, without torch: the verdict names the
step and the rank that parted, the digest sees one bit, the all-reduce gives every rank
the same flag, and bad input is refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from common import rank_check
from reference import ddp_scaler as rds
from reference import loss_scaling as rls
from reference import optim as ropt
from reference.nn import Parameter


def _state(found_inf: float, scale: float, digest: str) -> rank_check.RankState:
    return rank_check.RankState(found_inf, scale, digest)


def test_digest_sees_one_bit_of_a_parameter_and_the_scale() -> None:
    p = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    q = p.copy()
    q.view(np.uint32)[1, 2] ^= 1  # one last-place bit
    base = rank_check.digest(2.0**16, [p])
    assert rank_check.digest(2.0**16, [p.copy()]) == base
    assert rank_check.digest(2.0**16, [q]) != base
    assert rank_check.digest(2.0**15, [p]) != base
    assert rank_check.digest(2.0**16, [p.astype(np.float64)]) != base  # dtype is in it


def test_the_check_names_the_step_and_the_rank_that_skipped_alone() -> None:
    agree = [_state(0.0, 2.0**16, "a")] * 3
    assert rank_check.divergence(1, agree) is None
    rank_check.check(1, agree)
    parted = [_state(0.0, 2.0**17, "a"), _state(0.0, 2.0**17, "a"), _state(1.0, 2.0**15, "b")]
    assert rank_check.divergence(2, parted) == (
        "ranks diverge at step 2: rank 2 found inf/NaN alone and skipped its step (found_inf "
        "per rank [0.0, 0.0, 1.0], scale per rank [131072.0, 131072.0, 32768.0])")
    with pytest.raises(rank_check.RankDivergence, match="at step 2: rank 2 found"):
        rank_check.check(2, parted)


def test_the_check_names_the_fewer_side_and_on_a_tie_the_ranks_that_skipped() -> None:
    two = [_state(1.0, 2.0**15, "b"), _state(0.0, 2.0**17, "a")]
    assert "rank 0 found inf/NaN alone" in rank_check.divergence(2, two)
    one_stepped = [_state(1.0, 1.0, "b"), _state(0.0, 2.0, "a"), _state(1.0, 1.0, "b")]
    assert "rank 1 found no inf/NaN and stepped" in rank_check.divergence(3, one_stepped)
    later = [_state(0.0, 4.0, "a"), _state(0.0, 1.0, "b"), _state(0.0, 4.0, "a")]
    assert "step 4: rank 1 holds other parameters" in rank_check.divergence(4, later)
    tie = [_state(0.0, 4.0, "a"), _state(0.0, 1.0, "b")]
    assert "rank 1 holds other" in rank_check.divergence(5, tie)


def test_bad_input_to_the_check_and_the_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="need one RankState per rank"):
        rank_check.divergence(1, [])
    for bad in ((2, 1), (0, 0), (-1, 1), [0, 1], (0, 1.5), (0,), (0, True)):
        with pytest.raises(ValueError, match=r"fault must be None or \(rank, step\)"):
            rank_check.check_fault(bad, 2)  # type: ignore[arg-type]
    rank_check.check_fault(None, 2)
    rank_check.check_fault((1, 3), 2)
    with pytest.raises(ValueError, match="repair must be one of"):
        rds.check_repair("psum")


def _ranks(found: list[bool]) -> tuple[list[rls.GradScaler], list[ropt.SGD]]:
    """One scaler and optimizer per rank, unscaled: rank r's gradient inf iff found[r]."""
    scalers, optimizers = [], []
    for inf in found:
        p = Parameter(np.ones(3, dtype=np.float32))
        p.grad = np.array([1.0, np.inf if inf else 2.0, 3.0], dtype=np.float32)
        opt = ropt.SGD([p], lr=0.1)
        scaler = rls.GradScaler()
        scaler.scale(np.float32(1.0))
        scaler.unscale_(opt)
        scalers.append(scaler)
        optimizers.append(opt)
    return scalers, optimizers


@pytest.mark.parametrize("op, expected", [("max", 1.0), ("sum", 2.0)])
def test_the_found_inf_all_reduce_gives_every_rank_the_same_flag(op: str, expected: float
                                                                 ) -> None:
    """MAX: 1 on every rank; SUM: the count of ranks that found one; then every rank skips."""
    scalers, optimizers = _ranks([False, True, False, True])
    rds.sync_found_inf(scalers, optimizers, op)
    for scaler, opt in zip(scalers, optimizers, strict=True):
        assert float(scaler._found_inf_per_device(opt)["cpu"]) == expected
        scaler.step(opt)
        assert rls.step_skipped(scaler, opt)
        scaler.update()
        assert scaler.get_scale() == 2.0**15
    with pytest.raises(ValueError, match="op must be 'max' or 'sum'"):
        rds.sync_found_inf(*_ranks([False]), "min")


def test_without_the_all_reduce_only_the_rank_that_found_inf_skips() -> None:
    scalers, optimizers = _ranks([False, True])
    for scaler, opt in zip(scalers, optimizers, strict=True):
        scaler.step(opt)
        scaler.update()
    assert [s.get_scale() for s in scalers] == [2.0**16, 2.0**15]
