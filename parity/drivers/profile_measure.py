"""The measuring half of a profiled run (parity/drivers/profile.py writes the prediction
sheet first): the tree's loop timed phase by phase over the profiler's window, a one-row run
timed alike (what the roofline leaves out, NOTE [ Naming a gap ]), the bytes at every phase
boundary of one steady step (NOTE [ Phase boundaries ]), torch's op census, the three
honest-timing variants (NOTE [ Honest timing ]) and the second Linear's saved tensors.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from parity.drivers import profile_async as pasync
from parity.drivers.profile import ProfileCase, listed_layer
from reference import profile as rprof
from reference import profile_meters as rmeters


def per_index_seconds(indices: Any, fetch: Callable[[int], object] | None = None,
                      n: int = 256) -> float:
    """Seconds per sample of the loader's Python loop, probed apart from any step: `n`
    indices drawn from the tree's sampler (and each sample fetched on its own with `fetch`,
    as torch's default fetcher does), median of 5 rounds, over n."""
    import itertools

    times = []
    for _ in range(5):
        t0 = time.thread_time_ns()  # CPU time: what another process takes is not counted
        for i in itertools.islice(iter(indices), n):
            if fetch is not None:
                fetch(i)
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) * 1e-9 / n


def progress_total(case: ProfileCase) -> int:
    """How many times `measure` calls its progress callback: each step, and for torch each
    honest-timing variant's round (repeats + 1 rounds of 3)."""
    return case.steps + (3 * (case.repeats + 1) + pasync.progress_total(case)
                         if case.impl == "torch" else 0)


def summary(values: list[float]) -> dict[str, float]:
    """median and the quartiles (spread) of a few timings."""
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return {"median": v, "q1": v, "q3": v, "n": len(values)}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "n": len(values)}


def phase_summary(steps: list[dict[str, float]], which: range | list[int]) -> dict[str, dict]:
    chosen = [steps[i] for i in which if i < len(steps)]
    names = [k for k in (steps[0] if steps else {})]
    return {k: summary([s[k] for s in chosen]) for k in names} if chosen else {}


def _step_seconds(steps: list[Any]) -> list[dict[str, float]]:
    return [s.seconds() for s in steps]


def _off_cpu(steps: list[Any]) -> list[dict[str, float]]:
    return [s.off_cpu() for s in steps]


def _interleaved(case: ProfileCase, variants: dict[str, Callable[[], Any]],
                 progress: Callable[[], None]) -> dict[str, list[dict[str, float]]]:
    """Each variant's step run `repeats` + 1 times, round-robin (so a drift of the machine
    falls on all alike); the first round warms up and is dropped."""
    out: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(case.repeats + 1):
        for v, one in variants.items():
            seconds = one()
            if r:
                out[v].append(seconds)
            progress()
    return out


