"""The fsdp claims: FSDP2 (fully_shard, MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32 or bfloat16)) over gloo on CPU against reference/fsdp.py's simulated
ranks (the kinds and the registry: parity/tolerances.py).

On CUDA the engine is NCCL: its reduce-scatter has an order of its own (and ReduceOp.AVG is
NCCL's), so the bit-exact reduce-scatter and everything after it would become an order bound
(ddp.order_bound's argument); the shards and the all-gather (copies) carry over.
"""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

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
    # -- the GPT under FSDP2 (reference/fsdp_gpt.py, torch_impl/fsdp_gpt.py) ----------------
    Claim(
        id="fsdp.gpt_all_gather",
        statement=(
            "At every step of an FSDP2 run of the compact GPT (every block and the root "
            "fully_shard'ed), the parameters each module's forward used on every torch rank "
            "are reference.fsdp.all_gather of the reference ranks' shards: bfloat16 under "
            "bf16 (MixedPrecisionPolicy(param_dtype=bfloat16)), float32 under fp32 (no "
            "policy); world sizes 2 (default: fp32, bf16), 3 and 4 (slow)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ FSDP2's all-gather ]: at most one float32 -> bfloat16 rounding (round "
            "to nearest even) of the same shard bits on both sides, then copies; the shards "
            "are equal step after step (fsdp.gpt_adamw), the embeddings' and LayerNorms' "
            "rows as the Linears'."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_reduce_scatter",
        statement=(
            "Given the torch ranks' local (unsharded, param_dtype) gradients of the compact "
            "GPT, reference.fsdp.reduce_scatter per fully_shard module "
            "(reference.fsdp_gpt.groups: each block's 12 parameters, the root's wte, wpe, "
            "ln_f and lm_head) gives the bits of every rank's sharded float32 .grad at every "
            "step, fp32 and bf16 (reduce_dtype float32), world sizes 2 (default), 3 and 4 "
            "(slow: rows 16 and 32 that 3 does not divide)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ FSDP2's reduce-scatter on gloo ]: per module the same copy-in layout "
            "(the module's parameters in registration order, each gradient's padded chunk r "
            "in row r; bf16 -> float32 is exact), gloo's ring on the whole buffer, "
            "ReduceOp.AVG's one division by ws in float32, a cut. The local gradients are "
            "replayed: the reference's own are not torch's (torch runs every op in bfloat16 "
            "on the gathered bf16 weights; the reference emulates autocast, and BLAS orders "
            "differ), so with the replay nothing is left to bound."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_adamw",
        statement=(
            "After each of 3 FSDP2 steps of the compact GPT (4 in fp16; torch.optim.AdamW "
            "on the sharded DTensors, weight decay 0.01, the cosine schedule), every torch "
            "rank's rows of every parameter are the reference rank's AdamW on its shards, "
            "bit for bit (fp16: unscaled, or left as they were where the step skipped); so "
            "are the lr of every step and, after the last, every rank's AdamW state (step, "
            "exp_avg, exp_avg_sq of its rows), fp32, bf16 and fp16, world sizes 2 "
            "(default), 3 and 4 (slow)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Bit-identical sharded gradients (fsdp.gpt_reduce_scatter); AdamW is "
            "elementwise, and torch's for-loop path on a DTensor runs each op on the local "
            "rows, so each element rounds as the unsharded AdamW's would (fsdp."
            "unsharded_state's argument); the reference's AdamW as torch's CPU kernel (fused "
            "multiply-adds, torch's own sqrt: NOTE [ torch's CPU sqrt is MKL's ]) and the "
            "schedule's float64 recursion (NOTE [ Chainable schedules ]). fp16: the unscale "
            "is one float32 product by f32(1/S) per element on either side, and a skip is "
            "the same decision on every rank of both trees (fsdp.gpt_scaler)."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_scaler",
        statement=(
            "In fp16 (MixedPrecisionPolicy(param_dtype=float16, reduce_dtype=float32), "
            "ShardedGradScaler from 2^18 growing every 2 clean steps), at every step of the "
            "GPT's FSDP2 run every torch rank's scale used, found_inf read by step (after "
            "unscale_'s all-reduces), skip decision, and growth tracker and scale after "
            "update are the reference rank's (per-shard unscale_, found_inf all-reduced MAX "
            "then SUM, the shared skip, GradScaler's update), bit for bit; the 2-rank run "
            "reaches two growths, a skip on both ranks' rows and a skip whose inf only rank "
            "0's rows held (default), world sizes 3 and 4 (slow)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "found_inf is a count of the ranks that found an inf or NaN in their rows: both "
            "trees test the same bits (fsdp.gpt_reduce_scatter) for finiteness and reduce "
            "the flags MAX (the DTensor dispatch's Partial(\"max\")) then SUM "
            "(ShardedGradScaler.unscale_): integers, exact in float32 in any order (NOTE "
            "[ found_inf under FSDP2 ]). The update multiplies the scale by 2 or 1/2 (exact "
            "for a power of two) and counts clean steps: integer arithmetic, the same rule "
            "(ShardedGradScaler's CPU update: found_inf >= 1 backs off)."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_resume",
        statement=(
            "`train --world-size N --model gpt --parallel fsdp` (bf16, and fp16 with "
            "--init-scale 262144 --growth-interval 3; dropout 0.1 from "
            "every rank's own stream, cosine, a commit every 2 steps) stopped after its "
            "step-2 commit and resumed with --resume at the same N prints the digest of the "
            "run that never stopped (the joined state: every rank's rows concatenated), "
            "in fp16 also when the stopped and resumed runs recompute (uniform:2+selective: "
            "checkpointed segments of the fully_shard'ed blocks) and, torch, slow, fetch "
            "through 2 loader workers a rank while the uninterrupted one does neither: "
            "torch (DCP of get_state_dict's sharded state, set_state_dict on load) and the "
            "reference (each simulated rank's rows in its own container), 2 ranks (default) "
            "and 3 (slow)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Every entry a step reads is saved by the rank that holds it: its rows of every "
            "parameter and of AdamW's exp_avg and exp_avg_sq, the step counts, the lr and "
            "the schedule's position, the scaler's scale and growth tracker (the same on "
            "every rank), the data position and the rank's stream; a load puts "
            "each back into the same rows (the same N: the same chunks); the rest is the "
            "same deterministic arithmetic, and the digest is a function of the final bits. "
            "A recomputed segment re-gathers the same shards and replays its forward with "
            "the saved random state: the same bits as the tensors it did not keep; the "
            "workers fetch the batches of the consumed position the rank would."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_reshard",
        statement=(
            "`train --world-size N --model gpt --parallel fsdp` (fp16 with its scaler, "
            "dropout) committed by 2 ranks and resumed with --resume on 1, that run's commit "
            "resumed on 3 (rows 16, 32 and 128 in uneven chunks), then on 2: right after each "
            "load every rank holds its rows of every sharded entry (the parameters, AdamW's "
            "exp_avg and exp_avg_sq) cut from the saved full tensors (the saved ranks' rows "
            "joined) by torch.chunk's rule at the new N and every replicated entry as saved "
            "(step counts, lr, schedule, scaler, data position, step, skipped), bit for bit, "
            "so the joined state's digest is the saving run's; its stream is rank_seed(seed, "
            "rank, step)'s; at 3 ranks a run stopped at a commit and resumed ends with the "
            "digest of the one that went on: the reference's simulated ranks (default) and "
            "torch's gloo ranks (2 -> 3 default; 2 -> 1 -> 3 -> 2 slow)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ Resharding an FSDP checkpoint ]: rank r's saved rows are chunk r of the "
            "full tensor (unpadded), their concatenation is the full tensor, a rank at N' "
            "takes its chunk of it: copies of rows (the reference joins and cuts; DCP's "
            "planner reads each rank's overlap of the saved chunks by global offset into the "
            "DTensors of N'). The replicated entries are a read; the streams are re-derived "
            "(NOTE [ Resharding a DDP checkpoint ]). Across the change of N no digest is the "
            "N run's (a mean over N' shards rounds otherwise: fsdp.gpt_loss_curve); at one N "
            "the resume is fsdp.gpt_resume's, exact."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_loss_curve",
        statement=(
            "The learning control: the loss of a float32 FSDP2 run of the compact GPT on N "
            "torch ranks (the mean of the ranks' shard losses) at step k is within "
            "32 eps k |L1(k)| of the loss L1(k) of torch's single-process run on the same "
            "global batches from the same weights, both rounded to float32, for k up to 60 "
            "(world sizes 2, 3, 4; the default test: 2 ranks, 3 steps); not bit-equal."
        ),
        kind="eps",
        bound=32.0,
        scale="k |L1(k)|, the step times the single-process run's loss",
        reason=(
            "ddp.gpt_loss_curve's argument, measured and justified rather than derived: the "
            "reduce-scattered gradient is a float32 sum over the ranks' shard means divided "
            "by N (ReduceOp.AVG), which rounds otherwise than one mean over the batch, and "
            "AdamW's division by sqrt(v) turns a last-bit difference near a zero gradient "
            "into up to an lr of update, so the trajectories part and the gap grows with "
            "the steps. Measured (torch 2.13 CPU, 60 steps, cosine over 60, batch 12): "
            "the gap stays below 0.9 eps |L1| over the first 10 steps and below 5.3 eps k "
            "|L1(k)| over all 60 at ws 2, 3, 4 (worst at step 34, ws 4: a relative 2.1e-5); "
            "the bound is about 6x that. Not claimed for bf16: there FSDP2 runs every op in "
            "bfloat16 where the single process autocasts, and the curves part by up to 8% "
            "(ws 2). A run on the wrong rows or with another schedule is off by "
            "orders of magnitude more (1e-3 relative and up)."
        ),
        torch_since=(2, 8),
    ),
)

_SHARDS, _RS = ("fsdp.shards",), ("fsdp.reduce_scatter",)
_RULE = "which torch states the division rule reference/fsdp.py mirrors (>= 2.8)"
_INSIDE = "inside fully_shard (FSDP2's private parameter and collective code)"

_JOB = "how a torch rank runs this (the drivers' job, the launcher's entry): harness"

_GSTEP = ("fsdp.gpt_all_gather", "fsdp.gpt_reduce_scatter", "fsdp.gpt_adamw")
_GSTATE = ("fsdp.gpt_adamw", "fsdp.gpt_resume", "fsdp.gpt_reshard")
_GLOAD = ("fsdp.gpt_resume", "fsdp.gpt_reshard")
_DCP = "torch's DCP planner joins and cuts the DTensors' rows by their global offsets"
_GSCALER = ("fsdp.gpt_scaler",)
GPT_ROWS: tuple[Twin, ...] = (
    Twin.same("fsdp_gpt", "PRECISIONS", *_GSTEP),
    Twin.same("fsdp_gpt", "PAYLOAD", "fsdp.gpt_resume"),
    Twin.same("fsdp_gpt", "PARAM_DTYPES", *_GSTEP),
    Twin("policy", torch="torch_impl.fsdp_gpt:policy", claims=_GSTEP,
         why="the MixedPrecisionPolicy of a precision: the reference casts by PARAM_DTYPES"),
    Twin("make_scaler", reference="reference.loss_scaling:make_scaler",
         torch="torch_impl.fsdp_gpt:make_scaler", claims=(*_GSCALER, "fsdp.gpt_resume")),
    Twin("groups", reference="reference.fsdp_gpt:groups",
         alias="torch.distributed.fsdp.fully_shard", claims=("fsdp.gpt_reduce_scatter",)),
    Twin("Ranks", reference="reference.fsdp_gpt:Ranks", claims=_GSTEP,
         why="the simulated ranks: a torch rank is one process's Replica"),
    Twin("simulated_ranks", reference="reference.fsdp_gpt:simulated_ranks", claims=_GSTEP,
         why="builds the simulated ranks; a torch rank builds its Replica with replica"),
    Twin("Replica", torch="torch_impl.fsdp_gpt:Replica", claims=_GSTEP,
         why="one torch rank's fully_shard'ed GPT: a simulated rank is an entry of Ranks"),
    Twin("replica", torch="torch_impl.fsdp_gpt:replica", claims=_GSTEP,
         why="fully_shard's the blocks and the root on a process group"),
    Twin.same("fsdp_gpt", "StepRecord", *_GSTEP, *_GSCALER),
    Twin.same("fsdp_gpt", "fsdp_step", *_GSTEP, *_GSCALER, "fsdp.gpt_loss_curve"),
    Twin("gpt_job", torch="torch_impl.fsdp_gpt:gpt_job", claims=_GSTEP, why=_JOB),
    Twin("train_job", torch="torch_impl.fsdp_gpt:train_job", claims=("fsdp.gpt_resume",),
         why=_JOB),
    Twin("run", torch="torch_impl.fsdp_gpt:run", claims=(*_GSTEP, "fsdp.gpt_resume"),
         why=_JOB),
    Twin.same("fsdp_gpt", "train", *_GLOAD),
    # the checkpoint (reference/fsdp_gpt_ckpt.py, torch_impl/fsdp_gpt_ckpt.py)
    Twin("ADAMW_ENTRIES", torch="torch_impl.fsdp_gpt_ckpt:ADAMW_ENTRIES", claims=_GSTATE,
         why="get_state_dict's AdamW entries, flattened; the reference's are its own dicts"),
    Twin("SHARDED", reference="reference.fsdp_gpt_ckpt:SHARDED", claims=("fsdp.gpt_reshard",),
         why=_DCP),
    Twin("is_sharded", reference="reference.fsdp_gpt_ckpt:is_sharded",
         claims=("fsdp.gpt_reshard",), why=_DCP),
    Twin.same("fsdp_gpt_ckpt", "rank_state", *_GSTATE),
    Twin.same("fsdp_gpt_ckpt", "apply_loaded", *_GLOAD),
    Twin.same("fsdp_gpt_ckpt", "digest_state", *_GLOAD),
    Twin("cut", reference="reference.fsdp_gpt_ckpt:cut", claims=("fsdp.gpt_reshard",),
         why=_DCP),
    Twin.same("fsdp_gpt_ckpt", "load_ranks", *_GLOAD),
)

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
