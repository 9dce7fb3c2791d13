"""Causal self-attention on the tape: the attention core and the module around it.

    attn(x):  q, k, v = split(c_attn(x)) into n_head heads of d = C / n_head   (B, nh, T, d)
              y = core(q, k, v);  return resid_dropout(c_proj(merge heads of y))
    core:     s = (q k^T) * (1 / sqrt d);  s = masked_fill(s, future, -inf)
              p = attn_dropout(softmax(s));  y = p v                      (B, nh, T, d)

Backward of the attention core (NOTE [ Softmax backward ] in reference/layers.py for the
softmax step), with g the gradient of y:
    dp = g v^T,   dv = p^T g                 (p after dropout; dropout: dp <- dp * mask)
    ds = p (dp - sum_j p_j dp_j)             softmax's vector-Jacobian product
    ds <- 0 where masked;  ds <- ds / sqrt d
    dq = ds k,   dk = ds^T q

The tape. Every op saves, under torch's node and attribute names, the tensors torch's
autograd saves for it (reference/layers.py), so that the tape's bytes are autograd's bytes,
view sharing included: the core reshapes q, k^T and v into (B nh, T, d) COPIES (torch's
matmul folds the head axis into a batch axis, and the heads are strided views), the mask is
a fresh (1, 1, T, T) bool array, and p v saves p itself when there is no dropout (the same
storage as the softmax's result). NOTE [ The scale is not on the tape ]: torch wraps the
Python float 1/sqrt(d) as a 0-d float64 "wrapped number"; its MulBackward0 shows it as
`_saved_other` when read, but keeps it as a scalar that never passes through
saved_tensors_hooks (torch 2.6, 2.11 and 2.13 alike), so the reference keeps it beside the
tape (`_scale`), not on it. The product itself is computed in the input dtype.
The attention core is its own module (`core`, no parameters), so that it can be recomputed
on its own.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from reference import amp
from reference.layers import bmm, masked_fill, scale, softmax, softmax_backward
from reference.module import Module, Parameter, check_grad
from reference.nn import Dropout, Linear

if TYPE_CHECKING:
    from common.gpt_config import GPTConfig


def init_normal(p: Parameter, rng: np.random.Generator, std: float) -> None:
    p.data = rng.normal(0.0, std, size=p.data.shape).astype(p.data.dtype)


def linear(d_in: int, d_out: int, bias: bool, std: float, rng: np.random.Generator,
            dtype: type) -> Linear:
    """A Linear with GPT-2's initialization: weight ~ N(0, std^2), bias 0."""
    layer = Linear(d_in, d_out, bias, rng=rng, dtype=dtype)
    init_normal(layer.weight, rng, std)
    if layer.bias is not None:
        layer.bias.data = np.zeros_like(layer.bias.data)
    return layer


