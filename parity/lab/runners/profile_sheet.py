"""The profile's pages and pictures, as pure functions of its JSON: the prediction sheet
(predictions.md, written before anything is measured), the profile (profile.md: the phase
table with the gap named, memory per phase, the allocator's view on CUDA, honest timing, one
layer's saved tensors) and the two pictures (phase bars predicted vs measured with spread;
memory over the step by category). docs/profile.md renders the same tables from a committed
profile (parity/lab/gendocs/profile.py), so the page a user gets and the docs read alike.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from reference import profile as rprof

MEMORY_ROWS = ("weights", "grads", "master", "optimizer_state", "optimizer_step",
               "activations: model", "activations: loss", "activations: GradScaler")


def seconds(value: float | None) -> str:
    """A duration in the unit that keeps 3 significant digits readable (ns, us, ms, s)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def table(head: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    align = ["---:" if i in right else "---" for i in range(len(head))]
    return ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def case_line(case: dict[str, Any]) -> str:
    shape = (f"{tuple(case['sizes'])} {case['activation']}" if case["model"] == "mlp" else
             "(train --model gpt's shape)")
    return (f"`{case['impl']}` tree, model `{case['model']}` {shape}, "
            f"batch {case['batch']}, {case['optimizer']}, precision "
            f"`{case['precision']}`, recompute `{case['recompute']}`, device "
            f"`{case['device']}`; {case['steps']} steps, profiler schedule wait "
            f"{case['wait']}, warmup {case['warmup']}, active {case['active']}")


# ---------------------------------------------------------------- the prediction sheet
def machine_lines(machine: dict[str, Any]) -> list[str]:
    rows = [["matmul rate R", f"{machine['matmul_flops_per_s'] / 1e9:.3g} GFLOP/s",
             f"one {machine['probe_dtype']} ({machine['probe_n']} x {machine['probe_n']}) @ "
             "(n x n), median of 9"],
            ["copy bandwidth W", f"{machine['copy_bytes_per_s'] / 1e9:.3g} GB/s",
             "one 16 MiB copy (read + written), median of 9"],
            ["host-to-device", "-" if machine["h2d_bytes_per_s"] is None else
             f"{machine['h2d_bytes_per_s'] / 1e9:.3g} GB/s", "pageable 16 MiB copy"
             if machine["h2d_bytes_per_s"] else "none: the device is the host"],
            ["one tiny op", seconds(machine["op_s"]), "an add of two 1-element values"],
            ["empty sync", seconds(machine["sync_s"]), "synchronize with nothing queued"]]
    if machine.get("cublas_workspace") is not None:
        rows.append(["cuBLAS workspace", f"{machine['cublas_workspace']:,} B",
                     "what the process's first GEMM adds to memory_allocated"])
    blas = (f", BLAS threads {machine['blas_threads']} (OPENBLAS_NUM_THREADS / "
            "OMP_NUM_THREADS at start-up)" if machine.get("blas_threads") else "")
    return [f"Machine: {machine['device']}" + (f", threads {machine['threads']}"
                                               if machine.get("threads") else "") + blas, "",
            *table(["probe", "rate", "how"], rows, {1})]


def predictions_markdown(sheet: dict[str, Any]) -> str:
    """predictions.md: what the run will hold and how long each phase will take, from the
    accountant and the machine probes only (NOTE [ Predicting a phase ])."""
    case, mem = sheet["case"], {r["name"]: r for r in sheet["accountant"]
                                if r["section"] == "memory"}
    lines = [f"# Prediction sheet: {case_line(case)}", "",
             "Written before anything of the model is measured.", "", *machine_lines(
                 sheet["machine"]), "", "## Bytes (the accountant)", ""]
    lines += table(["category", "bytes", "formula"],
                    [[n, f"{mem[n]['predicted']:,}", mem[n]["formula"]] for n in MEMORY_ROWS
                     if n in mem], {1})
    lines += ["", f"{sheet['n_params']:,} parameters.", "", "## Time per phase (roofline)", ""]
    rows = []
    shares = predicted_shares(sheet)
    for phase, t in sheet["seconds"].items():
        work = sheet["work"][phase]
        what = (f"{work['flops']:,} FLOPs / R" if "flops" in work else
                f"{work['moved']:,} bytes moved / W" if work.get("moved") else "nothing to do")
        rows.append([phase, what, seconds(t), f"{shares[phase]:.1%}"])
    lines += table(["phase", "work", "predicted", "share of the step"], rows, {2, 3})
    lines += ["", f"Predicted slowest phase: **{sheet['slowest']}**.", "",
              "## Bytes at each phase boundary (steady step)", ""]
    lines += table(["boundary", *rprof.CATEGORIES, "total"],
                    [[b, *(f"{c[k]:,}" for k in rprof.CATEGORIES), f"{sum(c.values()):,}"]
                     for b, c in sheet["timeline"]], set(range(1, 7)))
    layer = sheet["layer"]
    lines += ["", f"## {layer_title(layer['index'])}'s saved tensors (predicted)", ""]
    lines += table(["module", "name", "tensor", "shape", "bytes"],
                    [[str(s.get("module", layer["index"])), s["name"], s["tensor"],
                      str(tuple(s["shape"])), f"{s['bytes']:,}"] for s in layer["saves"]], {4})
    return "\n".join(lines) + "\n"


def predicted_shares(sheet: dict[str, Any]) -> dict[str, float]:
    """Each phase's share of the step's predicted time (the roofline's)."""
    total = sum(sheet["seconds"].values())
    return {p: t / total if total else 0.0 for p, t in sheet["seconds"].items()}


def measured_shares(time_rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's median over the step's, "outside the phases" included (the medians need
    not add up to one)."""
    step = next(r["measured"]["median"] for r in time_rows if r["phase"] == "step")
    return {r["phase"]: r["measured"]["median"] / step for r in time_rows if r["phase"] != "step"}


def shares_line(sheet: dict[str, Any], time_rows: list[dict[str, Any]]) -> str:
    pred, meas = predicted_shares(sheet), measured_shares(time_rows)
    return ("Share of the step, predicted (roofline) / measured (median): " + ", ".join(
        f"{p} {pred[p]:.0%} / {meas[p]:.0%}" for p in pred) +
        f", outside the phases - / {meas.get('outside the phases', 0.0):.0%}.")


# ---------------------------------------------------------------- the profile
def phase_rows(time_rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in time_rows:
        m = r["measured"]
        terms = "; ".join(f"{t['term']} {seconds(t['seconds'])}" for t in r["terms"])
        out.append([r["phase"], seconds(r["predicted"]) if r["predicted"] else "0",
                    seconds(m["median"]), f"{seconds(m['q1'])} .. {seconds(m['q3'])}",
                    "-" if r["ratio"] is None else f"{r['ratio']:.3g}", terms, r["verdict"]])
    return out


PHASE_HEAD = ["phase", "predicted", "measured (median)", "spread (q1 .. q3)", "ratio",
              "named terms", "verdict"]


def memory_lines(rows: list[dict[str, Any]]) -> list[str]:
    body = [[r["boundary"], r["category"], f"{r['predicted']:,}", f"{r['measured']:,}",
             f"{r['gap']:+,}" if r["gap"] else "", r["term"]]
            for r in rows if r["predicted"] or r["measured"] or r["term"]]
    return table(["boundary", "category", "formula", "measured", "gap", "term"], body, {2, 3, 4})


def cuda_lines(rows: list[dict[str, Any]]) -> list[str]:
    keys = ("start", "end", "peak", "reserved", "formula", "gap", "allocator rounding",
            "cuBLAS workspace", "rest")
    return table(["phase", *keys, "term"],
                  [[r["phase"], *(f"{r[k]:,}" for k in keys), r["term"]] for r in rows],
                  set(range(1, len(keys) + 1)))


def honest_lines(honest: dict[str, Any]) -> list[str]:
    variants = list(honest["medians"])
    phases = [p for p in honest["medians"][variants[0]] if p != "outside the phases"]
    rows = [[p, *(f"{seconds(honest['medians'][v][p]['median'])} "
                  f"({honest['ratios'][v].get(p, float('nan')):.2f}x)" for v in variants)]
            for p in phases]
    return [*table(["phase", *variants], rows, set(range(1, len(variants) + 1))), "",
            f"{honest['cause']}. The seeded `.item()` ran "
            f"{honest['fault_calls']} times (once per forward of its variant)."]


def worker_lines(worker: dict[str, Any]) -> list[str]:
    """NOTE [ A sync on the CPU ]: the two loops' medians per phase, and what moved."""
    variants = list(worker["medians"])
    phases = [p for p in worker["medians"][variants[0]] if p != "outside the phases"]
    def cell(m: dict[str, float]) -> str:
        return f"{seconds(m['median'])} ({seconds(m['q1'])} .. {seconds(m['q3'])})"

    rows = [[p, *(cell(worker["medians"][v][p]) for v in variants)] for p in phases]
    moved = ("the wait moved: beyond the spread (first quartile above the other loop's "
             "third), the data wait fell by " f"{seconds(worker['data_wait_drop_s'])} and the "
             f"optimizer rose by {seconds(worker['optimizer_rise_s'])}; the step's total "
             f"changed by x{worker['step_ratio']:.2f}" if worker["moved"] else
             "the wait did NOT move beyond the spread: the worker was not the bottleneck")
    return [f"One loader worker, storage latency {seconds(worker['latency_s'])} per batch "
            + (f"({worker['latency_x']}x the synchronized step, at least "
               f"{seconds(worker['min_latency_s'])}: " if worker.get("latency_x") else "(")
            + "the worker is the bottleneck). The same train_step; the "
            "batch taken at the top of the step, then by an optimizer step post-hook (median, "
            "q1 .. q3):", "", *table(["phase", *variants], rows, set(range(1, len(variants) + 1))),
            "", f"Measured: {moved}. The optimizer did the same work in both loops, and so did "
            "the worker: a phase's time is what the thread waited for in it. On CUDA the "
            "device's queue is that worker, and `.item()` the hook (NOTE [ A sync on the CPU ], "
            "torch_impl/profile.py)."]


def saved_lines(layer: list[dict[str, Any]]) -> list[str]:
    return table(["module", "name", "shape", "dtype", "bytes", "a view of a parameter"],
                  [[s["module"], s["name"], str(tuple(s["shape"])), s["dtype"],
                    f"{s['nbytes']:,}", "yes" if s.get("is_parameter") else ""]
                   for s in layer], {4})


def layer_title(index: int | str) -> str:
    """The listed layer as the headings name it: the MLP's index, the GPT's block path."""
    return f"Layer {index}" if isinstance(index, int) else f"Block `{index}`"


def profile_markdown(result: dict[str, Any]) -> str:
    """profile.md: the comparison, every gap beside its named term or UNEXPLAINED."""
    sheet, measured, comp = result["sheet"], result["measured"], result["comparison"]
    case, written = sheet["case"], result["predictions"]
    on_cpu = not case["device"].startswith("cuda")
    clock = ("CPU: time.perf_counter_ns at each boundary; kernels run on the calling thread, "
             "nothing to synchronize" if on_cpu else
             "CUDA: torch.cuda.synchronize() then time.perf_counter_ns at each boundary")
    lines = [f"# Profile: {case_line(case)}", "",
             f"Predictions written first: `predictions.json` sha256 `{written['sha256']}` at "
             f"{written['written_at']}; measured from {measured['measured_from_ns']} ns "
             f"(epoch), {(measured['measured_from_ns'] - written['written_ns']) / 1e6:.1f} ms "
             "later.", "", f"Clock: {clock}. Phases: active steps (recorded by the profiler); "
             "the steps after the window run without the profiler.", "",
             *machine_lines(sheet["machine"]), "", "## Time per phase", ""]
    lines += table(PHASE_HEAD, phase_rows(comp["time"]), {1, 2, 3, 4})
    n_un = comp["unexplained"]
    lines += ["", f"Predicted slowest: **{sheet['slowest']}**; measured slowest: **"
              f"{measured_slowest(comp['time'])}**. Unexplained: {n_un['time']} time rows, "
              f"{n_un['memory']} memory rows.", "", shares_line(sheet, comp["time"]), "",
              *_link(result, "phases"),
              "## Bytes at each phase boundary", "", *memory_lines(comp["memory"]), "",
              *_link(result, "memory")]
    if comp.get("tape"):
        lines += ["The reference transformer's own tape count (GPT.held_bytes: distinct base "
                  "buffers) against the formula's activations (the saved token ids and targets "
                  "included):",
                  "", *table(["boundary", "formula", "tape", "gap", "term"],
                             [[r["boundary"], f"{r['predicted']:,}", f"{r['measured']:,}",
                               f"{r['gap']:+,}" if r["gap"] else "", r["term"]]
                              for r in comp["tape"]], {1, 2, 3}), ""]
    if comp["cuda"]:
        lines += ["## The CUDA allocator per phase (bytes)", "", *cuda_lines(comp["cuda"]), ""]
    if comp["honest"]:
        lines += ["## Honest timing: the same step, the sync moved", "",
                  *honest_lines(comp["honest"]), ""]
    if comp.get("worker"):
        lines += ["## Honest timing on an asynchronous boundary: a loader worker", "",
                  *worker_lines(comp["worker"]), ""]
    lines += [f"## {layer_title(sheet['layer']['index'])}'s saved tensors (measured: one forward "
              "under the precision's autocast, without checkpoints)", "",
              *saved_lines(measured["layer"]), ""]
    if measured.get("census"):
        ops = measured["census"]["batch"]
        lines += ["aten ops per phase: " + ", ".join(f"{k} {v}" for k, v in ops.items()), ""]
    if measured.get("trace"):
        lines += [f"Chrome trace of the active steps: `{measured['trace']}` (open in "
                  "chrome://tracing or https://ui.perfetto.dev).", ""]
    return "\n".join(lines)


def measured_slowest(time_rows: list[dict[str, Any]]) -> str:
    medians = {r["phase"]: r["measured"]["median"] for r in time_rows
               if r["phase"] in rprof.PHASES}
    return rprof.slowest(medians)


def _link(result: dict[str, Any], name: str) -> list[str]:
    """The page's link to the picture `name`.png, if it was drawn (result["pictures"])."""
    return [f"![{name}]({name}.png)", ""] if f"{name}.png" in result.get("pictures", ()) else []


# ---------------------------------------------------------------- pictures
def draw_phases(path: Path, results: list[dict[str, Any]]) -> None:
    """Per phase, the prediction beside the measured median with its q1..q3 spread (log
    scale); one panel per profile given."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 3.8),
                             squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        rows = [r for r in result["comparison"]["time"] if r["phase"] in rprof.PHASES]
        y = range(len(rows))
        pred = [r["predicted"] or float("nan") for r in rows]  # 0: no bar on a log axis
        med = [r["measured"]["median"] for r in rows]
        err = [[m - r["measured"]["q1"] for m, r in zip(med, rows, strict=True)],
               [r["measured"]["q3"] - m for m, r in zip(med, rows, strict=True)]]
        ax.barh([i + 0.2 for i in y], pred, height=0.4, label="predicted (roofline)",
                color="#9ecae1")
        ax.barh([i - 0.2 for i in y], med, height=0.4, xerr=err, label="measured (median, "
                "q1..q3)", color="#3182bd", capsize=3)
        ax.set_yticks(list(y), [r["phase"] for r in rows])
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("seconds per step")
        case = result["sheet"]["case"]
        ax.set_title(f"{case['impl']} on {case['device']}")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_memory(path: Path, results: list[dict[str, Any]]) -> None:
    """Bytes by category at each boundary of one steady step, stacked (measured), with the
    formula's total as a line."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 3.8),
                             squeeze=False)
    colors = ("#31a354", "#e6550d", "#756bb1", "#3182bd", "#969696")
    for ax, result in zip(axes[0], results, strict=True):
        bounds = result["measured"]["memory"]
        x = range(len(bounds))
        bottom = [0] * len(bounds)
        for cat, color in zip(rprof.CATEGORIES, colors, strict=True):
            vals = [c[cat] for _, c in bounds]
            ax.bar(list(x), vals, bottom=bottom, label=cat, color=color)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        formula = dict((b, c) for b, c in result["sheet"]["timeline"])
        ax.plot(list(x), [sum(formula[b][k] for k in rprof.CATEGORIES) for b, _ in bounds],
                "k_", markersize=22, label="formula total")
        ax.set_xticks(list(x), [b for b, _ in bounds], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("bytes live at the boundary")
        case = result["sheet"]["case"]
        ax.set_title(f"{case['impl']} on {case['device']}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
