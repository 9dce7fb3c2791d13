"""torch.compile as a mechanism: what it captures, where the capture breaks, when it compiles
again. There is no reference twin: compiling is PyTorch's business, and what a compiled
model must preserve is the math of reference/nn.py and reference/train.py (held by
parity/test_compile.py, claims in parity/claims/compile.py).

NOTE [ What torch.compile does ]
1. Capture. Dynamo runs the function's Python bytecode symbolically and records the torch
   operations it meets into an FX graph. Python that only steers the recording (loops over
   layers, attribute lookups, `if self.training`) is evaluated once, at capture time.
2. Guards. Everything the capture assumed (tensor dtypes, devices, sizes, strides,
   requires_grad, Python values it read) becomes a guard; each later call checks the guards
   and runs the cached graph, or, when one fails, captures again: a recompile. A size that
   changes fails a size guard. With `dynamic=None` (the default, "automatic dynamic") the
   first such failure re-captures with that size symbolic, so a second new size no longer
   recompiles; `dynamic=False` recompiles for every new size; `dynamic=True` or
   `torch._dynamo.mark_dynamic(x, dim)` before the first call make sizes symbolic at once.
   Sizes 0 and 1 are always specialized. The number of versions kept per function is capped
   (`torch._dynamo.config.recompile_limit`, 8; named `cache_size_limit` before torch 2.7);
   past it the function runs eagerly.
3. Graph breaks. What Dynamo cannot record (a value Python needs now: `.item()` feeding
   Python, `if tensor:`, a NumPy call on a tensor's data, an op whose output shape depends
   on the data, `print`, `.backward()`, a C function it does not model) ends the graph: the
   graph so far is compiled, the offending code runs eagerly, and capture resumes after it
   in a new frame. `fullgraph=True` turns a break into an error. Each break costs a graph
   boundary: no fusion across it, a round trip through Python, more guards.
4. Lowering. AOTAutograd traces the backward of the captured graph ahead of time (forward
   and backward become two graphs, and the forward saves what the backward needs, possibly
   recomputing cheap pointwise ops instead); Inductor turns each graph into kernels, C++
   with OpenMP and SIMD on CPU (built by the system's C++ compiler), Triton on CUDA, fusing
   pointwise operations and reductions into single loops. Matrix products go to extern
   kernels (BLAS/oneDNN, cuBLAS) or, with max_autotune, to Inductor's own templates.

NOTE [ Compiled numerics ]
Fusion changes WHERE values are rounded and IN WHAT ORDER sums are taken, never the formula:
a fused log_softmax sums its exponentials in another order, a Linear's bias may be added in
an epilogue after the matrix product instead of inside the BLAS call, the generated C++ may
contract a*b+c into one FMA, and a vectorized loop evaluates exp/erf/tanh with the same
SIMD routines as ATen (its scalar tail with libm). Each of those is an evaluation of the
same operation within the per-operation error bounds the nn claims already derive for two
implementations of it (any summation order: Higham's gamma_k; elementwise functions within
their stated ulps). So compiled vs eager, and compiled vs the reference, obey the same
first-order bounds propagated through the network (parity/claims/compile_bounds.py: the
worst case, and 6 sigma with rounding errors as independent random variables), not a new
empirical tolerance, with one saving against eager: a matrix product on operands equal on
both sides runs the same extern kernel and is bit-identical (the first Linear's forward).
Under autocast, Inductor keeps autocast's casts as explicit converts in the graph, so a
bfloat16 value stored between kernels is rounded to bfloat16 where eager rounds it: values
that differ before that rounding may land one bfloat16 ulp apart (parity/drivers/compile.py
adds it). Between two low-precision pointwise operations fused into one loop, Inductor
elides the downcast-upcast pair (torch._inductor.config.emulate_precision_casts, off by
default): the intermediate stays float32 where eager rounds it, one more ulp at most. The
MLP has no such pair (each GELU sits between two extern products); the transformer's
attention scale, mask and softmax are one (compile.gpt_bf16 allows an ulp at every
autocast rounding).

What the compiled training step captures (train.train_step under torch.compile): the
autocast forward and loss (one graph), the gradient clipping (one graph), the optimizer's
update; `.backward()`, GradScaler's Python and `.item()` break it (explain() lists them).
The backward still runs compiled: AOTAutograd compiled it with the forward graph.

NOTE [ The token check compiles ]
GPT.forward (torch_impl/gpt.py) begins with check_tokens. Its dtype and shape checks read
only what Dynamo guards anyway (dtype, rank, sizes), so they cost guards, not breaks; a
wrong dtype or shape raises while capturing (with fullgraph=True as Dynamo's Unsupported
"Observed exception" at check_tokens' line, from torch 2.13 with the ValueError as its
cause; without, the frame falls back to eager, which raises the ValueError itself). The
range check cannot read the tokens' minimum and maximum as Python numbers: that is a
data-dependent branch (fullgraph refuses it, "Could not guard on data-dependent expression";
without fullgraph the `.item()` reads break the graph three times). Under
torch.compiler.is_compiling() it is instead an assertion recorded in the graph,
torch._assert_async(all(0 <= idx < vocab_size), message): the forward captures as one graph,
and a bad token raises RuntimeError with the message "GPT: idx token ids must lie in [0,
vocab_size=V)" when the graph runs (eager's ValueError also names the range it got, which
the graph cannot format). Version-gated: Inductor before torch 2.11 drops the assertion from
its generated code (measured on 2.6; backends "eager" and "aot_eager" keep it on every
version), and a bad token then reaches the embedding's own bounds check in the generated
code ("index out of bounds"). So torch.compile(model.forward, fullgraph=True) and
model.compile() work on GPT as it is.

NOTE [ The mask is built for T ]
The attention core builds its (1, 1, T, T) causal mask for the sequence length at hand
(torch_impl/attention.py). Sliced from a (block, block) buffer, `bias[:, :, :T, :T]` is
contiguous exactly when T = block_size, so Dynamo's symbolic shapes guarded T != block_size
(in check_contiguous_sizes_strides): a full block after shorter sequences compiled a second
graph even with dynamic=True, and mark_dynamic on a full block was refused
(ConstraintViolationError). Built for T, the mask carries no such guard; its values, and so
every output, are bit for bit the slice's, and autograd saves the same fresh (1, 1, T, T)
bool tensor it saved for the slice's negation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torch_impl import amp

# NOTE [ The token check compiles ]: the first measured torch whose Inductor keeps the
# token range assertion in its generated code (2.6 drops it)
TOKEN_ASSERT_KEPT = (2, 11)

ForwardLoss = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def forward_loss(model: nn.Module, loss_fn: nn.Module, precision: str = "fp32") -> ForwardLoss:
    """(x, y) -> (loss, output): the model's forward under autocast(precision) and the loss
    in float32, as train_step's forward phase. Leading dimensions of the output (batch,
    sequence) are flattened for the loss: (B, T, C) logits with (B, T) classes work."""
    dtype = amp.autocast_dtype(precision)

    def step_forward(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with amp.autocast(dtype, x.device.type):
            output = model(x)  # (..., C)
            flat_y = y.flatten() if y.dim() < output.dim() else y.flatten(0, -2)
            loss = loss_fn(output.flatten(0, -2), flat_y)  # fp32 op list: float32 loss
        return loss, output

    return step_forward


def compile_forward_loss(model: nn.Module, loss_fn: nn.Module, *, precision: str = "fp32",
                         backend: str = "inductor", dynamic: bool | None = None,
                         fullgraph: bool = True) -> ForwardLoss:
    """forward_loss compiled: one graph (fullgraph=True makes any break an error), its
    backward compiled by AOTAutograd with it, so `loss.backward()` runs compiled kernels."""
    return torch.compile(forward_loss(model, loss_fn, precision), backend=backend,
                         dynamic=dynamic, fullgraph=fullgraph)


def compile_train_step(*, backend: str = "inductor", dynamic: bool | None = None
                       ) -> Callable[..., Any]:
    """train.train_step compiled where it can be: fullgraph=False, because `.backward()`,
    GradScaler and `.item()` break it (NOTE [ What torch.compile does ]); same signature."""
    from torch_impl.train import train_step

    return torch.compile(train_step, backend=backend, dynamic=dynamic, fullgraph=False)


def compile_gpt_forward(model: nn.Module, *, backend: str = "inductor",
                        dynamic: bool | None = None, fullgraph: bool = True) -> nn.Module:
    """The transformer compiled in place, nn.Module.compile: GPT's forward as it is, one
    graph with the token check in it (NOTE [ The token check compiles ]); keys, parameters
    and buffers are the instance's own. Returns the model."""
    from torch_impl.gpt import GPT

    if not isinstance(model, GPT):
        raise TypeError(f"compile_gpt_forward: a torch_impl.gpt.GPT, got {type(model).__name__}")
    model.compile(backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    return model


# ---------------------------------------------------------------- explaining a capture

@dataclass(frozen=True)
class Explanation:
    """What Dynamo captured of one call: torch._dynamo.explain, in plain values.

    graph_count: graphs captured; graph_break_count: graph_count - 1, torch's own figure (a
    break followed by no torch op leaves no second graph and is not counted there);
    break_reasons: (first line of the reason, "file:line" of the user code) per break, every
    break listed, counted or not; ops_per_graph: operations recorded in each graph.
    """

    graph_count: int
    graph_break_count: int
    break_reasons: tuple[tuple[str, str], ...]
    ops_per_graph: tuple[int, ...]


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Explanation:
    """Capture `fn(*args, **kwargs)` with torch._dynamo.explain and summarize it.

    explain(fn)(*args) is the form in every supported torch (2.6 on; explain(fn, *args) is
    deprecated). The reasons' wording changed: 2.6 gives one line ("generic_jump
    TensorVariable()"), 2.11 on a paragraph with an explanation and hints; the first line
    is kept, which names the cause in both.
    """
    out = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons = []
    for r in out.break_reasons:
        frame = r.user_stack[-1] if r.user_stack else None
        where = "" if frame is None else f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
        reasons.append((str(r.reason).strip().splitlines()[0], where))
    return Explanation(out.graph_count, out.graph_break_count, tuple(reasons),
                       tuple(len(ops) for ops in out.ops_per_graph))


# ---------------------------------------------------------------- guards and recompiles

@dataclass(frozen=True)
class Recompiles:
    """Compilations of one function over a sequence of calls, from torch's own counters.

    graphs: torch._dynamo.utils.counters["stats"]["unique_graphs"] (graphs compiled; one per
    compile for a function without breaks); failed_guards: the guard failures Dynamo
    recorded (torch._dynamo.utils.guard_failures), one line each, in order: why each
    recompile happened ("tensor 'x' size mismatch at index 0. expected 4, actual 8";
    torch 2.6 spells the tensor L['x']).
    """

    graphs: int
    failed_guards: tuple[str, ...]


def count_recompiles(fn: Callable[..., Any], calls: Iterable[Sequence[torch.Tensor]], *,
                     mark_dynamic: dict[int, Sequence[int]] | None = None) -> Recompiles:
    """Call an already compiled `fn` on each argument tuple of `calls`, counting compiles.

    `mark_dynamic` maps an argument position to the dimensions to mark dynamic
    (torch._dynamo.mark_dynamic) on every call's tensors. Dynamo's caches and counters are
    reset first (torch._dynamo.reset), so the count is this sequence's alone.
    """
    from torch._dynamo import utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    dynamo_utils.guard_failures.clear()
    for args in calls:
        for position, dims in (mark_dynamic or {}).items():
            for dim in dims:
                torch._dynamo.mark_dynamic(args[position], dim)
        fn(*args)
    failed = tuple(line for lines in dynamo_utils.guard_failures.values() for line in lines)
    return Recompiles(int(dynamo_utils.counters["stats"]["unique_graphs"]), failed)
