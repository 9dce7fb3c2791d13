"""Running a checkpointing schedule in both trees on one case, and what tests, checks,
pictures and benchmarks read from the runs.

A case is make_mlp's arguments plus a batch and seed (parity.strategies.recompute_models),
and optionally "autocast" ("float16" | "bfloat16": the forward runs under autocast):
`ref_case` runs a fresh reference model under a schedule, `torch_case` the torch twin with
the reference's weights on a device, both returning the gradients (parameters, input, and
where the dropout stream ends) and what was measured (held bytes, recompute counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from reference import amp as ramp
from reference import nn as ref
from reference import recompute as rrc
from torch_impl import nn as tnn
from torch_impl import recompute as trc
from torch_impl import state_mapping as tstate
from torch_impl.format_spec import DTYPES as TORCH_DTYPES

TORCH_DTYPE = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
SPECS_SMALL = ("none", "sqrt", "uniform:1", "uniform:2", "uniform:3", "optimal:1", "optimal:2",
               "optimal:3")
CASES = (  # the report's fixed cases: dropout on, off and in eval mode, both dtypes
    {"sizes": [6, 8, 8, 8, 8, 3], "activation": "gelu_tanh", "dropout": 0.3,
     "dtype": np.float64, "batch": 4, "seed": 11},
    {"sizes": [5, 7, 7, 7, 2], "activation": "relu", "dropout": 0.0, "dtype": np.float32,
     "batch": 3, "seed": 12},
    {"sizes": [4, 9, 9, 9, 9, 9, 4], "activation": "tanh", "dropout": 0.5,
     "dtype": np.float32, "batch": 2, "seed": 13},
    {"sizes": [3, 5, 5, 2], "activation": "gelu", "dropout": 0.2, "training": False,
     "dtype": np.float64, "batch": 3, "seed": 14},  # eval: Dropouts save nothing
)


def make_ref(case: dict) -> ref.Sequential:
    """The case's reference model (in eval mode when the case says "training": False)."""
    model = ref.make_mlp(case["sizes"], case["activation"], case["dropout"],
                         rng=np.random.default_rng(case["seed"]), dtype=case["dtype"])
    model.train(case.get("training", True))
    return model


def n_layers(case: dict) -> int:
    return len(make_ref(case))


def inputs(case: dict) -> tuple[np.ndarray, np.ndarray]:
    """(x, g): the model input and the output gradient of a case."""
    rng = np.random.default_rng(case["seed"] + 1)
    x = rng.standard_normal((case["batch"], case["sizes"][0])).astype(case["dtype"])
    g = rng.standard_normal((case["batch"], case["sizes"][-1])).astype(case["dtype"])
    return x, g


def ref_case(case: dict, spec: str | rrc.Schedule, *, preserve_rng_state: bool = True,
             early_stop: bool = True) -> tuple[rrc.ScheduledRun, dict[str, np.ndarray]]:
    """A fresh reference model of the case run forward + backward under `spec` (the forward
    under autocast to case["autocast"], "float16" or "bfloat16", when the case has one)."""
    model = make_ref(case)
    x, g = inputs(case)
    with ramp.autocast(case.get("autocast")):
        run = rrc.forward_with_schedule(model, x, spec, preserve_rng_state=preserve_rng_state,
                                        early_stop=early_stop)
    run.backward(g)
    grads = {k: p.grad for k, p in model.named_parameters()}
    grads["input"] = run.grad_input
    generators = list(model.generators().values())
    state = repr(generators[0].bit_generator.state) if generators else ""
    grads["rng_after"] = np.frombuffer(state.encode(), dtype=np.uint8)  # where draws resume
    return run, grads


def make_twin(case: dict, device: str = "cpu") -> torch.nn.Sequential:
    """The torch model of the case on `device`, holding the reference's initial weights."""
    twin = tnn.make_mlp(case["sizes"], case["activation"], case["dropout"],
                        generator=torch.Generator().manual_seed(0),
                        dtype=TORCH_DTYPE[np.dtype(case["dtype"])], device=device)
    twin.load_state_dict(tstate.state_dict_to_torch(make_ref(case).state_dict(), device))
    return twin.train(case.get("training", True))


