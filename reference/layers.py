"""The transformer's generic layers on the tape: Embedding and LayerNorm, and the small ops
(softmax, masked_fill, batched matmul) the attention core is built from.

Each op is one small function with one place where its inputs are read and its output made:
the place the autocast policy is consulted (reference/amp.py, NOTE [ Autocast on the
transformer ]). An op computes in its inputs' opmath dtype (float32 for a 2-byte lp array)
and rounds its result once to the result dtype, as torch's CPU kernels do. A module saves,
under torch's node and attribute names ("NativeLayerNormBackward0.input"), exactly the
tensors torch's autograd node saves, so the tape's bytes are autograd's bytes.

    Embedding  y = W[idx]                     saves "EmbeddingBackward0.indices" (int64)
               dW[j] += sum_{i: idx_i = j} g_i
    LayerNorm  over the last dimension (C features), eps = 1e-5:
               mean = (1/C) sum_c x_c,   var = (1/C) sum_c (x_c - mean)^2  (biased)
               rstd = 1 / sqrt(var + eps),   xhat = (x - mean) rstd,   y = xhat w + b
               saves "NativeLayerNormBackward0.input", ".result1" (mean), ".result2" (rstd),
               the last two of shape (..., 1)

# NOTE [ LayerNorm backward ]
With gw = g w (elementwise) and the row means <.> over the C features:
    dy/dx:  d xhat_c / d x_j = rstd (delta_cj - 1/C - xhat_c xhat_j / C)
    so      dx = rstd (gw - <gw> - xhat <gw xhat>)
    dw = sum over rows of g xhat,   db = sum over rows of g
The first term is the direct path, <gw> the path through the mean, xhat <gw xhat> the path
through rstd (d rstd / d x_j = -rstd^2 xhat_j / C). torch's CPU kernel evaluates the same
formula from the saved mean and rstd (layer_norm_backward_kernel), in another operation order;
its sums over the rows, dw and db, in the order of NOTE [ LayerNorm row sums on torch's CPU ].

# NOTE [ LayerNorm row sums on torch's CPU ]
torch's CPU kernel (aten/src/ATen/native/cpu/layer_norm_kernel.cpp,
LayerNormBackwardKernelImplInternal; the same order in every stored version, torch 1.x to
2.6 and later) sums dw's terms g xhat and db's terms g over the M rows in two passes, for
each of the N columns alone:
    1. a zeroed buffer of P rows, P = torch's intra-op thread count (at::get_num_threads()),
       in x's dtype (float32 or float64 here; a 2-byte x would round each partial sum to it:
       not mirrored, CPU autocast feeds LayerNorm float32); at::parallel_for(0, M, grain 1)
       cuts the rows into chunks of c = ceil(M / min(P, M)) consecutive rows, thread t taking
       rows [t c, (t + 1) c) (invoke_parallel, ATen/ParallelOpenMP.h; one chunk when P = 1 or
       M = 1; a thread may get none: M = 5 on P = 4 gives 2, 2, 1), and adds them, in row
       order, into buffer row t:
           part_t = ((0 + t_{t c}) + t_{t c + 1}) + ... + t_{min(M, (t + 1) c) - 1}
       (elementwise across the columns: the vectorized map2 / map3 reorder nothing);
    2. sum = ((0 + part_0) + part_1) + ... + part_{P - 1}   (unused rows are 0: adding 0 to
       a sum begun at +0 changes no bit).
On one thread (the claims' setting) that is 0 + (0 + t_0 + t_1 + ... + t_{M-1}): the rows in
order from +0, so a column of -0 sums to +0 (a running sum begun at the first row gives -0).
On P > 1 threads the chunks' partial sums are another order, an ulp apart from it. db's terms
are g itself, so its sum is torch's bit for bit; dw's terms are g xhat, whose xhat torch forms
as rstd x - rstd mean (gpt.layer_norm.backward bounds the difference), added in this order.

# NOTE [ Softmax backward ]
p = softmax(s) over the last axis: p_i = exp(s_i - max s) / sum_j exp(s_j - max s).
The Jacobian is dp_i / ds_j = p_i (delta_ij - p_j), so the vector-Jacobian product is
    ds = p * (g - sum_j p_j g_j)
computed from the saved result p alone (torch's SoftmaxBackward0 saves only `result`).
Entries masked to -inf have p = 0, hence ds = 0 there, with no special case.
"""

from __future__ import annotations

import numpy as np

