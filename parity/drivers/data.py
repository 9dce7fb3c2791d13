"""Driving the data pipeline of either tree the same way: one loop for both loaders, the
interrupted-and-resumed run, the lengths a pipeline announces against what it yields, and
the comparison of batch streams. Tests and the report's checks import these.

A run is `parity.strategies.data_sampler_runs`' dictionary: seed, num_samples, batch_size,
drop_last, epochs, interrupt (batches before the state is saved). A side is "reference" or
"torch"; the torch side builds its task on a device and its batches come back as NumPy.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from parity.compare import as_numpy, assert_claim, measure
from parity.tolerances import claim
from reference import data as ref
from torch_impl import data as tdata

SIDES = ("reference", "torch")
STREAM_COLUMNS = ("batch sizes", "inputs", "labels", "values")


@dataclass(frozen=True)
class Pipeline:
    """One side's sampler and the loader reading through it."""

    side: str
    sampler: Any  # reference.data.ResumableSampler | torch_impl.data.ResumableSampler
    loader: Any  # reference.data.Loader | torch.utils.data.DataLoader


def make_task(side: str, seed: int, num_samples: int, device: str = "cpu",
              double: bool = False) -> Any:
    """make_task of one side (float32, or float64 with `double`); torch's on `device`."""
    if side == "reference":
        return ref.make_task(seed, num_samples, dtype=np.float64 if double else np.float32)
    return tdata.make_task(seed, num_samples, device=device,
                           dtype=torch.float64 if double else torch.float32)


def pipeline(side: str, task: Any, run: dict) -> Pipeline:
    """A fresh sampler at (epoch 0, position 0) and make_loader over it, as `run` says."""
    module = ref if side == "reference" else tdata
    sampler = module.ResumableSampler(run["num_samples"], run["seed"])
    if side == "reference":
        loader = ref.make_loader(task, sampler, run["batch_size"], drop_last=run["drop_last"])
    else:
        loader = tdata.make_loader(task, sampler, run["batch_size"], drop_last=run["drop_last"],
                                   generator=torch.Generator().manual_seed(0))
    return Pipeline(side, sampler, loader)


def worker_pipeline(task: Any, run: dict, workers: int) -> Pipeline:
    """The torch side with its batches fetched by `workers` processes (WorkerLoader); the
    caller ends them with `.loader.close()`."""
    from torch_impl.data_workers import WorkerLoader

    sampler = tdata.ResumableSampler(run["num_samples"], run["seed"])
    loader = WorkerLoader(task, sampler, run["batch_size"], drop_last=run["drop_last"],
                          generator=torch.Generator().manual_seed(0), num_workers=workers,
                          timeout_s=60.0)
    return Pipeline("torch", sampler, loader)


def stream(p: Pipeline, epochs: int, stop_after: int | None = None) -> list[tuple]:
    """Batches (NumPy arrays) until the sampler reaches epoch `epochs`, or `stop_after`
    batches, calling iter(loader) again at every epoch end as a training loop does."""
    out: list[tuple] = []
    while p.sampler.epoch < epochs and len(out) != stop_after:
        for batch in p.loader:
            out.append(tuple(as_numpy(t) for t in batch))
            if len(out) == stop_after:
                break
    return out


def resumed(run: dict, tasks: dict[str, Any], saved_by: str, resumed_by: str
            ) -> tuple[list[tuple], list[tuple]]:
    """(head, tail): `interrupt` batches from `saved_by`, its sampler state through JSON
    (plain ints survive it) into a fresh `resumed_by` pipeline, and the rest from there."""
    first = pipeline(saved_by, tasks[saved_by], run)
    head = stream(first, run["epochs"], stop_after=run["interrupt"])
    state = json.loads(json.dumps(first.sampler.state_dict()))
    second = pipeline(resumed_by, tasks[resumed_by], run)
    second.sampler.load_state_dict(state)
    return head, stream(second, run["epochs"])


def flat(batches: list[tuple]) -> tuple[np.ndarray, ...]:
    """(batch sizes, inputs, labels, values) of a stream, each concatenated."""
    sizes = np.array([len(b[1]) for b in batches], dtype=np.int64)
    if not batches:
        return (sizes,)
    return (sizes, *(np.concatenate([b[i] for b in batches]) for i in range(3)))


def assert_streams(claim_id: str, actual: list[tuple], expected: list[tuple]) -> None:
    """The claim holds for two streams: the same number of batches, then every column."""
    assert len(actual) == len(expected), (
        f"claim {claim_id} broken: {len(actual)} batches vs {len(expected)} expected")
    columns = flat(actual), flat(expected)
    for name, a, b in zip(STREAM_COLUMNS[:len(columns[1])], *columns, strict=True):
        assert_claim(claim_id, actual=a, expected=b, context=name)


def stream_mismatches(claim_id: str, actual: list[tuple], expected: list[tuple]) -> float:
    """The report's measure of two streams: mismatching elements over every column (all of
    a column's elements when the lengths differ)."""
    columns = flat(actual), flat(expected)
    if len(actual) != len(expected):
        return float(max(sum(a.size for a in col) for col in columns))
    return sum((measure(claim(claim_id), a, b) if a.shape == b.shape else max(a.size, b.size))
               for a, b in zip(*columns, strict=True))


# -- lengths: what a pipeline announces, and what it then yields
def consume(p: Pipeline, consumed: int, via: str) -> None:
    """Move the sampler past `consumed` indices of epoch 0 (0 <= consumed <= n): by drawing
    them ("iterate"), or by loading the state that says so ("load_state_dict")."""
    if via == "iterate":
        for _ in itertools.islice(iter(p.sampler), consumed):
            pass
        return
    n = p.sampler.num_samples
    epoch, position = divmod(consumed, n)  # consumed == n: the next epoch, position 0
    p.sampler.load_state_dict({"seed": p.sampler.seed, "num_samples": n, "epoch": epoch,
                               "position": position})


def lengths(side: str, task: Any, run: dict, consumed: int, via: str) -> np.ndarray:
    """[len(sampler), indices iter(sampler) then yields, len(loader), batches iter(loader)
    then yields], each pipeline positioned after `consumed` samples."""
    p = pipeline(side, task, run)
    consume(p, consumed, via)
    announced_indices, indices = len(p.sampler), len(list(iter(p.sampler)))
    q = pipeline(side, task, run)
    consume(q, consumed, via)
    announced_batches, batches = len(q.loader), len(list(iter(q.loader)))
    return np.array([announced_indices, indices, announced_batches, batches], dtype=np.int64)
