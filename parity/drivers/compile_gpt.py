"""The compact transformer compiled, eager and in the reference on one batch (claims
compile.gpt_eager, compile.gpt_reference, compile.gpt_bf16), and its recompiles over batch
sizes and sequence lengths (compile.gpt_recompiles).

The bound is parity/claims/compile_gpt_bounds.py's (NOTE [ Probable bounds by probes ]);
the compiled model is torch_impl.compile.compile_gpt_forward's (the instance compiled as it
is, fullgraph, the token check an assertion in the graph).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

from common.gpt_config import TRAIN_SHAPE, GPTConfig
from parity.claims.compile_gpt_bounds import EPS32, Results, probe_bounds
from parity.compare import measure
from parity.drivers import gpt as dg
from parity.drivers.nn import to_numpy
from parity.tolerances import claim
from torch_impl import compile as tc
from torch_impl import gpt as tgpt

Fault = Callable[[tgpt.GPT], None]  # breaks a model in place (the mutation tests' faults)


# NOTE [ torch 2.6's compiled token-embedding gradient ]
# torch 2.6's Inductor on CPU returns a wrong gradient of the token embedding: the row of a
# token that occurs more than once in the batch does not hold the sum of its occurrences'
# contributions (measured: only the rows of tokens occurring once agree with eager; aot_eager
# agrees everywhere, so it is Inductor's code for the embedding backward). torch 2.11 and
# 2.13 are right. The position embedding is right on every version: its rows are summed
# over the batch before the embedding backward, whose indices are then distinct. Under
# torch before WTE_GRAD_RIGHT the claims compile.gpt_* leave that one gradient out and
# require it to be wrong (beyond the bound), so a fixed or a newly broken version shows.
WTE = "transformer.wte.weight"
WTE_GRAD_RIGHT = (2, 11)  # the first measured version whose compiled gradient is right
TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def claimed(entries: Iterable[str]) -> list[str]:
    """The compared entries the compile.gpt_* claims cover under this torch."""
    return [k for k in entries if not (k == WTE and TORCH < WTE_GRAD_RIGHT)]


@dataclass(frozen=True)
class GptCase:
    """One batch for one transformer: its shape (dropout off: the compiled graph draws its
    own masks), batch, sequence length, seed of weights and tokens."""

    config: GPTConfig = field(default_factory=lambda: TRAIN_SHAPE)
    batch: int = 4
    seq_len: int = 16
    seed: int = 1

    def __str__(self) -> str:
        c = self.config
        return (f"GPT {c.n_layer} blocks, width {c.n_embd}, {c.n_head} heads, vocab "
                f"{c.vocab_size}, batch {self.batch} x {self.seq_len} tokens, seed {self.seed}")


GPT_SMALL = GptCase()  # `train --model gpt`'s shape, one full block of tokens
# the Inductor claims' model: one block of the same shape has every operation kind of the
# four (embeddings, LayerNorm, attention's products, scale, mask and softmax, GELU, the
# residual adds, the head and the loss), hence the same kinds of fused kernel, and compiles
# in about a third of the time (Inductor's code generation and the C++ builds scale with
# the blocks; the faults of the mutation tests sit in blocks 1-3 and keep GPT_SMALL)
GPT_COMPILED = GptCase(replace(TRAIN_SHAPE, n_layer=1))
# the recompile counts' model: one block, since guards are on the tokens' sizes, which
# every block shares (4 blocks capture the same guards, 4 times slower)
GUARDED = GptCase(replace(TRAIN_SHAPE, n_layer=1))


def run(model: tgpt.GPT, idx: np.ndarray, targets: np.ndarray, precision: str = "fp32"
        ) -> Results:
    """Logits, loss and every parameter gradient of one forward (under autocast for "bf16")
    and backward, copied out (a gradient's memory is the next run's)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits, loss = model(dg.to_torch_tokens(idx), dg.to_torch_tokens(targets))
    loss.backward()
    out = {"output": to_numpy(logits.detach().float()).astype(
        np.float32 if precision == "fp32" else _bf16()),
        "loss": to_numpy(loss.detach())}
    out.update({k: to_numpy(p.grad).copy() for k, p in model.named_parameters()})
    return out


