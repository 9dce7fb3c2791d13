"""The accounting claims (the kinds and the registry: parity/tolerances.py). Every one compares
integers (bytes, FLOPs) exactly: a difference is a missing or extra term, never rounding."""

from __future__ import annotations

from parity.claims import Claim, Manifest, Twin

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

_STATE = ("accounting.state_bytes", "accounting.gpt_state_bytes")
_HELD = ("accounting.activation_bytes",)
_GPT_HELD = ("accounting.gpt_activation_bytes",)
_FLOPS = ("accounting.flops",)
_GPT_FLOPS = ("accounting.gpt_flops", "accounting.gpt_sdpa_flops")
_COUNTER = "torch.utils.flop_counter.FlopCounterMode"
_HOOKS = "torch_impl.accounting:StepMeter.held"
_FORMULA = "a formula's argument: torch's side measures the tensors as they are"
_PUBLISHED = "a published approximation set beside the exact count: nothing in torch to hold"


def _formula(module: str, name: str, *claims: str, why: str = _FORMULA) -> Twin:
    return Twin(name, reference=f"reference.{module}:{name}", claims=claims, why=why)


def _measured(module: str, name: str, *claims: str, alias: str = _COUNTER,
              torch: str | None = None) -> Twin:
    return Twin(name, reference=f"reference.{module}:{name}", torch=torch,
                alias=None if torch else alias, claims=claims)


MANIFEST = Manifest(
    topic="accounting",
    modules=("reference.accounting", "torch_impl.accounting", "reference.accounting_gpt",
             "reference.flops", "reference.flops_published"),
    rows=(
        _formula("accounting", "OPTIMIZERS", *_STATE),
        _formula("accounting", "PRECISIONS", *_STATE),
        _formula("accounting", "STATE_DTYPES", *_STATE),
        _formula("accounting", "PROJECT_PRECISIONS", *_STATE),
        Twin.same("accounting", "PER_TENSOR_STATE", *_STATE),
        Twin("CUDA_BLOCK", torch="torch_impl.accounting:CUDA_BLOCK",
             why="the CUDA caching allocator's rounding: the reference has no allocator"),
        _formula("accounting", "training_memory", *_STATE,
                 why="the formula (NOTE [ Training state bytes ]): torch's side measures it, "
                     "state_bytes below"),
        _formula("accounting", "optimizer_step_bytes", *_STATE),
        _formula("accounting", "memory_arguments", *_STATE),
        _formula("accounting", "project_precisions", *_STATE),
        _formula("accounting", "KORTHIKANTI_RECOMPUTE", why=_PUBLISHED),
        _formula("accounting", "KORTHIKANTI_TERMS", why=_PUBLISHED),
        _formula("accounting", "korthikanti_terms", why=_PUBLISHED),
        _formula("accounting", "activation_bytes", why=_PUBLISHED),
        _formula("accounting", "mlp_param_count", *_STATE),
        _formula("accounting", "mlp_param_tensors", *_STATE),
        _formula("accounting", "Saved", *_HELD,
                 why="a save the formula predicts; torch's Packed (below) is one it measured"),
        _measured("accounting", "mlp_saved", *_HELD, torch=_HOOKS),
        _measured("accounting", "held_bytes", *_HELD, torch=_HOOKS),
        _measured("accounting", "mlp_activation_bytes", *_HELD, torch=_HOOKS),
        _measured("accounting", "loss_saved", *_HELD, torch=_HOOKS),
        Twin.same("accounting", "parameter_bytes", *_STATE),
        Twin.same("accounting", "gradient_bytes", *_STATE),
        Twin.same("accounting", "optimizer_state_bytes", *_STATE),
        Twin.same("accounting", "state_bytes", *_STATE),
        Twin.same("accounting", "distinct_bytes", *_HELD),
        Twin("cuda_allocated", torch="torch_impl.accounting:cuda_allocated",
             why="what the CUDA allocator hands out for one request: no allocator in NumPy"),
        Twin("FlopCount", torch="torch_impl.accounting:FlopCount", claims=_FLOPS,
             why="FlopCounterMode's total by phase: the reference counts by formula "
                 "(reference/flops.py) and off its tape"),
        Twin("Packed", reference="reference.accounting:Saved",
             torch="torch_impl.accounting:Packed", claims=_HELD),
        Twin("StepMeter", reference="reference.accounting:tape_bytes",
             torch="torch_impl.accounting:StepMeter",
             claims=(*_HELD, *_FLOPS, *_GPT_FLOPS, *_GPT_HELD)),
        Twin("checkpointed", reference="reference.recompute_gpt:set_recompute",
             torch="torch_impl.accounting:checkpointed", claims=("accounting.gpt_flops",)),
        _measured("accounting", "tape_flops", "accounting.tape_flops"),
        _measured("accounting", "run_flops", "accounting.tape_flops"),
        _formula("accounting_gpt", "GPT_RECOMPUTE", *_GPT_HELD),
        _measured("accounting_gpt", "gpt_saved", *_GPT_HELD, torch=_HOOKS),
        _formula("accounting_gpt", "AFFINE_FROM", *_GPT_HELD),
        _measured("accounting_gpt", "gpt_activation_bytes", *_GPT_HELD, torch=_HOOKS),
        _measured("accounting_gpt", "gpt_tape_gemms", "accounting.gpt_tape_flops"),
        _measured("accounting_gpt", "gpt_tape_flops", "accounting.gpt_tape_flops"),
        _formula("flops", "RECOMPUTE", *_GPT_FLOPS),
        _formula("flops", "BLOCK_GEMMS", *_GPT_FLOPS),
        _formula("flops", "check_gpt", *_GPT_FLOPS),
        _measured("flops", "gpt_param_shapes", "accounting.gpt_state_bytes",
                  alias="torch.nn.Module.named_parameters"),
        _formula("flops", "gpt_param_tensors", "accounting.gpt_state_bytes"),
        _formula("flops", "gpt_param_count", "accounting.gpt_state_bytes"),
        _formula("flops", "Gemm", *_GPT_FLOPS),
        _measured("flops", "transformer_gemms", *_GPT_FLOPS),
        _measured("flops", "transformer_forward_flops", "accounting.gpt_tape_flops"),
        _measured("flops", "transformer_phase_flops", *_GPT_FLOPS),
        _measured("flops", "transformer_flops", *_GPT_FLOPS),
        _formula("flops", "MLP_ACTIVATIONS", *_FLOPS),
        _formula("flops", "mlp_layers", *_FLOPS),
        _formula("flops", "recompute_runs", *_FLOPS),
        _measured("flops", "mlp_flops", *_FLOPS),
        _formula("flops_published", "kaplan_flops", why=_PUBLISHED),
        _formula("flops_published", "palm_flops", why=_PUBLISHED),
        _formula("flops_published", "chinchilla_flops", why=_PUBLISHED),
        _formula("flops_published", "Approximation", why=_PUBLISHED),
        _formula("flops_published", "flop_approximations", why=_PUBLISHED),
    ),
    headline="parity/test_accounting.py::"
             "test_a_tanh_mlp_holds_the_formulas_bytes_in_torchs_hooks_and_the_reference_tape",
)
