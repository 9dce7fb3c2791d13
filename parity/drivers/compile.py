"""Running the MLP compiled, eager and in the reference on one batch, the numbers the
compile claims compare (parity/claims/compile.py), and the recompile counts.

The error bounds themselves (the worst-case and the probabilistic propagation of the nn
claims through the network) are parity/claims/compile_bounds.py.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch._inductor import config as inductor_config

from parity.claims.compile_bounds import EPS32, Results, bounds, probable_bounds
from parity.compare import as_numpy, eps_of, measure
from parity.tolerances import claim
from reference import losses as rloss
from reference import nn as ref
from torch_impl import compile as tc
from torch_impl import nn as tnn
from torch_impl import state_mapping as tstate

_CACHE_ROOT: list[tempfile.TemporaryDirectory] = []
# Kernels compiled in this process, one after another, not by a pool of worker processes:
# compile_threads is read only by torch/_inductor/async_compile.py, to choose between
# submitting each kernel's C++ build to a pool and building it at once; the generated
# source and the compiler's command line are the same either way, so the numbers are. On
# 2 shared cores the pool's start (each worker imports torch) cost more than it saved:
# one compiled transformer took about half the wall time with 1.
_COMPILE_THREADS = 1
# `python -m parity report` (parity/lab/report.py, its INDUCTOR_CACHE) names here one empty
# directory made for its run, shared by its test processes: see fresh_inductor_cache
RUN_CACHE = "MIRRORTRAIN_REPORT_INDUCTOR_CACHE"


@contextlib.contextmanager
def fresh_inductor_cache() -> Iterator[str]:
    """Inductor's on-disk caches in a fresh, empty directory for the duration, Dynamo's
    in-memory ones reset around it, kernels built in this process (_COMPILE_THREADS), the
    environment restored after (Inductor writes the directory it settled on back into
    TORCHINDUCTOR_CACHE_DIR).

    The directory is a new subdirectory of one temporary directory per process, removed at
    exit, not at the end of the block: Inductor memoizes paths into its cache for the life
    of the process (torch 2.6's precompiled C++ header is included by absolute path from
    every later kernel), so a directory deleted mid-process breaks the next compile.

    Inside the report's run ($MIRRORTRAIN_REPORT_INDUCTOR_CACHE set) it is instead the one
    directory the report made empty for that run, shared by its processes and modules: the
    run is still cold (it compiles everything it uses, nothing comes from before it), but
    what Inductor builds once per cache is built once per run, not once per process and
    module: its probes of the CPU's vector instructions (ten C++ builds, four of them of
    ATen's vector headers: about 9 s of CPU, before the first kernel), and a kernel or graph
    two tests generate alike. Inductor keys a cached kernel by its source and compiler
    command line and a cached graph by the graph, its inputs' metadata and the config, so
    what a test loads is what it would have built.
    """
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    shared = os.environ.get(RUN_CACHE)
    if not shared and not _CACHE_ROOT:
        _CACHE_ROOT.append(tempfile.TemporaryDirectory(prefix="mirrortrain-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = shared or tempfile.mkdtemp(dir=_CACHE_ROOT[0].name)
    torch._dynamo.reset()
    try:
        with inductor_config.patch(compile_threads=_COMPILE_THREADS):
            yield os.environ["TORCHINDUCTOR_CACHE_DIR"]
    finally:
        torch._dynamo.reset()
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


@dataclass(frozen=True)
class Case:
    """One batch for one MLP: sizes, activation, batch N, seed (weights, inputs, classes)."""

    sizes: tuple[int, ...] = (16, 32, 32, 8)
    activation: str = "gelu"
    batch: int = 32
    seed: int = 0


SMALL = Case()  # the default run's compiled case


def build(case: Case, device: str = "cpu"
          ) -> tuple[torch.nn.Sequential, ref.Sequential, np.ndarray, np.ndarray]:
    """(torch model, reference model with bit-identical weights, x (N, d_in), classes (N,))."""
    model = tnn.make_mlp(case.sizes, case.activation,
                         generator=torch.Generator().manual_seed(case.seed), device=device)
    reference = ref.make_mlp(case.sizes, case.activation, rng=np.random.default_rng(0))
    reference.load_state_dict(tstate.state_dict_from_torch(model.state_dict()))
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((case.batch, case.sizes[0])).astype(np.float32)
    y = rng.integers(0, case.sizes[-1], case.batch)
    return model, reference, x, y


def run_torch(fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
              model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> Results:
    """Loss, output and parameter gradients of fn(x, y) -> (loss, output) and backward."""
    device = next(model.parameters()).device
    model.zero_grad(set_to_none=True)
    loss, output = fn(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
    loss.backward()
    out = {"loss": as_numpy(loss), "output": as_numpy(output)}  # bfloat16 via ml_dtypes
    out.update({k: as_numpy(p.grad) for k, p in model.named_parameters()})
    return out


def run_reference(model: ref.Sequential, x: np.ndarray, y: np.ndarray) -> Results:
    """The same quantities from the reference (CrossEntropyLoss, mean)."""
    model.zero_grad()
    loss_fn = rloss.CrossEntropyLoss("mean")
    output = model.forward(x)
    loss = loss_fn(output, y)
    model.backward(loss_fn.backward(np.float32(1.0)))
    out = {"loss": np.asarray(loss), "output": output}
    out.update({k: p.grad for k, p in model.named_parameters()})
    return out


@dataclass(frozen=True)
class Numerics:
    """One case run three ways, with both bounds (in float32 eps) and whether the compiled
    backward really ran (its grad_fn is AOTAutograd's CompiledFunctionBackward)."""

    compiled: Results
    eager: Results
    reference: Results
    bound_eager: Results  # S of compile.eager (matrix products shared; compile.bf16's in bf16)
    bound_reference: Results  # S of compile.reference
    compiled_backward: bool


def numerics(case: Case = SMALL, device: str = "cpu", backend: str = "inductor",
             precision: str = "fp32") -> Numerics:
    """Run `case` compiled, eager and in the reference (float32), and bound every entry.

    float32: bound_eager and bound_reference are compile.eager's and compile.reference's
    (probable_bounds). precision "bf16" runs both torch sides under bfloat16 autocast;
    bound_eager is then compile.bf16's (the worst-case `bounds` with autocast's roundings, in
    the compared dtype's eps: the logits are bfloat16), and the reference's side (float32
    throughout) is for the amp topic, not this one.
    """
    model, reference, x, y = build(case, device)
    loss_fn = torch.nn.CrossEntropyLoss()
    eager = run_torch(tc.forward_loss(model, loss_fn, precision), model, x, y)
    compiled_fn = tc.compile_forward_loss(model, loss_fn, precision=precision, backend=backend)
    loss, _ = compiled_fn(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
    compiled_backward = "CompiledFunction" in type(loss.grad_fn).__name__
    compiled = run_torch(compiled_fn, model, x, y)
    rounding = 0.0 if precision == "fp32" else float(torch.finfo(tc.amp.autocast_dtype(
        precision)).eps)
    measured = np.abs(compiled["output"].astype(np.float64) - eager["output"])
    if precision == "fp32":
        bound_eager = probable_bounds(reference, x, y, same_matmuls=True,
                                      logits_difference=measured)
    else:
        bound_eager = bounds(reference, x, y, same_matmuls=True, rounding=rounding,
                             logits_difference=measured)
    for key, value in eager.items():  # S in the compared dtype's eps (bfloat16 logits)
        bound_eager[key] = bound_eager[key] * EPS32 / eps_of(value.dtype)
    reference_run = run_reference(reference, x, y)
    measured = np.abs(compiled["output"].astype(np.float64) - reference_run["output"])
    return Numerics(compiled, eager, reference_run, bound_eager,
                    probable_bounds(reference, x, y, logits_difference=measured),
                    compiled_backward)


def held_to_eager(eager_model: torch.nn.Module, compiled_model: torch.nn.Module,
                  case: Case, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """compile.eager on a given pair of MLPs of `case`'s sizes and activation with equal
    weights, one compiled however the caller compiled it (the optimize gauntlet's
    compiled_forward): forward, cross-entropy (eager on both sides) and backward on (x, y).
    (worst |a - b| / (eps S) over logits, loss and gradients, values compared)."""
    reference = ref.make_mlp(case.sizes, case.activation, rng=np.random.default_rng(0))
    reference.load_state_dict(tstate.state_dict_from_torch(eager_model.state_dict()))
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward_loss(model: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, ...]]:
        def fn(xt: torch.Tensor, yt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            output = model(xt)
            return loss_fn(output, yt), output
        return fn

    eager = run_torch(forward_loss(eager_model), eager_model, x, y)
    compiled = run_torch(forward_loss(compiled_model), compiled_model, x, y)
    measured = np.abs(compiled["output"].astype(np.float64) - eager["output"])
    bound = probable_bounds(reference, x, y, same_matmuls=True, logits_difference=measured)
    c = claim("compile.eager")
    worst = max(measure(c, compiled[k], eager[k], scale=bound[k]) for k in eager)
    return worst, sum(v.size for v in eager.values())


def train_step_pair(case: Case = SMALL, lr: float = 0.5, backend: str = "inductor"
                    ) -> tuple[Results, Results, Results]:
    """One fp32 SGD step (no clipping) by train.train_step eager and compiled
    (compile_train_step), from the same weights and batch: (eager, compiled, S) with the
    updated parameters and the step's loss, S in float32 eps:

        p' = p - lr g, both sides:  |p'_c - p'_e| <= lr E_g + eps (|p'| + lr |g|)

    (the same kernel on gradients that differ by E_g, compile.eager's bound: its product
    lr g and its subtraction may each round one ulp apart).
    """
    from torch_impl.loss_scaling import make_scaler
    from torch_impl.train import train_step

    results = []
    for step in (train_step, tc.compile_train_step(backend=backend)):
        model, reference, x, y = build(case)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        with expected_breaks_quiet():
            r = step(model, torch.nn.CrossEntropyLoss(), optimizer, make_scaler("fp32"),
                     torch.from_numpy(x), torch.from_numpy(y), precision="fp32")
        out = {k: as_numpy(p) for k, p in model.named_parameters()}
        out["loss"] = np.asarray(r.loss, dtype=np.float32)
        results.append(out)
    eager, compiled = results
    grads = run_reference(reference, x, y)
    bound = bounds(reference, x, y, same_matmuls=True)
    scale = {k: lr * bound[k] + np.abs(eager[k]) + lr * np.abs(grads[k])
             for k in eager if k != "loss"}
    scale["loss"] = bound["loss"]
    return eager, compiled, scale


@contextlib.contextmanager
def expected_breaks_quiet() -> Iterator[None]:
    """Dynamo's warnings held back while a step that is meant to break runs (the
    `.item()` hint, the ignored record_function): the breaks are this claim's subject,
    counted by compile.breaks, not news for the report's reader."""
    loggers = [logging.getLogger(name) for name in ("torch._dynamo", "torch._logging")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def names(model: torch.nn.Module) -> Sequence[str]:
    """The compared entries: loss, output, then every parameter's gradient."""
    return ("loss", "output", *(k for k, _ in model.named_parameters()))


# ---------------------------------------------------------------- guards and recompiles

# (batch, sequence) of successive calls: the batch changes, then the sequence, then both
SHAPES: tuple[tuple[int, int], ...] = ((4, 3), (8, 3), (8, 5), (16, 7))
MODES = ("static", "automatic", "mark_dynamic", "dynamic")


def shape_calls(case: Case = SMALL) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x (B, T, d_in), classes (B, T)) for every (B, T) of SHAPES, from case.seed."""
    g = torch.Generator().manual_seed(case.seed)
    return [(torch.randn(b, t, case.sizes[0], generator=g),
             torch.randint(0, case.sizes[-1], (b, t), generator=g)) for b, t in SHAPES]


def count_shape_recompiles(mode: str, case: Case = SMALL, backend: str = "eager"
                           ) -> tc.Recompiles:
    """Compilations of forward_loss over SHAPES under one mode:

        static        dynamic=False: every new shape fails a size guard and compiles again
        automatic     dynamic=None (the default): the first failure of a size guard
                      compiles again with that size symbolic; later sizes reuse it
        mark_dynamic  torch._dynamo.mark_dynamic on batch and sequence before each call
        dynamic       dynamic=True: every size symbolic from the first capture

    Guards belong to Dynamo, before any backend: "eager" (the default here) counts the same
    recompiles as "inductor" without paying for code generation.
    """
    if mode not in MODES:
        raise ValueError(f"count_shape_recompiles: mode must be one of {MODES}, got {mode!r}")
    model = tnn.make_mlp(case.sizes, case.activation,
                         generator=torch.Generator().manual_seed(case.seed))
    dynamic = {"static": False, "automatic": None, "mark_dynamic": None, "dynamic": True}[mode]
    fn = tc.compile_forward_loss(model, torch.nn.CrossEntropyLoss(), backend=backend,
                                 dynamic=dynamic)
    marks = {0: (0, 1), 1: (0, 1)} if mode == "mark_dynamic" else None
    return tc.count_recompiles(fn, shape_calls(case), mark_dynamic=marks)


def expected_graphs(mode: str) -> int:
    """What NOTE [ What torch.compile does ] predicts for SHAPES: one graph per distinct
    shape (static); one, plus one for each first change of a dimension (automatic: batch at
    the 2nd call, sequence at the 3rd); one (mark_dynamic, dynamic)."""
    if mode == "static":
        return len(set(SHAPES))
    if mode == "automatic":
        changed = {d for a, b in itertools.pairwise(SHAPES) for d in (0, 1) if a[d] != b[d]}
        return 1 + len(changed)
    return 1
