"""The ddp claims on sharded checkpoints (imported by parity/claims/ddp.py): resume, reshard
and kills. NOTE [ A checkpoint exists when its commit record does ] in ckpt/commit.py,
NOTE [ Resharding a DDP checkpoint ] in torch_impl/sharded_ckpt.py."""

from __future__ import annotations

from parity.claims import Claim, Twin

CKPT_CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="ddp.ckpt_resume",
        statement=(
            "A 2-rank DDP run (fp16, a GradScaler per rank, SGD with momentum, a per-rank "
            "random stream drawn every step) that saves sharded checkpoints with dcp.save "
            "every 2 steps and is resumed on 2 ranks from its step-4 commit ends at step 6 "
            "with the bits of the uninterrupted run on every rank: parameters, momentum "
            "buffers, scale, growth tracker, sampler epoch and position, step, the rank's "
            "generator state; and steps 5 and 6 draw the same values and give the same "
            "losses."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The saved state is every entry a step reads or writes (the module docstring's "
            "table in torch_impl/sharded_ckpt.py); DCP stores each tensor's bytes "
            "(torch.save of the storage) and loads them by copy_, so the resumed ranks "
            "start step 5 from the same bits, consume the same global batch (the sampler's "
            "position) and draw from the same generator state; every later operation is "
            "the same deterministic arithmetic on the same inputs."
        ),
    ),
    Claim(
        id="ddp.ckpt_reshard",
        statement=(
            "The same step-4 commit of 2 ranks resumed on 1 and on 3 ranks: every rank "
            "holds the saved replicated entries bit for bit (parameters, momentum, scale, "
            "growth tracker, sampler position, step), and its generator state is that of "
            "torch.Generator().manual_seed(rank_seed(seed, rank, 4)): per-rank streams are "
            "re-derived, not mapped; the steps after are a run of the new world size."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ Resharding a DDP checkpoint ]: every DDP rank holds the whole model, so "
            "each rank of the new world size reads every replicated key (from whichever "
            "rank's file DCP's planner put it in) and copies its bytes; the rule's seed is a "
            "pure function of integers. Nothing after the load is claimed equal to the "
            "2-rank continuation: a mean over 3 shards rounds differently from one over 2."
        ),
    ),
    Claim(
        id="ddp.ckpt_kill",
        statement=(
            "A 2-rank saving run SIGKILLed during its step-4 save (rank 1 after writing its "
            "data, the coordinator before the .metadata, the coordinator after it but before "
            "the commit record) leaves step 2 the newest commit: it verifies, the step-4 "
            "directory is listed as uncommitted, and it loads the bits the unkilled run "
            "saved at step 2; a 2-rank resume from it ends at step 6 with the uninterrupted "
            "run's bits (the default run kills rank 1 and checks the step-2 commit; the slow tests "
            "add the other two points and the resumes)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ A checkpoint exists when its commit record does ]: the step-4 commit "
            "record is written only after every rank's file and the metadata are durable, "
            "and only by the rename; a kill before it leaves the step-2 record and its files "
            "untouched (nothing writes into a committed step directory), and the run is "
            "deterministic, so what it saved at step 2 is what the unkilled run saved."
        ),
    ),
    Claim(
        id="ddp.ckpt_trees",
        statement=(
            "The torch run's step-4 state of both ranks, saved by the reference's sharded "
            "checkpoint (one container per rank and a commit record) and loaded on 2, 3 and "
            "1 simulated ranks, gives every rank the bits DCP's load gave the torch rank of "
            "the same world size (every entry at 2 ranks; the replicated entries at 3 and "
            "1); each tree refuses the other's checkpoint by its commit record's payload."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Both trees store the same flat keys and copy bytes (the container's .npy records, "
            "DCP's torch serialization) and apply the same reshard rule (rank 0's replicated "
            "entries; NOTE [ Resharding a DDP checkpoint ]); no arithmetic is involved. The "
            "payloads differ (DCP's pickled metadata is never read by the reference), so "
            "neither tree resumes the other's files."
        ),
    ),
    Claim(
        id="ddp.cli_kill_resume",
        statement=(
            "`python -m parity train --world-size N` (fp16 with skipped steps, dropout from "
            "every rank's own stream, a commit every 2 steps) SIGKILLed during a save (the "
            "last rank once its share appears, or the coordinator once the step directory "
            "holds all but the commit record) and rerun with --resume prints the state "
            "digest of the run that was not killed: both trees, world sizes 2, 3 and 4 (the "
            "default run: torch, 2 ranks; the rest are slow tests)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The killed save is no checkpoint (ddp.ckpt_kill: NOTE [ A checkpoint exists "
            "when its commit record does ]) and the previous commit holds every entry a step "
            "reads (ddp.ckpt_resume's table plus the skipped count), each rank's own stream "
            "included; a resumed torch rank rebuilds DDP's buckets before its first step "
            "(NOTE [ DDP's buckets after a resume ] in torch_impl/ddp_train.py), so from "
            "three ranks on the ring sums every element in the uninterrupted run's order; "
            "the rest is the same deterministic arithmetic on the same inputs, and the "
            "digest is a function of the final bits."
        ),
    ),
)