class AttentionCore(Module):
    """y = dropout(softmax(masked_fill(q k^T / sqrt d, future, -inf))) v, per head."""

    def __init__(self, block_size: int, dropout: float, *, rng: np.random.Generator) -> None:
        super().__init__()
        self.block_size = block_size
        self.attn_dropout = Dropout(dropout, rng=rng)
        self._shape: tuple[int, ...] = ()
        self._scale = 1.0
        self._dtypes: tuple[np.dtype, ...] = ()

    def __repr__(self) -> str:
        return "AttentionCore()"

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        B, nh, T, hs = q.shape  # batch, heads, time, head size
        self._scale = 1.0 / math.sqrt(hs)  # NOTE [ The scale is not on the tape ]
        qk = amp.decide("matmul", q.dtype, k.dtype)  # lower_precision_fp
        q_c, kt_c = amp.apply(qk, q, k.transpose(0, 1, 3, 2))  # lp casts (none if lp already)
        q3 = q_c.reshape(B * nh, T, hs)  # a copy: q is a strided view of the qkv output
        kt3 = kt_c.reshape(B * nh, hs, T)  # a copy, as torch's matmul
        s = scale(bmm(q3, kt3).reshape(B, nh, T, T), self._scale)  # unlisted: s's dtype
        future = np.triu(np.ones((1, 1, T, T), dtype=bool), 1)  # (1, 1, T, T), built for T
        s = masked_fill(s, future, -math.inf)  # exact, s's dtype
        (s_c,) = amp.apply(amp.decide("softmax", s.dtype), s)  # CUDA autocast: float32
        p = softmax(s_c)  # (B, nh, T, T)
        p_drop = self.attn_dropout.forward(p)
        av = amp.decide("matmul", p_drop.dtype, v.dtype)  # lower_precision_fp
        p_c, v_c = amp.apply(av, p_drop, v)
        a3 = p_c.reshape(B * nh, T, T)  # a view
        v3 = v_c.reshape(B * nh, T, hs)  # a copy
        self.save_for_backward({
            "qk:BmmBackward0.self": q3, "qk:BmmBackward0.mat2": kt3,
            "mask:MaskedFillBackward0.mask": future,
            "softmax:SoftmaxBackward0.result": p,
            "av:BmmBackward0.self": a3, "av:BmmBackward0.mat2": v3})
        self._shape = q.shape
        # the dtypes the casts' backwards widen (or round) the gradients back to
        self._dtypes = (q.dtype, k.dtype, s.dtype, p_drop.dtype, v.dtype)
        return bmm(a3, v3).reshape(B, nh, T, hs)

    def backward(self, grad_output: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        saved = self.pop_saved()
        B, nh, T, hs = self._shape
        q_dt, k_dt, s_dt, pd_dt, v_dt = self._dtypes
        a3, v3 = saved["av:BmmBackward0.self"], saved["av:BmmBackward0.mat2"]
        g3 = amp.cast(check_grad(self, grad_output, self._shape), amp.promote(a3.dtype, v3.dtype)
                      ).reshape(B * nh, T, hs)  # autograd rounds it to the product's dtype
        dv = amp.cast(bmm(a3.transpose(0, 2, 1), g3), v_dt)  # (B nh, T, hs)
        dp = amp.cast(bmm(g3, v3.transpose(0, 2, 1)).reshape(B, nh, T, T), pd_dt)
        p = saved["softmax:SoftmaxBackward0.result"]
        ds = softmax_backward(amp.cast(self.attn_dropout.backward(dp), p.dtype), p)
        ds = masked_fill(amp.cast(ds, s_dt), saved["mask:MaskedFillBackward0.mask"], 0.0)
        ds3 = scale(ds, self._scale).reshape(B * nh, T, T)
        dq = bmm(ds3, saved["qk:BmmBackward0.mat2"].transpose(0, 2, 1))  # (B nh, T, hs)
        dkt = bmm(saved["qk:BmmBackward0.self"].transpose(0, 2, 1), ds3)  # (B nh, hs, T)
        return (amp.cast(dq, q_dt).reshape(B, nh, T, hs),
                amp.cast(dkt.transpose(0, 2, 1), k_dt).reshape(B, nh, T, hs),
                dv.reshape(B, nh, T, hs))


class CausalSelfAttention(Module):
    """c_attn (C -> 3C), heads split, the core, heads merged, c_proj (C -> C), dropout."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator, dtype: type) -> None:
        super().__init__()
        C, std = config.n_embd, 0.02
        self.n_head = config.n_head
        self.c_attn = linear(C, 3 * C, config.bias, std, rng, dtype)
        self.core = AttentionCore(config.block_size, config.dropout,
                                                           rng=rng)
        self.c_proj = linear(
            C, C, config.bias, std / math.sqrt(2 * config.n_layer), rng, dtype)
        self.resid_dropout = Dropout(config.dropout, rng=rng)

    def __repr__(self) -> str:
        return "CausalSelfAttention()"

    def _needs_tape(self) -> bool:
        return False

    def forward(self, x: np.ndarray) -> np.ndarray:
        B, T, C = x.shape  # batch, time, channels
        nh = self.n_head
        q, k, v = np.split(self.c_attn.forward(x), 3, axis=2)  # 3 x (B, T, C), views
        q, k, v = (t.reshape(B, T, nh, C // nh).transpose(0, 2, 1, 3) for t in (q, k, v))
        y = self.core.forward(q, k, v)  # (B, nh, T, hs)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # a copy: torch's .contiguous()
        return self.resid_dropout.forward(self.c_proj.forward(y))

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        g = self.c_proj.backward(self.resid_dropout.backward(grad_output))  # (B, T, C)
        B, T, C = g.shape
        nh = self.n_head
        grads = self.core.backward(g.reshape(B, T, nh, C // nh).transpose(0, 2, 1, 3))
        dqkv = np.concatenate([d.transpose(0, 2, 1, 3).reshape(B, T, C) for d in grads], 2)
        return self.c_attn.backward(dqkv)
