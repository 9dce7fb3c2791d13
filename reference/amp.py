"""Autocast emulation: the compact model's forward and backward as torch.autocast runs them.

Inside `torch.autocast(device_type, dtype=lp)`, lp in {float16, bfloat16}, each op is on one
of three lists (torch 2.13, aten/src/ATen/autocast_mode.cpp and autocast_mode.h):
    lower_precision_fp   float32 arguments are cast to lp (float64 ones are not: only
                         float16/bfloat16/float32 are "eligible"), the op runs in lp;
    fp32                 lp arguments are cast to float32, the op runs in float32;
    (neither)            the op runs in whatever dtype its inputs have (GELU on an lp
                         tensor computes in float32 internally and stores lp).
The lists for the ops this project uses (LOWER_PRECISION_FP / FP32 below hold more):
    op           CPU                     CUDA
    linear       lower_precision_fp      lower_precision_fp
    addmm, mm    lower_precision_fp      lower_precision_fp
    matmul, bmm  lower_precision_fp      lower_precision_fp
    mv, addmv    (not listed: float32)   lower_precision_fp
    mse_loss     fp32                    fp32
    cross_entropy_loss  fp32             (not listed; its log_softmax and nll_loss are fp32)
    gelu, tanh, relu, dropout   not listed: they run in their input's dtype
CPU autocast defaults to bfloat16 and accepts float16 (torch >= 2.1; 2.13 here).

What a Linear does under autocast, with q(.) rounding to lp (round to nearest even; an
lp value lives here in a float32 array, exactly):
    forward    x_lp = q(x), W_lp = q(W), b_lp = q(b)            (the casts; W stays float32)
               y = q(x_lp W_lp^T + b_lp)                        float32 accumulation, one rounding
               saves x_lp ("input") and W_lp ("weight")          torch: addmm's mat1 and mat2
    backward   g arrives in lp
               dx = q(g W_lp),  dW = q(g^T x_lp),  db = q(sum_N g)     each accumulated in float32
               W.grad += dW, b.grad += db  in float32            (lp -> float32 is exact)
An op off the lists applied to an lp input (activations) computes in float32 and rounds
its output (and what it saves: Tanh's saved result is the lp output), and its backward
rounds the gradient it returns. A loss (fp32 list) reads the
lp output as float32 (exact) and returns a float32 gradient, which the cast's backward
(ToCopyBackward0) rounds to lp before the last Linear sees it. Parameters are never
rounded in place: they stay float32 "master weights"; only their casts are lp.

The emulation differs from torch only in float32 accumulation order (BLAS vs oneDNN) and
in the elementary functions (NOTE [ GELU formulas ] in reference/nn.py), both far below
an lp ulp, so each op's output is within 1 lp ulp of torch's (parity/tolerances.py derives
the bound and its precondition). Dropout's mask is not emulated in lp (it is float32 here).
"""

from __future__ import annotations

import numpy as np

from reference.formats import quantize
from reference.nn import Linear, Module, Sequential

# torch 2.13 aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)
LOWER_PRECISION_FP_CPU = (
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm",
    "_addmm_activation", "addbmm", "linear", "_convolution.deprecated", "matmul", "conv_tbc",
    "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
    "scaled_dot_product_attention", "_native_multi_head_attention",
)
FP32_CPU_LOSSES = (
    "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
    "poisson_nll_loss", "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss",
    "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "ctc_loss", "kl_div", "multilabel_margin_loss", "binary_cross_entropy_with_logits",
)
# torch 2.13 aten/src/ATen/autocast_mode.h, AT_FORALL_LOWER_PRECISION_FP (used for CUDA)
LOWER_PRECISION_FP_CUDA = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32_CUDA_LOSSES = (
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
)

