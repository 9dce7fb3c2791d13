"""The fp8_train claims (the kinds and the registry: parity/tolerances.py): the scaled linear
layer of reference/fp8_train.py and torch_impl/fp8_train.py, torchao's Float8Linear as the
oracle of its fp8 recipes, and training with it (resume).

torchao 0.18 ships no MX linear layer (torchao/prototype/mx_formats has the MX tensor, not
mx_linear.py), so mxfp8 and mxfp4 are held between the trees only; their casts are the MX
block formats of the mx topic (mx.torchao: to_mx against torchao's). The 2025-26 recipes
(fp8-blockwise-*, nvfp4: DeepSeek-V3's tiles, TE's NVFP4BlockScaling) are held between the
trees and to the recipe written apart from their quantizers (fp8_train.recipe_spec), whose
own claims hold them to DeepGEMM, torchao and TE (fp8_blockwise.*, nvfp4.*); bf16-sr's
BF16SR to the plain AdamWSR of optim_sr (fp8_train.bf16_sr).
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="fp8_train.casts",
        statement=(
            "For every scaled precision (fp8-tensorwise, fp8-rowwise, fp8-delayed, mxfp8, "
            "mxfp4, fp8-blockwise-deepseek, -torchao, -te, nvfp4) and every operand of the "
            "three GEMMs (x and W forward; g and W for grad_input; g and x for grad_weight), "
            "the quantize-dequantized float32 values q(a) the trees' GEMMs read are "
            "bit-identical, over three steps of a layer (delayed: with the scales each "
            "tree's own history gave; nvfp4: with the random bits each tree's BitStream of "
            "the same seed gave)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Each q is a cast the fp8_scaling and mx claims hold bit for bit (fp8_scaling."
            "current_trees, fp8_scaling.delayed_trees, mx.twins, and the twins claims of "
            "fp8_blockwise and nvfp4) followed by one float32 division by the same scale "
            "(fp8), an exact power-of-two product (MX) or the dequantization those claims "
            "hold; the histories record max|a| of the same arrays, an exact operation; the "
            "random bits are the same numpy arrays in both trees (NOTE [ One bit stream, "
            "both trees ])."
        ),
    ),
    Claim(
        id="fp8_train.gemm",
        statement=(
            "A ScaledLinear's output, input, weight and bias gradients in the two trees, "
            "for every scaled precision (the 2025-26 recipes included) and three steps: "
            "|a - b| <= eps (k + 1) S, S = |q(A)| |q(B)| (+ |b|) over the cast operands, k "
            "the GEMM's inner length (in, out, N, N)."
        ),
        kind="eps",
        bound=1.0,
        scale="(k + 1)(|q(A)| |q(B)| + |b|)",
        reason=(
            "The GEMMs are float32 products of bit-identical float32 operands (fp8_train."
            "casts): only the summation order differs (NumPy's OpenBLAS against torch.mm), "
            "so the bound of nn.linear carries over with A, B the cast operands: gamma_k "
            "sum|a_i b_i| each side, <= (k + 1) eps S apart (Higham, Thm 3.5). It holds for "
            "blockwise and nvfp4 unchanged: their dequantized operands are float32 arrays "
            "too, and nvfp4's grad_weight multiplies the transformed operands (NOTE [ The "
            "RHT in grad_weight ]), whose |q(A)| |q(B)| is the S computed."
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
            "In each tree, a `--model gpt` run in every scaled precision and bf16-sr "
            "interrupted at a step (checkpoint written, every object dropped, resumed from "
            "the file) ends in the bits of the uninterrupted run, delayed scaling's amax "
            "histories and scales and the BitStream's state (nvfp4, bf16-sr) included."
        ),
        kind="bits",
        bound=0,
        reason=(
            "train.resume_exact's argument, with the histories and scales in the model's "
            "state_dict (buffers) and the BitStream's state in the checkpoint's rng: the "
            "resumed run reads every value the next step reads, the random bits included; "
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
    Claim(
        id="fp8_train.recipe_spec",
        statement=(
            "A reference ScaledLinear of fp8-blockwise-deepseek, -torchao, -te and nvfp4 "
            "gives, over two steps and two layer shapes, the bits of the same float32 GEMMs "
            "(y = q(x) q(W)^T + b, dx = q(g) q(W), dW = q(g)^T q(x)) on operands cast as the "
            "recipe names them, straight from the quantizers: blockwise x and g in 1x128 "
            "tiles along K (128x1 for grad_weight's, along N), W in 128x128; nvfp4 x 1x16, W "
            "16x16, g 1x16 rounded stochastically on the layer's next bits, and grad_weight's "
            "g and x transformed by the RHT of their bfloat16 values along N, no RHT "
            "elsewhere."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The layer's quantize calls the same quantizers with the tiles, rounding, bits "
            "and transform the recipe names, and the GEMM is the same matmul of the same "
            "float32 arrays: every value is a deterministic function of the same inputs. A "
            "wrong tile, a missing or extra RHT or a nearest rounding of g changes operands "
            "that the test asserts do change (the SR and RHT operands differ from the plain "
            "ones)."
        ),
    ),
    Claim(
        id="fp8_train.bf16_sr",
        statement=(
            "bf16-sr: three BF16SR steps on the same float32 weights and gradients leave the "
            "weights and the moments (exp_avg, exp_avg_sq) bit-identical in the two trees "
            "(the reference with torch's sqrt), and equal to the plain AdamWSR of optim_sr "
            "on bfloat16 weights, the gradients rounded to nearest bfloat16 and the draws of "
            "a BitStream of the same seed; every weight holds a bfloat16 value."
        ),
        kind="bits",
        bound=0,
        reason=(
            "BF16SR rounds the gradient to nearest bfloat16 (one rounding, the same in both), "
            "steps AdamWSR (held bit for bit between the trees given torch's sqrt by "
            "optim.sr_twins) with the same draws, and widens the result exactly."
        ),
    ),
)

_CASTS = ("fp8_train.casts",)
_GEMM = ("fp8_train.gemm",)
_same = Twin.same

MANIFEST = Manifest(
    topic="fp8_train",
    modules=("reference.fp8_train", "torch_impl.fp8_train", "reference.recipes_train",
             "torch_impl.recipes_train"),
    rows=(
        _same("fp8_train", "quantize", *_CASTS, "fp8_train.recipe_spec"),
        _same("fp8_train", "scaled_forward", *_CASTS, *_GEMM),
        _same("fp8_train", "scaled_backward", *_CASTS, *_GEMM, "fp8_train.recipe_spec"),
        Twin("torch_bits", torch="torch_impl.fp8_train:torch_bits",
             why="the reference's bits are common.recipes_train.grad_bits' arrays as they are",
             claims=_CASTS),
        _same("fp8_train", "ScaledLinear", *_GEMM, "fp8_train.delayed_state",
              "fp8_train.torchao_emulated", "fp8_train.torchao_scaled_mm", "fp8_train.spike"),
        _same("fp8_train", "convert", "fp8_train.resume_exact"),
        Twin("delayed_state", reference="reference.fp8_train:delayed_state",
             alias="torch.nn.Module.named_buffers", claims=("fp8_train.delayed_state",)),
        Twin("to_bf16", reference="reference.recipes_train:to_bf16", alias="torch.Tensor.bfloat16",
             claims=("fp8_train.bf16_sr",)),
        _same("recipes_train", "BF16SR", "fp8_train.bf16_sr", "fp8_train.resume_exact"),
    ),
    headline="parity/test_fp8_train.py::"
             "test_one_fp8_linear_forward_and_backward_match_in_both_trees",
)
