"""Running the MLP compiled, eager and in the reference on one batch, and the first-order
error bounds of the compile claims (parity/claims/compile.py).

NOTE [ Compiled numerics ] (torch_impl/compile.py) says why one bound covers compiled vs
eager and compiled vs the reference: each compiled operation is another evaluation of the
same operation, inside the per-operation bounds the nn claims derive. This module
propagates those per-operation bounds through the network, forward and then backward:

    forward   Linear   E_out = E_in |W|^T + eps (k + 1)(|x| |W|^T + |b|)       (nn.linear)
              act f    E_out = L E_in + c eps S_f(x)            (nn.tanh/gelu.forward, L = max|f'|)
    loss      CE mean  E_l = (1/N) sum |p - onehot| E_z + eps S_ce               (nn.cross_entropy)
    backward  CE grad  E_G = p (E_z + sum_c p E_z) / N + eps S_ce'   (d softmax = p (dz - p.dz))
              Linear   E_dx = E_G |W| + eps (m + 1) |G||W|
                       E_dW = E_G^T |x| + |G|^T E_x + eps (N + 1) |G|^T |x|
                       E_db = sum_n E_G + eps (N + 1) sum_n |G|
              act f    E_dx = L E_G + M |G| E_x + c' eps S_f'(x)     (M = max|f''|)
              ReLU     E_dx = E_G [x > 0] + |G| [|x| <= E_x]   (a flipped sign flips the gate)

Compiled vs eager (same_matmuls): a product both sides run with the same kernel on equal
operands is equal, so its eps term is dropped where every operand it reads has E = 0.

E are absolute errors on the difference of two evaluations (each per-operation claim
already bounds a difference of two sides), G the reference's gradient at a layer's output,
first order (products of two errors, O(eps^2), are dropped). Everything is float64 on the
reference's float32 values; bounds are returned in units of float32 eps, as `scale=` of an
eps claim with bound 1.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from parity.compare import as_numpy, eps_of, measure
from parity.drivers.nn import LIPSCHITZ, activation_claims, activation_scales, ce_scales
from parity.tolerances import claim
from reference import losses as rloss
from reference import nn as ref
from torch_impl import compile as tc
from torch_impl import nn as tnn

# max |f''|: GELU'' = phi(x)(2 - x^2) peaks at 2 phi(0) = 0.79788 (tanh form: the same at 0
# and below it elsewhere); tanh'' = -2 tanh sech^2 peaks at 4 / (3 sqrt 3) = 0.76980.
CURVATURE = {"GELU": 0.8, "Tanh": 0.77}
EPS32 = float.fromhex("0x1p-23")  # float32 machine epsilon


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
    reference.load_state_dict(tnn.state_dict_from_torch(model.state_dict()))
    rng = np.random.default_rng(case.seed)
    x = rng.standard_normal((case.batch, case.sizes[0])).astype(np.float32)
    y = rng.integers(0, case.sizes[-1], case.batch)
    return model, reference, x, y


Results = dict[str, np.ndarray]  # "loss", "output", and one entry per parameter name


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


def bounds(model: ref.Sequential, x: np.ndarray, y: np.ndarray, *,
           same_matmuls: bool = False, rounding: float = 0.0,
           logits_difference: np.ndarray | None = None) -> Results:
    """The first-order bound on |a - b| for every entry of Results, in float32 eps
    (module docstring); `model` is the reference with the compared weights.

    same_matmuls: both sides run every matrix product with the same kernel (compiled vs
    eager on CPU: NOTE [ Compiled numerics ]), so a dot product whose operands are equal on
    both sides is equal: its eps (k + 1) term is dropped where all its operands carry zero
    error (the first Linear's forward). Where an operand differs, the same kernel's rounding
    errors on the two inputs are unrelated, and the term stays.

    rounding: the eps of autocast's dtype (bfloat16: 2^-7), or 0 for float32. Under
    autocast every Linear and activation output, and every activation gradient, weight and
    bias gradient is rounded to it; two values that differ before a rounding may round one
    ulp apart, so each rounding adds rounding |v| where its input's E > 0 (|v| from the
    float32 reference: the bfloat16 run's magnitudes differ by O(rounding), second order).

    logits_difference: the measured |z_a - z_b| of the two sides' logits. The loss is a
    function of the logits alone, so its bound may start from what the logits really
    differ by instead of their propagated bound (the compiled graph hides the activations
    in between, not its output).
    """
    eps = EPS32

    def flip(v: np.ndarray, e: np.ndarray) -> np.ndarray:
        return e + rounding * np.abs(v) * (e > 0)

    def mm(*errors: np.ndarray) -> np.ndarray | float:
        """eps where a product with operands of these errors rounds differently (masks)."""
        if not same_matmuls:
            return eps
        differs = functools.reduce(np.logical_or, [e > 0 for e in errors])  # broadcast
        return eps * differs.astype(np.float64)

    layers = list(model)
    xs, es = [x.astype(np.float64)], [np.zeros(x.shape)]
    for layer in layers:  # forward: activations and their error bounds
        a = xs[-1].astype(np.float32)
        out = layer.forward(a)
        row_differs = (es[-1] > 0).any(-1, keepdims=True)  # (N, 1)
        e_out = _forward_error(layer, a, out, es[-1], eps, mm(row_differs))
        es.append(e_out if isinstance(layer, ref.ReLU) else flip(out, e_out))
        xs.append(out.astype(np.float64))
    model.free_saved()
    z, e_z = xs[-1], es[-1]
    n, classes = z.shape
    onehot = np.eye(classes)[y]
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    p = np.exp(logp)
    loss_fn = rloss.CrossEntropyLoss("mean")
    loss_fn(xs[-1].astype(np.float32), y)
    dz = loss_fn.backward(np.float32(1.0))
    s_loss, s_grad = ce_scales("mean", xs[-1].astype(np.float32), y, np.float32(1.0), dz)
    e_in = e_z if logits_difference is None else logits_difference.astype(np.float64)
    result = {"output": e_z / eps,
              "loss": np.asarray((np.abs(p - onehot) * e_in).sum() / n / eps + s_loss)}
    g = (p - onehot) / n  # (N, C)
    e_g = flip(g, p * (e_z + (p * e_z).sum(-1, keepdims=True)) / n + eps * s_grad)
    for i in reversed(range(len(layers))):
        layer, a, e_a = layers[i], xs[i], es[i]
        if isinstance(layer, ref.Linear):
            w = layer.weight.data.astype(np.float64)
            aw, ag, aa = np.abs(w), np.abs(g), np.abs(a)
            pair = mm((e_g > 0).any(0)[:, None], (e_a > 0).any(0)[None, :])  # (out, in)
            e_w = e_g.T @ aa + ag.T @ e_a + pair * (n + 1) * (ag.T @ aa)
            result[f"{i}.weight"] = flip(ag.T @ aa, e_w) / eps
            if layer.bias is not None:
                e_b = e_g.sum(0) + eps * (n + 1) * ag.sum(0)
                result[f"{i}.bias"] = flip(ag.sum(0), e_b) / eps
            row = mm((e_g > 0).any(-1, keepdims=True))  # (N, 1)
            e_g = flip(ag @ aw, e_g @ aw + row * (layer.out_features + 1) * (ag @ aw))
            g = g @ w
        else:
            e_g, g = _backward_error(layer, a, e_a, g, e_g, eps)
            e_g = e_g if isinstance(layer, ref.ReLU) else flip(g, e_g)
    return result


def _forward_error(layer: ref.Module, x: np.ndarray, y: np.ndarray, e: np.ndarray,
                   eps: float, mm: np.ndarray | float) -> np.ndarray:
    ax = np.abs(x.astype(np.float64))
    if isinstance(layer, ref.Linear):
        w = np.abs(layer.weight.data.astype(np.float64))
        b = 0.0 if layer.bias is None else np.abs(layer.bias.data.astype(np.float64))
        return e @ w.T + mm * (layer.in_features + 1) * (ax @ w.T + b)
    if isinstance(layer, ref.ReLU):
        return e
    if isinstance(layer, ref.GELU | ref.Tanh):
        c = float(claim(activation_claims(layer)[0]).bound)  # type: ignore[arg-type]
        s = activation_scales(layer, x, y, np.zeros_like(x))[0]
        return LIPSCHITZ[type(layer).__name__] * e + c * eps * s
    raise TypeError(f"bounds: no compile bound for {layer!r} (Linear, ReLU, Tanh, GELU only; "
                    "dropout's mask is random per call and has no compiled twin here)")


def _backward_error(layer: ref.Module, x: np.ndarray, e_x: np.ndarray, g: np.ndarray,
                    e_g: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(E_dx, dx) through an activation, for the incoming gradient g with error e_g."""
    x32 = x.astype(np.float32)
    layer.forward(x32)
    dx = layer.backward(g.astype(np.float32)).astype(np.float64)
    if isinstance(layer, ref.ReLU):
        return e_g * (x > 0) + np.abs(g) * (np.abs(x) <= e_x), dx
    name = type(layer).__name__
    c = float(claim(activation_claims(layer)[1]).bound)  # type: ignore[arg-type]
    s = activation_scales(layer, x32, x32, g)[1]
    return LIPSCHITZ[name] * e_g + CURVATURE[name] * np.abs(g) * e_x + c * eps * s, dx


@dataclass(frozen=True)
class Numerics:
    """One case run three ways, with both bounds (in float32 eps) and whether the compiled
    backward really ran (its grad_fn is AOTAutograd's CompiledFunctionBackward)."""

    compiled: Results
    eager: Results
    reference: Results
    bound_eager: Results  # S of compile.eager (matrix products shared)
    bound_reference: Results  # S of compile.reference
    compiled_backward: bool


def numerics(case: Case = SMALL, device: str = "cpu", backend: str = "inductor",
             precision: str = "fp32") -> Numerics:
    """Run `case` compiled, eager and in the reference (float32), and bound every entry.

    precision "bf16" runs both torch sides under bfloat16 autocast; the eager bound then
    adds autocast's roundings and is in the compared dtype's eps (the logits are bfloat16),
    and the reference's side (float32 throughout) is for the amp topic, not this one.
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
    bound_eager = bounds(reference, x, y, same_matmuls=True, rounding=rounding,
                         logits_difference=measured)
    for key, value in eager.items():  # S in the compared dtype's eps (bfloat16 logits)
        bound_eager[key] = bound_eager[key] * EPS32 / eps_of(value.dtype)
    reference_run = run_reference(reference, x, y)
    measured = np.abs(compiled["output"].astype(np.float64) - reference_run["output"])
    return Numerics(compiled, eager, reference_run, bound_eager,
                    bounds(reference, x, y, logits_difference=measured), compiled_backward)


def held_to_eager(eager_model: torch.nn.Module, compiled_model: torch.nn.Module,
                  case: Case, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """compile.eager on a given pair of MLPs of `case`'s sizes and activation with equal
    weights, one compiled however the caller compiled it (the optimize gauntlet's
    compiled_forward): forward, cross-entropy (eager on both sides) and backward on (x, y).
    (worst |a - b| / (eps S) over logits, loss and gradients, values compared)."""
    reference = ref.make_mlp(case.sizes, case.activation, rng=np.random.default_rng(0))
    reference.load_state_dict(tnn.state_dict_from_torch(eager_model.state_dict()))
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward_loss(model: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, ...]]:
        def fn(xt: torch.Tensor, yt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            output = model(xt)
            return loss_fn(output, yt), output
        return fn

    eager = run_torch(forward_loss(eager_model), eager_model, x, y)
    compiled = run_torch(forward_loss(compiled_model), compiled_model, x, y)
    measured = np.abs(compiled["output"].astype(np.float64) - eager["output"])
    bound = bounds(reference, x, y, same_matmuls=True, logits_difference=measured)
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
