"""Training in fp8 and MX with PyTorch. See reference/fp8_train.py for the math (the three
GEMMs, q, NOTE [ Delayed scaling in a layer ]); same names, same order. What PyTorch does
differently or hides:

- The layer is an nn.Linear whose forward calls a torch.autograd.Function, `_ScaledMM`,
  as torchao's Float8Linear calls matmul_with_hp_or_float8_args: the forward saves the
  float32 input and weight, the backward casts them again for its two GEMMs.
- The GEMMs are torch.mm on the dequantized float32 operands, torchao's emulated path
  (`torch.mm(a._data.float() / a._scale, b._data.float() / b._scale)`), with the weight's
  transpose a view as torchao's weight_hp_t, then `output + bias` as Float8Linear adds it.
  torchao's own path on CPU, torch._scaled_mm, scales after an fp8 product of its own
  (claim fp8_train.torchao_scaled_mm).
- Delayed scaling's histories and scales are registered buffers, so model.state_dict()
  holds them; the backward updates them in place under no_grad.
- nvfp4's random bits are the reference's numpy arrays (common/recipes_train.py, NOTE [ One
  bit stream, both trees ]), moved onto the operand's device with torch.from_numpy: torch's
  own generators would draw other bits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from common.fp8_train import DELAYED_TENSORS, Recipe, recipe
from common.recipes_train import BitStream, grad_bits
from torch_impl import fp8_blockwise, fp8_scaling, mx, nvfp4


def quantize(a: torch.Tensor, fmt: str, r: Recipe, axis: int,
             scale: torch.Tensor | None = None, *, weight: bool = False, rht: bool = False,
             rbits: torch.Tensor | None = None) -> torch.Tensor:
    """q(a) of the 2-D float32 operand `a`, its inner dimension K on `axis` (0 or 1)."""
    if r.kind == "mx":
        k_last = a.movedim(axis, -1).contiguous()
        return mx.from_mx(mx.to_mx(k_last, fmt, r.mx_mode)).movedim(-1, axis)
    if r.kind == "blockwise":
        tile = r.weight_tile if weight else (r.tile if axis == 1 else r.tile[::-1])
        codes, scales = fp8_blockwise.quantize_blockwise(a, tile, r.variant)
        return fp8_blockwise.dequantize_blockwise(codes, scales, tile)
    if r.kind == "nvfp4":
        k_last = a.movedim(axis, -1).contiguous()  # (M, K)
        if rht:  # NOTE [ The RHT in grad_weight ] (reference/fp8_train.py)
            k_last = k_last.to(torch.bfloat16)
        codes, s, amax = nvfp4.quantize(
            k_last, r.weight_tile if weight else r.tile, with_rht=rht, rbits=rbits,
            rounding="nearest_even" if rbits is None else "stochastic")
        return nvfp4.dequantize(codes, s, amax).movedim(-1, axis)
    if scale is None:
        data, scale = fp8_scaling.current_scaling(a, fmt, axis if r.rowwise else None,
                                                  r.power_of_2)
    else:
        data = fp8_scaling.cast_to_fp8(a, scale, fmt)
    return data.to(torch.float32) / scale


def scaled_forward(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, r: Recipe,
                   scales: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """y2 = q(x2) @ q(W)^T (+ b), the weight cast as its transpose (torchao's weight_hp_t)."""
    s = scales or {}
    y2 = torch.mm(quantize(x2, r.forward, r, 1, s.get("input")),
                  quantize(w.t(), r.forward, r, 0, s.get("weight"), weight=True))
    return y2 if b is None else y2 + b


def scaled_backward(g2: torch.Tensor, x2: torch.Tensor, w: torch.Tensor, r: Recipe,
                    scales: dict[str, torch.Tensor] | None = None,
                    rbits: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx2, dW, db), torchao's backward: mm(q(g), q(W^T)^T) and mm(q(g)^T, q(x2))."""
    s = scales or {}
    bits_in, bits_w = (None, None) if rbits is None else rbits
    dx2 = torch.mm(quantize(g2, r.backward, r, 1, s.get("grad_output"), rbits=bits_in),
                   quantize(w.t(), r.forward, r, 1, s.get("weight"), weight=True).t())
    dw = torch.mm(quantize(g2, r.backward, r, 0, s.get("grad_output"), rht=r.wgrad_rht,
                           rbits=bits_w).t(),
                  quantize(x2, r.forward, r, 0, s.get("input"), rht=r.wgrad_rht))
    return dx2, dw, g2.sum(dim=0)


def torch_bits(bits: BitStream, n: int, d_out: int, device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """common.recipes_train.grad_bits as tensors on `device`: the reference's very bits."""
    bits_in, bits_w = grad_bits(bits, n, d_out)
    return torch.from_numpy(bits_in).to(device), torch.from_numpy(bits_w).to(device)


class _ScaledMM(torch.autograd.Function):
    """y2 = q(x2) @ q(W)^T with the scaled backward; the bias is added outside, by autograd."""

    @staticmethod
    def forward(ctx: Any, x2: torch.Tensor, w: torch.Tensor, layer: ScaledLinear
                ) -> torch.Tensor:
        ctx.save_for_backward(x2, w)
        ctx.layer = layer
        if layer.recipe.delayed:
            layer._record("input", x2)
            layer._record("weight", w)
        return scaled_forward(x2, w, None, layer.recipe, layer._scales())

    @staticmethod
    def backward(ctx: Any, g2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x2, w = ctx.saved_tensors
        layer = ctx.layer
        if layer.recipe.delayed:
            layer._record("grad_output", g2)
        rbits = (torch_bits(layer.bits, *g2.shape, g2.device) if layer.recipe.grad_stochastic
                 else None)
        dx2, dw, _ = scaled_backward(g2, x2, w, layer.recipe, layer._scales(), rbits)
        if layer.recipe.delayed:
            layer._update()
        return dx2, dw, None


class ScaledLinear(nn.Linear):
    """An nn.Linear whose GEMMs are scaled and cast by `precision`, taking over a Linear's
    Parameters (Float8Linear.from_float); delayed scaling's buffers fp8_amax_history_<t>
    and fp8_scale_<t>; `bits` the run's BitStream (reference/fp8_train.py)."""

    def __init__(self, linear: nn.Linear, precision: str, bits: BitStream | None = None
                 ) -> None:
        with torch.device("meta"):
            super().__init__(linear.in_features, linear.out_features,
                             bias=linear.bias is not None)
        self.recipe = recipe(precision)
        if self.recipe.grad_stochastic and bits is None:
            raise ValueError(f"ScaledLinear: {precision} rounds gradients stochastically and "
                             "needs the run's BitStream (bits=)")
        self.bits = bits
        if linear.weight.dtype != torch.float32:
            raise TypeError(f"ScaledLinear: the master weights must be float32, got "
                            f"{linear.weight.dtype}")
        if self.recipe.kind == "mx" and self.in_features % mx.BLOCK_SIZE:
            raise ValueError(f"ScaledLinear: {precision} needs in_features divisible by "
                             f"{mx.BLOCK_SIZE}, got {self.in_features}")
        self.weight = linear.weight
        self.bias = linear.bias
        device = linear.weight.device
        for t in DELAYED_TENSORS if self.recipe.delayed else ():
            self.register_buffer(f"fp8_amax_history_{t}",
                                 torch.zeros(self.recipe.history, device=device))
            self.register_buffer(f"fp8_scale_{t}", torch.ones((), device=device))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.recipe.name}"

    def _scales(self) -> dict[str, torch.Tensor] | None:
        if not self.recipe.delayed:
            return None
        return {t: getattr(self, f"fp8_scale_{t}") for t in DELAYED_TENSORS}

    @torch.no_grad()
    def _record(self, t: str, a: torch.Tensor) -> None:
        h = getattr(self, f"fp8_amax_history_{t}")
        h.copy_(fp8_scaling.record_amax(h, fp8_scaling.tensor_amax(a)))

    @torch.no_grad()
    def _update(self) -> None:
        for t in DELAYED_TENSORS:
            fmt = self.recipe.backward if t == "grad_output" else self.recipe.forward
            h, s = getattr(self, f"fp8_amax_history_{t}"), getattr(self, f"fp8_scale_{t}")
            new_h, new_s = fp8_scaling.delayed_update(h, s, fmt, self.recipe.margin)
            h.copy_(new_h)
            s.copy_(new_s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self!r}: expected float32 input (..., {self.in_features}), "
                             f"got {tuple(x.shape)} {x.dtype}")
        x2 = x.reshape(-1, self.in_features)  # (N, in)
        y2 = _ScaledMM.apply(x2, self.weight, self)
        if self.bias is not None:
            y2 = y2 + self.bias.to(y2.dtype)  # Float8Linear's `output + bias`
        return y2.reshape(*x.shape[:-1], self.out_features)


def convert(model: nn.Module, precision: str, bits: BitStream | None = None) -> list[str]:
    """Replace every nn.Linear inside the transformer's blocks by a ScaledLinear (the
    reference's convert: lm_head and the embeddings stay float32); the paths converted."""
    converted = []
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{path}.{name}" if path else name
            if type(child) is nn.Linear and ".h." in f".{full}":
                setattr(parent, name, ScaledLinear(child, precision, bits))
                converted.append(full)
    return converted
