"""Loss scaling across ranks at the edges of its declared ranges (common/arg_ranges.py:
SCALER_REPAIRS, SCALER_CHECKS, WORLD_SIZES): each repair, the torch tree's "sharded"
(ShardedGradScaler's SUM) included, is taken by both trees' checks (the reference's
scaler_step, which runs it; torch's scaler_job, which describes the launch), and an unknown
one is refused with the same line by the reference's scaler_step and by torch's scaler_step
and scaler_job (torch's scaler_step took it as "none"). Run in the reference, a repaired
loop keeps every rank's parameters the same bits and an unrepaired one parts them (claims
ddp.scaler_repair, ddp.scaler_divergence; parity/test_ddp_scaler.py holds each repair of
the torch ranks to the reference's). torch's job refuses a world size outside WORLD_SIZES
(0 divided by zero) and an unknown check."""

from __future__ import annotations

import numpy as np
import pytest

from common.arg_ranges import SCALER_CHECKS, SCALER_REPAIRS, WORLD_SIZES
from parity.compare import assert_claim
from parity.drivers import ddp_scaler as drv
from parity.drivers.edges import judge, outcome
from parity.strategies.edges import edges
from reference import ddp_scaler as rds
from reference.train_models import build
from torch_impl import ddp_scaler as tds

STEPS = 3  # the fault at step 2, one step after it


def _reference_refusal(repair: object) -> str | None:
    """The reference's scaler_step on two simulated ranks: its error line, if it refuses
    before touching them (None when it does not refuse there)."""
    try:
        rds.scaler_step([None, None], None, [], [], None, None, step=1,  # type: ignore[list-item]
                        precision="fp16", repair=repair)  # type: ignore[arg-type]
    except ValueError as e:
        return f"ValueError: {e}"
    except (AttributeError, TypeError):  # past the checks: it went on to run the ranks
        return None
    return None


@pytest.mark.parametrize("label, repair, inside", edges(SCALER_REPAIRS))
def test_each_repair_is_taken_or_refused_alike_by_both_trees(label: str, repair: str,
                                                             inside: bool) -> None:
    """Each member is taken by the reference's scaler_step and torch's scaler_job; an
    unknown one is refused with one line by those and by torch's scaler_step."""
    ref = outcome(lambda: _reference_refusal(repair))
    job = outcome(lambda: tds.scaler_job(drv.config(), STEPS, 2, drv.fault(2), repair))
    assert (ref.value is None) == inside and (job.error is None) == inside, (ref, job)
    if inside:
        return
    step = outcome(lambda: tds.scaler_step(None, None, None, None, rank=0, world_size=2,  # type: ignore[arg-type]
                                           step=1, fault=None, repair=repair, group=None))
    refused = type(ref)(error=ref.value)
    judge("ddp.scaler_repair", refused, job, f"repair {label}: torch's scaler_job")
    judge("ddp.scaler_repair", refused, step, f"repair {label}: torch's scaler_step")


@pytest.mark.parametrize("repair", SCALER_REPAIRS)
def test_each_repair_in_the_reference_keeps_or_parts_the_ranks(
        repair: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's loop with the seeded fault, the repair passed as torch's job names
    it: every repair keeps rank 1's parameters rank 0's bits; none parts them."""
    monkeypatch.setitem(drv.REFERENCE_REPAIR, repair, repair)  # "sharded" itself, not "sum"
    job = tds.scaler_job(drv.config(), STEPS, 2, drv.fault(2), repair)
    c = drv.config()
    initial = [p.data.copy() for p in build(c, np.random.default_rng(c.seed)).model.parameters()]
    run = drv.reference_run(job, initial, None)
    assert run.divergence[0] is None
    if repair == "none":
        assert run.divergence[1] is not None and run.skipped[1] == [False, True]
        assert drv.spread(run.final) > 0
        return
    assert run.divergence == [None] * STEPS and run.skipped[1] == [True, True]
    for k, (a, b) in enumerate(zip(run.final[1], run.final[0], strict=True)):
        assert_claim("ddp.scaler_repair", actual=a, expected=b,
                     context=f"{repair}: rank 1 param {k} vs rank 0")


@pytest.mark.parametrize("label, ws, inside", edges(WORLD_SIZES))
def test_torchs_job_takes_a_world_size_in_its_declared_range(label: str, ws: int,
                                                              inside: bool) -> None:
    """World size 1 builds; 2^31 - 1 is in range but 12 rows do not split into it; 0 and
    2^31 are refused with one line (0 divided by zero before)."""
    job = outcome(lambda: tds.scaler_job(drv.config(), STEPS, ws, None, "max"))
    if ws == 1:
        assert job.error is None and job.value["world_size"] == 1
    elif inside:
        assert job.error == (f"ValueError: scaler_job: batch_size 12 does not split into {ws} "
                             "equal shards")
    else:
        assert job.error == (f"ValueError: scaler_job: world_size={ws} is outside "
                             f"[{WORLD_SIZES.start}, {WORLD_SIZES.stop})")


@pytest.mark.parametrize("label, check, inside", edges(SCALER_CHECKS))
def test_torchs_job_takes_each_declared_check(label: str, check: str, inside: bool) -> None:
    """record and raise build a job; an unknown check is refused with one line."""
    job = outcome(lambda: tds.scaler_job(drv.config(), STEPS, 2, None, "none", check))
    assert (job.error is None) == inside, job.error
    if not inside:
        assert job.error == (f"ValueError: scaler_job: check must be one of {SCALER_CHECKS}, "
                             f"got {check!r}")
