"""The compile claims (the kinds and the registry: parity/tolerances.py).

Numeric bounds are `eps` claims with bound 1 and S the first-order bound that
parity/drivers/compile.py propagates through the network from the nn claims (its module
docstring writes out every rule); NOTE [ Compiled numerics ] in torch_impl/compile.py says
why a compiled operation sits inside the same per-operation bound as an eager one. The
measured ratio of observed to bound is generated into docs/compile.md.
"""

from __future__ import annotations

from parity.claims import Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="compile.eager",
        statement=(
            "On CPU, the MLP's forward + cross-entropy compiled by Inductor (fullgraph) and its "
            "compiled backward, float32: the logits, the loss and every parameter gradient are "
            "within S of eager, S the first-order bound propagated from the nn claims of the "
            "operations Inductor generates code for (activations, log-softmax, the bias "
            "gradient's sum) and from each matrix product whose operands differ between the "
            "sides; the loss's bound starts from the logits' measured difference."
        ),
        kind="eps",
        bound=1.0,
        scale="first-order bound, matrix products shared (parity/drivers/compile.py)",
        reason=(
            "Inductor on CPU (no max_autotune) lowers each matrix product to the extern kernel "
            "eager calls (addmm, mm), so a product of equal operands is equal; a product of "
            "operands that differ passes on |W| E and, its rounding errors on the two inputs "
            "being unrelated, adds eps (k + 1) |A||B| (nn.linear). The pointwise and "
            "reduction kernels it generates evaluate the same formulas in another order or with "
            "FMA contraction, within the per-operation bounds nn.gelu.*, nn.tanh.*, "
            "nn.cross_entropy and nn.linear (the bias sum) derive for any two implementations. "
            "First order: products of two errors, O(eps^2), are dropped."
        ),
    ),
    Claim(
        id="compile.reference",
        statement=(
            "The same compiled forward, loss and backward against the NumPy reference, float32: "
            "every compared value within S, the first-order bound propagated from the nn "
            "claims with each matrix product's own error included (eps (k + 1) |A||B|)."
        ),
        kind="eps",
        bound=1.0,
        scale="first-order bound, matrix products in any order (parity/drivers/compile.py)",
        reason=(
            "NumPy (OpenBLAS) and torch (MKL, oneDNN) sum the dot products in different orders, "
            "so a product adds up to eps (k + 1) |A||B| (nn.linear, Higham's gamma_k for both "
            "sides); every other operation as in compile.eager. The worst case assumes every "
            "rounding error aligned: docs/compile.md prints how far below it the data stay."
        ),
    ),
    Claim(
        id="compile.bf16",
        statement=(
            "On CPU under bfloat16 autocast, the compiled forward + loss and backward against "
            "eager: the bfloat16 logits, the float32 loss and every parameter gradient within "
            "S, compile.eager's bound with one bfloat16 ulp (eps_bf16 |v|) added at every "
            "autocast rounding whose input differs between the sides."
        ),
        kind="eps",
        bound=1.0,
        scale="compile.eager's first-order bound plus eps_bf16 |v| per differing rounding",
        reason=(
            "Inductor keeps autocast's casts as explicit converts, so every bfloat16 value is "
            "rounded where eager rounds it, and the products are the same extern bf16 kernels "
            "(float32 accumulation). Rounding is monotone: two inputs that differ round to "
            "values at most |a - b| + 1 ulp apart, and 1 ulp <= eps_bf16 |v|. Everything else "
            "is compile.eager's derivation; the loss (float32, the fp32 op list) starts from "
            "the measured difference of the logits."
        ),
    ),
    Claim(
        id="compile.train_step",
        statement=(
            "On CPU, one float32 SGD step of train.train_step compiled where it can be "
            "(compile_train_step: graphs broken at backward, GradScaler and .item()) against "
            "the eager step from the same state: every updated parameter p' within lr E_g + "
            "eps (|p'| + lr |g|), E_g compile.eager's gradient bound, and the loss within "
            "compile.eager's loss bound."
        ),
        kind="eps",
        bound=1.0,
        scale="lr E_g / eps + |p'| + lr |g| (parameters); compile.eager's (loss)",
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
)
