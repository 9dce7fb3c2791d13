"""The ddp claims on loss scaling across ranks (imported by parity/claims/ddp.py): the
divergence a per-rank found_inf causes, and its repair. NOTE [ found_inf is per rank ] in
reference/ddp_scaler.py."""

from __future__ import annotations

from parity.claims import Claim, Twin

SCALER_CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="ddp.scaler_divergence",
        statement=(
            "With DDP, fp16 autocast and a plain GradScaler per rank, and rank ws - 1's "
            "reduced gradient made +inf at step 2 (after the reduction: that rank alone sees "
            "it), the ranks part at exactly step 2, identically in both trees, world sizes 2 "
            "and 3: every rank's found_inf, scale, skipped flag and digest of scale and "
            "parameters at every step, and its final parameters, are the bits of the "
            "reference's simulated ranks replaying the torch ranks' local gradients; the "
            "digests agree across ranks at step 1 and differ from step 2 on; the cross-rank "
            "check names step 2 and rank ws - 1 in both trees (and, set to raise, ends the "
            "launch with that message); the reference on its own local gradients skips, "
            "scales and parts the same. The slow matrix adds world size 4, the fault on rank 0 "
            "at step 1 and on the last rank at step 4, 6 steps."
        ),
        kind="bits",
        bound=0,
        reason=(
            "NOTE [ found_inf is per rank ]: each scaler's unscale_ sees only its own rank's "
            "gradient, so the tampered rank alone sets found_inf, skips its step and backs "
            "off (S / 2, tracker 0) while the others step (and here grow, growth_interval 2). "
            "Both trees apply the same reducer (ddp.reduced_grads), the same kernels "
            "(loss_scaling.unscale, the update rule) and SGD (ddp.params) to the same local "
            "gradients, so each rank's state is the same bits in both; the skip, the scales "
            "and the verdict are discrete consequences of an inf the fault puts there, which "
            "no last-bit difference of the local gradients can move."
        ),
    ),
    Claim(
        id="ddp.scaler_repair",
        statement=(
            "The same fault with found_inf all-reduced between unscale_ and step (ReduceOp.MAX "
            "by hand, or torch's ShardedGradScaler, whose unscale_ all-reduces it with SUM, "
            "under DDP on gloo; the slow matrix adds SUM by hand, world size 4, other faults "
            "and none): every rank skips step 2 and halves its scale together; every "
            "rank's digest of scale and parameters is the same at every step across ranks and "
            "equal to the reference's (found_inf all-reduced by MAX, or by the ring mirror's "
            "SUM), and the final parameters are bit-identical across ranks and trees, world "
            "sizes 2 and 3; the cross-rank check finds nothing."
        ),
        kind="bits",
        bound=0,
        reason=(
            "After the all-reduce every rank's flag is the same value (MAX: 1; SUM: the count "
            "of ranks that found one, 1 here, exact in float32 in any order), and step and "
            "update ask only whether it is nonzero; the ranks then apply the same reduced "
            "gradient with the same scale and the same skip, so they stay equal, and each "
            "equals the reference's by the argument of ddp.scaler_divergence."
        ),
    ),
)

# The loss-scaling rows of the ddp manifest (parity/claims/ddp.py).
_SCALER = ("ddp.scaler_divergence", "ddp.scaler_repair")
SCALER_ROWS: tuple[Twin, ...] = (
    Twin.same("ddp_scaler", "REPAIRS", *_SCALER),
    Twin("CHECKS", torch="torch_impl.ddp_scaler:CHECKS", claims=("ddp.scaler_divergence",),
         why="how a torch rank reports a parted step, record or raise: the job's option"),
    Twin("check_repair", reference="reference.ddp_scaler:check_repair",
         why="the reference's check of its argument: torch's job checks its own before launch"),
    Twin.same("ddp_scaler", "tamper_", *_SCALER),
    Twin.same("ddp_scaler", "sync_found_inf", "ddp.scaler_repair"),
    Twin.same("ddp_scaler", "ScalerRecord", *_SCALER),
    Twin.same("ddp_scaler", "scaler_step", *_SCALER),
    Twin("scaler_job", torch="torch_impl.ddp_scaler:scaler_job",
         why="how a torch rank runs this (the drivers' job description): harness"),
    Twin("run", torch="torch_impl.ddp_scaler:run", claims=_SCALER,
         why="how a torch rank runs this (the launcher's entry): harness"),
)