from reference import amp
from reference.module import Module, Parameter, check_float, check_grad

LN_EPS = 1e-5


# ---------------------------------------------------------------- ops (one function each)


def embedding(weight: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """W[idx]: (*idx.shape, C), a gather (exact)."""
    return weight[idx]


def embedding_backward(g: np.ndarray, idx: np.ndarray, num_embeddings: int) -> np.ndarray:
    """dW (V, C): the rows of g summed into the rows their indices name (in index order)."""
    dw = np.zeros((num_embeddings, g.shape[-1]), dtype=g.dtype)
    np.add.at(dw, idx.reshape(-1), g.reshape(-1, g.shape[-1]))
    return dw


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = LN_EPS
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, mean, rstd) over the last axis; mean and rstd keep it as size 1. Computed in the
    opmath dtype; y rounded once to x's dtype, mean and rstd kept in the opmath dtype (an lp
    x with float32 weights: torch's mixed-dtype CPU kernel)."""
    xw = amp.wide(x)
    c = xw.dtype.type
    mean = xw.mean(axis=-1, keepdims=True, dtype=xw.dtype)
    d = xw - mean
    var = (d * d).mean(axis=-1, keepdims=True, dtype=xw.dtype)
    rstd = c(1) / np.sqrt(var + c(eps))
    return amp.cast(d * rstd * w + b, x.dtype), mean, rstd


def layer_norm_backward(g: np.ndarray, x: np.ndarray, mean: np.ndarray, rstd: np.ndarray,
                        w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dw, db): NOTE [ LayerNorm backward ], in mean's dtype; dx rounded to x's."""
    xhat = (amp.wide(x) - mean) * rstd
    g = amp.wide(g)
    gw = g * w
    dx = rstd * (gw - gw.mean(axis=-1, keepdims=True, dtype=g.dtype)
                 - xhat * (gw * xhat).mean(axis=-1, keepdims=True, dtype=g.dtype))
    return amp.cast(dx, x.dtype), torch_cpu_row_sum(g * xhat), torch_cpu_row_sum(g)


def torch_cpu_row_sum(t: np.ndarray, threads: int = 1) -> np.ndarray:
    """The sum of t's rows (every axis but the last) in the order torch's CPU LayerNorm
    backward adds them on `threads` intra-op threads: NOTE [ LayerNorm row sums on torch's
    CPU ]. A running sum from +0 per chunk of rows, then one over the chunks' sums from +0.

    NumPy's `sum` over the rows is neither: it starts from the first row, not from 0, and with
    one column (C = 1) the rows are contiguous and it turns pairwise (8 partial sums)."""
    rows = t.reshape(-1, t.shape[-1])  # (M, N)
    m = rows.shape[0]
    chunk = max(1, -(-m // max(1, min(threads, m))))  # c = ceil(M / min(P, M)) rows a thread
    zero = np.zeros((1, rows.shape[1]), rows.dtype)
    parts = np.array([_running_sum_from_zero(rows[start:start + chunk], zero)
                      for start in range(0, m, chunk)], rows.dtype).reshape(-1, rows.shape[1])
    return _running_sum_from_zero(parts, zero)  # parts: one row per thread that had rows


def _running_sum_from_zero(rows: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """((0 + r_0) + r_1) + ...: the last of cumsum over [0, r_0, r_1, ...] (one row a step)."""
    return np.cumsum(np.concatenate([zero, rows]), axis=0, dtype=rows.dtype)[-1]


def softmax(s: np.ndarray) -> np.ndarray:
    """exp(s - max s) / sum exp(s - max s) over the last axis (-inf entries give 0), in the
    opmath dtype, rounded once to s's dtype."""
    w = amp.wide(s)
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    return amp.cast(e / e.sum(axis=-1, keepdims=True, dtype=w.dtype), s.dtype)


def softmax_backward(g: np.ndarray, p: np.ndarray) -> np.ndarray:
    """p * (g - sum p g): NOTE [ Softmax backward ]; g in p's dtype, rounded once."""
    gw, pw = amp.wide(g), amp.wide(p)
    return amp.cast(pw * (gw - (pw * gw).sum(axis=-1, keepdims=True, dtype=gw.dtype)), p.dtype)


def masked_fill(s: np.ndarray, mask: np.ndarray, value: float) -> np.ndarray:
    """s where mask is False, `value` where it is True (exact)."""
    return np.where(mask, s.dtype.type(value), s)


