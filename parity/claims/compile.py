"""The compile claims (the kinds and the registry: parity/tolerances.py).

Numeric bounds are `eps` claims with bound 1 and S the first-order bound that
parity/claims/compile_bounds.py propagates through the network from the nn claims (its
module docstring writes out every rule: the worst case for compile.bf16 and
compile.train_step, the probabilistic one, NOTE [ Probable bounds ], for compile.eager and
compile.reference); NOTE [ Compiled numerics ] in torch_impl/compile.py says why a compiled
operation sits inside the same per-operation bound as an eager one. The measured ratio of
observed to bound is generated into docs/compile.md.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="compile.eager",
        statement=(
            "On CPU, the MLP's forward + cross-entropy compiled by Inductor (fullgraph) and its "
            "compiled backward, float32: the logits, the loss and every parameter gradient are "
            "within S of eager, S = 6 sigma, sigma the root-sum-square propagation of the nn "
            "claims' per-operation bounds through the network (rounding errors independent "
            "and of mean zero) over the operations Inductor generates code for (activations, "
            "log-softmax, the bias gradient's sum) and each matrix product whose operands "
            "differ between the sides; the loss's bound starts from the logits' measured "
            "difference."
        ),
        kind="eps",
        bound=1.0,
        scale="6 sigma, matrix products shared (parity/claims/compile_bounds.py)",
        reason=(
            "What differs: Inductor on CPU (no max_autotune) lowers each matrix product to the "
            "extern kernel eager calls (addmm, mm), so a product of equal operands is equal; "
            "its generated loops evaluate the pointwise ops and reductions (GELU/tanh and "
            "their backward, log-softmax, the bias-gradient sum, a bias added in an epilogue) "
            "in another order or with FMA contraction, each within its nn claim's bound B "
            "(nn.gelu.*, nn.tanh.*, nn.cross_entropy, nn.linear: a k-term sum rounds k times, "
            "|error| <= eps/2 of a partial sum <= |a||b|). Propagation, first order: the "
            "difference is a sum of independent mean-zero terms |t_j| <= B_j (Higham and "
            "Mary's model of rounding errors), so Hoeffding gives P(|X| >= L sigma) <= "
            "2 exp(-L^2/2) with sigma^2 = sum B_j^2: variances add through W^2 and the local "
            "f'(x)^2 where the worst case adds |W| E and max|f'| E (NOTE [ Probable bounds ]). "
            "L = 6: 3e-8 per value. The one approximation, covariances of errors a product "
            "mixes dropped, is checked by the data: docs/compile.md prints every entry's "
            "ratio to S, which a neglected covariance would push toward 1."
        ),
    ),
    Claim(
        id="compile.reference",
        statement=(
            "The same compiled forward, loss and backward against the NumPy reference, float32: "
            "every compared value within S = 6 sigma, compile.eager's propagation with every "
            "matrix product's own roundings included ((k + 1)/2 (eps |A||B|)^2 to the "
            "variance)."
        ),
        kind="eps",
        bound=1.0,
        scale="6 sigma, matrix products in any order (parity/claims/compile_bounds.py)",
        reason=(
            "NumPy (OpenBLAS) and torch (MKL, oneDNN) sum the dot products in different "
            "orders, so each product contributes its k + 1 roundings per side, each at most "
            "eps/2 |A||B|, independent on the two sides: (k + 1)/2 (eps |A||B|)^2 to the "
            "variance; every other operation and the choice L = 6 as in compile.eager "
            "(NOTE [ Probable bounds ] in parity/claims/compile_bounds.py)."
        ),
    ),
    Claim(
        id="compile.bf16",
        statement=(
            "On CPU under bfloat16 autocast, the compiled forward + loss and backward against "
            "eager: the bfloat16 logits, the float32 loss and every parameter gradient within "
            "S, the worst-case first-order bound of compile.eager's operations with one "
            "bfloat16 ulp (eps_bf16 |v|) added at every autocast rounding whose input differs "
            "between the sides."
        ),
        kind="eps",
        bound=1.0,
        scale="worst-case first-order bound plus eps_bf16 |v| per differing rounding",
        reason=(
            "Inductor keeps autocast's casts as explicit converts, so every bfloat16 value "
            "stored between kernels is rounded where eager rounds it (the MLP fuses no two "
            "bfloat16 pointwise operations, whose downcast-upcast pair Inductor would elide: "
            "NOTE [ Compiled numerics ]), and the products are the same extern bf16 kernels "
            "(float32 accumulation). Rounding is monotone: two inputs that differ round to "
            "values at most |a - b| + 1 ulp apart, and 1 ulp <= eps_bf16 |v|. Everything else "
            "is compile.eager's per-operation derivation, propagated in the worst case "
            "(`bounds`, parity/claims/compile_bounds.py); the loss (float32, the fp32 op "
            "list) starts from the measured difference of the logits."
        ),
    ),
    Claim(
        id="compile.train_step",
        statement=(
            "On CPU, one float32 SGD step of train.train_step compiled where it can be "
            "(compile_train_step: graphs broken at backward, GradScaler and .item()) against "
            "the eager step from the same state: every updated parameter p' within lr E_g + "
            "eps (|p'| + lr |g|), E_g the worst-case first-order gradient bound of "
            "compile.eager's operations, and the loss within the worst-case loss bound."
        ),
        kind="eps",
        bound=1.0,
        scale="lr E_g / eps + |p'| + lr |g| (parameters); worst-case first-order (loss)",
        reason=(
            "The compiled forward and backward are compile.eager's; SGD's update p - lr g runs "
            "the same kernel on gradients that differ by at most E_g, so p' differs by lr E_g "
            "plus at most one ulp where the product lr g and the subtraction round apart "
            "(<= eps lr |g| and eps |p'|)."
        ),
    ),
    Claim(
        id="compile.breaks",
        statement=(
            "Each seeded graph break (.item(), print, if on a tensor, an untranslatable NumPy "
            "call, nonzero) captures as two graphs with one break in torch._dynamo.explain; its "
            "repair captures as one graph with no break, and in eager the repair's output is "
            "bit-identical to the broken forward's."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counts are integers. The repairs change where a value lives (a Python number or a "
            "0-d tensor), not the IEEE operations applied to it: the division by a float32 "
            "maximum, the subtraction of a mean, a clip are the same operations on the same "
            "values."
        ),
    ),
    Claim(
        id="compile.recompiles",
        statement=(
            "Over calls of (batch, sequence) (4, 3), (8, 3), (8, 5), (16, 7), forward + loss "
            "compiles 4 graphs with dynamic=False, 3 by default (automatic dynamic), 1 with "
            "mark_dynamic on both dimensions or dynamic=True, counted by torch's "
            "counters['stats']['unique_graphs'], and each recompile's failed guard is a size "
            "mismatch of x."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Guard semantics (NOTE [ What torch.compile does ]): a static size guard fails for "
            "every new size; automatic dynamic makes a dimension symbolic at its first change "
            "(batch at the 2nd call, sequence at the 3rd); symbolic sizes >= 2 pass every size "
            "guard."
        ),
    ),
    Claim(
        id="compile.gpt_eager",
        statement=(
            "On CPU, the compact transformer's forward with its cross-entropy compiled by Inductor"
            " as it is (fullgraph, compile_gpt_forward: the token check an assertion in the graph)"
            " and its compiled backward, float32: the logits, the loss and every parameter "
            "gradient within S of eager, S = 6 sigma, sigma^2 the variance of the run's first-"
            "order response to every operation's rounding budget, estimated by 64 random-sign "
            "probes and doubled (NOTE [ Probable bounds by probes ]). Version-gated: before torch "
            "2.11 the token embedding's gradient is left out and is beyond S (torch 2.6's Inductor"
            " does not sum a repeated token's contributions: NOTE [ torch 2.6's compiled token-"
            "embedding gradient ] in parity/drivers/compile_gpt.py)."
        ),
        kind="eps",
        bound=1.0,
        scale="6 sqrt(2 x probe variance) (parity/claims/compile_gpt_bounds.py)",
        reason=(
            "What differs: Inductor generates its own loops for LayerNorm (its row mean and "
            "variance in another order), the attention's scale, mask and softmax (fused: "
            "max, exp, normalizer), the tanh-GELU, the residual and bias adds (fused into "
            "the neighbouring loops, possibly FMA-contracted) and the cross-entropy, forward "
            "and backward, and calls the same extern products (mm, bmm, addmm) on operands "
            "that already differ. Each is another evaluation of the same operation within a "
            "per-operation budget (a k-term sum sqrt((k + 1)/2) eps of its absolute terms "
            "in standard deviation; nn.gelu_tanh's and nn.cross_entropy's claims; LayerNorm's "
            "statistics once per row). To first order the difference of a compared value is "
            "sum_j c_j d_j over independent mean-zero d_j, |d_j| <= B_j, so its variance is at "
            "most sum c_j^2 B_j^2 = E[(sum c_j r_j B_j)^2] for random signs r_j: the float64 "
            "run's response to kicks of +-B_j at every operation, measured exactly by probes. "
            "Hoeffding: P(|X| >= 6 sigma) <= 3e-8 per value; 64 probes estimate sigma^2 "
            "within a chi-square of 64 degrees of freedom, and the doubling keeps the bound "
            "above 5 sigma unless the estimate is below half (about 5e-4 per value). "
            "docs/compile.md prints each entry's ratio to S."
        ),
        library=("torch",),
    ),
    Claim(
        id="compile.gpt_reference",
        statement=(
            "The same compiled transformer against the NumPy reference, float32: logits, loss "
            "and every parameter gradient within compile.gpt_eager's S (version-gated as "
            "compile.gpt_eager)."
        ),
        kind="eps",
        bound=1.0,
        scale="6 sqrt(2 x probe variance) (parity/claims/compile_gpt_bounds.py)",
        reason=(
            "The budgets of compile.gpt_eager are already those of two unrelated "
            "implementations of each operation (any summation order in every product and "
            "sum, every elementwise function within its nn claim), so they bound compiled vs "
            "the reference as well; the embedding gradients' scatter-adds are counted in any "
            "order (sqrt((n + 1)/2) eps of the n summed rows)."
        ),
    ),
    Claim(
        id="compile.gpt_bf16",
        statement=(
            "On CPU under bfloat16 autocast, the compiled transformer against eager: the "
            "bfloat16 logits (in bfloat16 eps), the float32 loss and every parameter gradient "
            "within S = compile.gpt_eager's probe bound with one more kick of eps_bf16 |v| at "
            "every value autocast rounds to bfloat16 (each product's output, the scale, "
            "softmax, GELU, and the gradients of those values); version-gated as compile.gpt_eager."
        ),
        kind="eps",
        bound=1.0,
        scale="6 sqrt(2 x probe variance), bfloat16 roundings kicked",
        reason=(
            "Inductor keeps autocast's converts, and may keep a fused intermediate in float32 "
            "where eager rounds it to bfloat16; round to nearest is monotone, so at each "
            "autocast rounding the two sides land at most |a - b| + 1 ulp apart, 1 ulp <= "
            "eps_bf16 |v| (compile.bf16's argument): one more bounded, mean-zero term per "
            "rounded value in the probe model; LayerNorm, the residual stream and the loss "
            "stay float32 under CPU autocast and keep their float32 budgets."
        ),
    ),
    Claim(
        id="compile.gpt_recompiles",
        statement=(
            "The transformer's forward + loss over (batch, sequence) (4, 3), (8, 3), (8, 5), "
            "(16, 7) compiles 4 graphs with dynamic=False, 3 by default, 1 with mark_dynamic "
            "on both dimensions of idx and targets or dynamic=True (torch's "
            "counters['stats']['unique_graphs']), each recompile's failed guard a size "
            "mismatch of idx; and a full block (sequence = block_size) after (4, 5) compiles "
            "no second graph with dynamic=True or mark_dynamic, no guard failing: the causal "
            "mask is built for T."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Guard semantics as compile.recompiles. The causal mask is built for T (NOTE "
            "[ The mask is built for T ] in torch_impl/compile.py), so no size in the graph "
            "depends on whether T equals block_size; the token check's shape test adds the "
            "guard T <= block_size, which a full block passes."
        ),
    ),
)

_TORCH = "compiling is torch's alone: no reference twin (NOTE [ What torch.compile does ])"
_RECOMPILES = ("compile.recompiles", "compile.gpt_recompiles")

MANIFEST = Manifest(
    topic="compile",
    modules=("torch_impl.compile",),
    rows=(
        Twin("TOKEN_ASSERT_KEPT", torch="torch_impl.compile:TOKEN_ASSERT_KEPT",
             claims=("compile.gpt_eager",), why=_TORCH),
        Twin("ForwardLoss", torch="torch_impl.compile:ForwardLoss", why=_TORCH),
        Twin("forward_loss", torch="torch_impl.compile:forward_loss", claims=("compile.eager",),
             why=_TORCH),
        Twin("compile_forward_loss", reference="reference.nn:Sequential.forward",
             torch="torch_impl.compile:compile_forward_loss",
             claims=("compile.eager", "compile.reference", "compile.bf16")),
        Twin("compile_train_step", reference="reference.train:train_step",
             torch="torch_impl.compile:compile_train_step", claims=("compile.train_step",)),
        Twin("compile_gpt_forward", reference="reference.gpt:GPT.forward",
             torch="torch_impl.compile:compile_gpt_forward",
             claims=("compile.gpt_eager", "compile.gpt_reference", "compile.gpt_bf16")),
        Twin("Explanation", torch="torch_impl.compile:Explanation", claims=("compile.breaks",),
             why=_TORCH),
        Twin("explain", torch="torch_impl.compile:explain", claims=("compile.breaks",),
             why=_TORCH),
        Twin("Recompiles", torch="torch_impl.compile:Recompiles", claims=_RECOMPILES,
             why=_TORCH),
        Twin("count_recompiles", torch="torch_impl.compile:count_recompiles",
             claims=_RECOMPILES, why=_TORCH),
    ),
    headline="parity/test_compile.py::"
             "test_compiled_mlp_matches_eager_and_reference_within_six_sigma_of_the_propagated"
             "_roundings",
)
