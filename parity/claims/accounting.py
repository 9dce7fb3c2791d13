"""The accounting claims (the kinds and the registry: parity/tolerances.py). Every one compares
integers (bytes, FLOPs) exactly: a difference is a missing or extra term, never rounding."""

from __future__ import annotations

from parity.claims import Claim

CLAIMS: tuple[Claim, ...] = (
    Claim(
        id="accounting.state_bytes",
        statement=(
            "After one training step of the MLP, the bytes of the parameters, gradients and "
            "optimizer state, category by category, equal training_memory with the precision "
            "mapped (this project's fp32, bf16 and fp16 are autocast over float32 weights: "
            "precision 'fp32', no master) plus optimizer_step_bytes (Adam's step), for every "
            "optimizer, measured from torch's tensors and from the reference's arrays; a model "
            "held in bf16/fp16 with float32 master copies measures as 'bf16_mixed'/'fp16_mixed' "
            "with master_weights, and only the autocast runs measure as ('fp32', no master)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Byte counts are integers: numel times itemsize per tensor, summed. torch.optim "
            "allocates zeros_like(param) per state and a float32 0-dim step per tensor (NOTE [ "
            "Training state bytes ]); the reference's optimizers keep the same arrays. A "
            "difference is a term missing from the formula, not rounding."
        ),
    ),
    Claim(
        id="accounting.flops",
        statement=(
            "FlopCounterMode's count of one torch training step of the MLP, split into "
            "forward, backward, recompute and optimizer (StepMeter's phase hooks), equals "
            "mlp_flops for every precision, activation, dropout and checkpoint schedule (none, "
            "sqrt, uniform:K, optimal:S; early stop on and off), on the CPU and on the meta "
            "device (sizes too large to allocate)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "FlopCounterMode counts 2 m n k per mm/addmm from shapes alone (NOTE [ FLOP "
            "conventions ]), and which GEMMs run is decided by autograd's needs_input_grad "
            "(no dx for the data) and by the checkpoint's early stop (NOTE [ Early stop in the "
            "block recompute ]): integers on both sides."
        ),
    ),
    Claim(
        id="accounting.tape_flops",
        statement=(
            "The reference's own count of its GEMMs (the forward from the Linear tapes' saved "
            "input shapes; forward, backward and recompute from its recompute counters) equals "
            "mlp_flops plus two named terms: the first Linear's dx, which the reference always "
            "computes and torch skips for data that does not require grad, and the GEMM of "
            "each segment's last Linear, which torch's early stop cuts and the reference "
            "finishes."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Each reference op knows its m, n, k; the recompute counts are the reference's own "
            "(recompute.ScheduledRun). Integers; the two terms are the only places the trees "
            "run different GEMMs."
        ),
    ),
    Claim(
        id="accounting.activation_bytes",
        statement=(
            "The bytes held between forward and backward, measured with saved_tensors_hooks "
            "(distinct (data_ptr, nbytes), parameters excluded), equal mlp_activation_bytes "
            "for the model, loss_saved for the loss and 4 bytes for fp16's GradScaler "
            "multiply, for every precision, activation, dropout and schedule; the reference's "
            "tape holds the same bytes for the model (float32, float64, and under autocast "
            "plus the first Linear's lp weight cast when it runs outside every checkpoint) and "
            "for the loss minus nll_loss's 0-dim total_weight (and the scale in fp16)."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Saved tensors are whole arrays: their bytes are numel times itemsize, and sharing "
            "(ReLU's result is the next Linear's input) is decided by which tensor an op saves "
            "(NOTE [ What the MLP saves ]). Under autocast the reference's lp tensors are 2-byte "
            "arrays saved where torch saves lp tensors (amp.saved_bytes); it always computes "
            "the first Linear's dx, so it keeps that Linear's weight cast, which torch's addmm "
            "does not save when its input needs no grad; the fp16 scale is the GradScaler "
            "multiply torch saves and the reference does not."
        ),
    ),
)