def scale(s: np.ndarray, factor: float) -> np.ndarray:
    """s * factor for a Python float: torch's wrapped number takes no part in type promotion,
    so the product is s's dtype, computed as opmath(s) * opmath(factor) and rounded once."""
    c = amp.opmath(s.dtype).type
    return amp.cast(amp.wide(s) * c(factor), s.dtype)


def bmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, m, k) @ (n, k, p) -> (n, m, p): n matrix products, k-term dot products accumulated
    in the opmath dtype, rounded once to the promoted dtype."""
    return amp.cast(np.matmul(amp.wide(a), amp.wide(b)), amp.promote(a.dtype, b.dtype))


# ---------------------------------------------------------------- modules


class Embedding(Module):
    """y = W[idx], W (num_embeddings, embedding_dim) ~ N(0, std^2) (GPT's init) from `rng`."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, rng: np.random.Generator,
                 dtype: type = np.float32, std: float = 0.02) -> None:
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError(f"Embedding: sizes must be positive, got "
                             f"({num_embeddings}, {embedding_dim})")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        w = rng.normal(0.0, std, size=(num_embeddings, embedding_dim)).astype(dtype)
        self.weight = Parameter(w)

    def __repr__(self) -> str:
        return f"Embedding({self.num_embeddings}, {self.embedding_dim})"

    def forward(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        if idx.dtype != np.int64:
            raise TypeError(f"{self!r}: expected int64 indices, got {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            raise IndexError(f"{self!r}: indices must lie in [0, {self.num_embeddings}), got "
                             f"[{idx.min()}, {idx.max()}]")
        self.save_for_backward({"EmbeddingBackward0.indices": idx})
        return embedding(self.weight.data, idx)

    def backward(self, grad_output: np.ndarray) -> None:
        idx = self.pop_saved()["EmbeddingBackward0.indices"]
        g = check_grad(self, grad_output, (*idx.shape, self.embedding_dim))
        self.weight.accumulate(embedding_backward(g, idx, self.num_embeddings))


class LayerNorm(Module):
    """LayerNorm over the last dimension with affine weight (ones) and bias (zeros)."""

    def __init__(self, normalized_shape: int, eps: float = LN_EPS, *,
                 dtype: type = np.float32) -> None:
        super().__init__()
        if normalized_shape < 1:
            raise ValueError(f"LayerNorm: normalized_shape must be positive, got "
                             f"{normalized_shape}")
        self.normalized_shape, self.eps = normalized_shape, eps
        self.weight = Parameter(np.ones(normalized_shape, dtype))
        self.bias = Parameter(np.zeros(normalized_shape, dtype))
        self._in_dtype = np.dtype(dtype)  # forward's input dtype, for backward's cast

    def __repr__(self) -> str:
        return f"LayerNorm({self.normalized_shape})"

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = check_float(self, x)
        if x.ndim < 1 or x.shape[-1] != self.normalized_shape:
            raise ValueError(f"{self!r}: expected input (..., {self.normalized_shape}), "
                             f"got {x.shape}")
        d = amp.decide("layer_norm", x.dtype)  # the input's dtype only: a mixed-dtype kernel
        (x_c,) = amp.apply(d, x)  # CUDA autocast: float32; CPU: as it comes
        w = self.weight.data
        if x_c.dtype != w.dtype and not (x_c.dtype in amp.LP_DTYPES.values()
                                         and w.dtype == amp.F32):
            raise TypeError(f"{self!r}: input is {x_c.dtype} but the weights are {w.dtype} "
                            f"(accepted: the weights' dtype, or float16/bfloat16 with float32 "
                            f"weights)")
        self._in_dtype = x.dtype
        y, mean, rstd = layer_norm(x_c, w, self.bias.data, self.eps)
        self.save_for_backward({"NativeLayerNormBackward0.input": x_c,
                                "NativeLayerNormBackward0.result1": mean,
                                "NativeLayerNormBackward0.result2": rstd})
        return y

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        saved = self.pop_saved()
        x = saved["NativeLayerNormBackward0.input"]
        mean = saved["NativeLayerNormBackward0.result1"]
        rstd = saved["NativeLayerNormBackward0.result2"]
        g = amp.cast(check_grad(self, grad_output, x.shape), x.dtype)  # autograd's cast
        dx, dw, db = layer_norm_backward(g, x, mean, rstd, self.weight.data)
        self.weight.accumulate(dw)
        self.bias.accumulate(db)
        return amp.cast(dx, self._in_dtype)  # the input cast's backward (exact widening)
