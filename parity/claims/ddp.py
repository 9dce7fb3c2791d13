"""The ddp claims (the kinds and the registry: parity/tolerances.py).

On CUDA the engine is NCCL, not gloo: DDP's reducer is the same C++ (the same buckets, the
same f32(1 / ws) pre-division: ddp.buckets and the pre-division half of ddp.reduced_grads
carry over), but NCCL sums in an order of its own (ring or tree, chosen by NCCL_ALGO, the
channel count and the protocol, and split across channels), which the gloo mirror does not
reproduce: there the bit-exact claims become ddp.order_bound. The CUDA runs check it against
NCCL's all_reduce (one GPU per rank, so at least two GPUs).
"""

from __future__ import annotations

from parity.claims import Claim, Helper, Manifest, Twin
from parity.claims.ddp_ckpt import CKPT_CLAIMS, CKPT_ROWS
from parity.claims.ddp_gpt import GPT_CLAIMS, GPT_ROWS
from parity.claims.ddp_scaler import SCALER_CLAIMS, SCALER_ROWS

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="ddp.ring_order",
        statement=(
            "reference.ddp.ring_allreduce gives every rank the bits dist.all_reduce (sum, gloo, "
            "processes on 127.0.0.1) gives it, for world sizes 2-5, float16, bfloat16, float32 "
            "and float64, 1 to 3,000,017 elements; from three ranks on a left-to-right sum "
            "does not."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ gloo's ring segments ]: the mirror forms each element's sum with the same "
            "additions in the same order ((x[k-1] + x[k-2]) + ...) + x[k] for the chunk k it "
            "falls in, with chunk boundaries from gloo's own segment arithmetic; each addition "
            "rounds once to the dtype on both sides (float16 and bfloat16 through float32, a "
            "double rounding that is innocuous since 24 >= 2 p + 2), so no result can differ."
        ),
    ),
    Claim(
        id="ddp.shards",
        statement=(
            "At every step rank r of a DDP run trains on rows r::ws of the loader's global "
            "batch: reference.ddp.shard of the reference loader's batch gives the bits of the "
            "inputs and targets each torch rank received."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Both loaders yield the same batches (data.loader) and both trees take the same "
            "rows (DistributedSampler's stride, indices[rank:total:num_replicas], applied to "
            "the batch); slicing copies bits."
        ),
    ),
    Claim(
        id="ddp.buckets",
        statement=(
            "At every step, reference.ddp.step_buckets lists the same parameters in the same "
            "order per bucket as DDP's reducer (GradBucket.parameters()): one bucket in "
            "parameter order at step 1, then buckets rebuilt in gradient-ready order closed "
            "at 1 MiB and 25 MiB, for float32 and under bf16/fp16 autocast."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ DDP's reducer ] 1-2: the reference computes the assignment with the "
            "reducer's rule (compute_bucket_assignment_by_size: close when size >= limit) on the "
            "ready order the engine produces for an MLP (reference.ddp.ready_order); integers, "
            "no rounding."
        ),
    ),
    Claim(
        id="ddp.reduced_grads",
        statement=(
            "Given the torch ranks' local gradients, reference.ddp.reduce_gradients gives the "
            "bits of DDP's reduced .grad on every rank at every step, world sizes 2, 3 and 4, "
            "float32 and under bf16/fp16 autocast (fp16 scaled by the GradScaler), with "
            "gradient_as_bucket_view False (the default) and True."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ DDP's reducer ] 3-5: the same f32(g * f32(1 / ws)) per element (f32((0 + "
            "g) / ws) where the gradient is its bucket view, from step 2 on), the same "
            "flat bucket layout, the ring's order on it (ddp.ring_order), an exact copy back. "
            "The local gradients themselves are the torch ranks' (replayed): the reference's "
            "own differ in the last bits (a BLAS product's summation order, nn.linear's "
            "bound), so its own reduced gradients are within that bound, not bit-equal."
        ),
    ),
    Claim(
        id="ddp.params",
        statement=(
            "After 3 DDP steps (SGD with momentum, constant lr; fp16 with the GradScaler) the "
            "reference's simulated ranks, replaying the torch ranks' local gradients, hold the "
            "bits of every torch rank's parameters, world sizes 2, 3 and 4, float32 and under "
            "bf16/fp16 autocast."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Bit-identical reduced gradients (ddp.reduced_grads), unscale (loss_scaling.unscale) "
            "and SGD (optim.sgd_bits: fma as torch's CPU kernels fuse) on the same starting "
            "parameters, step after step: no operation left whose rounding could differ."
        ),
    ),
    Claim(
        id="ddp.own_reduced",
        statement=(
            "With its own local gradients (its own MLP's forward and backward on each rank's "
            "shard, from the same parameters), the reference's reduced gradients are within B "
            "of DDP's at every step: B = c sum_r |g_r - g'_r| + (u + gamma_{ws-1} (1 + u)) c "
            "sum_r (|g_r| + |g'_r|), c = f32(1 / ws), g and g' the two trees' local gradients "
            "(S = B / eps: the claim is |a - b| <= B)."
        ),
        kind="eps",
        bound=1.0,
        scale="B/eps, B from both trees' local gradients",
        reason=(
            "The one difference left: the local gradients (BLAS summation orders, bounded layer "
            "by layer by nn.linear and amp.model_*). Each side forms x_r = g_r c (1 + d_r), "
            "|d_r| <= u, so |x_r - x'_r| <= c |g_r - g'_r| + u c (|g_r| + |g'_r|), and sums the "
            "ws values within gamma_{ws-1} sum|x_r| of their exact sum (Higham, Lemma 3.1), "
            "|x_r| <= (1 + u) c |g_r|; the two reduced values differ by at most the sum of "
            "these terms (B evaluated in float64, widened by 2^-50 relative to cover that). "
            "Where the ranks' gradients cancel, the first term is nearly attained."
        ),
    ),
    Claim(
        id="ddp.order_bound",
        statement=(
            "Two summation orders of the same ws values differ by at most eps S, S = (ws - 1) "
            "sum_r |x_r| / (1 - (ws - 1) u): on CPU gloo's ring against a left-to-right sum, and "
            "for any values (hypothesis) the ring mirror against a left-to-right sum and "
            "against torch.sum over a rank axis; on CUDA NCCL's all_reduce against the mirror."
        ),
        kind="eps",
        bound=1.0,
        scale="(ws - 1) sum_r |x_r| / (1 - (ws - 1) u)",
        reason=(
            "Any order of n = ws additions is within gamma_{n-1} sum|x_r| of the exact sum "
            "(Higham, Thm 4.3 / Lemma 3.1: gamma_k = k u / (1 - k u)), so two orders are within "
            "2 gamma_{n-1} sum|x_r| = eps (n - 1) sum|x_r| / (1 - (n - 1) u), eps = 2u: the "
            "NCCL statement, since its order is neither mirrored nor fixed across NCCL versions "
            "and settings."
        ),
    ),
    *SCALER_CLAIMS,
    *CKPT_CLAIMS,
    *GPT_CLAIMS,
    Claim(
        id="ddp.async_resume",
        statement=(
            "A 2-rank DDP run (the MLP, fp16, a per-rank stream) saving with dcp.async_save "
            "(staged copies, the write in the background, the commit after every rank's data "
            "is durable): each commit loads the bits of the state at its step although the "
            "parameters changed (the next step, or NaN written over them) before the held "
            "write began; saves asked for while the previous one still wrote commit whole; "
            "a resume from the step-4 commit ends at step 6 with the uninterrupted run's "
            "bits; a rank SIGKILLed or raising in its write (hanging: slow), or the "
            "coordinator SIGKILLed between the data and the record, leaves step 2 the newest "
            "commit, loadable, and a resume from it ends with the uninterrupted bits; `train "
            "--world-size 2 --async-save` ends on the sync run's digest, killed and resumed "
            "too (slow: both trees, both victims)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ An async save commits after its data is durable ] (reference/"
            "async_ckpt.py): async_save stages by copy before it returns (torch_impl/"
            "async_ckpt.py), so the bytes written are the step's whatever the live tensors "
            "do next; the record is written only after every rank's future completed and its "
            "files were fsynced and gathered, and a save starts only after the previous one "
            "committed, so no record names data that is not durable (NOTE [ A checkpoint "
            "exists when its commit record does ]); the run is deterministic and the saved "
            "state holds every entry a step reads (ddp.ckpt_resume)."
        ),
    ),
)