PRECISIONS: dict[str, str | None] = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def autocast_dtype(precision: str) -> str | None:
    """"fp32" -> None (no autocast), "bf16" -> "bfloat16", "fp16" -> "float16"."""
    if precision not in PRECISIONS:
        raise ValueError(f"amp: precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def _q(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round a float32 array to `fmt` (kept in float32); float64 is not eligible, as torch."""
    if x.dtype != np.float32:
        return x
    with np.errstate(over="ignore"):
        return quantize(x, fmt)


def linear_forward(layer: Linear, x: np.ndarray, fmt: str) -> np.ndarray:
    """y = q(q(x) q(W)^T + q(b)), recording ("input", "weight") on the layer's tape."""
    if x.ndim < 1 or x.shape[-1] != layer.in_features:
        raise ValueError(f"{layer!r}: expected input (..., {layer.in_features}), got {x.shape}")
    x_lp = _q(x, fmt).reshape(-1, layer.in_features)  # (N, in)
    w_lp = _q(layer.weight.data, fmt)  # (out, in)
    y = x_lp @ w_lp.T  # (N, out), float32 accumulation
    if layer.bias is not None:
        y = y + _q(layer.bias.data, fmt)
    layer.save_for_backward({"input": x_lp, "weight": w_lp})
    layer._in_shape = x.shape
    return _q(y, fmt).reshape(*x.shape[:-1], layer.out_features)


def linear_backward(layer: Linear, grad_output: np.ndarray, fmt: str) -> np.ndarray:
    """dx = q(g W_lp); W.grad += q(g^T x_lp); b.grad += q(sum_N g); g must be lp already."""
    saved = layer.pop_saved()
    x_lp, w_lp = saved["input"], saved["weight"]  # (N, in), (out, in)
    g2 = np.asarray(grad_output).reshape(-1, layer.out_features)  # (N, out)
    if g2.shape[0] != x_lp.shape[0]:
        raise ValueError(f"{layer!r}: grad_output {np.shape(grad_output)} does not match the "
                         f"saved input {x_lp.shape}")
    layer.weight.accumulate(_q(g2.T @ x_lp, fmt))  # (out, in)
    if layer.bias is not None:
        layer.bias.accumulate(_q(g2.sum(axis=0, dtype=g2.dtype), fmt))
    return _q(g2 @ w_lp, fmt).reshape(layer._in_shape)


def elementwise_forward(layer: Module, x: np.ndarray, fmt: str) -> np.ndarray:
    """An op off the lists on an lp input: float32 compute, lp output, lp saved tensors."""
    y = _q(layer.forward(x), fmt)
    layer.save_for_backward({k: _q(v, fmt) for k, v in layer.saved_tensors().items()})
    return y


def elementwise_backward(layer: Module, grad_output: np.ndarray, fmt: str) -> np.ndarray:
    """Its backward: float32 compute from the lp gradient and tape, lp input gradient."""
    return _q(layer.backward(grad_output), fmt)


class Autocast:
    """Run `model` (a Sequential, or one layer) as under torch.autocast("cpu", dtype).

    `dtype` None runs the model unchanged (fp32). Otherwise Linear layers follow
    `linear_forward`/`linear_backward` and every other layer whose input is low precision
    computes in float32 and has its output (forward) and input gradient (backward)
    rounded to the format. Each layer keeps its own tape, so `model.tape()` still lists
    what is saved.
    """

    def __init__(self, model: Module, dtype: str | None) -> None:
        if dtype not in (None, "float16", "bfloat16"):
            raise ValueError(f"Autocast: dtype must be None, 'float16' or 'bfloat16', "
                             f"got {dtype!r}")
        self.model, self.dtype = model, dtype
        self.layers = list(model) if isinstance(model, Sequential) else [model]
        self._low_out: list[bool] = []

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)

    def forward(self, x: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            return self.model.forward(x)
        low, self._low_out = False, []  # low: the current activation is an lp tensor
        for layer in self.layers:
            if isinstance(layer, Linear):
                x, low = linear_forward(layer, x, self.dtype), x.dtype == np.float32
            else:
                x = elementwise_forward(layer, x, self.dtype) if low else layer.forward(x)
            self._low_out.append(low)
        return x

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        """Backward through the autocast forward. A scaled lp backward may overflow to inf
        and then NaN: that is the event the GradScaler checks for, so NumPy's overflow and
        invalid warnings are silenced here (in fp32 too: a huge scale may overflow float32)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self._backward(grad_output)

    def _backward(self, grad_output: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            return self.model.backward(grad_output)
        if len(self._low_out) != len(self.layers):
            raise RuntimeError("Autocast.backward without an autocast forward")
        g = np.asarray(grad_output)
        low_in = [False, *self._low_out[:-1]]
        g = _q(g, self.dtype) if self._low_out[-1] else g  # ToCopyBackward0 of the loss's cast
        for layer, low in zip(reversed(self.layers), reversed(low_in), strict=True):
            if isinstance(layer, Linear):
                g = linear_backward(layer, g, self.dtype)  # lp; a float32 input gets it exactly
            else:
                g = elementwise_backward(layer, g, self.dtype) if low else layer.backward(g)
        self._low_out = []
        return g
