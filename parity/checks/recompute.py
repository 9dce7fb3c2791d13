"""Quick checks of the recompute claims, the helpers parity/test_recompute.py shares, pictures.

A case is make_mlp's arguments plus a batch and seed (parity.strategies.recompute_models):
`ref_case` runs a fresh reference model under a schedule, `torch_case` the torch twin with
the reference's weights, both returning the gradients (parameters and input) and what was
measured (held bytes, recompute counts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from parity.compare import measure
from parity.report import Observation, check, picture
from parity.tolerances import claim
from reference import nn as ref
from reference import recompute as rrc
from torch_impl import nn as tnn
from torch_impl import recompute as trc

TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
SPECS_SMALL = ("none", "sqrt", "uniform:1", "uniform:2", "uniform:3", "optimal:1", "optimal:2",
               "optimal:3")


def make_ref(case: dict) -> ref.Sequential:
    return ref.make_mlp(case["sizes"], case["activation"], case["dropout"],
                        rng=np.random.default_rng(case["seed"]), dtype=case["dtype"])


def inputs(case: dict) -> tuple[np.ndarray, np.ndarray]:
    """(x, g): the model input and the output gradient of a case."""
    rng = np.random.default_rng(case["seed"] + 1)
    x = rng.standard_normal((case["batch"], case["sizes"][0])).astype(case["dtype"])
    g = rng.standard_normal((case["batch"], case["sizes"][-1])).astype(case["dtype"])
    return x, g


def ref_case(case: dict, spec: str, preserve_rng_state: bool = True
             ) -> tuple[rrc.ScheduledRun, dict[str, np.ndarray]]:
    """A fresh reference model of the case run forward + backward under `spec`."""
    model = make_ref(case)
    x, g = inputs(case)
    run = rrc.forward_with_schedule(model, x, spec, preserve_rng_state=preserve_rng_state)
    run.backward(g)
    grads = {k: p.grad for k, p in model.named_parameters()}
    grads["input"] = run.grad_input
    generators = list(model.generators().values())
    state = repr(generators[0].bit_generator.state) if generators else ""
    grads["rng_after"] = np.frombuffer(state.encode(), dtype=np.uint8)  # where draws resume
    return run, grads


def make_twin(case: dict) -> torch.nn.Sequential:
    twin = tnn.make_mlp(case["sizes"], case["activation"], case["dropout"],
                        generator=torch.Generator().manual_seed(0),
                        dtype=TORCH_DTYPE[np.dtype(case["dtype"])])
    twin.load_state_dict(tnn.state_dict_to_torch(make_ref(case).state_dict()))
    return twin


def torch_case(case: dict, spec: str, preserve_rng_state: bool = True,
               use_reentrant: bool = False, input_requires_grad: bool = True
               ) -> tuple[trc.Measurement, dict[str, np.ndarray]]:
    """The torch twin (reference weights) run under `spec`, global RNG seeded from the case."""
    twin = make_twin(case)
    x, g = inputs(case)
    tx = torch.from_numpy(x.copy()).requires_grad_(input_requires_grad)
    with torch.random.fork_rng():
        torch.manual_seed(case["seed"])
        m = trc.measure(twin, tx, torch.from_numpy(g.copy()), spec,
                        preserve_rng_state=preserve_rng_state, use_reentrant=use_reentrant)
        after = torch.get_rng_state().numpy().copy()
    grads = {k: (np.full(p.shape, np.nan) if p.grad is None else p.grad.numpy())
             for k, p in twin.named_parameters()}
    grads["input"] = None if m.grad_input is None else m.grad_input.numpy()
    grads["rng_after"] = after
    return m, grads


def counts_array(counts: dict[int, int]) -> np.ndarray:
    return np.array([counts[i] for i in sorted(counts)], dtype=np.int64)


def plan_array(plan: Sequence[int | rrc.Segment], depth: int = 0) -> np.ndarray:
    """A plan flattened to integers: (depth, start, stop) per item, segments before bodies."""
    rows: list[tuple[int, int, int]] = []
    for item in plan:
        if isinstance(item, int):
            rows.append((depth, item, item + 1))
        else:
            rows.append((depth, -item.start - 1, item.stop))
            rows.extend(map(tuple, plan_array(item.body, depth + 1)))
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


_CASES = [
    {"sizes": [6, 8, 8, 8, 8, 3], "activation": "gelu_tanh", "dropout": 0.3,
     "dtype": np.float64, "batch": 4, "seed": 11},
    {"sizes": [5, 7, 7, 7, 2], "activation": "relu", "dropout": 0.0, "dtype": np.float32,
     "batch": 3, "seed": 12},
    {"sizes": [4, 9, 9, 9, 9, 9, 4], "activation": "tanh", "dropout": 0.5,
     "dtype": np.float32, "batch": 2, "seed": 13},
]


def _grads_obs(side: str) -> Observation:
    c, bad, n = claim(f"recompute.grads_{side}"), 0.0, 0
    run = ref_case if side == "reference" else torch_case
    for case in _CASES:
        _, base = run(case, "none")
        for spec in SPECS_SMALL:
            _, grads = run(case, spec)
            for key in base:
                bad, n = bad + measure(c, grads[key], base[key]), n + base[key].size
    return Observation(bad, n, f"{len(_CASES)} models x {len(SPECS_SMALL)} schedules, dropout on")


check("recompute.grads_reference")(lambda: _grads_obs("reference"))
check("recompute.grads_torch")(lambda: _grads_obs("torch"))


def _measured_obs(cid: str) -> Observation:
    c, bad, n = claim(cid), 0.0, 0
    for case in _CASES:
        for spec in SPECS_SMALL:
            run, _ = ref_case(case, spec)
            m, _ = torch_case(case, spec)
            if cid == "recompute.held_bytes":
                a, b = np.array([run.held_bytes]), np.array([m.held_bytes])
            elif cid == "recompute.counts":
                a, b = counts_array(run.recomputed()), counts_array(m.started)
            else:
                a = counts_array(run.recomputed()) - counts_array(run.interrupted())
                b = counts_array(m.finished)
            bad, n = bad + measure(c, a, b), n + a.size
    return Observation(bad, n, f"{len(_CASES)} models x {len(SPECS_SMALL)} schedules")


for _cid in ("recompute.held_bytes", "recompute.counts", "recompute.early_stop"):
    check(_cid)(lambda cid=_cid: _measured_obs(cid))


@check("recompute.plans")
def _() -> Observation:
    c, bad, n = claim("recompute.plans"), 0.0, 0
    for n_layers in range(1, 65):
        for spec in ("none", "sqrt", "uniform:1", f"uniform:{n_layers}",
                     *(f"optimal:{s}" for s in (1, 2, 3, 5, 8))):
            a = plan_array(rrc.parse_schedule(spec, n_layers).plan)
            b = plan_array(trc.parse_schedule(spec, n_layers).plan)
            bad += measure(c, a, b) if a.shape == b.shape else 1
            n += a.size
        for s in (1, 2, 3, 5, 8):
            cost = np.array([rrc.revolve_cost(n_layers, s)])
            bad += measure(c, cost, np.array([rrc.binomial_cost(n_layers, s)]))
    return Observation(bad, n, "n = 1..64, S in 1, 2, 3, 5, 8")


# ------------------------------------------------------------------ timing (benchmark, plot)
def chain(units: int, width: int, dropout: float = 0.0) -> dict:
    """`units` times Linear(width, width) + Tanh, then a Linear: 2 units + 1 modules."""
    return {"sizes": [width] * (units + 2), "activation": "tanh", "dropout": dropout,
            "dtype": np.float32, "batch": 64, "seed": 0}


def time_schedules(case: dict, specs: Sequence[str], side: str, repeats: int
                   ) -> dict[str, float]:
    """Median CPU seconds (time.process_time: this process only, so other jobs on a shared
    machine hardly count) of one forward + backward per spec, timed round-robin (spec after
    spec, `repeats` rounds after one warm-up round) so drifts hit every spec alike."""
    x, g = inputs(case)
    times: dict[str, list[float]] = {spec: [] for spec in specs}
    model, twin = make_ref(case), make_twin(case)
    tx, tg = torch.from_numpy(x).requires_grad_(True), torch.from_numpy(g)
    for _ in range(repeats + 1):
        for spec in specs:
            start = time.process_time()
            if side == "reference":
                rrc.forward_with_schedule(model, x, spec).backward(g)
            else:
                trc.forward_with_schedule(twin, tx, spec).backward(tg)
            times[spec].append(time.process_time() - start)
    return {spec: float(np.median(t[1:])) for spec, t in times.items()}


BENCH_SPECS = ("none", "sqrt", "uniform:2", "uniform:4", "optimal:2", "optimal:3", "optimal:4")


def tradeoff_rows(n_units: Sequence[int] = (8, 16, 32), width: int = 256, repeats: int = 5,
                  timed: bool = True) -> list[dict]:
    """Per chain and schedule: held and peak bytes relative to "none" (reference tape and
    torch's hooks), the theoretical recompute fraction R / n, and (timed) the measured
    forward+backward time ratio of both implementations."""
    rows = []
    for units in n_units:
        case = chain(units, width)
        n = len(make_ref(case))
        base_run, _ = ref_case(case, "none")
        t = {side: time_schedules(case, BENCH_SPECS, side, repeats) if timed else {}
             for side in ("reference", "torch")}
        for spec in BENCH_SPECS:
            run, _ = ref_case(case, spec)
            m, _ = torch_case(case, spec)
            row = {"n": n, "spec": spec, "held_ratio": run.held_bytes / base_run.held_bytes,
                   "torch_held_ratio": m.held_bytes / base_run.held_bytes,
                   "peak_ratio": run.peak_bytes / base_run.peak_bytes,
                   "recompute_fraction": sum(run.recomputed().values()) / n}
            for side in t if timed else ():
                row[f"{side}_time_ratio"] = t[side][spec] / t[side]["none"]
            rows.append(row)
    return rows


# ------------------------------------------------------------------ pictures
def draw_tape(path: Path, n_units: int = 12) -> None:
    """What is held between forward and backward, layer by layer, for several schedules."""
    import matplotlib.pyplot as plt

    case = chain(n_units // 2, 32)
    n = len(make_ref(case))
    specs = ("none", "uniform:3", "sqrt", "optimal:2", "optimal:1")
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(specs) + 1.2))
    for row, spec in enumerate(specs):
        model = make_ref(case)
        x, _ = inputs(case)
        run = rrc.forward_with_schedule(model, x, spec)
        y = len(specs) - 1 - row
        for entry in run.tape():
            last = entry.module.split(".")[-1]
            if entry.name == "input" and last.startswith("checkpoint"):
                start = int(last[len("checkpoint("):].split(":")[0])
                ax.add_patch(plt.Rectangle((start, y + 0.1), 0.25, 0.8, color="tab:orange"))
            else:
                i = int(last)
                ax.add_patch(plt.Rectangle((i + 0.3, y + 0.1), 0.65, 0.8, color="tab:blue"))

        def brackets(plan: Sequence[int | rrc.Segment], depth: int, y: int = y) -> None:
            for item in plan:
                if isinstance(item, rrc.Segment):
                    ax.plot([item.start, item.stop], [y + 0.05 + 0.07 * depth] * 2,
                            color="black", lw=1)
                    brackets(item.body, depth + 1)
        brackets(run.schedule.plan, 0)
        ax.text(n + 0.3, y + 0.5, f"{run.held_bytes / 1024:.0f} KiB held", va="center")
    ax.set_yticks([len(specs) - 1 - i + 0.5 for i in range(len(specs))], specs)
    ax.set_xlim(0, n + 3.5)
    ax.set_ylim(0, len(specs))
    ax.set_xlabel(f"layer index (Linear/Tanh chain of {n} modules, batch 64, width 32, "
                  "float32)")
    ax.set_title("The tape between forward and backward: blue = a layer's saved tensors, "
                 "orange = a segment's saved input,\nlines under a row = checkpointed segments "
                 "(stacked lines: nested)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


BENCH_JSON = Path(__file__).resolve().parents[2] / "docs" / "recompute_benchmark.json"


def draw_tradeoff(path: Path, rows: list[dict] | None = None) -> None:
    """Held bytes vs forward+backward time relative to no checkpointing, next to the
    theory 1 + R / (3n) (a layer's backward costing two forwards). Timings come from
    benchmarks/recompute.py's docs/recompute_benchmark.json; without it, theory only."""
    import json

    import matplotlib.pyplot as plt

    if rows is None:
        rows = (json.loads(BENCH_JSON.read_text()) if BENCH_JSON.exists()
                else tradeoff_rows((8, 16), 32, timed=False))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, side in zip(axes, ("reference", "torch"), strict=True):
        for n, marker in zip(sorted({r["n"] for r in rows}), "osD^", strict=False):
            sub = [r for r in rows if r["n"] == n]
            ax.scatter([r["held_ratio"] for r in sub],
                       [1 + r["recompute_fraction"] / 3 for r in sub], marker=marker,
                       facecolors="none", edgecolors="gray", label=f"theory 1 + R/(3n), n = {n}")
            if f"{side}_time_ratio" in sub[0]:
                ax.scatter([r["held_ratio"] for r in sub], [r[f"{side}_time_ratio"] for r in sub],
                           marker=marker, label=f"measured, n = {n}")
                for r in sub:
                    ax.annotate(r["spec"], (r["held_ratio"], r[f"{side}_time_ratio"]),
                                fontsize=6)
        ax.set_title(side)
        ax.set_xlabel("held bytes / held bytes without checkpointing")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("forward+backward time / without checkpointing")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


picture("recompute_tape.png")(draw_tape)
picture("recompute_tradeoff.png")(draw_tradeoff)
