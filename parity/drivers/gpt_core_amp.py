"""The attention core under autocast, op by op (claims gpt.attention_core_autocast_*): every
elementary op the reference's core runs (scores' product, scale, causal mask, softmax,
dropout, p v, and each backward step) is recorded with its operands during one reference
GPT forward and backward under autocast, with or without selective recomputation of the
core, and torch's own op is run on the same operands.

NOTE [ Attention core under autocast ]
Per op, on the same lp operands, elementwise in lp ulps beyond an allowance k:
    bmm (q k^T, p v, g v^T, p^T g, ds k, q^T ds): float32 accumulation of a k-term product in
        either order lies within gamma_k sum |a_i b_i| of the exact value; both round the
        float32 result to lp, monotone: k = the rounding spread of that interval
        (gpt.autocast_layers' derivation).
    scale, masked_fill, dropout and its backward: one product in float32 of two lp values
        (or a select), rounded once to lp in both trees: k = 0, bit-identical.
    softmax (lp in, lp out, computed in float32): each side within p (4 a + T + 2 + |s - max|)
        eps32 of the exact softmax of the lp scores (NOTE [ Attention error budget ], a = 4
        for NumPy's float32 exp), then rounded to lp: k = the rounding spread.
    softmax backward: p (g - sum p g) in float32, each side within u (|p| ((T + 1) sum |p g|
        + |g - sigma|) + |ds|) of the exact value on the lp operands: k = the rounding spread
        (torch before 2.11 rounds sigma to lp first: plus |p| (u_lp |sigma| + eta_lp / 2),
        eta_lp the smallest subnormal, NOTE [ Softmax backward's sum in lp ]).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import ml_dtypes
import numpy as np
import torch

from parity.drivers import gpt as dg
from parity.drivers.amp import SUFFIX, _gamma2, f32
from parity.drivers.lp_ordinal import rounding_spread
from reference import amp as ramp
from reference import attention as rattn
from reference import gpt as rgpt
from reference import nn as rnn
from reference import recompute_gpt as rrec
from torch_impl.format_spec import DTYPES as TORCH_DTYPES

Call = tuple[str, str, tuple, np.ndarray]  # (op, core path, operands, result)
Pair = tuple[str, str, np.ndarray, np.ndarray, np.ndarray]  # claim, where, ref, torch, k
# NOTE [ Softmax backward's sum in lp ]: torch 2.6's CPU softmax backward for bf16/fp16 rounds
# sigma = sum p g (accumulated in float32) to the lp dtype before p (g - sigma); torch 2.11 and
# 2.13 keep it in float32, as the reference does (versions between not checked here).
SIGMA_ROUNDED_TO_LP = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (
    2, 11)
_OPS = ("bmm", "scale", "masked_fill", "softmax", "softmax_backward")


@contextlib.contextmanager
def recording(model: rgpt.GPT) -> Iterator[list[Call]]:
    """Record every elementary op of every attention core (module-level functions of
    reference.attention, and each core's dropout) while the block runs."""
    calls: list[Call] = []
    where = [""]
    saved = {name: getattr(rattn, name) for name in _OPS}
    for name, f in saved.items():
        def rec(*args: object, _f: Callable = f, _n: str = name) -> np.ndarray:
            out = _f(*args)
            calls.append((_n, where[0], args, out))
            return out

        setattr(rattn, name, rec)
    cores = [(p, m) for p, m in model.named_modules() if isinstance(m, rattn.AttentionCore)]
    for path, core in cores:
        for method in ("forward", "backward"):
            f = getattr(type(core), method)

            def enter(*args: np.ndarray, _f: Callable = f, _c: object = core, _p: str = path
                      ) -> object:
                where[0] = _p
                return _f(_c, *args)

            setattr(core, method, enter)
        drop = core.attn_dropout
        for method, bound in (("forward", drop.forward), ("backward", drop.backward)):
            def drec(x: np.ndarray, *rest: object, _f: Callable = bound,
                     _m: str = method, _d: rnn.Dropout = drop) -> np.ndarray:
                before = _d._saved.get("mask")
                out = _f(x, *rest)
                noise = _d._saved.get("mask") if _m == "forward" else before
                if noise is not None:  # dropout on and training
                    calls.append((f"dropout_{_m}", where[0], (x, noise), out))
                return out

            setattr(drop, method, drec)
    try:
        yield calls
    finally:
        for name, f in saved.items():
            setattr(rattn, name, f)
        for _, core in cores:
            for obj in (core, core.attn_dropout):
                for method in ("forward", "backward"):
                    obj.__dict__.pop(method, None)


def _lp(a: np.ndarray, device: str) -> torch.Tensor:
    """An lp reference array as the torch lp tensor of the same values (widened exactly)."""
    fmt = next(k for k, v in ramp.LP_DTYPES.items() if np.dtype(v) == a.dtype)
    return torch.from_numpy(f32(np.ascontiguousarray(a))).to(device, TORCH_DTYPES[fmt])


def _softmax_delta(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact softmax, per-side float32 error bound) of lp scores s (NOTE above)."""
    s64 = f32(s).astype(np.float64)
    T = s.shape[-1]
    finite = np.isfinite(s64)
    m = np.where(finite, s64, -np.inf).max(-1, keepdims=True)
    shifted = np.where(finite, s64 - m, 0.0)
    e = np.where(finite, np.exp(shifted), 0.0)
    p = e / e.sum(-1, keepdims=True)
    return p, p * (4 * 4 + T + 2 + np.abs(shifted)) * float(np.finfo(np.float32).eps)


def torch_op(op: str, args: tuple, device: str) -> tuple[torch.Tensor, np.ndarray | None]:
    """Torch's own op on the reference's operands, and the exact (value, half-width) it is
    allowed to round from (None: bit-identical)."""
    u = float(np.finfo(np.float32).eps) / 2
    if op == "bmm":
        a, b = args
        a64, b64 = f32(a).astype(np.float64), f32(b).astype(np.float64)
        spread = (a64 @ b64, _gamma2(a.shape[-1]) * (np.abs(a64) @ np.abs(b64)))
        return torch.bmm(_lp(a, device), _lp(b, device)), spread  # type: ignore[return-value]
    if op == "scale":
        return _lp(args[0], device) * args[1], None
    if op == "masked_fill":
        x, mask, value = args
        return _lp(x, device).masked_fill(torch.from_numpy(mask).to(device), value), None
    if op == "softmax":
        return torch.softmax(_lp(args[0], device), -1), _softmax_delta(args[0])  # type: ignore
    if op == "softmax_backward":
        g, p = args
        g64, p64 = f32(g).astype(np.float64), f32(p).astype(np.float64)
        sigma = (p64 * g64).sum(-1, keepdims=True)
        ds = p64 * (g64 - sigma)
        T = p.shape[-1]
        half = 1.01 * u * (np.abs(p64) * ((T + 1) * np.abs(p64 * g64).sum(-1, keepdims=True)
                                          + np.abs(g64 - sigma)) + np.abs(ds))
        if SIGMA_ROUNDED_TO_LP:  # torch's side: p (g - q(sigma)), q(sigma) within u_lp |sigma|
            fmt = next(k for k, v in ramp.LP_DTYPES.items() if np.dtype(v) == p.dtype)
            lp = ml_dtypes.finfo(ramp.LP_DTYPES[fmt])  # relative, or absolute if subnormal
            half = half + 1.01 * np.abs(p64) * (float(lp.eps) / 2 * np.abs(sigma)
                                                + float(lp.smallest_subnormal) / 2)
        t = torch.ops.aten._softmax_backward_data(_lp(g, device), _lp(p, device), -1,
                                                  _lp(p, device).dtype)
        return t, (ds, half)  # type: ignore[return-value]
    x, noise = args  # dropout: torch's CPU kernel multiplies by its lp noise, keep / (1 - p)
    return _lp(x, device) * _lp(noise, device), None


def core_pairs(config: dg.GPTConfig, fmt: str, batch: int, seq_len: int, seed: int,
               recompute: bool = False, device: str = "cpu"
               ) -> tuple[list[Pair], list[Call]]:
    """Every recorded op of the reference's cores in one GPT forward and backward under `fmt`
    CPU autocast (dropout masks the reference's own draws), each against torch's op on the
    same operands: (pairs (claim, where, reference, torch, k), the calls)."""
    model = rgpt.GPT(config, rng=np.random.default_rng(seed % 1000))
    if recompute:
        rrec.recompute_attention_cores(model)
    idx, targets = dg.tokens(config, batch, seq_len, seed)
    with recording(model) as calls:
        with ramp.autocast(fmt, "cpu"):
            model.forward(idx, targets)
        model.backward()
    pairs: list[Pair] = []
    for i, (op, path, args, out) in enumerate(calls):
        t, spread = torch_op(op, args, device)
        k = (np.zeros(out.shape, np.int64) if spread is None
             else rounding_spread(spread[0], spread[1], fmt))
        pairs.append((f"gpt.attention_core_autocast_{SUFFIX[fmt]}", f"{path} #{i} {op}",
                      f32(out), f32(t).reshape(out.shape), k))
    return pairs, calls