def _bf16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def state_of(model: tgpt.GPT) -> dict[str, np.ndarray]:
    """The parameters as float32 arrays by name (the causal masks are buffers, not state)."""
    return {k: to_numpy(p.detach()) for k, p in model.named_parameters()}


@dataclass(frozen=True)
class GptNumerics:
    """One case compiled, eager and (float32) in the reference, with the probe bound S (in
    eps of each compared value's dtype) and whether the backward ran compiled code."""

    compiled: Results
    eager: Results
    reference: Results | None
    bound: Results
    compiled_backward: bool


def numerics(case: GptCase = GPT_SMALL, precision: str = "fp32", backend: str = "inductor",
             fault: Fault | None = None) -> GptNumerics:
    """Run `case` eager and compiled (compile_gpt_forward on a second instance with equal
    weights; `fault` breaks that instance first, for the mutation tests), and in the
    reference for float32; bound every entry (compile_gpt_bounds.probe_bounds)."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"numerics: precision must be 'fp32' or 'bf16', got {precision!r}")
    config = replace(case.config, dropout=0.0)
    reference, eager_model = dg.make_pair(config, np.float32, case.seed)
    _, compiled_model = dg.make_pair(config, np.float32, case.seed)
    idx, targets = dg.tokens(config, case.batch, case.seq_len, case.seed)
    eager = run(eager_model, idx, targets, precision)
    if fault is not None:
        fault(compiled_model)
    tc.compile_gpt_forward(compiled_model, backend=backend)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        _, loss = compiled_model(dg.to_torch_tokens(idx), dg.to_torch_tokens(targets))
    compiled_backward = "CompiledFunction" in type(loss.grad_fn).__name__
    compiled = run(compiled_model, idx, targets, precision)
    ref = None
    if precision == "fp32":
        logits, ref_loss, grads = dg.run_ref(reference, idx, targets, {})
        ref = {"output": logits, "loss": ref_loss, **grads}
    bound = probe_bounds(state_of(eager_model), config, idx, targets,
                         lp=precision, seed=case.seed).scale
    return GptNumerics(compiled, eager, ref, bound, compiled_backward)


def ratios(got: Results, want: Results, bound: Results) -> dict[str, float]:
    """Per entry: the worst |got - want| / (eps S), eps of the entry's dtype."""
    out = {}
    for k in want:
        eps = float(np.finfo(np.float32).eps) if got[k].dtype.itemsize == 4 else 2.0 ** -7
        d = np.abs(got[k].astype(np.float64) - want[k].astype(np.float64)) / eps
        out[k] = float(np.max(d / np.maximum(bound[k], np.finfo(np.float64).tiny)))
    return out