_BUCKETS = ("ddp.buckets",)
_RING = ("ddp.ring_order", "ddp.order_bound")
_REDUCED = ("ddp.reduced_grads", "ddp.own_reduced")
_DDP = "torch.nn.parallel.DistributedDataParallel"
_CPP = "DDP's Reducer does this in C++ (NOTE [ DDP's reducer ]): the reference mirrors it"

_ASYNC = ("ddp.async_resume",)
_ASYNC_JOB = "a job one rank runs under ranks/launcher.py: the tests' runs of the saver"
_ASYNC_ROWS = (
    Twin.same("async_ckpt", "PAYLOAD", *_ASYNC),
    Twin.same("async_ckpt", "MODES", *_ASYNC),
    Twin("FAULTS", torch="torch_impl.async_ckpt:FAULTS", claims=_ASYNC,
         why="where a seeded fault strikes in a rank's background write: a simulated rank has "
             "no process of its own"),
    Twin.same("async_ckpt", "AsyncSaveError", *_ASYNC),
    Twin("refusal", torch="torch_impl.async_ckpt:refusal", claims=_ASYNC,
         why="pinned staging needs CUDA: the reference stages NumPy copies only"),
    Twin("now", reference="reference.async_ckpt:now", claims=_ASYNC,
         why="the events' clock; torch's saver reads time.monotonic in place"),
    Twin("stage", reference="reference.async_ckpt:stage",
         alias="torch.distributed.checkpoint.staging.BlockingAsyncStager", claims=_ASYNC),
    Twin.same("async_ckpt", "AsyncSaver", *_ASYNC),
    Twin.same("async_ckpt", "save_step", *_ASYNC),
    Twin("async_job", torch="torch_impl.async_ckpt:async_job", why=_ASYNC_JOB),
    Twin("run", torch="torch_impl.async_ckpt:run", claims=_ASYNC, why=_ASYNC_JOB),
)

