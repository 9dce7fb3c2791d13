"""Training in fp8 and MX: a linear layer whose three GEMMs run on scaled, cast operands.

torchao's Float8Linear (float8/float8_linear.py, matmul_with_hp_or_float8_args), written out;
which operand is cast to which format along which axis, per precision: common/fp8_train.py.
With q(a) the quantize-dequantize of an operand (cast, then back to float32), for a layer
y = x W^T + b over x2 = x reshaped to (N, in), W (out, in) float32 master weights:

    forward:   y2 = q_fwd(x2, along in) @ q_fwd(W, along in)^T  (+ b)         (N, out)
    backward:  g2 = dL/dy2                                                     (N, out)
               dx2 = q_bwd(g2, along out) @ q_fwd(W, along out)               (N, in)
               dW  = q_bwd(g2, along N)^T @ q_fwd(x2, along N)                (out, in)
               db  = sum over N of g2 (not cast)

The forward saves the float32 x2 and W (torchao's ctx.save_for_backward(input_hp,
weight_hp_t)) and each GEMM casts its own operands. q, by recipe kind:

    fp8, current:  data, s = current_scaling(a, fmt, axis or None, power_of_2)
                   q(a) = f32(data) / s          (torchao's emulated mm: _data.float() / _scale)
    fp8, delayed:  s = the layer's stored scale of that tensor; record amax(a) in its history
                   data = cast_to_fp8(a, s, fmt);  q(a) = f32(data) / s
    mx:            q(a) = from_mx(to_mx(a with K last, fmt, "floor")), K moved back
    blockwise:     tile = W: weight_tile; x, g: tile along K ((1, 128), or (128, 1) where K
                   is the rows); q(a) = dequantize_blockwise(quantize_blockwise(a, tile,
                   variant), tile)                      (reference/fp8_blockwise.py)
    nvfp4:         a with K last; grad_weight's operands: bf16, then the RHT along K (= N);
                   codes, S, A = nvfp4.quantize(a, 16x16 for W else 1x16, g: stochastic on
                   the given rbits); q(a) = nvfp4.dequantize(codes, S, A), K moved back

NOTE [ The RHT in grad_weight ]: with M = diag(s) H / 4 per group of 16 along N (M M^T = I),
(M^T g)^T (M^T x) = g^T M M^T x = g^T x: grad_weight may multiply the transformed operands,
and the transform spreads an outlier over its 16 neighbours before the 1x16 scaling (TE
applies it to the columnwise copies of x and g only). The other two GEMMs take no RHT.

NOTE [ Delayed scaling in a layer ]: each scaled layer keeps, per tensor (input, weight,
grad_output), an amax history (L,) float32 and a scale () float32, as buffers (state, so the
checkpoint holds them: torch's register_buffer, the reference's buffers_of). A forward
records max|x| and max|W| in slot 0 of their histories, the backward max|g|; every cast of
the step uses the scale stored before it. At the end of the layer's backward, all three are
updated (fp8_scaling.delayed_update: roll, amax = max of the history, scale = fp8_max /
amax): step t casts with the scale computed from steps <= t - 1. The first step casts with
scale 1. A tensor whose amax outruns its history (a spike) is clamped at fp8_max: it
saturates (docs/fp8.md).

The GEMMs are float32 products of float32 operands, so the trees' casts agree bit for bit and
their products within the accumulation-order bound of a float32 matmul (claim fp8_train.gemm).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from common.fp8_train import DELAYED_TENSORS, Recipe, recipe
from common.recipes_train import BitStream, grad_bits
from reference import fp8_blockwise, fp8_scaling, mx, nvfp4
from reference.module import Module, Parameter, check_float, check_grad
from reference.nn import Linear, matmul


def quantize(a: np.ndarray, fmt: str, r: Recipe, axis: int,
             scale: np.ndarray | None = None, *, weight: bool = False, rht: bool = False,
             rbits: np.ndarray | None = None) -> np.ndarray:
    """q(a): the float32 values the GEMM reads for the 2-D float32 operand `a`, its inner
    dimension K on `axis` (0 or 1); `scale`: delayed scaling's stored scale; `weight`: a is
    W (blockwise and nvfp4 tile it so); nvfp4: `rht` transforms it first, `rbits` (uint8,
    a's shape with K last) round it stochastically."""
    if r.kind == "mx":
        k_last = np.ascontiguousarray(np.moveaxis(a, axis, -1))
        return np.moveaxis(mx.from_mx(mx.to_mx(k_last, fmt, r.mx_mode)), -1, axis)
    if r.kind == "blockwise":
        tile = r.weight_tile if weight else (r.tile if axis == 1 else r.tile[::-1])
        codes, scales = fp8_blockwise.quantize_blockwise(a, tile, r.variant)
        return fp8_blockwise.dequantize_blockwise(codes, scales, tile)
    if r.kind == "nvfp4":
        k_last = np.ascontiguousarray(np.moveaxis(a, axis, -1))  # (M, K)
        if rht:  # NOTE [ The RHT in grad_weight ]: TE transforms bfloat16 inputs
            k_last = k_last.astype(ml_dtypes.bfloat16)
        codes, s, amax = nvfp4.quantize(
            k_last, r.weight_tile if weight else r.tile, with_rht=rht, rbits=rbits,
            rounding="nearest_even" if rbits is None else "stochastic")
        return np.moveaxis(nvfp4.dequantize(codes, s, amax), -1, axis)
    if scale is None:
        data, scale = fp8_scaling.current_scaling(a, fmt, axis if r.rowwise else None,
                                                  r.power_of_2)
    else:
        data = fp8_scaling.cast_to_fp8(a, scale, fmt)
    return data.astype(np.float32) / scale


def scaled_forward(x2: np.ndarray, w: np.ndarray, b: np.ndarray | None, r: Recipe,
                   scales: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """y2 = q(x2) @ q(W)^T (+ b): the output GEMM (N, out); `scales` for delayed scaling."""
    s = scales or {}
    y2 = matmul(quantize(x2, r.forward, r, 1, s.get("input")),
                quantize(w, r.forward, r, 1, s.get("weight"), weight=True).T)
    return y2 if b is None else y2 + b


def scaled_backward(g2: np.ndarray, x2: np.ndarray, w: np.ndarray, r: Recipe,
                    scales: dict[str, np.ndarray] | None = None,
                    rbits: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx2, dW, db): the grad_input and grad_weight GEMMs and the bias gradient; `rbits`:
    the random bits of g (N, out) and of g^T (out, N) where g rounds stochastically."""
    s = scales or {}
    bits_in, bits_w = (None, None) if rbits is None else rbits
    dx2 = matmul(quantize(g2, r.backward, r, 1, s.get("grad_output"), rbits=bits_in),
                 quantize(w, r.forward, r, 0, s.get("weight"), weight=True))
    dw = matmul(quantize(g2, r.backward, r, 0, s.get("grad_output"), rht=r.wgrad_rht,
                         rbits=bits_w).T,
                quantize(x2, r.forward, r, 0, s.get("input"), rht=r.wgrad_rht))
    return dx2, dw, g2.sum(axis=0)


class ScaledLinear(Module):
    """A Linear whose GEMMs are scaled and cast by `precision` (common/fp8_train.py); it takes
    over a Linear's Parameters (torchao's Float8Linear.from_float). Delayed scaling's state
    is its buffers: fp8_amax_history_<t> (L,) and fp8_scale_<t> () for t in input, weight,
    grad_output (NOTE [ Delayed scaling in a layer ]). `bits`: the run's BitStream, which
    a recipe that rounds g stochastically (nvfp4) draws from at each backward (NOTE [ One
    bit stream, both trees ] in common/recipes_train.py)."""

    def __init__(self, linear: Linear, precision: str, bits: BitStream | None = None) -> None:
        super().__init__()
        self.recipe = recipe(precision)
        if self.recipe.grad_stochastic and bits is None:
            raise ValueError(f"ScaledLinear: {precision} rounds gradients stochastically and "
                             "needs the run's BitStream (bits=)")
        self.bits = bits
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if linear.weight.data.dtype != np.float32:
            raise TypeError(f"ScaledLinear: the master weights must be float32, got "
                            f"{linear.weight.data.dtype}")
        if self.recipe.kind == "mx" and self.in_features % mx.BLOCK_SIZE:
            raise ValueError(f"ScaledLinear: {precision} needs in_features divisible by "
                             f"{mx.BLOCK_SIZE}, got {self.in_features}")
        self.weight: Parameter = linear.weight
        self.bias: Parameter | None = linear.bias
        L = self.recipe.history
        self._buffers: dict[str, np.ndarray] = {}
        for t in DELAYED_TENSORS if self.recipe.delayed else ():
            self._buffers[f"fp8_amax_history_{t}"] = np.zeros(L, dtype=np.float32)
            self._buffers[f"fp8_scale_{t}"] = np.ones((), dtype=np.float32)
        self._in_shape: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"ScaledLinear({self.in_features}, {self.out_features}, {self.recipe.name})"

    def buffers_of(self) -> dict[str, np.ndarray]:
        return self._buffers

    def _scales(self) -> dict[str, np.ndarray] | None:
        if not self.recipe.delayed:
            return None
        return {t: self._buffers[f"fp8_scale_{t}"] for t in DELAYED_TENSORS}

    def _record(self, t: str, a: np.ndarray) -> None:
        h = self._buffers[f"fp8_amax_history_{t}"]
        h[...] = fp8_scaling.record_amax(h, fp8_scaling.tensor_amax(a))

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = check_float(self, x)
        if x.dtype != np.float32 or x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self!r}: expected float32 input (..., {self.in_features}), "
                             f"got {x.shape} {x.dtype}")
        x2 = x.reshape(-1, self.in_features)  # (N, in)
        w = self.weight.data  # (out, in)
        if self.recipe.delayed:
            self._record("input", x2)
            self._record("weight", w)
        b = None if self.bias is None else self.bias.data
        y2 = scaled_forward(x2, w, b, self.recipe, self._scales())
        self.save_for_backward({"input": x2, "weight": w})
        self._in_shape = x.shape
        return y2.reshape(*x.shape[:-1], self.out_features)

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        saved = self.pop_saved()
        x2, w = saved["input"], saved["weight"]
        g = check_grad(self, grad_output, (*self._in_shape[:-1], self.out_features))
        g2 = g.astype(np.float32).reshape(-1, self.out_features)  # (N, out)
        if self.recipe.delayed:
            self._record("grad_output", g2)
        rbits = (grad_bits(self.bits, *g2.shape) if self.recipe.grad_stochastic else None)
        dx2, dw, db = scaled_backward(g2, x2, w, self.recipe, self._scales(), rbits)
        self.weight.accumulate(dw)
        if self.bias is not None:
            self.bias.accumulate(db)
        if self.recipe.delayed:
            self._update()
        return dx2.reshape(self._in_shape)

    def _update(self) -> None:
        """NOTE [ Delayed scaling in a layer ]: roll every history, recompute every scale."""
        for t in DELAYED_TENSORS:
            fmt = self.recipe.backward if t == "grad_output" else self.recipe.forward
            h, s = (self._buffers[f"fp8_amax_history_{t}"], self._buffers[f"fp8_scale_{t}"])
            new_h, new_s = fp8_scaling.delayed_update(h, s, fmt, self.recipe.margin)
            h[...], s[...] = new_h, new_s


def convert(model: Module, precision: str, bits: BitStream | None = None) -> list[str]:
    """Replace every Linear inside the transformer's blocks (transformer.h.*: c_attn,
    attn.c_proj, c_fc, mlp.c_proj) by a ScaledLinear of `precision` (drawing from `bits`);
    the embeddings and lm_head stay float32 (torchao's usual filter leaves the output layer
    out; TE's NVFP4 recipe keeps the last layers in bf16). Returns the paths converted, in
    module order."""
    converted = []
    for path, parent in list(model.named_modules()):
        for name, child in list(parent._children.items()):
            full = f"{path}.{name}" if path else name
            if isinstance(child, Linear) and ".h." in f".{full}":
                scaled = ScaledLinear(child, precision, bits)
                parent._children[name] = scaled
                object.__setattr__(parent, name, scaled)
                converted.append(full)
    return converted


def delayed_state(model: Module) -> dict[str, Any]:
    """Every buffer of the model by name (the histories and scales), copied."""
    return {name: b.copy() for name, b in model.named_buffers()}
