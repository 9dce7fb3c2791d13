"""Autocast emulation: the compact model's forward and backward as torch.autocast runs them.

Inside `torch.autocast(device_type, dtype=lp)`, lp in {float16, bfloat16}, each op follows
the policy of the list it is on (aten/src/ATen/autocast_mode.cpp and autocast_mode.h; the
lists below, one pair per device type, are checked against the installed torch by
parity/test_amp.py):
    lower_precision_fp   float32 arguments are cast to lp (float64 ones are not: only
                         float16/bfloat16/float32 are "eligible"), the op runs in lp;
    fp32                 lp arguments are cast to float32, the op runs in float32;
    (neither)            the op runs in whatever dtype its inputs have (GELU on an lp
                         tensor computes in float32 internally and stores lp).
The lists for the ops this project uses:
    op           CPU                     CUDA
    linear       lower_precision_fp      lower_precision_fp
    addmm, mm    lower_precision_fp      lower_precision_fp
    matmul, bmm  lower_precision_fp      lower_precision_fp
    mv, addmv    (not listed: float32)   lower_precision_fp
    mse_loss     fp32                    fp32
    cross_entropy_loss  fp32             (not listed; its log_softmax and nll_loss are fp32)
    gelu, tanh, relu, dropout   not listed: they run in their input's dtype
CPU autocast defaults to bfloat16 and accepts float16.

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
rounds the gradient it returns. A loss (fp32 list) reads the lp output as float32 (exact)
and returns a float32 gradient, which the cast's backward (ToCopyBackward0) rounds to lp
before the last Linear sees it. Parameters are never rounded in place: they stay float32
"master weights"; only their casts are lp.

The emulation differs from torch only in float32 accumulation order (BLAS vs oneDNN or
cuBLAS) and in the elementary functions (NOTE [ GELU formulas ] in reference/nn.py), both
far below an lp ulp: each op's result is torch's, or one lp ulp from it where the exact
value lies that close to a rounding boundary (parity/claims/amp.py derives the bounds).
Dropout's mask is not emulated in lp (it is float32 here).
"""

from __future__ import annotations

import numpy as np

from reference.formats import quantize
from reference.nn import GELU, Dropout, Linear, Module, ReLU, Sequential, Tanh

# NOTE [ Autocast as a wrapper ]
# torch's autocast is a dispatch key: inside the context every op consults its list, so
# `with torch.autocast(...): model(x)` needs no change to the model and backward follows
# the recorded graph (torch_impl/amp.py's `autocast` is that context). The reference has
# no dispatcher: its layers compute in the dtype they are given and record a tape. So
# `Autocast(model, dtype, device_type)` wraps the model and applies each layer's policy
# itself, layer by layer, in `forward` and again (in reverse) in `backward`. The two read
# in parallel as
#     torch:      with autocast(dtype, device_type): out = model(x)      ... out.backward(g)
#     reference:  run = Autocast(model, dtype, device_type); out = run(x) ... run.backward(g)
# and differ in one more way: the reference keeps what each layer's backward received
# (`output_grads`, the gradient torch would give after `retain_grad()` on the layer's output)
# and each layer's output (`outputs`), so that parity tests can check the wiring layer by
# layer.

# torch 2.6 - 2.13 aten/src/ATen/autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)
# (aten names with their overload where the op has several)
LOWER_PRECISION_FP_CPU = (
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm",
    "_addmm_activation", "addbmm", "linear", "_convolution.deprecated", "matmul", "conv_tbc",
    "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input",
    "prelu", "scaled_dot_product_attention", "_native_multi_head_attention",
)
FP32_CPU_LOSSES = (
    "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
    "poisson_nll_loss", "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss",
    "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "ctc_loss.IntList", "ctc_loss.Tensor", "kl_div", "multilabel_margin_loss",
    "binary_cross_entropy_with_logits",
)
# torch 2.6 - 2.13 aten/src/ATen/autocast_mode.h, AT_FORALL_LOWER_PRECISION_FP (AutocastCUDA)
LOWER_PRECISION_FP_CUDA = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot",
    "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32_CUDA_LOSSES = (
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits",
)
LISTS: dict[str, dict[str, tuple[str, ...]]] = {
    "cpu": {"lower_precision_fp": LOWER_PRECISION_FP_CPU, "fp32": FP32_CPU_LOSSES},
    "cuda": {"lower_precision_fp": LOWER_PRECISION_FP_CUDA, "fp32": FP32_CUDA_LOSSES},
}
LAYER_OPS: dict[type, str] = {Linear: "linear", GELU: "gelu", Tanh: "tanh", ReLU: "relu",
                              Dropout: "dropout"}

