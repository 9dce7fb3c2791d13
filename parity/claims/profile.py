"""The profile claims (the kinds and the registry: parity/tolerances.py). Bytes and the order
of clock readings are integers, compared exactly; timings are reported by `python -m parity
profile`, never claimed (a shared machine moves them by more than any bound worth stating)."""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="profile.boundary_bytes",
        statement=(
            "In torch, the bytes live at every phase boundary of a steady training step of the "
            "MLP (the step's start, then the end of data wait, host-to-device, forward, "
            "backward, optimizer), category by category (weights, grads, optimizer state with "
            "Adam's step, activations autograd still holds, the loop's batch), equal the "
            "accountant's formula timeline (NOTE [ Phase boundaries ]) for every precision, "
            "optimizer, activation, dropout and checkpoint schedule; on the CPU, and on CUDA "
            "where the run has a GPU (the allocator's own view is a separate table)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Each side is an integer: the formula from reference/accounting.py's sheet, the "
            "measurement from the tensors themselves (distinct (data_ptr, nbytes); saved "
            "tensors seen through saved_tensors_hooks and held by weak reference, so what "
            "backward frees drops out). A difference is a missing term, never rounding."
        ),
    ),
    Claim(
        id="profile.reference_boundary_bytes",
        statement=(
            "In the reference, the bytes of its own arrays at every phase boundary (parameters, "
            "grads, optimizer state, every tape, the batch) equal the same formula timeline "
            "plus two named terms of exact size at the forward's end: -4 (nll_loss's 0-dim "
            "total_weight exists in torch only) and +8 B (the reference's loss keeps its own "
            "int64 copy of the target). Under bf16/fp16 or a checkpoint schedule the forward's "
            "activations are not compared (low-precision values live in float32 arrays; the "
            "checkpoints' inputs are held inside train_step, out of the loop's reach)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Integers on both sides (numel x itemsize per distinct array); the two terms are "
            "the trees' documented differences, each sized from the batch alone."
        ),
    ),
    Claim(
        id="profile.gpt_boundary_bytes",
        statement=(
            "In both trees, the bytes live at every phase boundary of a steady training step of "
            "the compact transformer (train --model gpt's shape), category by category, equal "
            "the formula timeline built from the transformer's accountant (gpt_saved: every "
            "save, held under the block schedule; training_memory; Adam's step) for every "
            "precision, optimizer, dropout and block schedule (none, sqrt, uniform:K, "
            "optimal:S), with no named term: the reference's tape saves what autograd saves, "
            "its loss's total_weight and the token ids and targets included; on the CPU."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Integers on both sides: the formula from the accountant's list of saves, the "
            "measurement from the tensors and arrays themselves (distinct (data pointer, "
            "bytes); torch's saves through saved_tensors_hooks, the reference's through its "
            "modules', checkpoints' and loss node's tapes). A difference is a missing term."
        ),
    ),
    Claim(
        id="profile.gpt_reference_tape",
        statement=(
            "The reference transformer's own tape count (GPT.held_bytes, distinct base "
            "buffers) at every phase boundary of a steady step equals the formula's "
            "activations (the token ids and targets the tape saved included): an independent "
            "second reading of the held bytes."
        ),
        kind="bits",
        bound=0,
        reason="Integers on both sides; GPT.held_bytes walks array bases, the meter pointers.",
    ),
    Claim(
        id="profile.gpt_flops",
        statement=(
            "The sheet's GEMM FLOPs of a transformer step per phase (forward, backward, "
            "recompute under any block schedule, nested optimal:S included, with torch's "
            "early stop; dropout on or off) equal what torch's FlopCounterMode counts by "
            "phase over the torch tree's step; the forward's equal the reference tape's own "
            "GEMM count (gpt_tape_flops) after a forward without recomputation."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Integers: the sheet's from transformer_forward_flops and recompute_runs over the "
            "blocks (parity/drivers/profile_gpt.py), torch's from the aten GEMMs it "
            "dispatched, the reference's from the shapes its tape holds."
        ),
    ),
    Claim(
        id="profile.phase_intervals",
        statement=(
            "Every timed step, in both trees and for both models, holds each phase once "
            "(data wait, host-to-device in torch, forward, backward, optimizer), in that "
            "order, as disjoint intervals of "
            "one integer clock (perf_counter_ns) inside the step's own interval: so the phase "
            "times and 'outside the phases' (>= 0) sum to the step time exactly."
        ),
        kind="bits",
        bound=0,
        reason=(
            "The clock is read once per boundary, in integer nanoseconds, and a phase's end "
            "is read before the next phase's start; a count of order violations is exact."
        ),
    ),
    Claim(
        id="profile.saved_tensors",
        statement=(
            "The saved tensors of the profile's listed layer (the MLP's second Linear; the "
            "transformer's first block), measured in torch (saved_tensors_hooks, parameter "
            "views left out) and in the reference (its tape), have the shapes and bytes the "
            "accountant predicts (mlp_saved, gpt_saved): the MLP for fp32 and, in torch, bf16 "
            "and fp16 autocast (the weight's cast copy included); the transformer for every "
            "precision in both trees."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Shapes and byte counts are integers; which tensors a layer saves is autograd's "
            "(torch) and the tape's (reference) decision, listed in NOTE [ What the MLP saves ] "
            "and NOTE [ What the transformer saves ]."
        ),
    ),
)

