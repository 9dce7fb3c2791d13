"""The scaled linear layer in both trees on the same inputs, and torchao's Float8Linear on them.

A layer pair: a reference Linear drawn from a seeded generator, its torch twin with the same
weights, each converted to its tree's ScaledLinear. A run feeds both the same x and g for a
few steps and records, per step, each tree's cast operands (the q of every GEMM operand, with
the scales stored before the step and, where g rounds stochastically, the bits the step's
backward will draw: a copy of the layers' BitStream), outputs, gradients and buffers, and the
scales S of claim fp8_train.gemm computed from the reference's cast operands.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from common.fp8_train import DELAYED_TENSORS, recipe
from common.recipes_train import BitStream, grad_bits
from reference import fp8_train as rfp8
from reference.nn import Linear
from torch_impl import fp8_train as tfp8

# (N, in, out) of the layer runs: the transformer's shapes (K = 32, 128 forward; N = 256)
SHAPES = ((64, 32, 96), (256, 128, 32))
STEPS = 3


@dataclass
class Step:
    """One step of a layer pair: name -> (reference array, torch array) and the scales S."""

    casts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    results: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    buffers: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    scales: dict[str, np.ndarray] = field(default_factory=dict)


def layer_pair(precision: str, d_in: int, d_out: int, seed: int
               ) -> tuple[rfp8.ScaledLinear, tfp8.ScaledLinear]:
    """(reference, torch) ScaledLinear of the same weights (torch's Linear init, a bias);
    each its own BitStream of the same seed where the recipe draws bits."""
    lin = Linear(d_in, d_out, rng=np.random.default_rng(seed))
    twin = torch.nn.Linear(d_in, d_out)
    with torch.no_grad():
        twin.weight.copy_(torch.from_numpy(lin.weight.data))
        twin.bias.copy_(torch.from_numpy(lin.bias.data))
    stochastic = recipe(precision).grad_stochastic
    return (rfp8.ScaledLinear(lin, precision, BitStream(seed) if stochastic else None),
            tfp8.ScaledLinear(twin, precision, BitStream(seed) if stochastic else None))


def _operands(q: Any, x2: Any, w: Any, g2: Any, precision: str,
              scales: dict | None, rbits: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """Every GEMM operand's q, by GEMM and role, from one tree's quantize (`rbits`: g's
    bits for grad_input and grad_weight where g rounds stochastically)."""
    r, s = recipe(precision), scales or {}
    bits_in, bits_w = (None, None) if rbits is None else rbits
    return {
        "output.x": q(x2, r.forward, r, 1, s.get("input")),
        "output.W": q(w, r.forward, r, 1, s.get("weight"), weight=True),
        "grad_input.g": q(g2, r.backward, r, 1, s.get("grad_output"), rbits=bits_in),
        "grad_input.W": q(w, r.forward, r, 0, s.get("weight"), weight=True),
        "grad_weight.g": q(g2, r.backward, r, 0, s.get("grad_output"), rht=r.wgrad_rht,
                           rbits=bits_w),
        "grad_weight.x": q(x2, r.forward, r, 0, s.get("input"), rht=r.wgrad_rht),
    }


def step_bits(layer: Any, n: int, d_out: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The bits `layer`'s next backward will draw (from a copy of its stream), or None."""
    if layer.bits is None:
        return None
    copy = BitStream(0)
    copy.load(layer.bits.state())
    return grad_bits(copy, n, d_out)


def run_layer(precision: str, shape: tuple[int, int, int], seed: int = 0,
              steps: int = STEPS) -> list[Step]:
    """`steps` forward/backward steps of a layer pair on fresh (x, g) each step."""
    n, d_in, d_out = shape
    ref, tor = layer_pair(precision, d_in, d_out, seed)
    rng = np.random.default_rng(seed + 1)
    out = []
    for step in range(steps):
        x = (rng.standard_normal((n, d_in)) * (1 + step)).astype(np.float32)
        g = (rng.standard_normal((n, d_out)) * 1e-3).astype(np.float32)
        rec = Step()
        # the casts, with the scales stored before the step
        r_bits, t_bits = step_bits(ref, n, d_out), step_bits(tor, n, d_out)
        r_q = _operands(rfp8.quantize, x, ref.weight.data, g, precision, ref._scales(), r_bits)
        t_scales = tor._scales()
        with torch.no_grad():
            t_q = _operands(tfp8.quantize, torch.from_numpy(x), tor.weight.detach(),
                            torch.from_numpy(g), precision, t_scales,
                            None if t_bits is None else tuple(map(torch.from_numpy, t_bits)))
        rec.casts = {k: (r_q[k], t_q[k].numpy()) for k in r_q}
        # one step of each
        ref.weight.grad = ref.bias.grad = None
        y = ref.forward(x)
        dx = ref.backward(g)
        xt = torch.from_numpy(x).requires_grad_()
        tor.zero_grad()
        yt = tor(xt)
        yt.backward(torch.from_numpy(g))
        rec.results = {"y": (y, yt.detach().numpy()), "dx": (dx, xt.grad.numpy()),
                       "weight": (ref.weight.grad, tor.weight.grad.numpy()),
                       "bias": (ref.bias.grad, tor.bias.grad.numpy())}
        rec.buffers = {name: (b.copy(), tor.get_buffer(name).numpy().copy())
                       for name, b in ref.buffers_of().items()}
        rec.scales = gemm_scales(r_q, ref.bias.data, g)
        out.append(rec)
    return out


def gemm_scales(q: dict[str, np.ndarray], bias: np.ndarray, g: np.ndarray
                ) -> dict[str, np.ndarray]:
    """(k + 1)(|q(A)| |q(B)| + |b|) for y, dx, dW and db: claim fp8_train.gemm's S."""
    a = {k: np.abs(v.astype(np.float64)) for k, v in q.items()}
    n, d_in = a["output.x"].shape
    d_out = a["output.W"].shape[0]
    return {"y": (d_in + 1) * (a["output.x"] @ a["output.W"].T + np.abs(bias)),
            "dx": (d_out + 1) * (a["grad_input.g"] @ a["grad_input.W"]),
            "weight": (n + 1) * (a["grad_weight.g"].T @ a["grad_weight.x"]),
            "bias": (n + 1) * np.abs(g.astype(np.float64)).sum(axis=0)}


def torchao_layer(recipe_name: str, emulate: bool, shape: tuple[int, int, int], seed: int = 0
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One forward/backward of torchao's Float8Linear (`recipe_name`, emulate) and of the
    torch tree's ScaledLinear on the same weights and (x, g): name -> (ours, torchao's)."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    n, d_in, d_out = shape
    _, ours = layer_pair(f"fp8-{recipe_name}", d_in, d_out, seed)
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe_name),
                                 emulate=emulate)
    plain = torch.nn.Linear(d_in, d_out)
    with torch.no_grad():
        plain.weight.copy_(ours.weight)
        plain.bias.copy_(ours.bias)
    theirs = Float8Linear.from_float(plain, config=config)
    rng = np.random.default_rng(seed + 1)
    x = torch.from_numpy((rng.standard_normal((n, d_in)) * 3).astype(np.float32))
    g = torch.from_numpy((rng.standard_normal((n, d_out)) * 1e-3).astype(np.float32))
    got = {}
    for name, layer in (("ours", ours), ("torchao", theirs)):
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.backward(g)
        got[name] = {"y": y.detach().numpy(), "dx": xi.grad.numpy(),
                     "weight": layer.weight.grad.numpy(), "bias": layer.bias.grad.numpy()}
    return {k: (got["ours"][k], got["torchao"][k]) for k in got["ours"]}


def torchao_scales(shape: tuple[int, int, int], seed: int = 0) -> dict[str, np.ndarray]:
    """(k + 3)(|q(A)| |q(B)| + |b|) of torchao_layer's tensorwise inputs: claim
    fp8_train.torchao_scaled_mm's S (the reference's casts of the same arrays)."""
    n, d_in, d_out = shape
    ref, _ = layer_pair("fp8-tensorwise", d_in, d_out, seed)
    rng = np.random.default_rng(seed + 1)
    x = (rng.standard_normal((n, d_in)) * 3).astype(np.float32)
    g = (rng.standard_normal((n, d_out)) * 1e-3).astype(np.float32)
    q = _operands(rfp8.quantize, x, ref.weight.data, g, "fp8-tensorwise", None)
    s = gemm_scales(q, ref.bias.data, g)
    k = {"y": d_in, "dx": d_out, "weight": n, "bias": n}
    return {name: v * (k[name] + 3) / (k[name] + 1) for name, v in s.items()}


__all__ = ["DELAYED_TENSORS", "SHAPES", "STEPS", "Step", "gemm_scales", "layer_pair",
           "run_layer", "step_bits", "torchao_layer", "torchao_scales"]
