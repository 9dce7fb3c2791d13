"""The compact transformer's claims in float32 and float64 (parity/claims/gpt.py joins them
to those under autocast, parity/claims/gpt_amp.py).

eps claims: |a - b| <= c eps S elementwise, eps of the compared dtype, S computed in float64
by parity/drivers/gpt_pairs.py and parity/claims/gpt_bounds.py at the values the op saw (so
the bound of an op is a function of what that op saw). Claims stated "on CPU" rest on the
CPU kernels' operation order (embedding's backward, the unfused dropout); the others hold on
any device.
"""

from __future__ import annotations

from parity.claims import Claim

_LN = ("C the normalized size, m = mean|x| over the row, xhat = (x - mean) rstd, w the "
       "LayerNorm weight")

FP_CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="gpt.saved_tensors",
        statement=(
            "For the whole model, forward with targets, float32 and float64, dropout on and "
            "off: the reference's tape holds the same saved tensors as torch's "
            "saved_tensors_hooks see (module path, torch node and attribute, shape, dtype, "
            "bytes; parameters excluded), and the bytes held, each distinct storage counted "
            "once at its full size, are equal."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Names, shapes, dtypes and byte counts are integers: any difference is a modelling "
            "mistake (a missing copy, a view taken for a copy, an op saving the wrong tensor)."
        ),
    ),
    Claim(
        id="gpt.state_dict_roundtrip",
        statement=(
            "reference GPT state_dict -> torch -> reference keeps every key (nanoGPT's names, "
            "lm_head.weight included when tied), shape, dtype and bit, untied and tied."
        ),
        kind="bits",
        bound=0,
        reason="The conversion is a copy: no arithmetic.",
    ),
    Claim(
        id="gpt.boundary",
        statement=(
            "Bad token ids (wrong dtype, wrong rank, T > block_size, ids outside the "
            "vocabulary, targets of another shape) raise the same error class in both trees, "
            "with a message naming GPT and what was expected."
        ),
        kind="bits",
        bound=0,
        reason="An error class is a discrete outcome: equal or not.",
    ),
    Claim(
        id="gpt.copy_task",
        statement=(
            "The copy task's inputs and labels, and the batches a loader yields after a "
            "mid-epoch resume from the other tree's sampler state, are bit-identical in both "
            "trees."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Tokens are pure functions of integers (hash words mod V - 1, NOTE [ Counter-based "
            "hashing instead of a Generator ] in reference/data.py), and the order is the "
            "sampler's (epoch, position): no floating point anywhere."
        ),
    ),
    Claim(
        id="gpt.flops",
        statement=(
            "The reference's list of matrix products (reference.gpt.matmuls: batch, m, n, k "
            "per product) gives exactly the FLOPs torch's FlopCounterMode counts for a forward "
            "and backward of the explicit path: 3 x sum 2 batch m n k."
        ),
        kind="bits",
        bound=0,
        reason="FLOP counts are integers; each product's backward is two products of its size.",
    ),
    Claim(
        id="gpt.embedding",
        statement=(
            "Embedding forward (a gather) and, on CPU, its weight gradient (rows of g summed "
            "per index) are bit-identical to torch, repeated indices included."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The gather is exact. torch's CPU embedding_dense_backward adds the rows of g into "
            "each weight row in index order, as np.add.at does: the same additions in the same "
            "order, from the same zeros. On any thread count: it splits the WEIGHT rows among "
            "threads (at::parallel_for(0, V, 1000)) and every thread walks all indices in order, "
            "adding only into the rows it owns, so no weight row's sum is ever split (checked on "
            "1 to 3 threads with torch 2.13). (CUDA sorts the indices and sums in another order: "
            "not claimed.)"
        ),
    ),
    Claim(
        id="gpt.layer_norm.forward",
        statement=(
            "LayerNorm output: |y_ref - y_torch| <= eps S, S = |w| (C rstd m + (C/2 + 7) "
            f"|xhat|) + |y|, with {_LN}; in float32 for rows with |x| < 2^64 (on CPU at 2^64 "
            "torch's kernel returns NaN for a constant row, whose output is the bias in the "
            "reference)."
        ),
        kind="eps",
        bound=1.0,
        scale="|w| (C rstd m + (C/2 + 7)|xhat|) + |y|",
        reason=(
            "NOTE [ LayerNorm error budget ] in parity/claims/gpt_bounds.py: the means (two-pass "
            "in NumPy, Welford-style moments in torch) differ by <= C eps m; the variance of the "
            "centred values by <= (C + 3) eps var (the mean's error enters it only to second "
            "order), so rstd by <= ((C + 3)/2 + 2) eps relative; y = xhat w + b adds <= 2 eps "
            "|w xhat| + eps |y| of roundings. The range: torch's CPU moments form products of "
            "x-sized values, which overflow float32 from |x| = 2^64 (a constant row comes out "
            "NaN under torch 2.6, 2.11 and 2.13, a row of random values from about 2^65); "
            "the reference squares the deviations from the mean, 0 for a constant row. Where "
            "a row's sum of squared deviations overflows, neither side normalizes (rstd 0 "
            "in both, the output the bias)."
        ),
    ),
    Claim(
        id="gpt.layer_norm.backward",
        statement=(
            "LayerNorm input, weight and bias gradients, each side from its own saved mean and "
            "rstd: within eps times the scales propagated in NOTE [ LayerNorm error budget ] "
            "from the measured difference of the two trees' saved statistics; the weight "
            "gradient's row sum bounded by its running sums on CPU with torch on one thread."
        ),
        kind="eps",
        bound=1.0,
        scale="the LayerNorm backward budget of parity/claims/gpt_bounds.py",
        reason=(
            "dx = rstd (gw - <gw> - xhat <gw xhat>) (NOTE [ LayerNorm backward ]): xhat differs "
            "by rstd |d mean| + |xhat| |d rstd| / rstd (measured; the statistics are held by "
            "gpt.layer_norm.forward) plus the roundings of forming it (2 u |xhat| in the "
            "reference, u (|xhat| + rstd |x| + rstd |mean|) in torch, which may compute x rstd - "
            "mean rstd); each mean over C adds C eps of its absolute terms, each of the three "
            "differences and products 2 eps of its magnitude (torch may reassociate them). dw = "
            "sum g xhat and db = sum g: the reference adds the rows in the order of torch's CPU "
            "kernel (NOTE [ LayerNorm row sums on torch's CPU ] in reference/layers.py), on one "
            "thread the rows in order from 0, so each sum's rounding is eps sum_k |s_k| over its "
            "running sums (NOTE [ Row-order sums ]: first-order running error, about sqrt(N) "
            "sum|t| for mixed signs); other devices or more threads (torch's per-thread chunks): "
            "(N + 1) eps of the absolute sum, which holds for any order."
        ),
    ),
    Claim(
        id="gpt.layer_norm.bias_grad",
        statement=(
            "LayerNorm's bias gradient (the sum of g over all rows) is bit-identical to torch on "
            "CPU with torch on one intra-op thread (the suite's setting, parity/setting.py), for "
            "every shape: the reference mirrors the kernel's summation order exactly. On more "
            "threads torch sums per-thread chunks of rows: not claimed (the reference's "
            "torch_cpu_row_sum(g, P) reproduces it, held by a test, but the model uses P = 1)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Same terms, same order (NOTE [ LayerNorm row sums on torch's CPU ] in "
            "reference/layers.py): torch's CPU LayerNorm backward adds the M rows of g into a "
            "zeroed buffer row per thread, thread t taking rows [t c, (t + 1) c), c = ceil(M / "
            "min(P, M)), then adds the P buffer rows from 0; elementwise across the C columns, "
            "so neither C nor the vector width changes the order. On P = 1 thread that is one "
            "running sum of the rows from 0, which the reference computes for every M and C "
            "(NumPy's own sum would not: it starts at the first row, so a column of -0 gives -0 "
            "where torch gives +0, and turns pairwise when C = 1). The same two-pass code in the "
            "stored sources from torch 1.x to 2.6 and later; checked bit for bit on torch 2.13 "
            "(1, 2 and 3 threads). On 2 threads the one-thread order is an ulp off for 6 rows of "
            "2 (found by a fuzz run on 2 threads), hence the setting."
        ),
    ),
    Claim(
        id="gpt.attention.forward",
        statement=(
            "Attention core output from the same q, k, v (and dropout keep-mask): within eps "
            "times the budget of NOTE [ Attention error budget ] (scores (d + 2) eps / sqrt(d) "
            "|q||k|^T, softmax's first-order propagation plus (4 a + T + 2 + |s - max|) eps p, "
            "a = 4 for float32 and 1 for float64, then (T + 1) eps |p||v|)."
        ),
        kind="eps",
        bound=1.0,
        scale="the attention forward budget of parity/claims/gpt_bounds.py",
        reason=(
            "q k^T is a d-term dot product in another BLAS order (Higham 3.5: (d + 1) eps |q||k| "
            "between two orders) scaled once; softmax propagates a score error e as p (e + "
            "<p, e>) (|J| of NOTE [ Softmax backward ]) and adds its own: exp within a eps "
            "relative per side (SLEEF 1 ulp, NumPy's float32 SIMD exp taken as 4), a T-term sum "
            "and one division; p v is a T-term dot product with the p error carried."
        ),
    ),
    Claim(
        id="gpt.attention.backward",
        statement=(
            "Attention core q, k, v gradients from the same q, k, v and incoming gradient, each "
            "side from its own saved softmax: within eps times the backward budget of NOTE "
            "[ Attention error budget ]."
        ),
        kind="eps",
        bound=1.0,
        scale="the attention backward budget of parity/claims/gpt_bounds.py",
        reason=(
            "g v^T and p^T g are d- and T-term products; ds = p (dp - <p, dp>) carries p's "
            "forward difference and dp's; dq = ds k / sqrt(d) and dk = ds^T q / sqrt(d) are "
            "T-term products of the carried ds. Each product of a carried error is first order; "
            "each rounding is counted on both sides, and every sum (<p, dp> included) in any "
            "order, (T + 1) eps of its absolute terms: torch's CPU softmax backward forms <p, dp> "
            "within one row (its threads split the rows only, so its result is the same on any "
            "thread count; checked on 1 to 3 threads with torch 2.13), and the bound does not "
            "rest on its order."
        ),
    ),
    Claim(
        id="gpt.logits",
        statement=(
            "Along one end-to-end forward (same weights, same dropout masks), every "
            "LayerNorm, Linear, GELU and attention core output, up to the logits, is within eps "
            "times its own budget at torch's inputs plus its inputs' measured differences "
            "carried through the absolute value of its Jacobian; and every LayerNorm's input "
            "(the residual stream, the glue between the ops) is within the previous one's "
            "and the branch output's measured differences plus one rounding per dropout "
            "product and add."
        ),
        kind="eps",
        bound=1.0,
        scale="the op's own budget + |J| (measured input difference / eps)",
        reason=(
            "First-order forward error analysis, op by op: the op's own difference is its "
            "claim (nn.linear, gpt.layer_norm.forward, gpt.attention.forward, "
            "nn.gelu_tanh.forward) "
            "and an input difference e moves its output by at most |J| e: |W| e for Linear, "
            "1.13 e for GELU, |w| rstd (e + <e> + |xhat| <|xhat| e>) for LayerNorm, through "
            "|q|, |k|, p (e + <p, e>) and |v| for the core. The residual adds and dropout "
            "products between ops are checked on the residual stream (otherwise a glue error would "
            "be carried, not seen; the reference's backward glue is held to central differences "
            "in tests/test_gpt_reference.py, torch's is autograd's). A bound propagated from the "
            "embeddings with |J| alone grows about tenfold per LayerNorm (rstd |x| ~ 10 on the "
            "residual stream) and is blind after two blocks: carrying the measured difference "
            "keeps each op's check as tight as its own claim."
        ),
    ),
    Claim(
        id="gpt.grads",
        statement=(
            "Along one end-to-end forward and backward (untied, same masks), every parameter "
            "gradient is within eps times its own budget at torch's input and incoming "
            "gradient plus those two measured differences carried: g^T x products (Linear dW, "
            "LayerNorm dw), column sums (biases) and per-index sums (embeddings)."
        ),
        kind="eps",
        bound=1.0,
        scale="own budget + |dg|^T |x| + |g|^T |dx| (in eps), per parameter",
        reason=(
            "dW = g^T x is bilinear: a difference dg of g and dx of x move it by at most "
            "|dg|^T |x| + |g|^T |dx| (first order), and the product itself adds nn.linear's "
            "(N + 1) eps |g|^T |x|; LayerNorm's dw = sum g xhat carries xhat's difference "
            "(NOTE [ LayerNorm error budget ], the statistics' difference measured at torch's "
            "input, plus the input's, through rstd (e + <e>) + |xhat| rstd <|xhat| e>); a sum of "
            "N terms in any order adds (N + 1) eps of the absolute sum, LayerNorm's dw and db in "
            "row order (CPU, one thread: torch's order, mirrored) eps times their running sums "
            "(NOTE [ Row-order sums ]), on more threads the any-order bound. The incoming "
            "gradients' differences are measured at each module, so each check is as tight as "
            "its own product."
        ),
    ),
    Claim(
        id="gpt.loss",
        statement=(
            "The mean next-token cross-entropy: |l_ref - l_torch| <= eps S, S = the per-row "
            "log-softmax budget of nn.cross_entropy averaged, the two reductions' roundings "
            "counted term by term in each library's summation order, the division, and the "
            "measured logits difference carried through the loss's gradient with Taylor's "
            "remainder (NOTE [ Cross-entropy of the transformer ])."
        ),
        kind="eps",
        bound=1.0,
        scale="mean (A + nll) + u mean ((d_numpy + d_torch) nll) + |l| + carried (in eps)",
        reason=(
            "d nll / d logits = p - onehot, so the exact loss moves by mean_rows (<p, e> - e_t) "
            "under a logits difference e, plus at most (1/2) max_j e_j^2 per row (the Hessian "
            "of log-sum-exp, diag(p) - p p^T); the per-row arithmetic is nn.cross_entropy's. "
            "The mean over N rows: NumPy adds 0 plus a pairwise sum, torch's CPU nll_loss a "
            "cascade of 16-term partial sums; both orders are reproduced bit for bit "
            "(parity/test_gpt_bounds.py) and each term's additions d_i counted, so the sums "
            "differ by u sum (d_numpy + d_torch) nll_i (NOTE [ Row-order sums ]), about "
            "(N/8 + 16) u per term rather than the any-order (N - 1) eps. torch's cascade is one "
            "serial loop over the rows (no parallel_for), so it is the same on any thread count "
            "(checked on 1 to 3 threads with torch 2.13)."
        ),
    ),
    Claim(
        id="gpt.sdpa",
        statement=(
            "attention='sdpa' (torch's fused scaled_dot_product_attention, is_causal=True, no "
            "dropout), given the explicit path's q, k, v, is within gpt.attention.forward's "
            "budget of the explicit path's output."
        ),
        kind="eps",
        bound=1.0,
        scale="the attention forward budget of parity/claims/gpt_bounds.py",
        reason=(
            "The fused kernel computes the same softmax(q k^T / sqrt d) v in another order "
            "(blocks of keys, an online softmax with a running max and rescaling, the scale "
            "folded into q): a reordering of the same sums and one exp per term, inside the "
            "budget that already allows any summation order and a eps per exp on each side."
        ),
    ),
    Claim(
        id="gpt.sdpa_logits",
        statement=(
            "The attention='sdpa' model (torch's fused CPU flash kernel, is_causal=True, "
            "dropout off, T <= 512) against the reference's explicit model on the same weights, "
            "along one end-to-end forward up to the logits: every op within gpt.logits' carried "
            "budget, each attention core within gpt.attention.forward's carried budget plus "
            "2 (a_sdpa - a) p|v| + |y|, and the residual stream as gpt.logits holds it."
        ),
        kind="eps",
        bound=1.0,
        scale="gpt.logits' S; at the cores + 2 (a_sdpa - a) p|v| + |y| (in eps)",
        reason=(
            "NOTE [ The fused CPU kernel's error budget ]: for T <= 512 keys the CPU flash "
            "kernel is one block: s = (q k^T) c by a d-term gemm and one multiply, as the "
            "explicit path; the running max is the row max, exp(s - max) summed into l "
            "(T terms, any order) and e v accumulated by a T-term gemm, both as the explicit "
            "path's sum and p v; the first block's rescale multiplies by exp(-inf) = 0, exactly. "
            "Two differences: the exp is exp_u20, documented within 20 ulp in float32 (a "
            "Sleef u10 exp in float64), against the a per side the explicit budget allows; an "
            "exp error d_j moves y = sum e_j v_j / l by sum p_j d_j (v_j - y), at most 2 a p|v|: "
            "hence 2 (a_sdpa - a) p|v| more; and y = acc (1/l) rounds twice where p = e / l "
            "rounds once: |y| more. Without is_causal every earlier position attends to the "
            "future and the core differs by O(|v|), far outside the bound. Gradients are not "
            "claimed: the flash backward recomputes p from the saved log-sum-exp, whose "
            "rounding this budget does not carry."
        ),
    ),
    Claim(
        id="gpt.init",
        statement=(
            "Every normally drawn parameter of the torch GPT (embeddings, Linear weights, "
            "lm_head when untied) has the mean and std the reference's init drew it with "
            "(0, and 0.02, or 0.02/sqrt(2 n_layer) for the residual projections attn.c_proj "
            "and mlp.c_proj): per parameter a two-sided z test of the sample mean and a "
            "two-sided chi-square test of the sum of squares, Bonferroni over the 2 m tests."
        ),
        kind="statistical",
        bound=1e-6,
        reason=(
            "NumPy's and torch's generators cannot draw alike, so the distributions are "
            "compared. Under the reference's N(0, s^2), z = mean sqrt(n) / s ~ N(0, 1) and "
            "Q = sum x^2 / s^2 ~ chi2_n (the float32 rounding of the draws moves Q by 2^-24 "
            "relative); the observation is min(1, 2 m min p), so a correct init fails with "
            "probability <= 1e-6 per run (each run a fixed seed: a pass stays a pass). Power, "
            "computed by parity/drivers/gpt.py's variance_test_power and asserted by the test "
            "for every parameter: at the smallest one (wte, n = 384 at the default config, "
            "22 tests), a std 2x off (a variance ratio of 4, as the residual scaling dropped "
            "at n_layer = 2) is missed with probability < 1e-16 (0 in float64), a std 1.5x "
            "off with 7e-9 and 1/1.5x with 5e-9. The mean test sees a bias of 0.4 s at n = 384 "
            "with probability 0.99 (z = 7.8 against the 5.5 threshold), 0.3 s with 0.66."
        ),
    ),
    Claim(
        id="gpt.init_constants",
        statement=(
            "Every parameter the reference's init sets to a constant (LayerNorm weights 1, "
            "LayerNorm and Linear biases 0) is bit-identical in the torch GPT."
        ),
        kind="bits",
        bound=0,
        reason="Constants need no generator: ones and zeros are exact in both trees.",
    ),
)