_PHASES = ("profile.phase_intervals",)
_BYTES = ("profile.boundary_bytes", "profile.reference_boundary_bytes",
          "profile.gpt_boundary_bytes")
_SHEET = ("the prediction sheet (NOTE [ Predicting a phase ]), written once: the lab sets it "
          "beside either tree's times")
_DEVICE = "a device's own cost (queue, copy, workspace, sync): the reference has no device"
_WORKER = "a loader worker's latency (NOTE [ A sync on the CPU ]): the reference is one process"
_same = Twin.same

MANIFEST = Manifest(
    topic="profile",
    modules=("reference.profile", "torch_impl.profile", "reference.profile_meters",
             "torch_impl.profile_meters"),
    rows=(
        Twin("PHASES", reference="reference.profile:PHASES", claims=_PHASES, why=_SHEET),
        Twin("CATEGORIES", reference="reference.profile:CATEGORIES", claims=_BYTES, why=_SHEET),
        Twin("TRAFFIC_WORDS", reference="reference.profile:TRAFFIC_WORDS", why=_SHEET),
        Twin("roofline_seconds", reference="reference.profile:roofline_seconds", why=_SHEET),
        Twin("optimizer_moved_bytes", reference="reference.profile:optimizer_moved_bytes",
             why=_SHEET),
        Twin("slowest", reference="reference.profile:slowest", why=_SHEET),
        Twin("device_sync", torch="torch_impl.profile:device_sync", why=_DEVICE),
        _same("profile", "matmul_rate"),
        _same("profile", "copy_bandwidth"),
        Twin("h2d_bandwidth", torch="torch_impl.profile:h2d_bandwidth", why=_DEVICE),
        _same("profile", "op_overhead"),
        Twin("Step", reference="reference.profile:Step", torch="torch_impl.profile:Step",
             claims=_PHASES, disorder="torch_impl/profile.py defines it first, "
                                      "reference/profile.py after the probes"),
        Twin("cublas_workspace_bytes", torch="torch_impl.profile:cublas_workspace_bytes",
             why=_DEVICE),
        Twin("sync_latency", torch="torch_impl.profile:sync_latency", why=_DEVICE),
        _same("profile", "PhaseTimer", *_PHASES),
        _same("profile", "drive_step", *_PHASES),
        Twin("HostBatches", torch="torch_impl.profile:HostBatches", claims=_BYTES,
             why="the batch on the host, for the host-to-device phase: the reference has no "
                 "device"),
        Twin("SlowStorage", torch="torch_impl.profile:SlowStorage", why=_WORKER),
        Twin("WorkerBatches", torch="torch_impl.profile:WorkerBatches", why=_WORKER),
        Twin("profiled_steps", torch="torch_impl.profile:profiled_steps",
             why="a torch.profiler trace of the phases beside every aten op: no profiler "
                 "in NumPy"),
        _same("profile_meters", "BoundaryMemory", *_BYTES),
        Twin("OpCensus", torch="torch_impl.profile_meters:OpCensus",
             why="the aten ops each phase dispatches: the reference's ops are Python calls"),
        Twin("item_in_forward", torch="torch_impl.profile_meters:item_in_forward",
             why="the seeded .item() sync (NOTE [ Honest timing ]): nothing to sync in NumPy"),
        Twin("tape_nodes", reference="reference.profile_meters:tape_nodes",
             claims=("profile.gpt_reference_tape",),
             why="the nodes whose tapes the reference reads: torch's hooks see every save"),
        Twin("saved_by_module", reference="reference.module:Module.tape",
             torch="torch_impl.profile_meters:saved_by_module", claims=("profile.saved_tensors",)),
        Twin("transformer_phase_flops", reference="reference.flops:transformer_phase_flops",
             torch="torch_impl.accounting:StepMeter", claims=("profile.gpt_flops",)),
    ),
    headline="parity/test_profile.py::test_phases_are_disjoint_ordered_intervals_inside_each_step",
)
