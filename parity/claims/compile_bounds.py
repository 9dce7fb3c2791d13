"""The first-order error bounds of the compile claims (parity/claims/compile.py): the
nn claims' per-operation bounds propagated through an MLP, forward and then backward, in
the worst case (`bounds`: compile.bf16, compile.train_step) and with rounding errors as
independent random variables (`probable_bounds`: compile.eager, compile.reference).

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

NOTE [ Probable bounds ]
The worst case above assumes every rounding error at its maximum and every error aligned
with the sign of the weight it meets; the measured compiled-vs-eager differences sit orders
of magnitude below it, the deeper the path the further (docs/compile.md), so a bound of that
kind sees only gross faults. `probable_bounds` uses the standard model of probabilistic
rounding-error analysis (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019): each rounding
error is a random variable of mean zero, bounded as the per-operation claims bound it, and
independent of the others. To first order the difference of the two sides is then a sum
X = sum_j c_j d_j of independent, mean-zero terms |c_j d_j| <= B_j, and Hoeffding's
inequality gives

    P(|X| >= LAMBDA sigma) <= 2 exp(-LAMBDA^2 / 2),    sigma^2 = sum_j B_j^2,

so the rules above hold with every worst-case sum of bounds replaced by the root of the sum
of their squares, and the bound is LAMBDA sigma:

    forward   Linear   V_out = V_in (W^2)^T + (k + 1)/2 (eps (|x| |W|^T + |b|))^2
              act f    V_out = f'(x)^2 V_in + (c eps S_f(x))^2
    loss      CE mean  E_l = sqrt(sum ((p - onehot) D_z)^2) / N + eps S_ce   (D_z measured)
    backward  CE grad  V_G = p^2 (V_z + sum_c p^2 V_z) / N^2 + (eps S_ce')^2
              Linear   V_dx = V_G W^2 + (m + 1)/2 (eps |G||W|)^2
                       V_dW = V_G^T x^2 + (G^2)^T V_x + (N + 1)/2 (eps |G|^T |x|)^2
                       V_db = sum_n V_G + (N + 1)/2 (eps sum_n |G|)^2
              act f    V_dx = f'(x)^2 V_G + M^2 G^2 V_x + (c' eps S_f'(x))^2
              ReLU     V_dx = V_G [x > 0] + (G [|x| <= LAMBDA sqrt(V_x)])^2

V are variances (sigma^2, absolute). A k-term dot product rounds k times, each error at most
u = eps/2 of a partial sum bounded by |a||b|, on each of the two sides independently:
2 k u^2 = k/2 eps^2 of (|a||b|)^2, with one more term for the bias ((k + 1)/2). f'(x) is
the local derivative (the reference's own backward of ones), not its maximum: first order.
The loss's own term eps S_ce (nn.cross_entropy) stays a worst-case addend (one value: no
sum of many roundings to average over); the loss starts from the logits' measured
difference D_z as before. The model's one approximation: errors of different coordinates
that a product mixes (two hidden units fed by the same earlier errors) are treated as
independent, their covariances dropped; the weights' mixed signs make those covariances
small, and docs/compile.md prints every entry's measured ratio to the bound, which a
neglected covariance would push toward 1. LAMBDA = 6: under the model a value exceeds its
bound with probability <= 2 exp(-18) = 3e-8, below 1e-3 over the ~10^4 values of a test
case.
"""

from __future__ import annotations

import functools

import numpy as np

from parity.drivers.nn import LIPSCHITZ, activation_claims, activation_scales, ce_scales
from parity.tolerances import claim
from reference import losses as rloss
from reference import nn as ref

# max |f''|: GELU'' = phi(x)(2 - x^2) peaks at 2 phi(0) = 0.79788 (tanh form: the same at 0
# and below it elsewhere); tanh'' = -2 tanh sech^2 peaks at 4 / (3 sqrt 3) = 0.76980.
CURVATURE = {"GELU": 0.8, "Tanh": 0.77}
EPS32 = float.fromhex("0x1p-23")  # float32 machine epsilon
LAMBDA = 6.0  # NOTE [ Probable bounds ]: P(exceeded) <= 2 exp(-LAMBDA^2 / 2) per value

Results = dict[str, np.ndarray]  # "loss", "output", and one entry per parameter name


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


