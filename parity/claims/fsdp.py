"""The fsdp claims: FSDP2 (fully_shard, MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32 or bfloat16)) over gloo on CPU against reference/fsdp.py's simulated
ranks (the kinds and the registry: parity/tolerances.py).

On CUDA the engine is NCCL: its reduce-scatter has an order of its own (and ReduceOp.AVG is
NCCL's), so the bit-exact reduce-scatter and everything after it would become an order bound
(ddp.order_bound's argument); the shards and the all-gather (copies) carry over.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin
from parity.claims.fsdp_gpt import GPT_CLAIMS, GPT_ROWS, HARNESS

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="fsdp.shards",
        statement=(
            "After fully_shard, every torch rank's local shard of every parameter (the "
            "DTensor's to_local()) is reference.fsdp.shard's rows of the full parameter: "
            "torch.chunk's dim-0 blocks of ceil(d0 / ws) rows, the last short or empty, for "
            "world sizes 2 and 3 and rows 33, 32 and 5 (that do and do not divide)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ FSDP2's shards ]: integer row arithmetic, the same rule as "
            "FSDPParam._init_sharded_param (_chunk_with_empty), then a copy of the rows."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.all_gather",
        statement=(
            "At every step, the bfloat16 parameters each Linear's forward used on every torch "
            "rank are reference.fsdp.all_gather of the reference ranks' float32 shards: cast "
            "to bfloat16, concatenated in rank order, the padding dropped."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ FSDP2's all-gather ]: one float32 -> bfloat16 rounding (round to nearest "
            "even) on both sides, then copies (all_gather_single on gloo sends bytes); the "
            "shards themselves are equal step after step (fsdp.params)."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.reduce_scatter",
        statement=(
            "Given the torch ranks' local (unsharded, bfloat16) gradients, "
            "reference.fsdp.reduce_scatter gives the bits of every rank's sharded float32 "
            ".grad at every step, world sizes 2 and 3, reduce_dtype float32 and bfloat16; "
            "a left-to-right sum does not (bfloat16, ws 3), nor does f32(1 / ws) times the "
            "sum in place of ReduceOp.AVG's division. The collective alone: "
            "reference.fsdp.gloo_reduce_scatter gives dist.reduce_scatter_single's bits, ws "
            "2-4, float32 and bfloat16, SUM and AVG, ws x 1 to ws x 600,001 elements."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ FSDP2's reduce-scatter on gloo ]: the same copy-in layout (each "
            "gradient's padded chunk r in row r, exact casts), gloo's ring on the whole flat "
            "buffer (ddp.ring_order: the same additions in the same order, each rounded once "
            "to reduce_dtype), ReduceOp.AVG's one division by ws in reduce_dtype, an exact "
            "cast to float32 and a cut. The local gradients are replayed: the two trees' own "
            "bf16 forward and backward round differently (a BLAS order)."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.params",
        statement=(
            "After each of the steps (AdamW, lr 0.01, weight decay 0.01), every torch rank's "
            "sharded parameters are the reference rank's AdamW on its shards, bit for bit."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Bit-identical sharded gradients (fsdp.reduce_scatter) and AdamW (optim: fma as "
            "torch's CPU kernels fuse, torch's own sqrt passed in, NOTE [ torch's CPU sqrt "
            "is MKL's ]); torch.optim.AdamW's for-loop path on a DTensor runs each op on the "
            "local shard, elementwise, so it rounds as on a plain tensor."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.unsharded_state",
        statement=(
            "After the last step, the torch ranks' AdamW state (step, exp_avg, exp_avg_sq) "
            "and parameters, joined along dim 0, are the bits of a single-process "
            "torch.optim.AdamW (plain tensors) and of reference.optim.AdamW stepped on the "
            "full parameters with the joined reduced gradients; every rank's own state is "
            "the reference rank's."
        ),
        kind="bits",
        bound=0,
        reason=(
            "AdamW is elementwise: an element's update reads only that element's parameter, "
            "gradient and state and the shared scalars (step, lr, betas), so cutting the "
            "tensors into row blocks changes no operand and no rounding; the padding rows "
            "never reach the optimizer (it sees the unpadded view). Where an optimizer "
            "mixes elements (a norm: LAMB, clipping) this would become a bound."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.reduce_dtype",
        statement=(
            "At step 1 (the same parameters and batches, so the same local bf16 gradients "
            "g_r in both runs), FSDP2's sharded gradient reduced in bfloat16 is within B of "
            "the one reduced in float32: B = (sum_r |g_r| / ws) (gamma(u_b) + u_d (1 + "
            "gamma(u_b)) + gamma(u_f) + u_f (1 + gamma(u_f))), u_b = 2^-8, u_f = 2^-24, "
            "u_d = u_b + u_f (1 + u_b), gamma(u) = (ws - 1) u / (1 - (ws - 1) u) (S = B / "
            "eps: the claim is |a - b| <= B)."
        ),
        kind="eps",
        bound=1.0,
        scale="B/eps, B from the ranks' local bf16 gradients",
        reason=(
            "Each path sums the ws values in some order, every partial sum rounded to its "
            "dtype: within gamma_{ws-1} sum|g_r| of the exact sum (Higham, Lemma 3.1), then "
            "divides by ws, one more rounding (u_f; a bf16 quotient is float32's rounded "
            "again: u_d) of a value at most (1 + gamma) sum|g_r| / ws; the two results "
            "differ by at most the sum of both errors. Relative to the result the cost is "
            "unbounded where the ranks cancel (measured in bf16 ulps of the float32 "
            "result in docs/distributed.md); relative to sum|g_r| it is a few bf16 ulps."
        ),
        torch_since=(2, 8),
    ),
    *GPT_CLAIMS,
)

_SHARDS, _RS = ("fsdp.shards",), ("fsdp.reduce_scatter",)
_RULE = "which torch states the division rule reference/fsdp.py mirrors (>= 2.8)"
_INSIDE = "inside fully_shard (FSDP2's private parameter and collective code)"

_JOB = HARNESS

MANIFEST = Manifest(
    topic="fsdp",
    modules=("reference.fsdp", "torch_impl.fsdp", "reference.fsdp_gpt", "torch_impl.fsdp_gpt",
             "reference.fsdp_gpt_ckpt", "torch_impl.fsdp_gpt_ckpt"),
    rows=(
        Twin("REDUCE_DTYPES", torch="torch_impl.fsdp:REDUCE_DTYPES", claims=("fsdp.reduce_dtype",),
             why="the reduce dtypes a job takes by name: the reference takes its arrays'"),
        Twin("RULE_STATED", torch="torch_impl.fsdp:RULE_STATED", claims=_RS, why=_RULE),
        Twin("NOT_STATED", torch="torch_impl.fsdp:NOT_STATED", claims=_RS, why=_RULE),
        Twin.same("fsdp", "OPS", *_RS),
        Twin("chunk_rows", reference="reference.fsdp:chunk_rows", alias="torch.chunk",
             claims=_SHARDS),
        Twin("padded_rows", reference="reference.fsdp:padded_rows", claims=_SHARDS, why=_INSIDE),
        Twin("shard", reference="reference.fsdp:shard",
             alias="torch.distributed.fsdp.fully_shard", claims=_SHARDS),
        Twin("unpadded", reference="reference.fsdp:unpadded", claims=("fsdp.params",),
             why=_INSIDE),
        Twin("all_gather", reference="reference.fsdp:all_gather",
             alias="torch.distributed.all_gather_into_tensor", claims=("fsdp.all_gather",)),
        Twin("divide_factors", reference="reference.fsdp:divide_factors", claims=_RS,
             why=_INSIDE),
        Twin("reduce_scatter", reference="reference.fsdp:reduce_scatter",
             claims=(*_RS, "fsdp.reduce_dtype"), why=_INSIDE),
        Twin.same("fsdp", "gloo_reduce_scatter", *_RS),
        Twin("copy_in", reference="reference.fsdp:copy_in", alias="torch._chunk_cat",
             claims=_RS),
        Twin.same("fsdp", "StepRecord", *_RS),
        Twin.same("fsdp", "fsdp_step", "fsdp.all_gather", *_RS, "fsdp.params"),
        Twin("fsdp_job", torch="torch_impl.fsdp:fsdp_job", claims=("fsdp.params",), why=_JOB),
        Twin("reduce_scatter_job", torch="torch_impl.fsdp:reduce_scatter_job", claims=_RS,
             why=_JOB),
        Twin("run", reference="reference.optim:AdamW", torch="torch_impl.fsdp:run",
             claims=("fsdp.params", "fsdp.unsharded_state")),
        *GPT_ROWS,
    ),
    headline="parity/test_fsdp.py::test_two_fsdp_steps_match_the_simulated_ranks_bitwise",
)
