"""Every gap between the prediction sheet and a profile's measurement, beside its term.

# NOTE [ Naming a gap ]
Time. The roofline (NOTE [ Predicting a phase ]) counts arithmetic and data movement only.
What it leaves out is sized from measurements taken after the sheet was written:
    Python overhead per op     the phase's batch-independent cost: the same phase's CPU time
                               with ONE row (the same model, the same ops), less that row's
                               roofline; torch's op census says over how many aten ops it
                               spreads (the interpreter, module calls, autograd's graph,
                               the dispatcher, a kernel launch on CUDA)
    Adam's per-tensor step     the optimizer's share of it: torch.optim's for-loop runs a
                               handful of ops per parameter TENSOR, whatever its size
    recomputation              the backward's ops that re-run a checkpointed forward (the
                               census's module forwards during backward), its share of it
    the loader's per-sample    the data wait's cost that grows with the batch: the sampler
      loop                     yields indices one by one (and torch's default fetcher reads
                               each sample on its own, then collates): (B - 1) x the cost per
                               index of that loop, probed apart from the step (the aten ops
                               that fetch adds are its own: the data wait's overhead term
                               counts only the one-row cost, or they would count twice)
    the profiler's cost per op  CPU time of the active steps (recorded) less that of the
                               steps after the window, run without the profiler (its
                               callbacks cost every op while it is on)
    waiting for a core         wall time less the thread's CPU time (time.thread_time_ns),
                               median over the active steps: the thread was not running
                               (another process held the core, or the thread blocked)
    a sync                     on CUDA, the boundary synchronize with an empty queue, twice
A phase measured within GAP x its prediction needs no term ("as predicted"). Otherwise the
gap is explained when prediction + terms lies within SLACK of the median, or within the
active steps' interquartile spread if that is wider: timings of a shared machine move that
much between runs, and a term sized from another run cannot be closer. Anything else is
printed as UNEXPLAINED, with the share the named terms cover.
Memory is exact (integers): a gap is named only when it equals its term to the byte.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parity.drivers import profile as drv
from parity.drivers import profile_async as pasync
from parity.drivers import profile_measure as meas
from reference import profile as rprof

GAP = 1.25  # measured / predicted below this: as predicted
SLACK = 0.25  # |measured - (predicted + terms)| <= SLACK x measured: explained
UNEXPLAINED = "UNEXPLAINED"
NOT_COMPARED = "not compared"
OUTSIDE = "outside the phases"


def _ops(census: dict[str, int], phase: str) -> int:
    return census.get(phase, 0) + (census.get("recompute", 0) if phase == "backward" else 0)


def _overhead_terms(case: drv.ProfileCase, phase: str, fixed: float,
                    census: dict[str, dict[str, int]] | None, op_s: float
                    ) -> list[dict[str, Any]]:
    """The phase's per-op cost under its name(s): the one-row phase's cost, plus the ops that
    grow with the batch (the census at both sizes) at the op probe's cost, split by the
    census into recomputation and the rest where it can be."""
    n_tensors = case.n_param_tensors
    if census is None:  # the reference: no census
        ops = more = again = 0
    else:
        ops, more = _ops(census["batch"], phase), _ops(census["batch"], phase) - _ops(
            census["one row"], phase)
        again = census["batch"].get("recompute", 0) if phase == "backward" else 0
    if phase == "data wait":  # the ops that grow with the batch are the per-sample loop's
        more = 0  # own (each sample's fetch): sized by that term, not counted twice
    size = fixed + max(0, more) * op_s
    detail = "the same phase with one row" + (
        f"; {ops} aten ops, {more} more than with one row (at the op probe's "
        f"{op_s * 1e6:.2f} us each)" if ops else "")
    if phase == "optimizer":
        name = "Adam's per-tensor step" if case.optimizer in ("Adam", "AdamW") else \
            "the optimizer's per-tensor loop"
        per = f", {ops / n_tensors:.1f} ops per tensor" if ops else ""
        return [{"term": name, "seconds": size,
                 "detail": f"{n_tensors} parameter tensors stepped one by one{per}; {detail}"}]
    terms = [{"term": "Python overhead per op", "seconds": size * (1 - again / ops) if ops
              else size, "detail": detail}]
    if again:
        terms.append({"term": "recomputation", "seconds": size * again / ops,
                      "detail": f"{again} of the backward's {ops} ops re-run the "
                                "checkpointed forward"})
    return terms


def off_cpu_with_outside(offs: list[dict[str, float]]) -> list[dict[str, float]]:
    """Each step's off-CPU seconds per phase, with "outside the phases" (the step's less the
    phases')."""
    return [{**o, OUTSIDE: o["step"] - sum(v for k, v in o.items() if k != "step")}
            for o in offs]


