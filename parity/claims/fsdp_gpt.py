"""The fsdp claims on the compact GPT trained with AdamW under FSDP2 (imported by
parity/claims/fsdp.py, the topic's module, which holds the MANIFEST): the step held bit for
bit to the reference replaying the torch ranks' local gradients, the scaler, resume (at the
same N, resharded, and saved asynchronously), and the learning control against one process.
The run: reference/fsdp_gpt.py; its checkpoint: reference/fsdp_gpt_ckpt.py.
"""

from __future__ import annotations

from parity.claims import Claim, Twin

HARNESS = "how a torch rank runs this (the drivers' job, the launcher's entry): harness"

GPT_CLAIMS: tuple[Claim, ...] = (
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
    Claim(
        id="fsdp.gpt_async_resume",
        statement=(
            "`train --world-size N --model gpt --parallel fsdp --async-save` (copy; fp16 "
            "with its scaler, dropout, a commit every 2 steps) saves through the DDP run's "
            "AsyncSaver: every commit read back holds each rank's state as it was at the "
            "save (its DTensor rows of the parameters and AdamW's buffers, the replicated "
            "entries, its stream), although the ranks took their next step, or overwrote "
            "their parameters with NaN, before its background write began; the record "
            "comes after every rank's write, the run returns after its last commit; a run "
            "stopped at an async commit and resumed ends with the digest of the run that "
            "never stopped, at the same N and, resumed on 3 ranks from 2 ranks' commit, "
            "stopped again at 3 and resumed; and a rank's write that fails or is killed, or "
            "a coordinator stopped between the data and the record, leaves the previous "
            "commit the newest, which resumes to the uninterrupted digest: torch's gloo "
            "ranks (2; the reshard and the kills slow) and the reference's simulated ranks."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ An async save commits after its data is durable ]: the state is copied "
            "before save returns (BlockingAsyncStager: fresh CPU tensors for each DTensor's "
            "local rows, its mesh and placement kept, so DCP writes the rows at their "
            "global offsets), so what the background writes is the step's bits, whatever "
            "the live shards hold by then; the files and the record are the sync save's, "
            "so a load is fsdp.gpt_resume's (or fsdp.gpt_reshard's) exact one; a step "
            "directory without its record is no checkpoint, and nothing writes into a "
            "committed one. Copies and reads: no rounding anywhere."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_scaled",
        statement=(
            "The scaled precisions under FSDP2 (no MixedPrecisionPolicy: float32 all-gather "
            "and reduce-scatter; each rank's ScaledLinears cast the gathered weight and its "
            "own shard's x and g): 2 steps of the compact GPT (AdamW, cosine) on the torch "
            "ranks, and the reference's simulated ranks replaying their local gradients "
            "(fp8-delayed: and their amax vectors) with their own bits, hold the bits of "
            "the gathered parameters, the reduce-scattered gradient shards and every rank's "
            "rows after AdamW at every step, and of every rank's final AdamW state, lr, "
            "delayed scaling's amax histories and scales (the same on every rank) and "
            "BitStream state (nvfp4: rank r's own, different rank to rank) (default: 2 "
            "ranks, fp8-delayed, nvfp4 and fp8-rowwise; slow: every scaled precision at 2 "
            "and 3 ranks)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Without a policy the parameters are gathered and their gradients reduced in "
            "float32, fsdp.gpt_all_gather's and fsdp.gpt_reduce_scatter's fp32 case (the "
            "formats stop at each rank's local gradient), and AdamW on the rows is "
            "fsdp.gpt_adamw's. fp8-delayed: a MAX of float32 values is exact in any order, "
            "a NaN carried apart (NOTE [ Delayed scaling on N ranks ]), then "
            "fp8_scaling.delayed_update, bit for bit between the trees; every rank writes "
            "the same reduced amaxes, so its buffers are every other rank's. A BitStream's "
            "state is integers advanced by the same draws, shape by shape, in both trees "
            "(NOTE [ One bit stream, both trees ]); each rank's is seeded by rank_seed."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_scaled_local",
        statement=(
            "Each FSDP2 rank casts the gathered weight and its own shard: at the first step "
            "of the compact GPT at a scaled precision (fp8-delayed, nvfp4 and fp8-rowwise by "
            "default; slow: every scaled precision, 2 and 3 ranks), every torch rank's local "
            "gradient is bit-identical to torch's single-process backward, without FSDP, of "
            "the same GPT on that rank's rows with that rank's own bits; and at every step "
            "the weight entry of every rank's fp8-delayed amax vector is the largest "
            "magnitude of the gathered weight."
        ),
        kind="bits",
        bound=0,
        reason=(
            "FSDP2 gathers the float32 shards into the full weight (copies) and registers it "
            "in the module before the block's forward, so the ScaledLinear's casts read the "
            "same W as one process (NOTE [ Scaled GEMMs under FSDP2 ] 2); x and g are the "
            "rank's rows; the same ops on the same operands with the same bits, one "
            "intra-op thread in both, give the same bits, and an amax is a max: exact. A "
            "weight scaled from the rank's shard moves the cast wherever the shard does not "
            "hold the weight's max."
        ),
        torch_since=(2, 8),
    ),
    Claim(
        id="fsdp.gpt_scaled_resume",
        statement=(
            "`train --world-size N --model gpt --parallel fsdp --precision P --horizon 4` "
            "stopped after its step-2 commit and resumed with --resume at the same N prints "
            "the digest of the run that never stopped (nvfp4 and fp8-delayed, torch and the "
            "reference, 2 ranks (default); slow: every scaled precision); committed by 2 "
            "ranks and resumed on 3, every rank holds the saved delayed-scaling buffers "
            "and nvfp4's rank r the stream BitStream(rank_seed(seed, r, step)) (default: "
            "the reference; slow: torch)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "fsdp.gpt_resume's argument, with the two entries a scaled run adds: "
            "fp8-delayed's histories and scales are module buffers, which fully_shard does "
            "not shard (replicated model/<name> entries, equal on every rank, a read at any "
            "world size), and nvfp4's bits/rank<r> is the rank's own BitStream state, "
            "restored at the same N and re-derived at another (NOTE [ Random bits on N "
            "ranks ]); the digest is a function of the final bits."
        ),
        torch_since=(2, 8),
    ),
)

_GSTEP = ("fsdp.gpt_all_gather", "fsdp.gpt_reduce_scatter", "fsdp.gpt_adamw")
_GSTATE = ("fsdp.gpt_adamw", "fsdp.gpt_resume", "fsdp.gpt_reshard")
_GLOAD = ("fsdp.gpt_resume", "fsdp.gpt_reshard")
_ASYNC = ("fsdp.gpt_async_resume",)
_DCP = "torch's DCP planner joins and cuts the DTensors' rows by their global offsets"
_GSCALER = ("fsdp.gpt_scaler",)
_SCALED = ("fsdp.gpt_scaled", "fsdp.gpt_scaled_local")
_SRESUME = ("fsdp.gpt_scaled_resume",)
GPT_ROWS: tuple[Twin, ...] = (
    Twin.same("fsdp_gpt", "PRECISIONS", *_GSTEP),
    Twin.same("fsdp_gpt", "PAYLOAD", "fsdp.gpt_resume"),
    Twin.same("fsdp_gpt", "PARAM_DTYPES", *_GSTEP),
    Twin("param_dtype", reference="reference.fsdp_gpt:param_dtype", claims=(*_GSTEP, *_SCALED),
         why="what the all-gather casts to: torch's policy (none for a scaled precision)"),
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
    Twin.same("fsdp_gpt", "fsdp_step", *_GSTEP, *_GSCALER, *_SCALED, "fsdp.gpt_loss_curve"),
    Twin("gpt_job", torch="torch_impl.fsdp_gpt:gpt_job", claims=_GSTEP, why=HARNESS),
    Twin("train_job", torch="torch_impl.fsdp_gpt:train_job", claims=("fsdp.gpt_resume", *_ASYNC),
         why=HARNESS),
    Twin("run", torch="torch_impl.fsdp_gpt:run", claims=(*_GSTEP, "fsdp.gpt_resume", *_ASYNC),
         why=HARNESS),
    Twin.same("fsdp_gpt", "train", *_GLOAD, *_ASYNC),
    # the checkpoint (reference/fsdp_gpt_ckpt.py, torch_impl/fsdp_gpt_ckpt.py)
    Twin("ADAMW_ENTRIES", torch="torch_impl.fsdp_gpt_ckpt:ADAMW_ENTRIES", claims=_GSTATE,
         why="get_state_dict's AdamW entries, flattened; the reference's are its own dicts"),
    Twin("SHARDED", reference="reference.fsdp_gpt_ckpt:SHARDED", claims=("fsdp.gpt_reshard",),
         why=_DCP),
    Twin("BUFFERS", reference="reference.fsdp_gpt_ckpt:BUFFERS", claims=_SRESUME,
         why="get_state_dict gives a buffer as a plain tensor, a DTensor only for a parameter"),
    Twin("OWN", reference="reference.fsdp_gpt_ckpt:OWN", claims=_SRESUME,
         why="the torch rank's load leaves its own entries out of the template instead"),
    Twin("is_sharded", reference="reference.fsdp_gpt_ckpt:is_sharded",
         claims=("fsdp.gpt_reshard",), why=_DCP),
    Twin.same("fsdp_gpt_ckpt", "rank_state", *_GSTATE, *_SRESUME),
    Twin.same("fsdp_gpt_ckpt", "apply_loaded", *_GLOAD, *_SRESUME),
    Twin.same("fsdp_gpt_ckpt", "digest_state", *_GLOAD),
    Twin("cut", reference="reference.fsdp_gpt_ckpt:cut", claims=("fsdp.gpt_reshard",),
         why=_DCP),
    Twin.same("fsdp_gpt_ckpt", "load_ranks", *_GLOAD),
)