PRECISIONS: dict[str, str | None] = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def autocast_dtype(precision: str) -> str | None:
    """"fp32" -> None (no autocast), "bf16" -> "bfloat16", "fp16" -> "float16"."""
    if precision not in PRECISIONS:
        raise ValueError(f"amp: precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def op_policy(op: str, device_type: str = "cpu") -> str | None:
    """"lower_precision_fp", "fp32" (for the losses listed here), or None (not listed)."""
    if device_type not in LISTS:
        raise ValueError(f"amp: device_type must be one of {tuple(LISTS)}, got {device_type!r}")
    for policy, ops in LISTS[device_type].items():
        if op in ops or any(o.split(".")[0] == op for o in ops):
            return policy
    return None


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
    return _q(y, fmt).reshape(*x.shape[:-1], layer.out_features)


def linear_backward(layer: Linear, grad_output: np.ndarray, fmt: str) -> np.ndarray:
    """dx = q(g W_lp); W.grad += q(g^T x_lp); b.grad += q(sum_N g); g must be lp already."""
    saved = layer.pop_saved()
    x_lp, w_lp = saved["input"], saved["weight"]  # (N, in), (out, in)
    g = np.asarray(grad_output)
    g2 = g.reshape(-1, layer.out_features)  # (N, out)
    if g2.shape[0] != x_lp.shape[0]:
        raise ValueError(f"{layer!r}: grad_output {g.shape} does not match the saved input "
                         f"{x_lp.shape}")
    layer.weight.accumulate(_q(g2.T @ x_lp, fmt))  # (out, in)
    if layer.bias is not None:
        layer.bias.accumulate(_q(g2.sum(axis=0, dtype=g2.dtype), fmt))
    return _q(g2 @ w_lp, fmt).reshape(*g.shape[:-1], layer.in_features)


def elementwise_forward(layer: Module, x: np.ndarray, fmt: str) -> np.ndarray:
    """An op off the lists on an lp input: float32 compute, lp output, lp saved tensors."""
    y = _q(layer.forward(x), fmt)
    layer.save_for_backward({k: _q(v, fmt) for k, v in layer.saved_tensors().items()})
    return y


def elementwise_backward(layer: Module, grad_output: np.ndarray, fmt: str) -> np.ndarray:
    """Its backward: float32 compute from the lp gradient and tape, lp input gradient."""
    return _q(layer.backward(grad_output), fmt)


class Autocast:
    """Run `model` (a Sequential, or one layer) as under torch.autocast(device_type, dtype).

    `dtype` None runs the model unchanged (fp32). Otherwise each layer follows its op's
    policy (`op_policy`): Linear is lower_precision_fp (`linear_forward`/`linear_backward`);
    a layer off the lists whose input is low precision computes in float32 and has its
    output (forward) and input gradient (backward) rounded to the format. Each layer keeps
    its own tape, so `model.tape()` still lists what is saved. After a run, `outputs[i]` is
    layer i's output and `output_grads[i]` the gradient its backward received
    (NOTE [ Autocast as a wrapper ]).
    """

    def __init__(self, model: Module, dtype: str | None, device_type: str = "cpu") -> None:
        if dtype not in (None, "float16", "bfloat16"):
            raise ValueError(f"Autocast: dtype must be None, 'float16' or 'bfloat16', "
                             f"got {dtype!r}")
        op_policy("linear", device_type)  # refuses an unknown device type
        self.model, self.dtype, self.device_type = model, dtype, device_type
        self.layers = list(model) if isinstance(model, Sequential) else [model]
        for layer in self.layers:
            op = LAYER_OPS.get(type(layer))
            expected = "lower_precision_fp" if isinstance(layer, Linear) else None
            if op is None or op_policy(op, device_type) != expected:
                raise NotImplementedError(f"Autocast: no emulation of {layer!r} under "
                                          f"{device_type} autocast")
        self.outputs: list[np.ndarray] = []
        self.output_grads: list[np.ndarray] = []
        self._low_out: list[bool] = []

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)

    def forward(self, x: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            return self.model.forward(x)
        low, self._low_out, self.outputs = False, [], []  # low: x is an lp tensor
        for layer in self.layers:
            if isinstance(layer, Linear):  # op_policy("linear") == "lower_precision_fp"
                x, low = linear_forward(layer, x, self.dtype), x.dtype == np.float32
            else:
                x = elementwise_forward(layer, x, self.dtype) if low else layer.forward(x)
            self._low_out.append(low)
            self.outputs.append(x)
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
        self.output_grads = [g] * len(self.layers)
        for i in range(len(self.layers) - 1, -1, -1):
            layer, low = self.layers[i], low_in[i]
            self.output_grads[i] = g
            if isinstance(layer, Linear):
                g = linear_backward(layer, g, self.dtype)  # lp; a float32 input gets it exactly
            else:
                g = elementwise_backward(layer, g, self.dtype) if low else layer.backward(g)
        self._low_out = []
        return g
