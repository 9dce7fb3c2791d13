"""The loss_scaling claims (the kinds and the registry: parity/tolerances.py).

On CUDA: the scaler's kernels compute the same IEEE operations as on CPU (AmpKernels.cu,
ForeachNonFiniteCheckAndUnscale.cu), and so do the clip coefficient and multiply; the SGD of
loss_scaling.scaler is bit-exact only where torch's CUDA kernels fuse multiply-adds as the
reference's `fma` flag says (optim.sgd). Clipping's norms do not share an order across
devices (CUDA's multi-tensor norm kernel reduces in its own), which the n-term bound of
loss_scaling.clip_grad_norm allows. underflow_mask and train inherit the CUDA conditions of
the amp claims (the drivers run torch's train_step with cuBLAS's reduced-precision
reductions off).
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

# The training runs of loss_scaling.train: steps, clipping threshold, and the least number
# of steps that must clip (norm above max_norm) and must not, so both branches are reached.
TRAIN_STEPS = 40
TRAIN_MAX_GRAD_NORM = 0.4
TRAIN_MIN_CLIPPED = 10
TRAIN_MIN_UNCLIPPED = 3
TRAIN_MIN_LOSS_REDUCTION = 0.6

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="loss_scaling.update_rule",
        statement=(
            "For any scale (float32, subnormals and near-max included), tracker, found_inf and "
            "hyperparameters (non-power-of-two factors, any growth_interval), one update of "
            "reference.loss_scale_kernels.update_scale_ gives the same scale bits and tracker "
            "as torch._amp_update_scale_."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The rule is integer logic plus one float64 product rounded to float32 (NOTE [ Scale "
            "update rounding ]); NumPy's float64 multiply and float32 cast are IEEE, as C++'s."
        ),
    ),
    Claim(
        id="loss_scaling.unscale",
        statement=(
            "Unscaling float32, float64 and float16 gradients (finite across magnitudes, +-inf, "
            "NaN) by any float32 scale gives the same bits and the same found_inf as "
            "torch._amp_foreach_non_finite_check_and_unscale_."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "inv = f32(1/f64(S)) then one multiply per element in the gradient's opmath type "
            "(NOTE [ Unscale by reciprocal ]): each step is one IEEE rounding. NaN payloads are "
            "not compared."
        ),
    ),
    Claim(
        id="loss_scaling.scaler",
        statement=(
            "Driven by the same gradient stream (finite across magnitudes, +inf, -inf, NaN in any "
            "tensor; unscale_ explicit or inside step; state_dict save/load across the two "
            "implementations; random hyperparameters), the reference and torch GradScalers hold "
            "the same scale, growth tracker, skip decisions, unscaled gradients and SGD "
            "parameters after every step."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Composition of loss_scaling.update_rule, loss_scaling.unscale and optim.sgd "
            "(bit-exact SGD); the skip decision is the same found_inf flag. NaN payloads are not "
            "compared."
        ),
    ),
    Claim(
        id="loss_scaling.clip",
        statement=(
            "Given the same total norm (any float32: below, at and above max_norm, 0, inf, NaN), "
            "reference.clip_grad.clip_grads_with_norm_ and torch.nn.utils.clip_grads_with_norm_ "
            "(foreach True and False) leave the same gradient bits: unchanged below max_norm - "
            "1e-6, scaled by max_norm / (norm + 1e-6) above, zero or NaN for a non-finite norm. "
            "With an inf or NaN gradient, clip_grad_norm_'s own norms are the same non-finite "
            "value in both trees, and the clipped gradients the same bits."
        ),
        kind="nan_class",
        bound=0,
        reason=(
            "Both compute f32(f32(1 / f32(norm + 1e-6)) * f32(max_norm)), clamp it at 1 with NaN "
            "propagating, and multiply each element once in float32 (reference/clip_grad.py): "
            "the same IEEE operations in the same order. A non-finite gradient makes both sums "
            "of squares inf (or NaN), whatever their order. NaN payloads are not compared."
        ),
    ),
    Claim(
        id="loss_scaling.clip_grad_norm",
        statement=(
            "clip_grad_norm_ of the same finite float32 gradients (m tensors, the largest of n "
            "elements; norms below and above max_norm), each tree computing its own norm: "
            "|norm_ref - norm_torch| <= eps S and each clipped gradient within eps S, with eps "
            "= 2^-23."
        ),
        kind="eps",
        bound=1.0,
        scale="(n+m+6)/2 norm; (n+m+16)/2 c|g| clipped, 0 unclipped",
        reason=(
            "A sum of n squares in float32, in any order, is within gamma_(n+1) of the exact sum "
            "(the terms are positive; products rounded or fused); its square root halves that "
            "and adds u = 2^-24; the norm of the m norms adds gamma_m / 2 + 2u: each tree within "
            "(n + m + 6)/2 u of the exact norm, the two within (n + m + 6) u = eps (n + m + 6)/2. "
            "The coefficient's three roundings (add, reciprocal, multiply) add 3u per tree, the "
            "multiply of the gradient one more: c|g| ((n + m + 6) + 2 * 4 + 2) u. Below the "
            "clamp both coefficients are exactly 1 and the gradients bit-identical. foreach "
            "True/False do not change the CPU result (one linalg.vector_norm per tensor)."
        ),
    ),
    Claim(
        id="loss_scaling.underflow_mask",
        statement=(
            "float16 autocast without loss scaling: the set of parameter-gradient elements that "
            "are exactly zero (underflow) is the same in the reference and torch, layer by layer."
        ),
        kind="bits",
        bound=0,
        reason=(
            "An element is zero when its lp result rounds below 2^-25. The implementations agree "
            "within 1 lp ulp per op (amp.linear_fp16), so a mask can differ only where one side "
            "holds the smallest subnormal 2^-24 and the other 0; the test records how many "
            "elements sit at +-2^-24 (the edge is reached) and requires equal masks."
        ),
    ),
    Claim(
        id="loss_scaling.train",
        statement=(
            f"{TRAIN_STEPS} SGD steps (lr 0.1, clipping at {TRAIN_MAX_GRAD_NORM}) of the compact "
            "model 8-32-32-1 with each tree's train.train_step, fp16 with a GradScaler and "
            "bf16 without, with and without recomputation (uniform:2: checkpointed segments "
            "recomputed under autocast in both trees), torch given the reference's parameters "
            "before every step: every "
            "step's scale, skip and clip decision are equal, at least "
            f"{TRAIN_MIN_CLIPPED} steps clip and {TRAIN_MIN_UNCLIPPED} do not, the loss falls by "
            f"more than {TRAIN_MIN_LOSS_REDUCTION:.0%} in each tree, and each parameter after "
            "each step is within B of torch's: B = lr (c |g_r - g_t| + |g| dc)(1 + 4u) + 2u lr "
            "c |g| + the two final float32 roundings, from the two trees' unclipped gradients "
            "g_r, g_t of the step (S = B / eps: the claim is |a - b| <= B)."
        ),
        kind="eps",
        bound=1.0,
        scale="B/eps, B the per-step bound",
        reason=(
            "One step from the same parameters: the gradients differ by |g_r - g_t| (their "
            "difference is amp.model_*'s claim, layer by layer; unscaling by a power of two is "
            "exact); the clip coefficients c = min(1, max_norm / (||g|| + 1e-6)) by dc = c ((n + "
            "m + 16) u + ||g_r - g_t||_2 / ||g||) (loss_scaling.clip_grad_norm), 0 when both "
            "clamp to 1; SGD forms p - lr c g with at most one rounding of the product and "
            "rounds once to float32 (s: the float32 spacing): two results of values D apart "
            "differ by <= D + (s_1 + s_2)/2. A skipped step must leave the parameters "
            "bit-identical (B = 0). Syncing the parameters makes each step's bound exact "
            "instead of compounding an unknown growth of earlier differences."
        ),
    ),
    Claim(
        id="loss_scaling.gpt_trajectory",
        statement=(
            "fp16 training of the compact transformer (default config, dropout off, SGD) with "
            "GradScaler(init_scale=2^24, growth_interval=2) in both trees, same weights and "
            "batches, each tree on its own for 16 steps: the scale after every update and "
            "the set of skipped steps are identical, in a run with real fp16 gradient "
            "overflows (several skipped steps, the scale backing off and growing again)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The scale update is exact (loss_scaling.update_rule) and a step is skipped iff "
            "some unscaled gradient is inf or NaN. The overflow is decided by whether a "
            "scaled fp16 gradient exceeds 65504; the trees' gradients differ by a few fp16 "
            "ulps (gpt.autocast_layers_fp16) while halving the scale moves them by a factor "
            "of 2, so a flip needs a gradient within a few ulps of the overflow threshold; "
            "the test proves the run reached both skips and growth."
        ),
    ),
)


MANIFEST = Manifest(
    topic="loss_scaling",
    modules=("reference.loss_scale_kernels", "reference.loss_scaling", "reference.clip_grad",
             "torch_impl.loss_scaling"),
    rows=(
        Twin("update_scale_", reference="reference.loss_scale_kernels:update_scale_",
             alias="torch._amp_update_scale_", claims=("loss_scaling.update_rule",)),
        Twin("inv_scale", reference="reference.loss_scale_kernels:inv_scale",
             claims=("loss_scaling.unscale",),
             why="torch computes it inside GradScaler.unscale_: "
                 "self._scale.double().reciprocal().float()"),
        Twin("non_finite_check_and_unscale_",
             reference="reference.loss_scale_kernels:non_finite_check_and_unscale_",
             alias="torch._amp_foreach_non_finite_check_and_unscale_",
             claims=("loss_scaling.unscale",)),
        Twin("OptState", reference="reference.loss_scaling:OptState",
             alias="torch.amp.grad_scaler.OptState", claims=("loss_scaling.scaler",)),
        Twin("GradScaler", reference="reference.loss_scaling:GradScaler",
             torch="torch_impl.loss_scaling:GradScaler", alias="torch.amp.GradScaler",
             claims=("loss_scaling.scaler", "loss_scaling.gpt_trajectory")),
        Twin("StaticLossScaler", reference="reference.loss_scaling:StaticLossScaler",
             why="the reference's comparison point (a fixed S): torch has no static scaler"),
        Twin("step_skipped", reference="reference.loss_scaling:step_skipped",
             torch="torch_impl.loss_scaling:step_skipped",
             claims=("loss_scaling.train", "loss_scaling.gpt_trajectory"),
             disorder="torch_impl/loss_scaling.py defines it after make_scaler, "
                      "reference/loss_scaling.py before"),
        Twin("make_scaler", reference="reference.loss_scaling:make_scaler",
             torch="torch_impl.loss_scaling:make_scaler",
             claims=("loss_scaling.underflow_mask", "loss_scaling.train")),
        Twin("get_total_norm", reference="reference.clip_grad:get_total_norm",
             alias="torch.nn.utils.get_total_norm", claims=("loss_scaling.clip_grad_norm",)),
        Twin("clip_grads_with_norm_", reference="reference.clip_grad:clip_grads_with_norm_",
             alias="torch.nn.utils.clip_grads_with_norm_", claims=("loss_scaling.clip",)),
        Twin("clip_grad_norm_", reference="reference.clip_grad:clip_grad_norm_",
             alias="torch.nn.utils.clip_grad_norm_",
             claims=("loss_scaling.clip", "loss_scaling.clip_grad_norm")),
    ),
    headline="parity/test_loss_scaling.py::test_scaler_steps_match_torch_gradscaler_bitwise",
)