# The sharded-checkpoint rows of the ddp manifest (parity/claims/ddp.py).
_CKPT = ("ddp.ckpt_resume", "ddp.ckpt_reshard", "ddp.ckpt_kill", "ddp.ckpt_trees")
_DCP = "DCP's versions and notices: the reference writes its own container (ckpt)"
_JOB = "a job one rank runs under ranks/launcher.py (how a rank runs this, not a mechanism)"
CKPT_ROWS: tuple[Twin, ...] = (
    Twin.same("sharded_ckpt", "PAYLOAD", "ddp.ckpt_trees"),
    Twin("FAULTS", torch="torch_impl.sharded_ckpt:FAULTS", claims=("ddp.ckpt_kill",),
         why="where a seeded kill lands in DCP's save: the reference's container is ckpt's"),
    Twin("DCP_TAKES_NO_DIST", torch="torch_impl.sharded_ckpt:DCP_TAKES_NO_DIST", why=_DCP),
    Twin("ONE_PROCESS_WARNING", torch="torch_impl.sharded_ckpt:ONE_PROCESS_WARNING", why=_DCP),
    Twin("TYPED_STORAGE_WARNING", torch="torch_impl.sharded_ckpt:TYPED_STORAGE_WARNING",
         why=_DCP),
    Twin("dcp_notices_ignored", torch="torch_impl.sharded_ckpt:dcp_notices_ignored", why=_DCP),
    Twin("no_dist_kwargs", torch="torch_impl.sharded_ckpt:no_dist_kwargs", why=_DCP),
    Twin.same("sharded_ckpt", "save_sharded", *_CKPT),
    Twin("rank_stream", reference="reference.sharded_ckpt:rank_stream",
         claims=("ddp.ckpt_reshard",),
         why="the re-derived per-rank stream: torch's ckpt_job seeds a torch.Generator alike"),
    Twin.same("sharded_ckpt", "load_sharded", *_CKPT),
    Twin("rank_state", torch="torch_impl.sharded_ckpt:rank_state", claims=_CKPT,
         why="this rank's saved table, aliasing live tensors: the reference's is "
             "ddp_train.rank_state"),
    Twin("apply_loaded", torch="torch_impl.sharded_ckpt:apply_loaded", claims=_CKPT,
         why="what DCP loaded put into objects it could not alias: the reference's state is "
             "plain arrays"),
    Twin("ckpt_job", torch="torch_impl.sharded_ckpt:ckpt_job", why=_JOB),
    Twin("run", torch="torch_impl.sharded_ckpt:run", claims=_CKPT, why=_JOB),
)
