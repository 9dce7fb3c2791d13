"""The recompute claims (the kinds and the registry: parity/tolerances.py)."""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="recompute.grads_reference",
        statement=(
            "Under every schedule (none, uniform:K, sqrt, optimal:S), with dropout on, the "
            "reference's parameter and input gradients are bit-identical to running without "
            "checkpointing, and the generators end in the same state; in float32, float64 and "
            "with the forward under float16 or bfloat16 autocast."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The recompute re-runs the same NumPy operations on the same input and weights, with "
            "the generators restored so Dropout draws the same masks (NOTE [ RNG replay ]) and "
            "the autocast state of the forward re-entered, so every op casts and rounds as it "
            "did (NOTE [ Autocast state ]): every tensor backward reads is bit-identical, and "
            "so is every gradient."
        ),
    ),
    Claim(
        id="recompute.grads_torch",
        statement=(
            "Under every schedule, torch.utils.checkpoint (use_reentrant=False, "
            "preserve_rng_state=True; nested for optimal:S) gives gradients bit-identical to the "
            "same model without checkpointing, dropout on, and leaves the dropout generator "
            "where it would be; in float32, float64 and under float16/bfloat16 autocast; on CPU "
            "and on CUDA."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The recompute runs the same kernels on the same inputs with the stashed RNG state "
            "of the input's device (the CPU generator, or the CUDA device's: nn.Dropout draws "
            "from the generator of its input's device), so Dropout draws the same noise; the "
            "kernels are deterministic for a fixed shape, thread count and stream (these use no "
            "atomics); checkpoint records the autocast state at forward and re-enters it around "
            "the recompute."
        ),
    ),
    Claim(
        id="recompute.held_bytes",
        statement=(
            "The bytes held between forward and backward (distinct storage, parameters and "
            "0-byte tensors excluded) predicted from the reference tape equal what torch's "
            "saved_tensors_hooks see packed, for every schedule, with and without early stop, in "
            "float32, float64 and under float16/bfloat16 autocast (2-byte lp tensors, "
            "amp.saved_bytes); on CUDA with each Dropout mask at 1 byte per element."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Byte counts are integers: the tape holds segment inputs plus the tapes of layers run "
            "normally, the same tensors torch saves; any difference is a modelling error, not "
            "rounding. Version and device facts: torch < 2.12 also packs the 0-element dummy "
            "input of its _NoopSaveInputs Function (no bytes); on CUDA nn.Dropout runs the fused "
            "native_dropout, which saves a bool mask where the CPU kernel saves float noise "
            "(NOTE [ Dropout's saved mask by device ])."
        ),
    ),
    Claim(
        id="recompute.counts",
        statement=(
            "Per layer, the forwards run during backward by the reference equal the forwards "
            "torch starts (forward pre-hooks) during backward, for every schedule, with and "
            "without early stop, on CPU and CUDA."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counts are integers. Both stop a recompute after the last layer that saves (NOTE [ "
            "Early stop ]): torch interrupts that layer inside its forward, after its saves, so "
            "it is counted as started, and the reference runs it whole."
        ),
    ),
    Claim(
        id="recompute.early_stop",
        statement=(
            "Per layer, torch's finished forwards during backward (forward hooks) equal the "
            "reference's count minus the recomputes in which that layer is its segment's last "
            "saving layer (where torch's early stop interrupts it; none with early_stop=False)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Counts are integers; the interruption happens in every recompute of a segment, at "
            "the pack of the last tensor the forward saved (NOTE [ Early stop ])."
        ),
    ),
    Claim(
        id="recompute.plans",
        statement=(
            "For every spec and 1 <= n <= 64 layers the two trees' parse_schedule give the same "
            "plan; optimal:S's recompute count equals Griewank-Walther's closed form r n - beta(S "
            "+ 1, r - 1)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Plans are integers; the reference minimizes over every first split and the torch "
            "twin takes the binomial formula's largest optimal split, so equal plans check the "
            "formula against the search."
        ),
    ),
    Claim(
        id="recompute.gpt_grads_reference",
        statement=(
            "On the transformer, under every block schedule (uniform:K, sqrt, optimal:S over "
            "the n_layer blocks), selective recomputation of the attention core, and both "
            "together, dropout on: the reference's loss and every parameter gradient are "
            "bit-identical to no recomputation, and the dropout generator ends in the same "
            "state; in float32, float64 and with the forward under float16 or bfloat16 "
            "autocast."
        ),
        kind="bits",
        bound=0,
        reason=(
            "A checkpointed block and a RecomputedCore re-run the same NumPy operations on the "
            "same inputs and weights, with the generator restored (NOTE [ RNG replay ]) and the "
            "forward's autocast state re-entered, so backward reads bit-identical tensors."
        ),
    ),
    Claim(
        id="recompute.gpt_grads_torch",
        statement=(
            "On the transformer, torch.utils.checkpoint per block (the blocks' ModuleList run "
            "under the plan) and around the attention core (selective), alone and together, "
            "dropout on: the loss and every parameter gradient are bit-identical to no "
            "checkpointing and the dropout generator ends where it would; float32, float64 and "
            "under float16/bfloat16 autocast; on CPU and CUDA."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The recompute runs the same kernels on the same inputs, with the RNG state of the "
            "inputs' device replayed and the autocast state re-entered (recompute.grads_torch's "
            "reason); the kernels are deterministic for a fixed shape, thread count and stream."
        ),
    ),
    Claim(
        id="recompute.gpt_held_bytes",
        statement=(
            "On the transformer, under every block schedule, selective recomputation and both, "
            "the bytes held between forward and backward (distinct storages, parameters "
            "excluded) read off the reference's tape equal what torch's saved_tensors_hooks "
            "see packed; float32 and float64, dropout on (on CUDA with dropout off, as "
            "gpt.saved_tensors)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Byte counts are integers. A checkpointed block keeps its input (B, T, C); a "
            "RecomputedCore keeps q, k and v, three views of the qkv Linear's (B, T, 3C) "
            "output, one storage in both trees; everything else is gpt.saved_tensors' tape."
        ),
    ),
)

_GRADS = ("recompute.grads_reference", "recompute.grads_torch")
_MEASURED = ("recompute.held_bytes", "recompute.counts", "recompute.early_stop")
_GPT = ("recompute.gpt_grads_reference", "recompute.gpt_grads_torch",
        "recompute.gpt_held_bytes")
_AUTOGRAD = "autograd's backward recomputes in torch: the plan is a loop in forward_with_schedule"
_PLANS = ("recompute.plans",)

_same = Twin.same


MANIFEST = Manifest(
    topic="recompute",
    modules=("reference.recompute", "torch_impl.recompute", "reference.recompute_plans",
             "torch_impl.recompute_plans", "reference.recompute_gpt", "torch_impl.recompute_gpt"),
    rows=(
        Twin("Item", reference="reference.recompute:Item", why=_AUTOGRAD),
        Twin("Counter", reference="reference.recompute:Counter", claims=("recompute.counts",),
             why="the reference counts each layer's forwards; torch's measure counts them "
                 "with forward hooks"),
        Twin("Region", reference="reference.recompute:Region", claims=_GRADS, why=_AUTOGRAD),
        Twin("Checkpoint", reference="reference.recompute:Checkpoint",
             claims=("recompute.grads_reference", "recompute.early_stop"),
             why="torch.utils.checkpoint keeps the same input, RNG and autocast state in its "
                 "frames: the twin is checkpoint below"),
        Twin("distinct_bytes", reference="reference.recompute:distinct_bytes",
             torch="torch_impl.accounting:distinct_bytes", claims=("recompute.held_bytes",)),
        Twin("CHECKPOINT_PACKS_DUMMY", torch="torch_impl.recompute:CHECKPOINT_PACKS_DUMMY",
             claims=("recompute.held_bytes",),
             why="how a torch version saves a checkpoint's inputs (a 0-byte dummy before "
                 "2.12): the reference keeps its input alone"),
        Twin("dropout_saves_bool_mask", torch="torch_impl.recompute:dropout_saves_bool_mask",
             claims=("recompute.held_bytes",),
             why="where nn.Dropout saves a bool mask (CUDA): the reference's mask is in the "
                 "input dtype, as the CPU's"),
        Twin("ScheduledRun", reference="reference.recompute:ScheduledRun", claims=_GRADS,
             why="autograd's backward recomputes in torch; measure (below) observes what this "
                 "reads off its tape"),
        _same("recompute", "forward_with_schedule", *_GRADS),
        _same("recompute", "checkpoint", *_GRADS),
        _same("recompute", "checkpoint_sequential", *_GRADS),
        Twin("Measurement", reference="reference.recompute:ScheduledRun",
             torch="torch_impl.recompute:Measurement", claims=_MEASURED),
        Twin("measure", reference="reference.recompute:ScheduledRun.backward",
             torch="torch_impl.recompute:measure", claims=_MEASURED),
        _same("recompute_plans", "parse_schedule", *_PLANS),
        Twin("revolve_cost", reference="reference.recompute_plans:revolve_cost", claims=_PLANS,
             why="the reference searches the cost table; torch's planner takes the closed "
                 "form's split (revolve_split)"),
        _same("recompute_plans", "revolve_split", *_PLANS),
        _same("recompute_plans", "revolve_plan", *_PLANS),
        Twin("binomial_cost", reference="reference.recompute_plans:binomial_cost",
             claims=_PLANS, why="Griewank-Walther's closed form, the reference's check of "
                                "revolve_cost: a plan's cost is no torch quantity"),
        Twin("checkpoints_held", reference="reference.recompute_plans:checkpoints_held",
             why="the segment inputs a plan stores at once, for check_budget: torch_impl "
                 "takes the closed form's plan as it is"),
        Twin("check_budget", reference="reference.recompute_plans:check_budget",
             why="the reference checks its searched plan against the slots: the closed form "
                 "torch_impl plans with needs no check"),
        _same("recompute_gpt", "RecomputedCore", *_GPT),
        _same("recompute_gpt", "recompute_attention_cores", *_GPT),
        _same("recompute_gpt", "set_recompute", *_GPT),
    ),
    headline="parity/test_recompute.py::"
             "test_checkpointed_mlp_holds_and_recomputes_what_torch_checkpoint_does",
)
