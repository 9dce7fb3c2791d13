"""The compact transformer's claims under autocast: the tape, every layer, the attention
core op by op, and the free-running model (parity/claims/gpt.py holds the float32 and
float64 ones and joins these to its CLAIMS; the kinds and the registry: parity/tolerances.py).
"""

from __future__ import annotations

from parity.claims import Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="gpt.autocast_saved_tensors",
        statement=(
            "Under bfloat16 and float16 CPU autocast (float32 weights), forward with targets, "
            "dropout on and off: the reference's tape holds the same saved tensors as torch's "
            "saved_tensors_hooks see (module path, node and attribute, shape, dtype, bytes; "
            "parameters excluded) -- 2-byte lp copies for the matmuls and their weight casts, "
            "float32 for LayerNorm and the loss, lp for the CPU's softmax result, GELU input "
            "and dropout noise -- and the bytes held are equal. CUDA lists softmax as fp32 "
            "(a float32 result plus an lp copy for p v); the reference emulates that list, "
            "checked on CPU only."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Names, shapes, dtypes and byte counts are integers: each op consults the same "
            "autocast list as torch (reference.amp, held to torch by amp.op_lists) and keeps "
            "real 2-byte arrays, so any difference is a modelling mistake."
        ),
    ),
    Claim(
        id="gpt.autocast_layers_bf16",
        statement=(
            "Under bfloat16 autocast, every Linear of the transformer (c_attn, c_proj, c_fc, "
            "the MLP's c_proj and lm_head, whose output is the logits), each torch Linear fed "
            "the input and incoming gradient of the reference's own run: output, input "
            "gradient, weight and bias gradient within k bfloat16 ulps per element, k = "
            "ord(q(v + d)) - ord(q(v - d)) with v the exact result on those lp operands and "
            "d the float32 accumulation bound (k = 0: bit-identical). Observed: ulps beyond "
            "k. The LayerNorms and embeddings of the same run (float32 ops under autocast) "
            "hold gpt.layer_norm.* and gpt.embedding."
        ),
        kind="ulps",
        bound=0,
        reason=(
            "amp.model_bf16's derivation for a Linear: each tree's float32 accumulation of a "
            "k-term dot product of the same lp operands lies within gamma_k sum|a_i b_i| of "
            "v; round to nearest is monotone, so both results lie among the members from "
            "q(v - d) to q(v + d). The parameter gradients are lp values widened exactly by "
            "the cast's backward. Feeding every layer the reference's own operands checks "
            "the casts and roundings of each op without the growth of 1-ulp differences a "
            "free-running lp comparison carries (no derived end-to-end lp bound is claimed)."
        ),
        fmt="bfloat16",
    ),
    Claim(
        id="gpt.autocast_layers_fp16",
        statement="As gpt.autocast_layers_bf16, under float16 autocast, in float16 ulps.",
        kind="ulps",
        bound=0,
        reason="The derivation of gpt.autocast_layers_bf16 with float16's members.",
        fmt="float16",
    ),
    Claim(
        id="gpt.autocast_free",
        statement=(
            "Under bfloat16 and float16 CPU autocast, free-running (each tree runs its own "
            "forward from the tokens to the loss and its own backward, same weights, torch's "
            "dropout masks replayed): the two runs are NOT bit-identical, and the difference is "
            "born in a float32 op: every op output up to the first that differs is "
            "bit-identical, and that first one is a LayerNorm fed bit-identical inputs (or "
            "no forward output differs, the logits included, and the difference is born in "
            "the float32 loss or the backward's float32 LayerNorm sums). The end differences "
            "(loss, logits, gradients) are measured in docs/gpt.md, not bounded."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ Where a free-running autocast run diverges ] in parity/drivers/gpt_free.py: "
            "CPU autocast keeps LayerNorm in float32, where NumPy's two-pass mean and variance "
            "and torch's Welford-style moments round differently (gpt.layer_norm.forward); the "
            "cast to lp hides most of an ulp of float32 but not the values next to a rounding "
            "boundary, and those spread through the matmuls after it. Where the difference is "
            "born is discrete: a run counts as a failure if the first differing output is an lp "
            "op's or an op fed differing inputs (a cast, a rounding or a mask of the "
            "reference's own making)."
        ),
    ),
    Claim(
        id="gpt.attention_core_autocast_bf16",
        statement=(
            "Under bfloat16 CPU autocast, every elementary op of the attention core "
            "(q k^T, the scale, the causal mask, softmax, dropout, p v; backward: g v^T, p^T g, "
            "dropout's, softmax's, the mask's and the scale's backward, ds k, q^T ds), torch's "
            "op fed the reference's own lp operands, with and without selective recomputation "
            "of the core: within k bfloat16 ulps per element, k = 0 (bit-identical) for the scale, "
            "the mask and dropout, and for the products and softmax the rounding spread of "
            "NOTE [ Attention core under autocast ] (version-gated: torch before 2.11 rounds "
            "softmax backward's sum p g to lp, and is allowed that rounding). Observed: ulps "
            "beyond k."
        ),
        kind="ulps",
        bound=0,
        reason=(
            "NOTE [ Attention core under autocast ] in parity/drivers/gpt_core_amp.py: both "
            "trees compute each op in float32 from the same lp operands and round once to lp; "
            "a single product or a select is the same IEEE operation on both sides, a sum "
            "(the products' accumulation, softmax's exp and normalizer, softmax backward's "
            "<p, g>) lands within a derived float32 interval on each side, and round to "
            "nearest is monotone, so the two lp results are at most the interval's rounding "
            "spread apart. The recomputed core re-enters its forward's autocast state, so its "
            "ops see the same lp operands and are held to the same allowance."
        ),
        fmt="bfloat16",
    ),
    Claim(
        id="gpt.attention_core_autocast_fp16",
        statement="As gpt.attention_core_autocast_bf16, under float16 autocast, in float16 ulps.",
        kind="ulps",
        bound=0,
        reason="The derivation of gpt.attention_core_autocast_bf16 with float16's members.",
        fmt="float16",
    ),
    Claim(
        id="gpt.autocast_free_residual",
        statement=(
            "Along the free-running autocast runs of gpt.autocast_free, every LayerNorm's input "
            "(the residual stream, float32 under autocast) is within the previous one's and the "
            "branch output's measured differences plus one lp rounding of the dropout product "
            "and one float32 rounding of the add: |a - b| <= eps32 S."
        ),
        kind="eps",
        bound=1.0,
        scale="e_prev + |n| e_branch + (eps_lp |n y| + eta_lp) / eps32 + |x| (in float32 eps)",
        reason=(
            "x_new = x + dropout(y): the add is float32 + lp -> float32 (one float32 rounding "
            "per side), the dropout product lp * lp -> lp (one lp rounding per side, relative "
            "eps_lp/2 |n y|, or absolute eta_lp/2 where it falls among float16's subnormals "
            "below 2^-14, eta_lp the smallest subnormal); first order "
            "in the measured differences of x and y (gpt.logits' residual check under "
            "autocast). A residual stream rounded to lp, or an extra cast, adds about eps_lp "
            "|x| and breaks it."
        ),
    ),
)