def cpu_seconds(steps: list[dict[str, float]], offs: list[dict[str, float]]
                ) -> list[dict[str, float]]:
    """Each step's CPU seconds per phase (wall less off-CPU), "outside the phases" and the
    step included: what the thread itself spent, whatever else held the machine."""
    return [{k: wall[k] - off.get(k, 0.0) for k in wall}
            for wall, off in zip(steps, off_cpu_with_outside(offs), strict=True)]


def verdict(predicted: float, measured: dict[str, float], terms: list[dict[str, Any]]) -> str:
    """NOTE [ Naming a gap ]: "as predicted", "explained" or UNEXPLAINED (with the share)."""
    m = measured["median"]
    if predicted > 0 and predicted / GAP <= m <= predicted * GAP:
        return "as predicted"
    covered = predicted + sum(t["seconds"] for t in terms)
    if abs(m - covered) <= max(SLACK * m, measured["q3"] - measured["q1"]):
        return "explained"
    gap = m - predicted
    share = (covered - predicted) / gap if gap else 0.0
    return f"{UNEXPLAINED} (terms cover {share:.0%} of the gap)"


def time_rows(case: drv.ProfileCase, sheet: dict[str, Any], measured: dict[str, Any],
              sheet_one_row: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per phase, then "outside the phases" and the step: predicted, measured over
    the active steps, unrecorded, ratio, terms, verdict."""
    steps, cpu = measured["steps"], cpu_seconds(measured["steps"], measured["off_cpu"])
    active = meas.phase_summary(steps, case.active_steps)
    active_cpu = meas.phase_summary(cpu, case.active_steps)
    unrecorded_cpu = meas.phase_summary(cpu, case.unprofiled_steps)
    off = meas.phase_summary(off_cpu_with_outside(measured["off_cpu"]), case.active_steps)
    one_cpu = cpu_seconds(measured["one_row"], measured["one_row_off_cpu"])
    one = meas.phase_summary(one_cpu, range(len(one_cpu)))
    sync, op_s = sheet["machine"]["sync_s"], sheet["machine"]["op_s"]
    rows = []
    unrecorded = meas.phase_summary(steps, case.unprofiled_steps)
    for phase in [*sheet["seconds"], OUTSIDE, "step"]:
        p = sum(sheet["seconds"].values()) if phase == "step" else sheet["seconds"].get(phase, 0.0)
        m = active[phase]
        terms: list[dict[str, Any]] = []
        if phase != "step":
            p1 = sheet_one_row["seconds"].get(phase, 0.0)
            fixed = max(0.0, one[phase]["median"] - p1)
            if phase == OUTSIDE:
                terms.append({"term": "Python overhead per op", "seconds": fixed,
                              "detail": "train_step's own code between its phases (argument "
                                        "checks, the calls), measured with one row"})
            else:
                terms += _overhead_terms(case, phase, fixed, measured["census"], op_s)
            if phase == "data wait":
                per, where = measured["per_index_s"], ("the sampler's" if case.impl ==
                                                       "reference" else "the sampler's and "
                                                       "the per-sample fetch's")
                terms.append({"term": "the loader's per-sample loop",
                              "seconds": (case.batch - 1) * per,
                              "detail": f"{case.batch - 1} more samples than one row, at "
                                        f"{per * 1e6:.2f} us each ({where} Python loop, "
                                        "probed apart)"})
            if case.impl == "torch" and unrecorded_cpu:
                extra = active_cpu[phase]["median"] - unrecorded_cpu[phase]["median"]
                if extra > 0:
                    terms.append({"term": "the profiler's cost per op", "seconds": extra,
                                  "detail": "CPU time of the recorded steps less that "
                                            "of the steps run without the profiler"})
            if off[phase]["median"] > 0:
                blas = sheet["machine"].get("blas_threads", "1")
                terms.append({"term": "waiting for a core" if blas == "1" else
                              "waiting for a core or for BLAS's threads",
                              "seconds": off[phase]["median"],
                              "detail": "wall time less the thread's CPU time "
                                        "(thread_time_ns), median: the thread was not "
                                        "running (another process held the core" + (
                                            ")" if blas == "1" else "; or it waited for "
                                            "NumPy's BLAS threads, which run the GEMM "
                                            "beside it: OPENBLAS_NUM_THREADS=1 leaves one)")})
            if sync and phase in sheet["seconds"]:
                terms.append({"term": "a sync", "seconds": 2 * sync,
                              "detail": "the boundary synchronize, at the start and the end"})
        rows.append({"phase": phase, "predicted": p, "measured": m,
                     "unrecorded": unrecorded.get(phase), "one_row": one.get(phase),
                     "ratio": m["median"] / p if p else None, "terms": terms,
                     "verdict": "" if phase == "step" else verdict(p, m, terms)})
    return rows


def reference_memory_terms(case: drv.ProfileCase) -> dict[tuple[str, str], tuple[int, str]]:
    """(boundary, category) -> (gap, term): where the reference's objects differ from torch's
    counting, which the formula follows, to the byte. The transformer's reference saves
    what torch saves, its loss's total_weight and a view of the targets included: none."""
    if case.model == "gpt":
        return {}
    return {("forward", "activations"): (-4, "nll_loss's 0-dim total_weight: torch only"),
            ("forward", "batch"): (case.batch * 8, "the reference's loss saves its own int64 "
                                                   "copy of the target (astype)")}


def memory_rows(case: drv.ProfileCase, sheet: dict[str, Any],
                measured: dict[str, Any]) -> list[dict[str, Any]]:
    """Every category at every boundary: formula, measured, gap, term (exact)."""
    formula = dict((b, c) for b, c in sheet["timeline"])
    named = reference_memory_terms(case) if case.impl == "reference" else {}
    skip: dict[tuple[str, str], str] = {}
    mlp_reference = case.impl == "reference" and case.model == "mlp"  # GPT: all compared
    if mlp_reference and case.precision != "fp32":
        skip[("forward", "activations")] = (f"{NOT_COMPARED}: the reference holds "
                                            f"{case.precision} values in float32 arrays")
    if mlp_reference and case.recompute != "none":
        for category in ("activations", "batch"):
            skip[("forward", category)] = (f"{NOT_COMPARED}: the checkpoints' inputs live "
                                           "inside train_step, out of the loop's reach")
    rows = []
    for boundary, cats in measured["memory"]:
        for category in rprof.CATEGORIES:
            p, m = formula[boundary][category], cats[category]
            term = skip.get((boundary, category), "")
            if not term and m != p:
                gap, name = named.get((boundary, category), (None, ""))
                term = name if m - p == gap else UNEXPLAINED
            rows.append({"boundary": boundary, "category": category, "predicted": p,
                         "measured": m, "gap": m - p, "term": term})
    return rows


def tape_formula(timeline: list[tuple[str, dict[str, int]]]) -> dict[str, int]:
    """The bytes a model's own tape count holds at each boundary: the formula's activations
    (which hold the token ids and targets the tape saved: the timeline counts them there,
    not as batch)."""
    return {boundary: cats["activations"] for boundary, cats in timeline}


def tape_rows(case: drv.ProfileCase, sheet: dict[str, Any],
              measured: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference transformer's own count (GPT.held_bytes) at each boundary against
    tape_formula: a second, independent reading of the forward's held bytes (exact)."""
    if not measured.get("tape"):
        return []
    formula = tape_formula(sheet["timeline"])
    return [{"boundary": b, "predicted": formula[b], "measured": v, "gap": v - formula[b],
             "term": "" if v == formula[b] else UNEXPLAINED} for b, v in measured["tape"]]


def cuda_rows(case: drv.ProfileCase, sheet: dict[str, Any],
              measured: dict[str, Any]) -> list[dict[str, Any]]:
    """On CUDA, each phase's allocator view against the formula's device bytes at its end:
    the gap named by the allocator's rounding of the storages counted, Adam's step living on
    the CPU, and cuBLAS's workspace (the machine probe); the reserve and the phase's peak
    are shown beside it."""
    if not measured.get("cuda"):
        return []
    formula = dict((b, c) for b, c in sheet["timeline"])
    boundaries = dict((b, c) for b, c in measured["memory"])
    step = next(r["predicted"] for r in sheet["accountant"] if r["name"] == "optimizer_step")
    workspace = sheet["machine"]["cublas_workspace"] or 0
    rows = []
    for phase, stats in measured["cuda"].items():
        on_host = formula[phase]["batch"] if phase == "data wait" else 0
        device_bytes = sum(formula[phase].values()) - step - on_host
        rounding = boundaries[phase].get("allocator rounding", 0)
        gap = stats["end"] - device_bytes
        rest = gap - rounding - workspace
        rows.append({"phase": phase, **stats, "formula": device_bytes, "gap": gap,
                     "allocator rounding": rounding, "cuBLAS workspace": workspace,
                     "reserve": stats["reserved"] - stats["end"], "rest": rest,
                     "term": "allocator rounding + cuBLAS workspace; Adam's step on the CPU"
                             if rest == 0 else UNEXPLAINED})
    return rows


def honest_timing(case: drv.ProfileCase, measured: dict[str, Any]) -> dict[str, Any] | None:
    """NOTE [ Honest timing ] (torch_impl/profile.py): each phase's median under the three
    timings, the ratio of each to the synchronized one, and what the device lets appear."""
    if measured["honest"] is None:
        return None
    medians = {v: meas.phase_summary(steps, range(len(steps)))
               for v, steps in measured["honest"].items()}
    base = medians["synchronized"]
    ratios = {v: {p: m[p]["median"] / base[p]["median"] for p in m if base[p]["median"] > 0}
              for v, m in medians.items()}
    cpu = not case.device.startswith("cuda")
    return {"medians": medians, "ratios": ratios, "fault_calls": measured["fault_calls"],
            "device": "CPU" if cpu else "CUDA",
            "cause": drv.CPU_NULL if cpu else
            ("CUDA: unsynchronized, a phase's clock stops when its kernels are queued and the "
             "device's time lands at the next sync (loss.item() in the optimizer phase, or "
             "the seeded .item() in the forward)")}


def separated(a: dict[str, float], b: dict[str, float]) -> bool:
    """a's timings above b's by more than their spread: a's first quartile above b's third."""
    return a["q1"] > b["q3"]


def worker_timing(measured: dict[str, Any]) -> dict[str, Any] | None:
    """Each loop's medians per phase, whether the wait moved (the data wait lower and the
    optimizer higher with the batch taken in the optimizer, each beyond the spread), and
    by how much."""
    worker = measured.get("worker")
    if worker is None:
        return None
    med = {v: meas.phase_summary(steps, range(len(steps))) for v, steps in
           worker["steps"].items()}
    a, b = med[pasync.IN_DATA_WAIT], med[pasync.IN_OPTIMIZER]
    moved = (separated(a["data wait"], b["data wait"])
             and separated(b["optimizer"], a["optimizer"]))
    return {"latency_s": worker["latency_s"], "latency_x": worker.get("latency_x"),
            "min_latency_s": worker.get("min_latency_s"), "medians": med, "moved": moved,
            "data_wait_drop_s": a["data wait"]["median"] - b["data wait"]["median"],
            "optimizer_rise_s": b["optimizer"]["median"] - a["optimizer"]["median"],
            "step_ratio": b["step"]["median"] / a["step"]["median"]}


def unexplained(comparison: dict[str, Any]) -> dict[str, int]:
    """How many time rows and memory rows no term explains."""
    return {"time": sum(r["verdict"].startswith(UNEXPLAINED) for r in comparison["time"]),
            "memory": sum(r["term"] == UNEXPLAINED for r in comparison["memory"])
            + sum(r["term"] == UNEXPLAINED for r in comparison["cuda"])
            + sum(r["term"] == UNEXPLAINED for r in comparison.get("tape", []))}


def compare(case: drv.ProfileCase, sheet: dict[str, Any], measured: dict[str, Any]
            ) -> dict[str, Any]:
    sheet_one = drv.predict(drv.with_batch(case, 1), sheet["machine"])
    out = {"time": time_rows(case, sheet, measured, sheet_one),
           "memory": memory_rows(case, sheet, measured),
           "cuda": cuda_rows(case, sheet, measured),
           "tape": tape_rows(case, sheet, measured),
           "honest": honest_timing(case, measured), "worker": worker_timing(measured)}
    out["unexplained"] = unexplained(out)
    return out


def boundary_arrays(case: drv.ProfileCase, boundaries: list[tuple[str, dict[str, int]]]
                    ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]:
    """(measured, expected, where) over every (boundary, category) compared: expected is the
    formula's bytes plus the named term's exact size where the tree has one (NOTE [ Naming a
    gap ]); the pairs the reference cannot see are left out (memory_rows says why)."""
    formula = dict(drv.formula_timeline(case))
    named = reference_memory_terms(case) if case.impl == "reference" else {}
    skipped = {(r["boundary"], r["category"]) for r in memory_rows(
        case, {"timeline": list(formula.items())}, {"memory": boundaries})
        if r["term"].startswith(NOT_COMPARED)}
    measured, expected, where = [], [], []
    for boundary, cats in boundaries:
        for category in rprof.CATEGORIES:
            if (boundary, category) in skipped:
                continue
            gap, _ = named.get((boundary, category), (0, ""))
            measured.append(cats[category])
            expected.append(formula[boundary][category] + gap)
            where.append((boundary, category))
    return np.array(measured, dtype=np.int64), np.array(expected, dtype=np.int64), where


def saves_mismatches(measured: list[dict[str, Any]], predicted: list[dict[str, Any]]) -> int:
    """How many of one layer's saved tensors differ from the prediction by (shape, bytes):
    parameter views left out (no new bytes), both lists sorted, extra entries counted."""
    got = sorted((tuple(s["shape"]), s["nbytes"]) for s in measured if not s.get("is_parameter"))
    want = sorted((tuple(s["shape"]), s["bytes"]) for s in predicted)
    return sum(a != b for a, b in zip(got, want, strict=False)) + abs(len(got) - len(want))