def rng_state(device: str) -> np.ndarray:
    """The state of the generator nn.Dropout draws from on `device`, as bytes."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_rng_state(torch.device(device)).numpy().copy()
    return torch.get_rng_state().numpy().copy()


def torch_case(case: dict, spec: str | rrc.Schedule, device: str = "cpu", *,
               preserve_rng_state: bool = True, early_stop: bool = True,
               use_reentrant: bool = False, input_requires_grad: bool = True
               ) -> tuple[trc.Measurement, dict[str, np.ndarray]]:
    """The torch twin (reference weights) run under `spec` on `device`, its RNG seeded from
    the case (torch.manual_seed seeds the CPU and every CUDA generator) inside fork_rng."""
    twin = make_twin(case, device)
    x, g = inputs(case)
    tx = torch.from_numpy(x.copy()).to(device).requires_grad_(input_requires_grad)
    tg = torch.from_numpy(g.copy()).to(device)
    autocast = case.get("autocast")
    with torch.random.fork_rng():  # the CPU and every CUDA generator
        torch.manual_seed(case["seed"])
        m = trc.measure(twin, tx, tg, spec, preserve_rng_state=preserve_rng_state,
                        early_stop=early_stop, use_reentrant=use_reentrant,
                        autocast_dtype=TORCH_DTYPES[autocast] if autocast else None)
        after = rng_state(device)
    grads = {k: (np.full(p.shape, np.nan) if p.grad is None else p.grad.cpu().numpy())
             for k, p in twin.named_parameters()}
    grads["input"] = None if m.grad_input is None else m.grad_input.cpu().numpy()
    grads["rng_after"] = after
    return m, grads


def predicted_held_bytes(run: rrc.ScheduledRun, device: str = "cpu") -> int:
    """The held bytes torch should measure on `device`, from the reference tape.

    The tape models CPU kernels; on CUDA each Dropout mask held is a bool (1 byte per
    element) instead of the input dtype (NOTE [ Dropout's saved mask by device ])."""
    if not trc.dropout_saves_bool_mask(device):
        return run.held_bytes
    masks = [t for t in run.tape() if t.name == "mask"]
    return run.held_bytes - sum(t.nbytes - int(np.prod(t.shape)) for t in masks)


def dropout_recomputed(case: dict, recomputed: dict[int, int]) -> bool:
    """Whether any Dropout layer of the case ran again during backward (the RNG replay's
    edge: without it the recompute draws another mask)."""
    return any(recomputed[i] for i, layer in enumerate(make_ref(case))
               if isinstance(layer, ref.Dropout))


def counts_array(counts: dict[int, int]) -> np.ndarray:
    return np.array([counts[i] for i in sorted(counts)], dtype=np.int64)


def finished_predicted(run: rrc.ScheduledRun) -> np.ndarray:
    """Per layer: the reference's recomputes minus the early-stop interruptions."""
    return counts_array(run.recomputed()) - counts_array(run.interrupted())


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


# -- chains of equal layers: the counting tables, the tape picture, the benchmark
def tanh_chain_recomputes(spec: str, n: int) -> int:
    """R, the layer forwards the reference runs during backward, for `spec` on a chain of
    n Tanh layers (every layer saves, so early stop cuts nothing)."""
    model = ref.Sequential(*(ref.Tanh() for _ in range(n)))
    run = rrc.forward_with_schedule(model, np.zeros((1, 1)), spec)
    run.backward(np.zeros((1, 1)))
    return sum(run.recomputed().values())


def chain(units: int, width: int, dropout: float = 0.0) -> dict:
    """`units` times Linear(width, width) + Tanh, then a Linear: 2 units + 1 modules."""
    return {"sizes": [width] * (units + 2), "activation": "tanh", "dropout": dropout,
            "dtype": np.float32, "batch": 64, "seed": 0}


BENCH_SPECS = ("none", "sqrt", "uniform:2", "uniform:4", "optimal:2", "optimal:3", "optimal:4")
BENCH_UNITS = (8, 16, 32)  # chains of 17, 33 and 65 modules


def tradeoff_rows(n_units: Sequence[int] = BENCH_UNITS, width: int = 256,
                  specs: Sequence[str] = BENCH_SPECS) -> list[dict]:
    """Per chain and schedule, exact and timing-free: held and peak bytes relative to "none"
    (reference tape; torch's hooks for torch_held_ratio) and R / n, the recompute fraction."""
    rows = []
    for units in n_units:
        case = chain(units, width)
        n = n_layers(case)
        base_run, _ = ref_case(case, "none")
        for spec in specs:
            run, _ = ref_case(case, spec)
            m, _ = torch_case(case, spec)
            rows.append({"n": n, "spec": spec,
                         "held_ratio": run.held_bytes / base_run.held_bytes,
                         "torch_held_ratio": m.held_bytes / base_run.held_bytes,
                         "peak_ratio": run.peak_bytes / base_run.peak_bytes,
                         "recompute_fraction": sum(run.recomputed().values()) / n})
    return rows


def theory_time_ratio(recompute_fraction: float) -> float:
    """1 + R / (3n): forward + backward time relative to none if a layer's backward costs two
    of its forwards and every layer costs the same."""
    return 1 + recompute_fraction / 3