def probable_bounds(model: ref.Sequential, x: np.ndarray, y: np.ndarray, *,
                    same_matmuls: bool = False, logits_difference: np.ndarray | None = None
                    ) -> Results:
    """LAMBDA sigma for every entry of Results, in float32 eps (NOTE [ Probable bounds ]);
    `model` is the reference with the compared weights, same_matmuls and logits_difference
    as in `bounds` (float32 only: autocast's roundings are compile.bf16's, worst case)."""
    eps = EPS32
    layers = list(model)
    xs, vs = [x.astype(np.float64)], [np.zeros(x.shape)]
    for layer in layers:  # forward: activations and the variances of their differences
        a = xs[-1].astype(np.float32)
        out = layer.forward(a)
        a64, v = a.astype(np.float64), vs[-1]
        if isinstance(layer, ref.Linear):
            w = layer.weight.data.astype(np.float64)
            b = 0.0 if layer.bias is None else np.abs(layer.bias.data.astype(np.float64))
            rounds = (v > 0).any(-1, keepdims=True) if same_matmuls else True  # (N, 1)
            own = (layer.in_features + 1) / 2 * (eps * (np.abs(a64) @ np.abs(w).T + b)) ** 2
            vs.append(v @ (w * w).T + rounds * own)
        elif isinstance(layer, ref.ReLU):
            vs.append(v * (a64 > 0))
        elif isinstance(layer, ref.GELU | ref.Tanh):
            c = float(claim(activation_claims(layer)[0]).bound)  # type: ignore[arg-type]
            s = activation_scales(layer, a, out, np.zeros_like(a))[0]
            vs.append(_slope(layer, a) ** 2 * v + (c * eps * s) ** 2)
            layer.forward(a)  # _slope ran the layer on ones: restore its saved input
        else:
            raise TypeError(f"probable_bounds: no compile bound for {layer!r} (Linear, ReLU, "
                            "Tanh, GELU only)")
        xs.append(out.astype(np.float64))
    model.free_saved()
    z, v_z = xs[-1], vs[-1]
    n, classes = z.shape
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(classes)[y]
    loss_fn = rloss.CrossEntropyLoss("mean")
    loss_fn(z.astype(np.float32), y)
    dz = loss_fn.backward(np.float32(1.0))
    s_loss, s_grad = ce_scales("mean", z.astype(np.float32), y, np.float32(1.0), dz)
    d_z = np.sqrt(v_z) if logits_difference is None else logits_difference.astype(np.float64)
    result = {"output": LAMBDA * np.sqrt(v_z) / eps,
              "loss": np.asarray(LAMBDA * np.sqrt((((p - onehot) * d_z) ** 2).sum()) / n / eps
                                 + s_loss)}
    g = (p - onehot) / n  # (N, C)
    v_g = p ** 2 * (v_z + (p ** 2 * v_z).sum(-1, keepdims=True)) / n ** 2 + (eps * s_grad) ** 2
    for i in reversed(range(len(layers))):
        layer, a, v_a = layers[i], xs[i], vs[i]
        if isinstance(layer, ref.Linear):
            w = layer.weight.data.astype(np.float64)
            ag = np.abs(g)
            v_w = v_g.T @ a ** 2 + (g ** 2).T @ v_a + (n + 1) / 2 * (eps * ag.T @ np.abs(a)) ** 2
            result[f"{i}.weight"] = LAMBDA * np.sqrt(v_w) / eps
            if layer.bias is not None:
                v_b = v_g.sum(0) + (n + 1) / 2 * (eps * ag.sum(0)) ** 2
                result[f"{i}.bias"] = LAMBDA * np.sqrt(v_b) / eps
            rounds = (v_g > 0).any(-1, keepdims=True) if same_matmuls else True
            own = (layer.out_features + 1) / 2 * (eps * ag @ np.abs(w)) ** 2
            v_g, g = v_g @ w ** 2 + rounds * own, g @ w
        elif isinstance(layer, ref.ReLU):
            flips = np.abs(a) <= LAMBDA * np.sqrt(v_a)  # the gate may differ between sides
            v_g, g = v_g * (a > 0) + (g * flips) ** 2, g * (a > 0)
        else:
            x32 = a.astype(np.float32)
            slope = _slope(layer, x32)
            layer.forward(x32)
            dx = layer.backward(g.astype(np.float32)).astype(np.float64)
            name = type(layer).__name__
            c = float(claim(activation_claims(layer)[1]).bound)  # type: ignore[arg-type]
            s = activation_scales(layer, x32, x32, g)[1]
            v_g = slope ** 2 * v_g + (CURVATURE[name] * g) ** 2 * v_a + (c * eps * s) ** 2
            g = dx
    return result


def _slope(layer: ref.Module, x: np.ndarray) -> np.ndarray:
    """f'(x), from the reference layer's own backward of ones (float64)."""
    layer.forward(x.astype(np.float32))
    return np.abs(layer.backward(np.ones(x.shape, np.float32)).astype(np.float64))
