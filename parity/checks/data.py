"""Quick checks of the data claims for `python -m parity report` (see parity/test_data.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from parity.compare import measure
from parity.report import Observation, check
from parity.tolerances import claim
from reference import data as ref
from torch_impl import data as tdata

SEEDS = (0, 1, 2**32 - 1)


def _ref_batches(sampler: ref.ResumableSampler, task: ref.Task, batch_size: int,
                 drop_last: bool, epochs: int, stop_after: int | None = None) -> list[tuple]:
    loader, out = ref.make_loader(task, sampler, batch_size, drop_last=drop_last), []
    while sampler.epoch < epochs and len(out) != stop_after:
        for batch in loader:
            out.append(batch)
            if len(out) == stop_after:
                break
    return out


def _torch_batches(sampler: tdata.ResumableSampler, task: tdata.Task, batch_size: int,
                   drop_last: bool, epochs: int, stop_after: int | None = None) -> list[tuple]:
    loader = tdata.make_loader(task, sampler, batch_size, drop_last=drop_last,
                               generator=torch.Generator().manual_seed(0))
    out: list[tuple] = []
    while sampler.epoch < epochs and len(out) != stop_after:
        for batch in loader:
            out.append(tuple(t.numpy() for t in batch))
            if len(out) == stop_after:
                break
    return out


def _flat(batches: list[tuple]) -> np.ndarray:
    """Sizes, inputs, labels and values of a stream as one byte string (uint8 array)."""
    parts = [np.array([len(b[1]) for b in batches], dtype=np.int64)]
    parts += [np.concatenate([b[i] for b in batches]).ravel() for i in range(3)]
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in parts])


def _compare(claim_id: str, actual: np.ndarray, expected: np.ndarray) -> float:
    if actual.shape != expected.shape:
        return float(max(actual.size, expected.size))  # a different length: all mismatched
    return measure(claim(claim_id), actual, expected)


@check("data.task")
def _() -> Observation:
    worst, n = 0.0, 0
    for seed in SEEDS:
        for np_dtype, torch_dtype in ((np.float32, torch.float32), (np.float64, torch.float64)):
            a = ref.make_task(seed, 1024, dtype=np_dtype)
            b = tdata.make_task(seed, 1024, dtype=torch_dtype)
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


def _resume_cases() -> list[tuple[int, int, bool, int]]:
    """(batch_size, interrupt, drop_last, n): mid-epoch, boundary, and around the tail."""
    return [(7, k, drop, 100) for drop in (False, True) for k in (0, 1, 7, 14, 15, 29, 30)]


def _resume_observation(claim_id: str, side: Any, batches: Any, note: str) -> Observation:
    """Interrupted + resumed stream vs uninterrupted, on one side (reference or torch)."""
    worst, n = 0.0, 0
    task = side.make_task(5, 100)
    for batch_size, interrupt, drop_last, num in _resume_cases():
        whole = batches(side.ResumableSampler(num, 5), task, batch_size, drop_last, 3)
        s1 = side.ResumableSampler(num, 5)
        head = batches(s1, task, batch_size, drop_last, 3, stop_after=interrupt)
        s2 = side.ResumableSampler(num, 5)
        s2.load_state_dict(s1.state_dict())
        tail = batches(s2, task, batch_size, drop_last, 3)
        worst = max(worst, _compare(claim_id, _flat(head + tail), _flat(whole)))
        n += 1
    return Observation(worst, n, note)


@check("data.resume_reference")
def _() -> Observation:
    return _resume_observation("data.resume_reference", ref, _ref_batches,
                               "n=100, batch 7, 3 epochs, cuts 0..30 batches, drop_last both")


@check("data.resume_torch")
def _() -> Observation:
    return _resume_observation("data.resume_torch", tdata, _torch_batches,
                               "DataLoader, n=100, batch 7, 3 epochs, cuts 0..30 batches")


@check("data.loader")
def _() -> Observation:
    worst, n = 0.0, 0
    ref_task, torch_task = ref.make_task(9, 100), tdata.make_task(9, 100)
    for batch_size, interrupt, drop_last, num in _resume_cases():
        ref_whole = _ref_batches(ref.ResumableSampler(num, 9), ref_task, batch_size,
                                 drop_last, 3)
        torch_whole = _torch_batches(tdata.ResumableSampler(num, 9), torch_task, batch_size,
                                     drop_last, 3)
        worst = max(worst, _compare("data.loader", _flat(torch_whole), _flat(ref_whole)))
        s1 = ref.ResumableSampler(num, 9)  # saved by the reference, resumed in torch
        head = _ref_batches(s1, ref_task, batch_size, drop_last, 3, stop_after=interrupt)
        s2 = tdata.ResumableSampler(num, 9)
        s2.load_state_dict(s1.state_dict())
        tail = _torch_batches(s2, torch_task, batch_size, drop_last, 3)
        worst = max(worst, _compare("data.loader", _flat(head + tail), _flat(ref_whole)))
        n += 2
    return Observation(worst, n, "streams and reference->torch resumes, 14 cuts")
