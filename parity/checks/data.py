"""Quick checks of the data claims for `python -m parity report` (see parity/test_data.py):
fixed seeds and cuts through the one driver, parity/drivers/data.py."""

from __future__ import annotations

from parity.compare import measure
from parity.drivers.data import (
    SIDES,
    lengths,
    make_task,
    pipeline,
    resumed,
    stream,
    stream_mismatches,
)
from parity.report import Observation, check
from parity.tolerances import claim
from reference import data as ref
from torch_impl import data as tdata

SEEDS = (0, 1, 2**32 - 1)


def _runs(seed: int) -> list[dict]:
    """n = 100, batch 7, 3 epochs; cuts mid-epoch, at the boundary and around the tail."""
    return [{"seed": seed, "num_samples": 100, "batch_size": 7, "drop_last": drop, "epochs": 3,
             "interrupt": k} for drop in (False, True) for k in (0, 1, 7, 14, 15, 29, 30)]


@check("data.task")
def _() -> Observation:
    worst, n = 0.0, 0
    for seed in SEEDS:
        for double in (False, True):
            a, b = make_task("reference", seed, 1024, double=double), \
                make_task("torch", seed, 1024, double=double)
            for x, y in ((b.inputs, a.inputs), (b.labels, a.labels), (b.values, a.values)):
                worst = max(worst, measure(claim("data.task"), x, y))
                n += y.size
    return Observation(worst, n, "3 seeds x {float32, float64}, 1024 samples")


@check("data.order")
def _() -> Observation:
    worst, n = 0.0, 0
    for seed in SEEDS:
        for epoch in (0, 1, 2**32 - 1):
            a = ref.epoch_order(seed, epoch, 4096)
            b = tdata.epoch_order(seed, epoch, 4096)
            worst = max(worst, measure(claim("data.order"), b, a))
            n += a.size
    return Observation(worst, n, "3 seeds x epochs {0, 1, 2^32-1}, n = 4096")


def _resume_observation(side: str) -> Observation:
    """Interrupted + resumed stream vs uninterrupted, within one side."""
    cid, worst, n = f"data.resume_{side}", 0.0, 0
    tasks = {side: make_task(side, 5, 100)}
    for run in _runs(5):
        whole = stream(pipeline(side, tasks[side], run), run["epochs"])
        head, tail = resumed(run, tasks, side, side)
        worst, n = max(worst, stream_mismatches(cid, head + tail, whole)), n + 1
    return Observation(worst, n, "n=100, batch 7, 3 epochs, cuts 0..30 batches, drop_last both")


check("data.resume_reference")(lambda: _resume_observation("reference"))
check("data.resume_torch")(lambda: _resume_observation("torch"))


@check("data.loader")
def _() -> Observation:
    worst, n = 0.0, 0
    tasks = {side: make_task(side, 9, 100) for side in SIDES}
    for run in _runs(9):
        ref_whole = stream(pipeline("reference", tasks["reference"], run), run["epochs"])
        torch_whole = stream(pipeline("torch", tasks["torch"], run), run["epochs"])
        worst = max(worst, stream_mismatches("data.loader", torch_whole, ref_whole))
        for saved_by, resumed_by in (("reference", "torch"), ("torch", "reference")):
            head, tail = resumed(run, tasks, saved_by, resumed_by)
            worst = max(worst, stream_mismatches("data.loader", head + tail, ref_whole))
        n += 3
    return Observation(worst, n, "streams and resumes across implementations, 14 cuts")


@check("data.length")
def _() -> Observation:
    c, bad, n = claim("data.length"), 0.0, 0
    for num in (1, 7, 100):
        tasks = {side: make_task(side, 3, num) for side in SIDES}
        for batch_size in (1, 3, 7, 128):
            for drop_last in (False, True):
                run = {"seed": 3, "num_samples": num, "batch_size": batch_size,
                       "drop_last": drop_last}
                for consumed in sorted({0, 1, num // 2, num - 1, num}):
                    for via in ("iterate", "load_state_dict"):
                        a = lengths("reference", tasks["reference"], run, consumed, via)
                        b = lengths("torch", tasks["torch"], run, consumed, via)
                        announced, yielded = b[[0, 2]], a[[1, 3]]
                        bad += measure(c, b, a) + measure(c, announced, yielded) \
                            + measure(c, a[[0, 2]], yielded)
                        n += a.size
    return Observation(bad, n, "n in {1, 7, 100}, batch {1, 3, 7, 128}, drop_last both, "
                              "consumed 0, 1, n/2, n-1, n")