def measure_torch(case: ProfileCase, out: Path | None,
                  progress: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """The torch loop: `steps` steps under the profiler's schedule (the trace into out), each
    step after the window followed by a one-row step timed alike; then one steady step with
    BoundaryMemory, one with OpCensus at each size, the honest-timing variants, and the
    second Linear's saved tensors."""
    import contextlib
    import functools

    import torch

    from torch_impl import data as tdata
    from torch_impl import profile as tprof
    from torch_impl import profile_meters as tmeters

    device, on_cuda = case.device, case.device.startswith("cuda")
    sync = tprof.device_sync(device)
    window = case.wait + case.warmup + case.active

    def census(model: Any, data: Any, step: Any) -> dict[str, int]:
        counter = tmeters.OpCensus(model)
        try:
            with counter:
                tprof.drive_step(tprof.PhaseTimer(observers=[counter], annotate=False), data,
                                 step, device)
        finally:
            counter.remove()
        return counter.counts

    def timed(timer: Any, fault: bool) -> dict[str, float]:
        with tmeters.item_in_forward(run.model) if fault else contextlib.nullcontext() as calls:
            tprof.drive_step(timer, data, step, device)
        fault_calls.extend(calls or ())
        return timer.steps[-1].seconds()

    (run, data, step), (run1, data1, step1) = torch_parts(case), torch_parts(case, 1)
    listing = listing_parts(case)  # every model is built before anything is measured
    fault_calls: list[int] = []
    with torch.random.fork_rng(devices=[device] if on_cuda else []):
        torch.manual_seed(case.train_config().seed)  # dropout's default generator, restored
        timer, one = tprof.PhaseTimer(sync=sync), tprof.PhaseTimer(sync=sync)

        def one_step(i: int) -> None:
            tprof.drive_step(timer, data, step, device)
            if i >= window:  # no profiler: the one-row step, instrumented alike, interleaved
                tprof.drive_step(one, data1, step1, device)
            progress()

        measured_from = time.time_ns()
        tprof.profiled_steps(window, one_step, wait=case.wait, warmup=case.warmup,
                             active=case.active, cuda=on_cuda,
                             trace=None if out is None else str(out / "trace.json"))
        for i in range(window, case.steps):  # after the profiler: the run without it
            one_step(i)
        while len(one.steps) <= case.repeats:  # too few steps after the window: top up
            tprof.drive_step(one, data1, step1, device)
        meter = tmeters.BoundaryMemory(run.model, run.optimizer, device)
        with meter:
            tprof.drive_step(tprof.PhaseTimer(observers=[meter], sync=sync, annotate=False),
                             data, step, device, meter)
        ops = {"batch": census(run.model, data, step), "one row": census(run1.model, data1, step1)}
        variants = {v: functools.partial(timed, tprof.PhaseTimer(sync=s, annotate=False),
                                         v.endswith("forward"))
                    for v, s in (("synchronized", sync), ("unsynchronized", None),
                                 ("unsynchronized, .item() in forward", None))}
        honest = _interleaved(case, variants, progress)
        step_s = statistics.median(s["step"] for s in honest["synchronized"])
        worker = pasync.worker_timings(case, run, step, step_s, progress)
        saves = layer_saves(case, listing)
        task = data.loader.dataset
        per_index = per_index_seconds(tdata.ResumableSampler(len(task), 1), task.__getitem__)
    return {"per_index_s": per_index, "measured_from_ns": measured_from,
            "steps": _step_seconds(timer.steps), "off_cpu": _off_cpu(timer.steps),
            "one_row": _step_seconds(one.steps[1:]), "one_row_off_cpu": _off_cpu(one.steps[1:]),
            "memory": meter.boundaries,
            "cuda": meter.cuda or None, "census": ops, "honest": honest,
            "worker": worker,
            "fault_calls": len(fault_calls),
            "layer": saves,
            "trace": None if out is None else "trace.json"}


def measure_reference(case: ProfileCase, out: Path | None,
                      progress: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """The reference loop: the same steps by perf_counter (no profiler, no device: no trace,
    no census, no honest-timing variants), each step after the window followed by a one-row
    step, one steady step with BoundaryMemory (its tapes), and the second Linear's tape."""
    import numpy as np

    from reference import data as rdata

    (run, data, step), (_, data1, step1) = reference_parts(case), reference_parts(case, 1)
    listing = listing_parts(case)  # every model is built before anything is measured
    window = case.wait + case.warmup + case.active
    # fp16 overflows on purpose now and then (reference.train.Run.train_step does the same)
    with np.errstate(over="ignore", invalid="ignore"):
        timer, one = rprof.PhaseTimer(), rprof.PhaseTimer()
        measured_from = time.time_ns()
        for i in range(case.steps):
            rprof.drive_step(timer, data, step)
            if i >= window:
                rprof.drive_step(one, data1, step1)
            progress()
        while len(one.steps) <= case.repeats:  # too few steps after the window: top up
            rprof.drive_step(one, data1, step1)
        meter = rmeters.BoundaryMemory(run.model, run.loss_fn, run.optimizer)
        rprof.drive_step(rprof.PhaseTimer(observers=[meter]), data, step, meter)
        saves = layer_saves(case, listing)
        per_index = per_index_seconds(rdata.ResumableSampler(case.train_config().num_samples, 1))
    return {"per_index_s": per_index, "measured_from_ns": measured_from,
            "steps": _step_seconds(timer.steps), "off_cpu": _off_cpu(timer.steps),
            "one_row": _step_seconds(one.steps[1:]), "one_row_off_cpu": _off_cpu(one.steps[1:]),
            "memory": meter.boundaries, "tape": meter.tape or None,
            "cuda": None, "census": None, "honest": None, "fault_calls": 0,
            "layer": saves, "trace": None}


def reference_parts(case: ProfileCase, batch: int | None = None) -> tuple[Any, Any, Any]:
    """(run, next_batch, step) of the reference tree: a Run of the case's TrainConfig (with
    `batch` rows if given) and its train_step with the run's arguments bound."""
    import functools

    from reference import train as rtrain

    c = case.train_config(batch)
    run = rtrain.Run(c)
    step = functools.partial(rtrain.train_step, run.model, run.loss_fn, run.optimizer,
                             run.scaler, precision=c.precision, max_grad_norm=c.max_grad_norm,
                             schedule=run.schedule)
    return run, run.next_batch, step


def torch_parts(case: ProfileCase, batch: int | None = None) -> tuple[Any, Any, Any]:
    """(run, next_batch, step) of the torch tree: a Run on the case's device, its batches on
    the host (HostBatches: the copy is a phase of its own), train_step bound."""
    import functools

    from torch_impl import profile as tprof
    from torch_impl import train as ttrain

    c = case.train_config(batch)
    run = ttrain.Run(c, case.device)
    step = functools.partial(ttrain.train_step, run.model, run.loss_fn, run.optimizer,
                             run.scaler, precision=c.precision, max_grad_norm=c.max_grad_norm,
                             schedule=run.schedule)
    return run, tprof.HostBatches(c), step


def _listed(module: str, layer: int | str) -> bool:
    return module == str(layer) or module.startswith(f"{layer}.")


def listing_parts(case: ProfileCase) -> tuple[Any, Any, Any]:
    """The tree's parts of `case` without recomputation (a GPT carries its schedule: it is
    built without one), for layer_saves."""
    import dataclasses

    plain = dataclasses.replace(case, recompute="none")
    return reference_parts(plain) if case.impl == "reference" else torch_parts(plain)


def layer_saves(case: ProfileCase, parts: tuple[Any, Any, Any] | None = None
                ) -> list[dict[str, Any]]:
    """What the listed layer (listed_layer) saves on one forward of the first batch of
    `parts` (default: a fresh listing_parts(case)) under the case's autocast: module, name,
    shape, dtype, bytes (torch: whether a parameter's view)."""
    run, data, _ = parts or listing_parts(case)
    layer = listed_layer(case)
    if case.impl == "reference":
        from reference import amp as ramp

        with ramp.autocast(ramp.autocast_dtype(case.precision)):
            run.model.forward(data()[0])
        saves = [s for s in run.model.tape() if _listed(s.module, layer)]
        run.model.free_saved()
        return [asdict(s) for s in saves]
    import torch

    from torch_impl import amp
    from torch_impl import profile_meters as tmeters

    device = torch.device(case.device)
    with amp.autocast(amp.autocast_dtype(case.precision), device.type):
        saves = tmeters.saved_by_module(run.model, data()[0].to(device))
    return [s for s in saves if _listed(s["module"], layer)]


def measure(case: ProfileCase, out: Path | None,
            progress: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """The tree's loop (NOTE [ Phase boundaries ]); call it after write_predictions."""
    run = measure_torch if case.impl == "torch" else measure_reference
    return run(case, out, progress)




WARM_TRIES = 64  # a skipped step halves S: 2^16 comes down to any gradient's range by then


def boundary_bytes(case: ProfileCase) -> list[tuple[str, dict[str, int]]]:
    """Bytes by category at every boundary of one steady step (after the first step that was
    not skipped: it creates the optimizer's state; the gradients exist from the first),
    nothing timed: what the claims check."""
    return _metered_step(case, warm=True).boundaries


def reference_tape_bytes(case: ProfileCase) -> list[tuple[str, int]]:
    """The reference transformer's own tape count (GPT.held_bytes) at every boundary of the
    steady step boundary_bytes meters."""
    if case.impl != "reference" or case.model != "gpt":
        raise ValueError("reference_tape_bytes: the reference transformer keeps the count")
    return _metered_step(case, warm=True).tape


def timed_steps(case: ProfileCase, n: int) -> list[Any]:
    """`n` steps of the tree's loop through its PhaseTimer (reference.profile.Step or
    torch_impl.profile.Step: each phase's (start, end) on the one clock), nothing else."""
    return _metered_step(case, warm=False, n=n)


def _metered_step(case: ProfileCase, *, warm: bool, n: int = 1) -> Any:
    """warm: steps until one is applied (fp16 skips the first until S comes down), then one
    step metered by BoundaryMemory: the meter. Otherwise `n` plain timed steps."""
    if case.impl == "reference":
        import numpy as np

        run, data, step = reference_parts(case)
        timer = rprof.PhaseTimer()
        with np.errstate(over="ignore", invalid="ignore"):
            if not warm:
                for _ in range(n):
                    rprof.drive_step(timer, data, step)
                return timer.steps
            for _ in range(WARM_TRIES):
                if not rprof.drive_step(rprof.PhaseTimer(), data, step).skipped:
                    break
            meter = rmeters.BoundaryMemory(run.model, run.loss_fn, run.optimizer)
            rprof.drive_step(rprof.PhaseTimer(observers=[meter]), data, step, meter)
        return meter
    import torch

    from torch_impl import profile as tprof
    from torch_impl import profile_meters as tmeters

    run, data, step = torch_parts(case)
    sync = tprof.device_sync(case.device)
    if not warm:
        timer = tprof.PhaseTimer(sync=sync)
        for _ in range(n):
            tprof.drive_step(timer, data, step, case.device)
        return timer.steps
    with torch.random.fork_rng(devices=[case.device] if case.device != "cpu" else []):
        torch.manual_seed(case.train_config().seed)
        for _ in range(WARM_TRIES):
            if not tprof.drive_step(tprof.PhaseTimer(sync=sync, annotate=False), data, step,
                                    case.device).skipped:
                break
        meter = tmeters.BoundaryMemory(run.model, run.optimizer, case.device)
        with meter:
            tprof.drive_step(tprof.PhaseTimer(observers=[meter], sync=sync, annotate=False),
                             data, step, case.device, meter)
    return meter


def interval_faults(step: Any, phases: tuple[str, ...]) -> list[str]:
    """What is wrong with one timed step's intervals (empty: nothing): every phase in
    `phases` present, each (start <= end), in that order without overlap, all inside the
    step's own (start, end)."""
    faults = [f"{p} missing" for p in phases if p not in step.phases]
    faults += [f"{p} extra" for p in step.phases if p not in phases]
    cursor = step.start
    for p in phases:
        if p not in step.phases:
            continue
        s, e = step.phases[p]
        if s < cursor:
            faults.append(f"{p} starts before the previous phase ended (or the step began)")
        if e < s:
            faults.append(f"{p} ends before it starts")
        cursor = max(cursor, e)
    if cursor > step.end:
        faults.append("a phase ends after the step")
    return faults
