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
    Claim(
        id="accounting.gpt_flops",
        statement=(
            "FlopCounterMode's count of one torch training step of the compact transformer "
            "(explicit attention), split into forward, backward, recompute and optimizer, "
            "equals transformer_phase_flops for recompute 'none', 'full' (each block under "
            "torch.utils.checkpoint with set_checkpoint_early_stop(False)) and "
            "'full_early_stop' (torch's default: mlp.c_proj's GEMM is not re-run when dropout "
            "is 0), any dropout, precision, heads and sequence length up to block_size; on "
            "the CPU and on the meta device, where GPT-2 small's and medium's shapes are "
            "counted without allocating them."
        ),
        kind="bits",
        bound=0,
        reason=(
            "FlopCounterMode counts 2 m n k per mm, addmm and bmm from shapes alone; the "
            "explicit path is matmuls whose shapes NOTE [ The GPT-2 style decoder ] lists, "
            "every GEMM input requires grad (backward exactly 2x), and which GEMMs a block "
            "recompute re-runs is decided by the early stop (NOTE [ Early stop in the block "
            "recompute ]). Integers on both sides."
        ),
    ),
    Claim(
        id="accounting.gpt_sdpa_flops",
        statement=(
            "With attention='sdpa', FlopCounterMode on the CPU counts 0 FLOPs for "
            "scaled_dot_product_attention, forward and backward (torch 2.6, 2.11 and 2.13 "
            "alike: _scaled_dot_product_flash_attention_for_cpu is not in its registry): "
            "the count equals transformer_phase_flops minus the attention part (scores and "
            "att @ v) of every phase; on the meta device SDPA takes the math path and the "
            "count equals transformer_phase_flops. CUDA's fused kernels are registered and "
            "not covered here."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Integers: what is not registered counts exactly 0; the attention part is "
            "transformer_forward_flops' 'attention' (4 B s^2 h per layer), doubled for "
            "backward, once per re-run block in the recompute."
        ),
        library=("torch",),
    ),
    Claim(
        id="accounting.gpt_tape_flops",
        statement=(
            "The reference transformer's own count of its forward GEMMs, read off its tape "
            "(each Linear's saved input with its in and out features; the attention core's "
            "saved q, k^T, att and v shapes), equals transformer_forward_flops and torch's "
            "forward count, in float32 and float64 (the reference has no recompute and no "
            "autocast on the transformer yet)."
        ),
        kind="bits",
        bound=0,
        reason="Shapes times 2: integers; each op on the tape knows its m, n, k.",
    ),
    Claim(
        id="accounting.gpt_state_bytes",
        statement=(
            "After one training step of the compact transformer, its parameters, gradients "
            "and optimizer state, measured from torch's tensors and from the reference's "
            "arrays, equal training_memory('fp32', no master) over gpt_param_count's "
            "parameters (tied or untied head) plus optimizer_step_bytes over "
            "gpt_param_shapes' tensors, for every optimizer and autocast precision."
        ),
        kind="bits",
        bound=0,
        reason=(
            "numel times itemsize per tensor, summed; autocast keeps float32 parameters (NOTE "
            "[ Formula precisions vs this project's precisions ])."
        ),
    ),
    Claim(
        id="accounting.gpt_activation_bytes",
        statement=(
            "The bytes the compact transformer holds between forward and backward, measured "
            "with saved_tensors_hooks (distinct storages, parameters excluded) for the model, "
            "the loss and fp16's GradScaler multiply, equal gpt_activation_bytes (NOTE [ What "
            "the transformer saves ]) on the CPU for fp32, bf16 and fp16 autocast, any "
            "dropout, recompute none and whole blocks (full, full_early_stop); gpt_saved "
            "lists torch's saves one for one (module, node attribute, bytes); the "
            "reference's tape holds the same bytes in float32 and float64 without recompute."
        ),
        kind="bits",
        bound=0,
        reason=(
            "Saved tensors are whole storages: numel times itemsize; which saves share a "
            "storage (softmax's result is att @ v's operand without dropout) and which are "
            "fresh copies (matmul's reshaped heads, autocast's casts) is decided by the ops, "
            "not by rounding."
        ),
    ),
)
