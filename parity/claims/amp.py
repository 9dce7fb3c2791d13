"""The amp claims (the kinds and the registry: parity/tolerances.py).

Every amp claim holds on CPU and, by the same derivation, on CUDA provided cuBLAS
accumulates fp16/bf16 products in float32 (parity/drivers/amp.py switches
torch.backends.cuda.matmul.allow_{fp16,bf16}_reduced_precision_reduction off around the CUDA
runs) and the float32 elementary functions on CUDA meet the nn claims' bounds; the CUDA runs
use the CUDA op lists.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

# The smallest share of elements a single run must meet the precondition of an
# amp.linear_* / amp.activation_* claim in (so a test never passes by comparing nothing),
# and of elements an amp.model_* run must find bit-identical (k = 0).
LINEAR_MIN_COMPARED = 0.9
ACTIVATION_MIN_COMPARED = 0.75
MODEL_MIN_EXACT = 0.85

_MODEL_STATEMENT = (
    "Under {fmt} autocast, the compact model (Linear, activation, Linear, activation, Linear; "
    "GELU, tanh-GELU, Tanh or ReLU; MSE loss) run inside reference.amp.autocast, and each torch "
    "layer under torch.autocast fed the input and the incoming gradient the reference's run gave "
    "the same layer: every layer output, input gradient and parameter gradient is within k "
    "{fmt} ulps of torch's, per element, where k = ord(q(v + d)) - ord(q(v - d)) counts the "
    "{fmt} members that round the interval around the exact result v of the op on those lp "
    "operands (d: the op's float32 error bound), and the loss gradient reaching the last "
    "Linear is bit-identical (k = 0). k = 0, i.e. bit-identical, for at least "
    f"{MODEL_MIN_EXACT:.0%} of the elements of each run. Observed: the ulps beyond k."
)
_MODEL_REASON = (
    "Given the same lp operands each tree's float32 result lies within d of v: a dot product "
    "of length k within gamma_k sum|a_i b_i| (Higham, Thm 3.5; v in float64 adds k 2^-53 of "
    "it), an activation within the float32 bound c eps S of its nn claim (tanh 2 eps |y|, 6 eps "
    "|g|; GELU c eps |x|, c eps |g|(1 + |x|(1 + x^2)); ReLU exact); Tanh's backward adds the "
    "observed difference of the two saved outputs. Round to nearest is monotone, so both "
    "results lie among the members from q(v - d) to q(v + d): k apart at most, and the same "
    "member when no rounding boundary falls within d of v. The loss gradient is the same "
    "float32 value on both sides (nn.mse_loss.elementwise), rounded once. Comparing every "
    "layer on the reference's own inputs tests the wiring (which results are rounded, in "
    "which order) without the propagation of earlier 1-ulp differences that a free run adds."
)

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="amp.casts",
        statement=(
            "Under autocast (float16 and bfloat16), what a Linear saves for backward (the lp "
            "cast of its input, addmm's mat1, and of its weight, mat2) is bit-identical in "
            "reference.amp.autocast and torch.autocast, and the float32 master weights are "
            "unchanged."
        ),
        kind="bits",
        bound=0,
        reason=(
            "A cast is one correctly rounded operation (round to nearest even) with one right "
            "answer (formats.encode); the weight is cast, never rounded in place."
        ),
    ),
    Claim(
        id="amp.linear_bf16",
        statement=(
            "A Linear under bfloat16 autocast, fed the same input, weights and lp output "
            "gradient: output, input gradient, weight gradient and bias gradient are bfloat16 "
            "values within 1 bfloat16 ulp of torch's, at every element where the float32 "
            "accumulation bound is below half a bfloat16 ulp of the result; that precondition "
            f"holds for at least {LINEAR_MIN_COMPARED:.0%} of the elements of every Linear "
            "tested (batch 1-40, 1-96 inputs, 1-24 outputs)."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "Both compute q(sum_i a_i b_i) from the same lp operands: a float32 accumulation "
            "rounded once to lp. The accumulations differ only in order, by at most gamma_k "
            "sum|a_i b_i| (gamma_k = k 2^-24, k terms); when that is below half an lp ulp u of "
            "the result, |acc_ref - acc_torch| < u/2 and two round-to-nearest results of values "
            "closer than u are at most 1 ulp apart."
        ),
        fmt="bfloat16",
    ),
    Claim(
        id="amp.linear_fp16",
        statement=(
            "As amp.linear_bf16, under float16 autocast: float16 values within 1 float16 ulp "
            "where the float32 accumulation bound is below half a float16 ulp, which holds for "
            f"at least {LINEAR_MIN_COMPARED:.0%} of the elements of every Linear tested."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "The derivation of amp.linear_bf16 with the float16 ulp (2^-10 relative, 2^-24 "
            "absolute in the subnormal range)."
        ),
        fmt="float16",
    ),
    Claim(
        id="amp.activation_bf16",
        statement=(
            "GELU (erf and tanh), Tanh and ReLU on a bfloat16 tensor under autocast (its values "
            "drawn as bfloat16 roundings of N(0, 4)): forward "
            "output and input gradient are bfloat16 values within 1 bfloat16 ulp of torch's "
            "wherever the float32 bound of the matching nn claim (nn.tanh.*, nn.gelu*.*) is "
            "below half a bfloat16 ulp of the result; that holds for at least "
            f"{ACTIVATION_MIN_COMPARED:.0%} of the elements of each tensor (the others: GELU's "
            "tails and Tanh's saturation, where the result is tiny next to the bound's scale)."
        ),
        kind="ulps",
        bound=1,
        reason=(
            "Both compute in float32 and round once to lp. The float32 results differ by at most "
            "the nn claim's c eps S; where that is below half an lp ulp u of the result, the two "
            "values are closer than u and their round-to-nearest images are at most 1 ulp "
            "apart. ReLU is exact on lp values. Beyond the drawn inputs the statement fails in "
            "torch, not in the derivation: over every finite bfloat16 input, torch 2.13's CPU "
            "GELU gives 0 where the result x/2 is at or below float32's smallest normal "
            "(|x| up to 2^-125: 506 inputs) and inf for x >= 2^127 (the reference: x), "
            "measured on an AVX-512 CPU."
        ),
        fmt="bfloat16",
    ),
    Claim(
        id="amp.activation_fp16",
        statement=(
            "As amp.activation_bf16 on float16 tensors: within 1 float16 ulp under the same "
            f"precondition, which holds for at least {ACTIVATION_MIN_COMPARED:.0%} of the "
            "elements of each tensor."
        ),
        kind="ulps",
        bound=1,
        reason="As amp.activation_bf16, with the float16 ulp.",
        fmt="float16",
    ),
    Claim(
        id="amp.model_bf16",
        statement=_MODEL_STATEMENT.format(fmt="bfloat16"),
        kind="ulps",
        bound=0,
        reason=_MODEL_REASON,
        fmt="bfloat16",
    ),
    Claim(
        id="amp.model_fp16",
        statement=_MODEL_STATEMENT.format(fmt="float16"),
        kind="ulps",
        bound=0,
        reason=_MODEL_REASON + " float16 has 3 more mantissa bits than bfloat16, so a float32 "
        "bound of the same size straddles a rounding boundary about 8 times as often.",
        fmt="float16",
    ),
    Claim(
        id="amp.dropout",
        statement=(
            "Dropout on a float16 or bfloat16 tensor under CPU autocast, given torch's "
            "keep-mask: the output, the saved mask and the input gradient are bit-identical "
            "to torch's (p in (0, 1)). CPU only: CUDA's fused native_dropout saves a bool mask "
            "and applies the scale in float32."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Each is one correctly rounded operation on the same operands in both trees "
            "(NOTE [ Dropout mask ]): mask = q(f32(keep) / f32(1 - p)), y = q(x mask), "
            "dx = q(g mask), each computed in float32 (exact for a product of two lp values) "
            "and rounded once to lp."
        ),
    ),
    Claim(
        id="amp.state",
        statement=(
            "Any nesting of autocast contexts (dtype float16, bfloat16 or None, enabled or "
            "not) leaves reference.amp.autocast_state() equal to what torch.is_autocast_enabled "
            "and, where enabled, torch.get_autocast_dtype report for the device type (CPU; "
            "CUDA under --device cuda), at every depth, entering and leaving."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The state is discrete (a flag and a dtype): both trees push it on entry and "
            "restore it on exit (NOTE [ Autocast state ]). The dtype of a disabled state is "
            "not compared: no op reads it, and torch's default differs by device (CUDA "
            "float16, CPU bfloat16)."
        ),
    ),
    Claim(
        id="amp.saved_bytes",
        statement=(
            "Under float16 and bfloat16 autocast, every module of the compact model (Linear, "
            "GELU, tanh-GELU, Tanh or ReLU, Dropout) holds on the reference's tape tensors of "
            "the same shapes, dtypes and bytes as what saved_tensors_hooks see torch save for "
            "it (parameter views excluded): the 2-byte lp input and lp weight cast of a Linear, "
            "the lp result or input of an activation, Dropout's lp mask. On the CPU; on CUDA "
            "without Dropout (its fused kernel saves a bool mask)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Shapes, dtypes and byte counts are integers: the reference keeps lp values in real "
            "2-byte arrays (NOTE [ Low-precision arrays ]) and saves what each torch op saves, "
            "so any difference is a design mismatch."
        ),
    ),
    Claim(
        id="amp.op_lists",
        statement=(
            "reference.amp's op lists are torch's: every op listed for a device type has an "
            "Autocast kernel registered for it in the installed torch (AutocastCPU, "
            "AutocastCUDA; torch 2.6 to 2.13 register the same listed ops), and every listed "
            "op that can be called with plain tensors returns lp under CPU autocast "
            "(lower_precision_fp: float32 inputs) or float32 (fp32: lp inputs); the CUDA "
            "policies are called on a CUDA device only; and the ops the transformer runs "
            "unlisted (reference.amp.UNLISTED: embedding, gelu, masked_fill, dropout, mul, add, "
            "the softmax kernels) have no Autocast kernel on either device type and return "
            "their input's dtype (float32 or lp) under autocast. Observed: the ops whose "
            "registration or dtype differs from the lists."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Membership and policy are discrete: the dispatcher either has an Autocast kernel "
            "for the op or not, and an op's output dtype is the policy's. Ops that need "
            "structured arguments (RNN layers, native multi-head attention, CTC, "
            "_convolution.deprecated) are checked by registration only."
        ),
        library=("torch",),
    ),
)

_LISTS = ("amp.op_lists",)
_CPP = "torch's list is C++ (aten/src/ATen/autocast_mode.cpp): amp.op_lists reads its kernels"
_INSIDE = "torch does this inside each op's Autocast kernel (C++), not as a function"
_DTYPES = "the NumPy dtypes the policy names: torch names its own (torch.float32, ...)"
_STATE = ("amp.state",)
_LAYERS = ("amp.linear_bf16", "amp.linear_fp16", "amp.activation_bf16", "amp.activation_fp16",
           "amp.model_bf16", "amp.model_fp16", "amp.dropout", "amp.saved_bytes")


def _list(name: str) -> Twin:
    return Twin(name, reference=f"reference.amp:{name}", claims=_LISTS, why=_CPP)


def _inside(name: str, *claims: str) -> Twin:
    return Twin(name, reference=f"reference.amp:{name}", claims=claims, why=_INSIDE)


MANIFEST = Manifest(
    topic="amp",
    modules=("reference.amp", "torch_impl.amp"),
    rows=(
        _list("LOWER_PRECISION_FP_CPU"), _list("FP32_CPU_LOSSES"),
        _list("LOWER_PRECISION_FP_CUDA"), _list("FP32_CUDA_LOSSES"), _list("FP32_CUDA_NORMS"),
        _list("UNLISTED"), _list("LISTS"),
        Twin("LP_DTYPES", reference="reference.amp:LP_DTYPES",
             why="NumPy's 2-byte dtypes (ml_dtypes' bfloat16): torch has both built in"),
        Twin("F32", reference="reference.amp:F32", why=_DTYPES),
        Twin("F64", reference="reference.amp:F64", why=_DTYPES),
        Twin("ELIGIBLE", reference="reference.amp:ELIGIBLE", claims=("amp.casts",),
             why="torch's is_eligible (autocast_mode.h, C++): float64 is never cast"),
        Twin("FLOATS", reference="reference.amp:FLOATS", why=_DTYPES),
        Twin("PRECISIONS", reference="reference.amp:PRECISIONS",
             torch="torch_impl.amp:PRECISIONS"),
        Twin("autocast_dtype", reference="reference.amp:autocast_dtype",
             torch="torch_impl.amp:autocast_dtype"),
        _inside("op_policy", *_LISTS),
        Twin("AutocastState", reference="reference.amp:AutocastState",
             torch="torch_impl.amp:AutocastState", claims=_STATE),
        Twin("autocast_state", reference="reference.amp:autocast_state",
             torch="torch_impl.amp:autocast_state", claims=_STATE),
        Twin("autocast", reference="reference.amp:autocast", torch="torch_impl.amp:autocast",
             claims=(*_STATE, *_LAYERS)),
        _inside("Decision", "amp.casts"),
        Twin("promote", reference="reference.amp:promote", alias="torch.promote_types",
             claims=("amp.casts",)),
        _inside("opmath", "amp.activation_bf16", "amp.activation_fp16"),
        _inside("decide", "amp.casts", *_LISTS),
        Twin("cast", reference="reference.amp:cast", alias="torch.Tensor.to",
             claims=("amp.casts",)),
        _inside("apply", "amp.casts"),
        _inside("wide", "amp.activation_bf16", "amp.activation_fp16"),
    ),
    headline="parity/test_amp.py::test_linear_forward_under_bf16_autocast_matches_torch_autocast",
)
