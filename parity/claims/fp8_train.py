"""The fp8_train claims (the kinds and the registry: parity/tolerances.py): the scaled linear
layer of reference/fp8_train.py and torch_impl/fp8_train.py, torchao's Float8Linear as the
oracle of its fp8 recipes, and training with it (resume).

torchao 0.18 ships no MX linear layer (torchao/prototype/mx_formats has the MX tensor, not
mx_linear.py), so mxfp8 and mxfp4 are held between the trees only; their casts are the MX
block formats of the mx topic (mx.torchao: to_mx against torchao's).
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="fp8_train.casts",
        statement=(
            "For every precision (fp8-tensorwise, fp8-rowwise, fp8-delayed, mxfp8, mxfp4) "
            "and every operand of the three GEMMs (x and W forward; g and W for grad_input; "
            "g and x for grad_weight), the quantize-dequantized float32 values q(a) the "
            "trees' GEMMs read are bit-identical, over three steps of a layer (delayed: "
            "with the scales each tree's own history gave)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Each q is a cast the fp8_scaling and mx claims hold bit for bit (fp8_scaling."
            "current_trees, fp8_scaling.delayed_trees, mx.twins) followed by one float32 "
            "division by the same scale (fp8) or an exact power-of-two product (MX); the "
            "histories record max|a| of the same arrays, an exact operation."
        ),
    ),
    Claim(
        id="fp8_train.gemm",
        statement=(
            "A ScaledLinear's output, input, weight and bias gradients in the two trees, "
            "for every precision and three steps: |a - b| <= eps (k + 1) S, S = |q(A)| "
            "|q(B)| (+ |b|) over the cast operands, k the GEMM's inner length (in, out, N, N)."
        ),
        kind="eps",
        bound=1.0,
        scale="(k + 1)(|q(A)| |q(B)| + |b|)",
        reason=(
            "The GEMMs are float32 products of bit-identical float32 operands (fp8_train."
            "casts): only the summation order differs (NumPy's OpenBLAS against torch.mm), "
            "so the bound of nn.linear carries over with A, B the cast operands: gamma_k "
            "sum|a_i b_i| each side, <= (k + 1) eps S apart (Higham, Thm 3.5)."
        ),
    ),
    Claim(
        id="fp8_train.delayed_state",
        statement=(
            "fp8-delayed: after each of three steps of a layer on the same inputs, the trees' "
            "amax histories and scales (input, weight, grad_output) are bit-identical."
        ),
        kind="bits",
        bound=0,
        reason=(
            "A history records max|a| of bit-identical inputs (the weight and x as given, g "
            "as given), and the update is fp8_scaling.delayed_update, held bit for bit "
            "between the trees by fp8_scaling.delayed_trees."
        ),
    ),
    Claim(
        id="fp8_train.torchao_emulated",
        extra="torchao",
        statement=(
            "torchao 0.18's Float8Linear (emulate=True) with the tensorwise and the rowwise "
            "recipe gives, for one forward and backward of a linear layer, the bits of the "
            "torch tree's ScaledLinear (fp8-tensorwise, fp8-rowwise): output, input, weight "
            "and bias gradients."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Same casts (hp_tensor_to_float8_dynamic is the project's current_scaling: "
            "fp8_scaling.torchao_current, whose power-of-2 scales round down on these "
            "inputs), the same dequantization _data.float() / _scale, the same torch.mm on "
            "operands of the same layout (the weight cast as its transpose), the bias added "
            "after: the same operations in the same order."
        ),
    ),
    Claim(
        id="fp8_train.torchao_scaled_mm",
        extra="torchao",
        statement=(
            "torchao 0.18's Float8Linear on CPU (emulate=False: torch._scaled_mm), tensorwise "
            "recipe: output, input and weight gradients within eps (k + 3) S of the torch "
            "tree's, S = |q(A)| |q(B)| (+ |b|); the bias gradient bit-identical."
        ),
        kind="eps",
        bound=1.0,
        scale="(k + 3)(|q(A)| |q(B)| + |b|)",
        reason=(
            "The emulation rounds each dequantized operand (a8 / s: one rounding, relative u "
            "= eps / 2) and sums float32 products; _scaled_mm sums the products of the codes "
            "and multiplies the sum by the rounded reciprocals 1 / s_a, 1 / s_b (three more "
            "roundings). Against the exact sum of q(A) q(B), the first is within (k + 2) u S "
            "(gamma_k and the two operand roundings), the second within (k + 3) u S, so they "
            "are (2 k + 5) u S <= (k + 3) eps S apart (Higham, Thm 3.5). The bias is added by "
            "the same autograd sum in both. With the rowwise recipe torchao rounds the output "
            "to bfloat16 (its workaround for _scaled_mm's missing float32 output): not "
            "claimed."
        ),
    ),
    Claim(
        id="fp8_train.resume_exact",
        statement=(
            "In each tree, a `--model gpt` run in fp8-tensorwise, fp8-rowwise, fp8-delayed, "
            "mxfp8 and mxfp4 interrupted at a step (checkpoint written, every object dropped, "
            "resumed from the file) ends in the bits of the uninterrupted run, delayed "
            "scaling's amax histories and scales included."
        ),
        kind="bits",
        bound=0,
        reason=(
            "train.resume_exact's argument, with the histories and scales in the model's "
            "state_dict (buffers): the resumed run reads every value the next step reads; "
            "the casts are deterministic functions of them."
        ),
    ),
    Claim(
        id="fp8_train.spike",
        statement=(
            "A seeded activation spike (x times 2^6 at step 8 of 24) into a scaled layer: the "
            "float8_e4m3fn format counts (over_max, to_zero, ...) of the scaled input x * s "
            "at every step are the same integers in both trees, for delayed scaling, current "
            "scaling, delayed with margin 6 and delayed with a history of 1; delayed "
            "saturates at the spike, current and the margin do not."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The scales are bit-identical (fp8_train.delayed_state, fp8_scaling.current_trees) "
            "and so are the products x * s of float32 inputs; counting is an integer function "
            "of the values."
        ),
    ),
)

_CASTS = ("fp8_train.casts",)
_GEMM = ("fp8_train.gemm",)
_same = Twin.same

MANIFEST = Manifest(
    topic="fp8_train",
    modules=("reference.fp8_train", "torch_impl.fp8_train"),
    rows=(
        _same("fp8_train", "quantize", *_CASTS),
        _same("fp8_train", "scaled_forward", *_CASTS, *_GEMM),
        _same("fp8_train", "scaled_backward", *_CASTS, *_GEMM),
        _same("fp8_train", "ScaledLinear", *_GEMM, "fp8_train.delayed_state",
              "fp8_train.torchao_emulated", "fp8_train.torchao_scaled_mm", "fp8_train.spike"),
        _same("fp8_train", "convert", "fp8_train.resume_exact"),
        Twin("delayed_state", reference="reference.fp8_train:delayed_state",
             alias="torch.nn.Module.named_buffers", claims=("fp8_train.delayed_state",)),
    ),
    headline="parity/test_fp8_train.py::"
             "test_one_fp8_linear_forward_and_backward_match_in_both_trees",
)
