"""Memory of one training step in bytes, as Python integers: the training state (weights,
gradients, master copy, optimizer state), activations (Korthikanti et al. 2022 for a
transformer; the exact count for the compact MLP), and the same quantities read off the
reference's own objects (parameters, optimizer state, the tape). FLOPs: reference/flops.py.

# NOTE [ Training state bytes ]
Per parameter (training_memory):
    weights        4 (fp32) or 2 (fp16_mixed, bf16_mixed)
    grads          as the weights (a gradient has its parameter's dtype)
    master         4 if a float32 master copy exists (master_weights)
    grad_buffer    4 if a float32 gradient-accumulation buffer exists
    optimizer      states x bytes: sgd 0, sgd_momentum 1 (momentum_buffer), adam and adamw 2
                   (exp_avg, exp_avg_sq); bytes 4 for optimizer_state_dtype "fp32", and for
                   "default" when the optimizer steps float32 values (fp32 weights, or the
                   master copy), else the weights' 2 (torch.optim allocates zeros_like(param))
Per parameter TENSOR, which a per-parameter formula cannot see (optimizer_step_bytes):
    adam step      torch.optim.Adam/AdamW keep state["step"], a float32 0-dim tensor, per
                   parameter tensor (on the CPU unless capturable or fused): 4 bytes each
ZeRO (Rajbhandari et al. 2020) counts mixed-precision Adam as 2 + 2 + 12 = 16 bytes/param.

# NOTE [ Formula precisions vs this project's precisions ]
training_memory's `precision` is the dtype the WEIGHTS are held in. This project's precisions
("fp32", "bf16", "fp16", reference/amp.py) are autocast regions over float32 parameters:
weights, gradients and optimizer state stay float32 and there is no master copy. Low precision
lives only in activations: per-op casts, among them the cast copy of a Linear's weight that
its GEMM saves for backward (an activation term, mlp_saved). So
    this project's fp32, bf16, fp16   ->  precision "fp32", master_weights False
    the formula's fp16_mixed, bf16_mixed (2-byte weights + float32 master, Megatron and apex
    O2 style: model.half() with the optimizer stepping a float32 copy)  ->  none of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from reference.flops import _positive, mlp_layers
from reference.nn import Linear, Module

OPTIMIZERS = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}  # states per parameter
PRECISIONS = {"fp32": 4, "fp16_mixed": 2, "bf16_mixed": 2}  # bytes of a weight
STATE_DTYPES = ("default", "fp32")
PROJECT_PRECISIONS = ("fp32", "bf16", "fp16")
PER_TENSOR_STATE = ("step",)  # optimizer state entries held once per parameter tensor


def _choice(name: str, value: object, accepted: Iterable[str]) -> str:
    accepted = tuple(accepted)
    if value not in accepted:
        raise ValueError(f"{name} must be one of {accepted}, got {value!r}")
    return value  # type: ignore[return-value]


def training_memory(n_params: int, *, optimizer: str, precision: str, master_weights: bool,
                    optimizer_state_dtype: str = "default", grad_buffer: bool = False
                    ) -> dict[str, int]:
    """Bytes of the training state of n_params parameters (NOTE [ Training state bytes ]):
    weights, grads, master, grad_buffer, optimizer_state, total, bytes_per_param."""
    _positive("n_params", n_params)
    states = OPTIMIZERS[_choice("optimizer", optimizer, OPTIMIZERS)]
    weight = PRECISIONS[_choice("precision", precision, PRECISIONS)]
    _choice("optimizer_state_dtype", optimizer_state_dtype, STATE_DTYPES)
    if precision == "fp32" and master_weights:
        raise ValueError("master_weights=True with precision 'fp32': the weights are float32 "
                         "already; a master copy exists only with 'fp16_mixed' or 'bf16_mixed'")
    stepped_in_fp32 = master_weights or weight == 4 or optimizer_state_dtype == "fp32"
    per_param = {"weights": weight, "grads": weight, "master": 4 * master_weights,
                 "grad_buffer": 4 * grad_buffer,
                 "optimizer_state": states * (4 if stepped_in_fp32 else weight)}
    out = {k: v * n_params for k, v in per_param.items()}
    out["total"] = sum(out.values())
    out["bytes_per_param"] = sum(per_param.values())  # total / n_params, exactly
    return out


def optimizer_step_bytes(optimizer: str, n_tensors: int) -> int:
    """Adam's and AdamW's float32 0-dim `step` per parameter tensor: 4 n_tensors (else 0)."""
    _choice("optimizer", optimizer, OPTIMIZERS)
    return 4 * _positive("n_tensors", n_tensors) if optimizer in ("adam", "adamw") else 0


def memory_arguments(project_precision: str) -> dict[str, object]:
    """training_memory's precision arguments for one of this project's precisions (NOTE [
    Formula precisions vs this project's precisions ]): autocast keeps float32 weights."""
    _choice("precision", project_precision, PROJECT_PRECISIONS)
    return {"precision": "fp32", "master_weights": False}


def project_precisions(precision: str, master_weights: bool) -> tuple[str, ...]:
    """The inverse: this project's precisions whose training state the formula describes."""
    _choice("precision", precision, PRECISIONS)
    return PROJECT_PRECISIONS if precision == "fp32" and not master_weights else ()


# ---------------------------------------------------------------- transformer activations
KORTHIKANTI_RECOMPUTE = ("none", "selective", "full")

# Korthikanti et al. 2022, section 4.1: bytes one layer saves, 16-bit activations and 1-byte
# dropout masks; s tokens, b sequences, h width, a heads. Coefficients of (s b h, a s^2 b).
KORTHIKANTI_TERMS: dict[str, tuple[int, int]] = {
    "attention: QKV input (LayerNorm output)": (2, 0),
    "attention: q and k (QK^T inputs)": (4, 0),
    "attention: softmax output": (0, 2),
    "attention: softmax dropout mask": (0, 1),
    "attention: dropout output (att @ v input)": (0, 2),
    "attention: v": (2, 0),
    "attention: projection input": (2, 0),
    "attention: residual dropout mask": (1, 0),
    "mlp: first Linear input (LayerNorm output)": (2, 0),
    "mlp: GELU input": (8, 0),
    "mlp: second Linear input": (8, 0),
    "mlp: dropout mask": (1, 0),
    "layernorm: the two LayerNorm inputs": (4, 0),
}


def korthikanti_terms(*, seq_len: int, batch: int, hidden: int, n_head: int) -> dict[str, int]:
    """Each term of KORTHIKANTI_TERMS in bytes for one layer: c1 s b h + c2 a s^2 b."""
    s, b = _positive("seq_len", seq_len), _positive("batch", batch)
    h, a = _positive("hidden", hidden), _positive("n_head", n_head)
    if h % a:
        raise ValueError(f"n_head must divide hidden: {h} is not a multiple of {a}; "
                         f"accepted: n_head in the divisors of hidden")
    return {name: c1 * s * b * h + c2 * a * s * s * b
            for name, (c1, c2) in KORTHIKANTI_TERMS.items()}


def activation_bytes(*, seq_len: int, batch: int, hidden: int, n_head: int, n_layer: int,
                     recompute: str = "none") -> int:
    """Korthikanti et al. 2022, per layer, times n_layer (16-bit activations):
        none       s b h (34 + 5 a s / h) = 34 s b h + 5 a s^2 b
        selective  34 s b h     (the a s^2 b terms recomputed: softmax, its dropout, att @ v)
        full       2 s b h      (only each layer's input is kept)
    """
    terms = korthikanti_terms(seq_len=seq_len, batch=batch, hidden=hidden, n_head=n_head)
    _positive("n_layer", n_layer)
    _choice("recompute", recompute, KORTHIKANTI_RECOMPUTE)
    s, b, h, a = seq_len, batch, hidden, n_head
    per_layer = {"none": 34 * s * b * h + 5 * a * s * s * b, "selective": 34 * s * b * h,
                 "full": 2 * s * b * h}[recompute]
    assert recompute != "none" or per_layer == sum(terms.values())
    return n_layer * per_layer


# ---------------------------------------------------------------- the compact MLP
def mlp_param_count(sizes: Sequence[int]) -> int:
    """sum over Linear layers of in out + out (every Linear of make_mlp has a bias)."""
    mlp_layers(sizes)
    return sum(i * o + o for i, o in itertools.pairwise(sizes))


def mlp_param_tensors(sizes: Sequence[int]) -> int:
    """Two tensors (weight, bias) per Linear: what Adam keeps a `step` for."""
    mlp_layers(sizes)
    return 2 * (len(sizes) - 1)


@dataclass(frozen=True)
class Saved:
    """One tensor held for backward: which layer saves it, under what name, which logical
    tensor it is (two saves of one tensor share `tensor` and are held once), and its size."""

    layer: int | str
    name: str
    tensor: str
    shape: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


# NOTE [ What the MLP saves ]
# Per make_mlp layer, torch's saved tensors (reference/nn.py and torch_impl/nn.py name them),
# N rows, e the model's itemsize, parameters excluded (a GEMM's mat2 = W^T is a view of one):
#   Linear      "input" (N, in): addmm's mat1 (saved whenever the weight requires grad)
#   ReLU, Tanh  "result" (N, w): the output, which the next Linear saves again: one tensor
#   GELU        "self" (N, w): the Linear output; the GELU output is the next Linear's input
#   Dropout     "mask" (N, w): the scaled keep-mask in the input's dtype (a 0-dim zero for
#               p = 1); CUDA's fused kernel (0 < p < 1) keeps a bool mask: 1 byte
# Under autocast (float32 model, low-precision itemsize 2), a Linear whose input is float32
# (the first: the data) saves a fresh low-precision cast of it, and a Linear whose input
# requires grad also saves its weight's low-precision cast copy (out x in): mat2 is no longer
# a view of the parameter. Every other saved tensor is low precision, shared as above.
def mlp_saved(sizes: Sequence[int], batch: int, *, activation: str = "gelu",
              dropout: float = 0.0, precision: str = "fp32", itemsize: int = 4,
              input_requires_grad: bool = False, device: str = "cpu"
              ) -> tuple[list[Saved], list[Saved]]:
    """(saved, inputs): every tensor make_mlp(sizes) saves in forward (NOTE [ What the MLP
    saves ]), and the tensor entering each layer (what a checkpoint there would keep)."""
    layers = mlp_layers(sizes, activation, dropout)
    _choice("precision", precision, PROJECT_PRECISIONS)
    _choice("device", device, ("cpu", "cuda"))
    if itemsize not in (4, 8):
        raise ValueError(f"itemsize must be 4 (float32) or 8 (float64), got {itemsize!r}")
    n = _positive("batch", batch)
    low = precision != "fp32" and itemsize == 4  # autocast leaves float64 alone
    saved: list[Saved] = []
    inputs: list[Saved] = []
    cur, size, grad, j = "x", itemsize, input_requires_grad, 0
    for i, kind in enumerate(layers):
        width = sizes[j]  # the input's width (j counts the Linear layers passed)
        inputs.append(Saved(i, "input", cur, (n, width), size))
        if kind == "linear":
            n_in, n_out = sizes[j], sizes[j + 1]
            if low and size != 2:
                cur, size = f"cast({cur})", 2
            saved.append(Saved(i, "input", cur, (n, n_in), size))
            if low and grad:
                saved.append(Saved(i, "weight", f"cast({i}.weight)", (n_in, n_out), 2))
            cur, grad, j = f"{i}.out", True, j + 1
        elif kind in ("relu", "tanh"):
            cur = f"{i}.out"
            saved.append(Saved(i, "result", cur, (n, width), size))
        elif kind in ("gelu", "gelu_tanh"):
            saved.append(Saved(i, "self", cur, (n, width), size))
            cur = f"{i}.out"
        else:
            fused = device == "cuda" and dropout < 1.0
            shape = () if dropout == 1.0 else (n, width)
            saved.append(Saved(i, "mask", f"{i}.mask", shape, 1 if fused else size))
            cur = f"{i}.out"
    inputs.append(Saved(len(layers), "input", cur, (n, sizes[-1]), size))  # the output
    return saved, inputs


def held_bytes(entries: Iterable[Saved]) -> int:
    """Bytes of the distinct tensors among `entries` (two saves of one tensor count once)."""
    distinct = {e.tensor: e.nbytes for e in entries}
    return sum(distinct.values())


def mlp_activation_bytes(sizes: Sequence[int], batch: int, *, activation: str = "gelu",
                         dropout: float = 0.0, precision: str = "fp32", itemsize: int = 4,
                         recompute: str = "none", input_requires_grad: bool = False,
                         device: str = "cpu") -> int:
    """Bytes the model holds between forward and backward under a checkpoint schedule: the
    saves of every layer run normally plus each top-level segment's input, distinct."""
    from reference.recompute import Segment, parse_schedule

    saved, inputs = mlp_saved(sizes, batch, activation=activation, dropout=dropout,
                              precision=precision, itemsize=itemsize,
                              input_requires_grad=input_requires_grad, device=device)
    held: list[Saved] = []
    for item in parse_schedule(recompute, len(inputs) - 1).plan:
        if isinstance(item, Segment):
            held.append(inputs[item.start])
        else:
            held += [e for e in saved if e.layer == item]
    return held_bytes(held)


def loss_saved(batch: int, classes: int, *, loss: str = "cross_entropy", itemsize: int = 4,
               output: Saved | None = None) -> list[Saved]:
    """What the loss saves, computed in float32 under autocast (the fp32 op list) or in the
    model's dtype (itemsize). `output`: the model's output tensor (MSE saves it as is when it
    has the loss's itemsize; a low-precision one is cast, and the cast is saved).
        cross_entropy  log_softmax's result = nll_loss's self (one tensor, N x C), the int64
                       target (N), and nll_loss's 0-dim total_weight: torch only (the
                       reference's CrossEntropyLoss has no class weights to sum)
        mse            self (N x C) and target (N x C)
    """
    _choice("loss", loss, ("cross_entropy", "mse"))
    n, c = _positive("batch", batch), _positive("classes", classes)
    if loss == "cross_entropy":
        return [Saved("loss", "result", "loss.logp", (n, c), itemsize),
                Saved("loss", "target", "target", (n,), 8),
                Saved("loss", "total_weight", "loss.total_weight", (), itemsize)]
    same = output is not None and output.itemsize == itemsize
    x = output.tensor if same else f"cast({output.tensor if output else 'output'})"
    return [Saved("loss", "self", x, (n, c), itemsize),
            Saved("loss", "target", "target", (n, c), itemsize)]


# ---------------------------------------------------------------- the reference's own objects
def parameter_bytes(model: Module) -> int:
    """Bytes of the model's parameters (each Parameter once)."""
    return sum(p.data.nbytes for p in {id(p): p for p in model.parameters()}.values())


def gradient_bytes(model: Module) -> int:
    """Bytes of the gradients present (None counts 0)."""
    return sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: object) -> dict[str, int]:
    """State entry name -> bytes summed over parameters (reference/optim.py's `state`)."""
    out: dict[str, int] = {}
    for entries in optimizer.state.values():  # type: ignore[attr-defined]
        for name, value in entries.items():
            out[name] = out.get(name, 0) + int(np.asarray(value).nbytes)
    return out


def state_bytes(model: Module, optimizer: object) -> dict[str, int]:
    """weights, grads, optimizer_state (per-element entries), optimizer_step (per-tensor
    entries: Adam's step), total."""
    entries = optimizer_state_bytes(optimizer)
    out = {"weights": parameter_bytes(model), "grads": gradient_bytes(model),
           "optimizer_state": sum(v for k, v in entries.items() if k not in PER_TENSOR_STATE),
           "optimizer_step": sum(v for k, v in entries.items() if k in PER_TENSOR_STATE)}
    out["total"] = sum(out.values())
    return out


def distinct_bytes(arrays: Iterable[np.ndarray]) -> int:
    """Bytes of distinct (data pointer, nbytes) among arrays: reference.recompute's notion."""
    seen = {(a.__array_interface__["data"][0], a.nbytes) for a in arrays if a.nbytes}
    return sum(nbytes for _, nbytes in seen)


def tape_bytes(modules: Iterable[Module]) -> int:
    """Distinct bytes on the tapes of these modules now (model.modules(), and a loss)."""
    return distinct_bytes(a for m in modules for a in m.saved_tensors().values())


def tape_flops(model: Module) -> int:
    """Forward GEMM FLOPs of the Linear layers whose tape is held now: 2 N in out each, N the
    rows of the saved input (each op knows its m, n, k)."""
    return sum(2 * m.saved_tensors()["input"].shape[0] * m.in_features * m.out_features
               for m in model.modules()
               if isinstance(m, Linear) and "input" in m.saved_tensors())



def run_flops(run: object) -> dict[str, int]:
    """The GEMM FLOPs a reference.recompute.ScheduledRun performed, after its backward, from
    its own counters: forward and recompute layer runs times 2 N in out per Linear, backward
    4 N in out per Linear (the reference always computes dx), and `cut`: the part of the
    recompute that torch's early stop skips (the segments' last Linear, which the reference
    finishes). torch's recompute = recompute - cut."""
    model, counts = run.model, run.counter.counts  # type: ignore[attr-defined]
    rows = int(np.prod(run.output.shape[:-1]))  # type: ignore[attr-defined]
    recomputed, cut = run.recomputed(), run.interrupted()  # type: ignore[attr-defined]
    gemm = {i: 2 * rows * layer.in_features * layer.out_features
            for i, layer in enumerate(model) if isinstance(layer, Linear)}
    return {"forward": sum(counts["forward"].get(i, 0) * g for i, g in gemm.items()),
            "backward": 2 * sum(gemm.values()),
            "recompute": sum(recomputed[i] * g for i, g in gemm.items()),
            "cut": sum(cut[i] * g for i, g in gemm.items())}