def held_to_eager(eager_model: tgpt.GPT, compiled_model: tgpt.GPT, loss_fn: torch.nn.Module,
                  idx: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
    """compile.gpt_eager on a given pair of transformers with equal weights, one compiled
    however the caller compiled it (the optimize gauntlet's), each run as train_step runs
    it: logits = model(idx)[0], loss_fn((logits, None), targets), backward.
    (worst |a - b| / (eps S) over logits, loss and gradients, values compared)."""
    results = []
    for model in (eager_model, compiled_model):
        model.zero_grad(set_to_none=True)
        output = model(dg.to_torch_tokens(idx))
        loss = loss_fn(output, dg.to_torch_tokens(targets))
        loss.backward()
        out = {"output": to_numpy(output[0].detach()), "loss": to_numpy(loss.detach())}
        out.update({k: to_numpy(p.grad).copy() for k, p in model.named_parameters()})
        results.append(out)
    eager, compiled = results
    bound = probe_bounds(state_of(eager_model), eager_model.config, idx, targets).scale
    c = claim("compile.gpt_eager")
    worst = max(measure(c, compiled[k], eager[k], scale=bound[k]) for k in eager)
    return worst, sum(v.size for v in eager.values())


# ---------------------------------------------------------------- guards and recompiles

# (batch, sequence) of successive calls: the batch changes, then the sequence, then both
GPT_SHAPES: tuple[tuple[int, int], ...] = ((4, 3), (8, 3), (8, 5), (16, 7))
MODES = ("static", "automatic", "mark_dynamic", "dynamic")


def shape_calls(case: GptCase = GUARDED) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(idx, targets), int64 (B, T) each, for every (B, T) of GPT_SHAPES."""
    g = torch.Generator().manual_seed(case.seed)
    v = case.config.vocab_size
    return [(torch.randint(0, v, (b, t), generator=g), torch.randint(0, v, (b, t), generator=g))
            for b, t in GPT_SHAPES]


def count_shape_recompiles(mode: str, case: GptCase = GUARDED, backend: str = "eager"
                           ) -> tc.Recompiles:
    """Compilations of the transformer's forward + loss over GPT_SHAPES under one mode
    (parity/drivers/compile.py's count_shape_recompiles for the modes); "mark_dynamic" marks
    batch and sequence of idx and targets before each call. Dynamo's guards, before any
    backend: "eager" counts what "inductor" would."""
    if mode not in MODES:
        raise ValueError(f"count_shape_recompiles: mode must be one of {MODES}, got {mode!r}")
    config = replace(case.config, dropout=0.0)
    model = tgpt.GPT(config, generator=torch.Generator().manual_seed(case.seed))
    dynamic = {"static": False, "automatic": None, "mark_dynamic": None, "dynamic": True}[mode]
    tc.compile_gpt_forward(model, backend=backend, dynamic=dynamic)
    marks = {0: (0, 1), 1: (0, 1)} if mode == "mark_dynamic" else None
    return tc.count_recompiles(model, shape_calls(case), mark_dynamic=marks)


def expected_graphs(mode: str) -> int:
    """NOTE [ What torch.compile does ] on GPT_SHAPES: one graph per distinct shape (static);
    one plus one per first change of a dimension (automatic); one (mark_dynamic, dynamic)."""
    if mode == "static":
        return len(set(GPT_SHAPES))
    if mode == "automatic":
        changed = {d for a, b in itertools.pairwise(GPT_SHAPES) for d in (0, 1) if a[d] != b[d]}
        return 1 + len(changed)
    return 1


def full_block_calls(case: GptCase = GUARDED) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(idx, targets) of (4, 5) tokens, then (4, block_size): a full block after a short one."""
    g = torch.Generator().manual_seed(case.seed)
    v, block = case.config.vocab_size, case.config.block_size
    return [(torch.randint(0, v, (4, t), generator=g), torch.randint(0, v, (4, t), generator=g))
            for t in (5, block)]


def count_full_block(mode: str, case: GptCase = GUARDED) -> tc.Recompiles | str:
    """Compilations over full_block_calls with dynamic=True ("dynamic") or mark_dynamic on
    batch and sequence ("mark_dynamic"); the exception's class name where Dynamo refuses (a
    marked dimension specialized to a constant: what a mask sliced from a (block, block)
    buffer did, NOTE [ The mask is built for T ])."""
    if mode not in ("dynamic", "mark_dynamic"):
        raise ValueError(f"count_full_block: mode must be 'dynamic' or 'mark_dynamic', got "
                         f"{mode!r}")
    model = tgpt.GPT(replace(case.config, dropout=0.0),
                     generator=torch.Generator().manual_seed(case.seed))
    tc.compile_gpt_forward(model, backend="eager", dynamic=True if mode == "dynamic" else None)
    marks = {0: (0, 1), 1: (0, 1)} if mode == "mark_dynamic" else None
    guards_log = logging.getLogger("torch._guards")  # logs the violation before raising it
    level = guards_log.level
    guards_log.setLevel(logging.CRITICAL)
    try:
        return tc.count_recompiles(model, full_block_calls(case), mark_dynamic=marks)
    except ConstraintViolationError as exc:
        return type(exc).__name__
    finally:
        guards_log.setLevel(level)


__all__ = ["EPS32", "GPT_COMPILED", "GPT_SHAPES", "GPT_SMALL", "GUARDED", "MODES", "TORCH",
           "WTE", "WTE_GRAD_RIGHT", "GptCase", "GptNumerics", "claimed", "count_full_block",
           "count_shape_recompiles", "expected_graphs", "full_block_calls",
           "held_to_eager", "numerics", "ratios", "run", "shape_calls", "state_of"]