MANIFEST = Manifest(
    topic="ddp",
    modules=("reference.ddp", "torch_impl.ddp", "reference.ddp_scaler", "torch_impl.ddp_scaler",
             "reference.sharded_ckpt", "torch_impl.sharded_ckpt", "reference.ddp_gpt",
             "torch_impl.ddp_gpt", "reference.ddp_train", "torch_impl.ddp_train",
             "reference.async_ckpt", "torch_impl.async_ckpt"),
    rows=(
        Twin("MIB", reference="reference.ddp:MIB", why=_CPP),
        Twin("MAX_SEGMENT_BYTES", reference="reference.ddp:MAX_SEGMENT_BYTES", claims=_RING,
             why="gloo's ring segment limit (C++, NOTE [ gloo's ring segments ])"),
        Twin("FIRST_BUCKET_BYTES", reference="reference.ddp:FIRST_BUCKET_BYTES",
             claims=_BUCKETS, why=_CPP),
        Twin("BUCKET_BYTES", reference="reference.ddp:BUCKET_BYTES", claims=_BUCKETS, why=_CPP),
        Twin("ring_chunks", reference="reference.ddp:ring_chunks", claims=_RING,
             why="gloo cuts the ring's chunks in C++ (gloo/allreduce.cc)"),
        Twin("ring_allreduce", reference="reference.ddp:ring_allreduce",
             alias="torch.distributed.all_reduce", claims=_RING),
        Twin("naive_sum", reference="reference.ddp:naive_sum", claims=_RING,
             why="a left-to-right sum: what the ring is not, the claims' control"),
        Twin("bucket_plan", reference="reference.ddp:bucket_plan",
             alias="torch.distributed._compute_bucket_assignment_by_size", claims=_BUCKETS),
        Twin("ready_order", reference="reference.ddp:ready_order", claims=_BUCKETS, why=_CPP),
        Twin("step_buckets", reference="reference.ddp:step_buckets", alias=_DDP,
             claims=_BUCKETS),
        Twin("reduce_gradients", reference="reference.ddp:reduce_gradients", alias=_DDP,
             claims=_REDUCED),
        Twin.same("ddp", "shard", "ddp.shards"),
        Twin.same("ddp", "StepRecord", "ddp.reduced_grads", "ddp.buckets"),
        Twin("local_backward", reference="reference.ddp:local_backward",
             claims=("ddp.own_reduced",),
             why="every simulated rank's backward: a torch rank runs its own, in ddp_step"),
        Twin("reduce_into", reference="reference.ddp:reduce_into", alias=_DDP,
             claims=_REDUCED),
        Twin("Replica", torch="torch_impl.ddp:Replica", claims=("ddp.params",),
             why="one torch rank's model under DDP: a simulated rank is an entry of the lists "
                 "ddp_step takes"),
        Twin("replica", torch="torch_impl.ddp:replica", claims=("ddp.params",),
             why="builds a Replica on a process group; the reference builds its ranks with "
                 "train_models.build"),
        Twin.same("ddp", "ddp_step", "ddp.params", "ddp.reduced_grads"),
        *SCALER_ROWS,
        *CKPT_ROWS,
        *GPT_ROWS,
        *_ASYNC_ROWS,
        Twin.same("ddp_train", "PAYLOAD", "ddp.cli_kill_resume"),
        Twin("Rank", reference="reference.ddp_train:Rank", claims=("ddp.cli_kill_resume",),
             why="one simulated rank's objects: a torch rank is a process (run)"),
        Twin("rank_state", reference="reference.ddp_train:rank_state",
             torch="torch_impl.sharded_ckpt:rank_state", claims=("ddp.ckpt_trees",)),
        Twin.same("ddp_train", "train", "ddp.cli_kill_resume", "ddp.gpt_resume"),
        Twin("train_job", torch="torch_impl.ddp_train:train_job", claims=("ddp.gpt_resume",),
             why="the job a torch rank runs (a process); the reference's ranks run in train"),
        Twin("run", reference="reference.ddp_train:train", torch="torch_impl.ddp_train:run",
             claims=("ddp.cli_kill_resume",)),
    ),
    helpers=(
        Helper("torch_impl.ddp_jobs", "how a torch rank runs the ddp jobs (their constructors "
               "and run(job, rank, group)): harness the drivers call, not mechanism"),
    ),
    headline="parity/test_ddp.py::test_two_ddp_steps_match_the_simulated_ranks_bitwise",
)
