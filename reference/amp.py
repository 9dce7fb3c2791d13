"""Autocast: a context in which each op picks its own dtype, and real 2-byte arrays.

`with autocast(lp, device_type):` is torch.autocast(device_type, dtype=lp), lp in {float16,
bfloat16}. Inside it every op consults `decide(op, *input_dtypes)`, which applies the policy
of the list the op is on (aten/src/ATen/autocast_mode.cpp and autocast_mode.h; the lists
below, one pair per device type, are held to the installed torch by parity/test_amp.py):
    lower_precision_fp   eligible inputs (float32, float16, bfloat16; never float64) are
                         cast to lp; the op computes in lp (float32 accumulation) -> lp
    fp32                 eligible inputs are cast to float32; the op computes in float32
    (neither)            no cast: the op runs in its inputs' promoted dtype (torch's type
                         promotion: lp with float32 -> float32, float16 with bfloat16 ->
                         float32), computing lp in float32 ("opmath") and rounding once
Outside the context (or with enabled=False) every op is unlisted. The lists for the ops this
project uses:
    op                  CPU                       CUDA
    linear, addmm, mm   lower_precision_fp        lower_precision_fp
    matmul, bmm         lower_precision_fp        lower_precision_fp
    mv, addmv           (not listed)              lower_precision_fp
    mse_loss, nll_loss  fp32                      fp32
    cross_entropy_loss  fp32                      (not listed; its log_softmax is fp32)
    softmax, log_softmax, layer_norm  (not listed)  fp32
    gelu, tanh, relu, dropout, mul    not listed: they run in their input's dtype
    embedding, masked_fill, add       not listed (UNLISTED, held to torch too)
CPU autocast defaults to bfloat16 and accepts float16.

# NOTE [ Low-precision arrays ]
An lp tensor is a real 2-byte array here: np.float16 or ml_dtypes.bfloat16. Its values are
made by reference.formats' rounding (`cast`: encode to codes, view the codes as the 2-byte
dtype), never by NumPy's or ml_dtypes' own conversion. Arithmetic on lp arrays is explicit:
widen to float32 (`opmath`: exact), compute, round once (`cast`). So a saved lp tensor costs
2 bytes an element on the tape, as in torch, and every rounding is a line of the reference.

What a Linear does inside the context (reference/nn.py), with q(.) = cast(., lp):
    forward    x_lp = q(x), W_lp = q(W), b_lp = q(b)           (the casts; W stays float32)
               y = q(x_lp W_lp^T + b_lp)                       float32 accumulation, one rounding
               saves x_lp ("input") and W_lp ("weight")         torch: addmm's mat1 and mat2
    backward   g arrives in lp (a float32 one is rounded first: autograd's validate_outputs)
               dx_lp = q(g W_lp), dW = q(g^T x_lp), db = q(sum_N g)    each accumulated in float32
               W.grad += dW, b.grad += db, dx = dx_lp in x's dtype: the casts' backward
               (ToCopyBackward0) widens exactly; parameters stay float32 "master weights"
A loss (fp32 list) casts its lp input to float32 (exact), saves that float32 copy, and its
backward's float32 gradient is rounded back to lp by the cast's backward.

# NOTE [ Autocast on the transformer ]
What each op of reference/gpt.py does inside the context, lp = the autocast dtype, with
the dtype its result has (the residual stream x stays float32 throughout):
    wte[idx] + wpe[pos], drop     unlisted: float32 (the tables are float32 parameters)
    ln_1, ln_2, ln_f              CPU: unlisted, float32 in -> float32 out; CUDA: fp32.
                                  Saves input, mean, rstd in float32 either way. (An lp
                                  input on the CPU: torch's mixed kernel, lp out, float32
                                  mean and rstd; the reference does the same.)
    c_attn, c_proj, c_fc, lm_head lower_precision_fp (linear / addmm / mm): lp out; saves the
                                  lp input and the lp cast of the weight
    q @ k^T, p @ v                lower_precision_fp (matmul -> bmm): lp out; saves the lp
                                  (B nh, T, d) copies torch's matmul makes
    * (1 / sqrt d), masked_fill   unlisted: lp in, lp out (opmath product, rounded once)
    softmax                       CPU: unlisted, lp in -> lp out, saves its lp result;
                                  CUDA: fp32 -> saves a float32 result, and p @ v then
                                  saves a new lp cast of it (the tape grows by 4 + 2
                                  bytes per probability instead of 2)
    attn_dropout, resid_dropout,  unlisted: in their input's dtype (the CPU's saved noise
    mlp.dropout, gelu             is lp; gelu saves its lp input)
    x + branch                    unlisted: float32 + lp promotes to float32 (exact widening)
    cross_entropy                 CPU: fp32 (cross_entropy_loss); CUDA: its log_softmax is
                                  fp32: the lp logits are widened, log-probs saved in float32
Backward: each op's gradient comes in its output's dtype (autograd rounds a float32
gradient reaching an lp output once), is computed in opmath and rounded once; a cast's
backward widens (or rounds) the gradient back to the dtype before the cast, so every
parameter's .grad is float32. The reference's saved tensors under autocast are torch's by
name, shape, dtype and bytes (claim gpt.autocast_saved_tensors).

# NOTE [ Autocast state ]
torch keeps the autocast state per device type in thread-local flags; the context saves
them on entry and restores them on exit, so contexts nest (an inner enabled=False turns
autocast off; an inner dtype wins). torch.utils.checkpoint records the state at forward
and re-enters it around the recompute, so a recomputed segment casts as its forward did,
whatever context backward runs in. The reference keeps one stack of states: its arrays
have no device, so the innermost context's device_type picks the lists (torch consults the
state of the device the op's tensors live on). `autocast_state()` is what a checkpoint
records; `autocast.entering(state)` re-enters it. torch also caches the casts of leaf
float32 parameters within the outermost region; the reference casts each time (same
bits, and the saved casts are the same tensors by value).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

import ml_dtypes
import numpy as np

from reference.formats import encode

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
# AT_FORALL_FP32 (AutocastCUDA) also lists the normalizations; AutocastCPU does not, so on
# the CPU softmax, log_softmax and layer_norm run in their input's dtype (torch 2.6 - 2.13)
FP32_CUDA_NORMS = ("softmax.int", "log_softmax.int", "layer_norm", "native_layer_norm")
# The other ops the transformer runs: no Autocast kernel on either device type, so they run
# in their inputs' (promoted) dtype (torch 2.6 - 2.13)
UNLISTED = ("embedding", "gelu", "masked_fill.Scalar", "dropout", "native_dropout",
            "mul.Tensor", "mul.Scalar", "add.Tensor", "_softmax", "_log_softmax")
LISTS: dict[str, dict[str, tuple[str, ...]]] = {
    "cpu": {"lower_precision_fp": LOWER_PRECISION_FP_CPU, "fp32": FP32_CPU_LOSSES},
    "cuda": {"lower_precision_fp": LOWER_PRECISION_FP_CUDA,
             "fp32": FP32_CUDA_LOSSES + FP32_CUDA_NORMS},
}

LP_DTYPES: dict[str, np.dtype] = {"float16": np.dtype(np.float16),
                                  "bfloat16": np.dtype(ml_dtypes.bfloat16)}
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
ELIGIBLE = (F32, *LP_DTYPES.values())  # what autocast casts; float64 never
FLOATS = (F64, *ELIGIBLE)
PRECISIONS: dict[str, str | None] = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def autocast_dtype(precision: str) -> str | None:
    """"fp32" -> None (no autocast), "bf16" -> "bfloat16", "fp16" -> "float16"."""
    if precision not in PRECISIONS:
        raise ValueError(f"amp: precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def op_policy(op: str, device_type: str = "cpu") -> str | None:
    """"lower_precision_fp", "fp32" (for the ops listed here), or None (not listed)."""
    if device_type not in LISTS:
        raise ValueError(f"amp: device_type must be one of {tuple(LISTS)}, got {device_type!r}")
    for policy, ops in LISTS[device_type].items():
        if op in ops or any(o.split(".")[0] == op for o in ops):
            return policy
    return None


# -- the state and the context (NOTE [ Autocast state ])
@dataclass(frozen=True)
class AutocastState:
    """torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type)."""

    enabled: bool = False
    dtype: str = "bfloat16"
    device_type: str = "cpu"


_STACK: list[AutocastState] = [AutocastState()]


def autocast_state() -> AutocastState:
    """The state ops consult now (the innermost context's; disabled outside any)."""
    return _STACK[-1]


class autocast:  # lower case: torch.autocast's name
    """torch.autocast(device_type, dtype, enabled) for the reference's ops.

    `dtype` "float16" | "bfloat16", or None for the project's fp32 (disabled); enabled=False
    disables it too. Entering pushes the state, exiting restores the one before: contexts
    nest, and an exception inside leaves the state as it was.
    """

    def __init__(self, dtype: str | None, device_type: str = "cpu", *,
                 enabled: bool = True) -> None:
        if dtype not in (None, *LP_DTYPES):
            raise ValueError(f"autocast: dtype must be None, 'float16' or 'bfloat16', "
                             f"got {dtype!r}")
        op_policy("linear", device_type)  # refuses an unknown device type
        self.state = AutocastState(enabled and dtype is not None, dtype or "bfloat16",
                                   device_type)

    @classmethod
    def entering(cls, state: AutocastState) -> autocast:
        """The context that re-enters a recorded state (what a recompute runs under)."""
        return cls(state.dtype, state.device_type, enabled=state.enabled)

    def __enter__(self) -> AutocastState:
        _STACK.append(self.state)
        return self.state

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        _STACK.pop()


# -- the policy
@dataclass(frozen=True)
class Decision:
    """What an op does with its float inputs: `cast` them to (None: no cast), compute in
    `compute` (the opmath dtype: float32 for lp), return `result`."""

    cast: np.dtype | None
    compute: np.dtype
    result: np.dtype


def promote(*dtypes: np.dtype) -> np.dtype:
    """torch's type promotion among float dtypes: float64 > float32 > {float16, bfloat16},
    and float16 with bfloat16 gives float32."""
    kinds = {np.dtype(d) for d in dtypes}
    if not kinds or not kinds <= set(FLOATS):
        raise TypeError(f"amp: expected float dtypes, got {sorted(map(str, kinds))}")
    if len(kinds) == 1:
        return kinds.pop()
    return F64 if F64 in kinds else F32


def opmath(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic on `dtype` runs in: float32 for lp, the dtype itself otherwise."""
    return F32 if np.dtype(dtype) in LP_DTYPES.values() else np.dtype(dtype)


def decide(op: str, *dtypes: np.dtype, state: AutocastState | None = None) -> Decision:
    """The one policy: the cast, compute and result dtypes of `op` on inputs of `dtypes`
    under `state` (default: the current one). Pass the dtypes the kernel promotes: an op
    whose kernel takes mixed dtypes by design passes its input's only (layer_norm with an lp
    input and float32 weight returns lp on the CPU)."""
    state = autocast_state() if state is None else state
    listed = op_policy(op, state.device_type) if state.enabled else None
    cast_to = {"lower_precision_fp": LP_DTYPES[state.dtype], "fp32": F32, None: None}[listed]
    after = [cast_to if cast_to is not None and np.dtype(d) in ELIGIBLE else d for d in dtypes]
    result = promote(*after)
    return Decision(cast_to, opmath(result), result)


# -- the arrays (NOTE [ Low-precision arrays ])
def cast(a: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """torch's .to(dtype): a itself when it has the dtype already (or dtype is None);
    narrowing to lp is reference.formats' round to nearest even (overflow to inf) on the
    float32 value; widening is exact."""
    a = np.asarray(a)
    if dtype is None or a.dtype == np.dtype(dtype):
        return a
    dtype = np.dtype(dtype)
    for name, lp in LP_DTYPES.items():
        if dtype == lp:
            return encode(np.ascontiguousarray(a, dtype=opmath(a.dtype)), name).view(lp)
    return a.astype(dtype)


def apply(decision: Decision, *arrays: np.ndarray | None) -> list[np.ndarray | None]:
    """The decision's casts of an op's inputs (eligible ones only; None passes through)."""
    return [a if a is None or decision.cast is None or a.dtype not in ELIGIBLE
            else cast(a, decision.cast) for a in arrays]


def wide(a: np.ndarray) -> np.ndarray:
    """a in its opmath dtype: lp widened to float32 (exact), float32/float64 unchanged."""
    return cast(a, opmath(a.dtype))
