"""The catalogue of seeded faults, plain data that both trees read: which model each applies
to, what it writes where, where it first shows and what repairs it. Writing a fault into a
model is each tree's own code (reference/faults.py, torch_impl/faults.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Write:
    """One write of a fault. `target` is a parameter's path ("2.weight"), a module attribute's
    ("transformer.h.0.ln_1.eps", how "attribute"), or "batch.x" (the step's float inputs).
    `index` picks the elements (None: the whole axis; () with how "attribute"); how "set"
    writes `value` there, "multiply" multiplies them by it, "attribute" sets the attribute."""

    target: str
    index: tuple[int | None, ...]
    value: float
    how: str = "set"


@dataclass(frozen=True)
class Fault:
    """A deterministic fault seeded before a chosen step into a run of `model` (mlp or gpt):
    its writes, in order, and what else of the run it changes (plain data: the torch tree
    seeds the same faults). A fault that is code rather than a value is a field:

        loss    the run's loss function is replaced for the whole run (a name in each
                tree's faults.LOSSES: "hand_written_cross_entropy")
        lr      every parameter group's learning rate is set to it before the fault's step
                (the scheduler continues from there)
        scaler  False: the run drops its GradScaler before the fault's step and trains on
                unscaled (train_step's fault "fp16_without_scaler", the loss-scaling topic's)
    """

    name: str
    model: str
    writes: tuple[Write, ...]
    what: str  # where it first shows, and why
    fix: str
    # (precision, phase, module, op) where it first shows: the regression guard's claim
    shows: tuple[tuple[str, str, str, str], ...] = ()
    loss: str | None = None
    lr: float | None = None
    scaler: bool = True
    delay: int = 0  # the steps from the fault's step to the one where it first shows

    @property
    def module(self) -> str:
        """The module the first write strikes ("batch" for the step's inputs; "loss" for a
        replaced loss, "" for a fault without writes)."""
        if self.loss is not None:
            return "loss"
        return self.writes[0].target.rpartition(".")[0] if self.writes else ""


MLP_FAULTS = (
    Fault("weight_overflow", "mlp", (Write("2.weight", (0, 0), 2.0**17),),
          "one weight of the second Linear set to 2^17 = 131072: beyond float16's max 65504 "
          "(finite in float32 and bfloat16). Under fp16 autocast its cast is inf, so that "
          "Linear's output column 0 is inf (forward, AddmmBackward0); the backward then "
          "multiplies a zero gradient by it (AddmmBackward0 returns NaN). fp32 and bf16 runs "
          "stay finite.",
          "keep weights inside the format (weight decay, clipping the update), or train in "
          "bf16, whose range is float32's"),
    Fault("inf_weight", "mlp", (Write("2.weight", (0, 0), float("inf")),),
          "one weight of the second Linear set to +inf, in any precision: that Linear's "
          "output column 0 is +-inf (forward, AddmmBackward0).",
          "find what wrote the inf (a diverging update, a bad checkpoint) and restore from "
          "the last finite checkpoint"),
    Fault("poisoned_batch", "mlp", (Write("batch.x", (0, 0), float("nan")),),
          "one input value of the step's batch set to NaN (a corrupt sample), in any "
          "precision: the first Linear's output row 0 is NaN (forward, AddmmBackward0, its "
          "input already non-finite); in the backward the loss's log_softmax returns NaN "
          "first (LogSoftmaxBackward0).",
          "validate the data (torch.isfinite on each batch at load), drop or repair the sample"),
    Fault("log_of_zero", "mlp", (Write("4.weight", (), 2.0**10, "multiply"),),
          "the run's loss written by hand as -mean(log(softmax(z)[y])), and the last Linear's "
          "weights multiplied by 2^10 (an over-confident model): where the target's logit "
          "trails the largest by more than ln(1 / smallest subnormal) (float32 103.3, a "
          "float16 softmax 16.6), softmax underflows to exactly 0 at the target and "
          "log(0) = -inf (forward, module loss, op LogBackward0, its input finite: 0); the "
          "backward's 1/p is -inf there and softmax's backward makes 0 * inf = NaN "
          "(SoftmaxBackward0). torch's cross_entropy on the same logits is finite.",
          "use log_softmax / cross_entropy (the log-sum-exp form: (z - m) - log sum exp(z - m) "
          "never takes the exp of the target's own gap)",
          tuple((p, "forward", "loss", "LogBackward0") for p in ("fp32", "bf16", "fp16")),
          loss="hand_written_cross_entropy"),
    Fault("lr_divergence", "mlp", (),
          "every parameter group's learning rate set to 1e10 (AdamW, weight decay 0.01). "
          "Decoupled weight decay multiplies each weight by 1 - lr wd = 1 - 1e8 per update "
          "(|1 - lr wd| > 1 once lr wd > 2: a geometric growth, whatever the gradients), and "
          "Adam's step adds about lr: after 5 updates every weight of the first Linear is "
          "+-inf, and its matmul sums +inf and -inf products: NaN (forward, 5 steps after the "
          "fault, module 0, op AddmmBackward0, its weight and bias already non-finite). The "
          "step is derived by running both trees (bit-identical in float32 training).",
          "a learning rate with lr * weight_decay well below 2 (the configured 1e-2 keeps "
          "every value finite over the same steps); a warmup, and a detector watching the "
          "loss and the update norm, catch a divergence before it overflows",
          (("fp32", "forward", "0", "AddmmBackward0"),), lr=1e10, delay=5),
    Fault("fp16_without_scaler", "mlp", (Write("4.weight", (), 2.0**-16, "multiply"),),
          "the run drops its GradScaler (train_step's fault fp16_without_scaler, as in the "
          "loss-scaling topic) and the last Linear's weights are multiplied by 2^-16 (a "
          "small-init output layer): the gradients reaching the earlier layers are 2^-16 "
          "smaller, and under fp16 autocast many fall below float16's smallest subnormal "
          "2^-24 (below the tie 2^-25 the cast rounds to 0) in the float16 backward. Nothing "
          "is non-finite: the detector never stops, and only the per-parameter zero counts "
          "show the gradients lost (0.weight, 0.bias, 2.weight, 2.bias).",
          "keep the GradScaler (dynamic loss scaling: S = 2^16 lifts the same gradients "
          "into float16's normal range, and the zero counts drop to 0), or train in bf16",
          scaler=False),
)

GPT_FAULTS = (
    Fault("attention_overflow", "gpt",
          (Write("transformer.h.0.attn.c_attn.weight", (), 2.0**12, "multiply"),),
          "the first block's qkv weights multiplied by 2^12 (a temperature of 2^-24 on the "
          "scores: q and k grow 4096-fold, q k^T 2^24-fold). Under fp16 autocast the scores "
          "matmul q k^T exceeds 65504 and rounds to inf (forward, module "
          "transformer.h.0.attn.core, op BmmBackward0, its inputs finite and in range); "
          "softmax turns the row into NaN. fp32 and bf16 hold the scores: no fault, only "
          "saturated attention.",
          "keep the scores in range: scale q before the product (q / sqrt(d) first), compute "
          "the scores and softmax in float32 (CUDA autocast runs softmax in float32 but not "
          "the matmul), use bf16, or a fused attention kernel (SDPA)",
          (("fp16", "forward", "transformer.h.0.attn.core", "BmmBackward0"),)),
    Fault("layernorm_eps0", "gpt",
          (Write("transformer.h.0.ln_1.eps", (), 0.0, "attribute"),
           Write("transformer.wte.weight", (0, None), 0.0),
           Write("transformer.wpe.weight", (None, None), 0.0)),
          "the first LayerNorm's eps set to 0, and a constant row to normalize: token 0's "
          "embedding zeroed (a padding row) and the position embedding zeroed. Every position "
          "holding token 0 is a row of zeros: variance 0, rstd = 1/sqrt(0) = inf, "
          "(x - mean) * rstd = 0 * inf = NaN, in any precision (forward, module "
          "transformer.h.0.ln_1, op NativeLayerNormBackward0).",
          "keep eps > 0 (torch's default is 1e-5): it bounds rstd by 1/sqrt(eps) for any "
          "row, constant ones included",
          tuple((p, "forward", "transformer.h.0.ln_1", "NativeLayerNormBackward0")
                for p in ("fp32", "bf16", "fp16"))),
    Fault("poisoned_embedding", "gpt", (Write("transformer.wte.weight", (None, 0),
                                              float("nan")),),
          "channel 0 of every token embedding set to NaN (a corrupt checkpoint or a bad "
          "update of the table), in any precision: the token embedding's output is NaN at "
          "index (0, 0, 0) (forward, module transformer.wte, op EmbeddingBackward0, its "
          "weight already non-finite).",
          "restore the table from the last finite checkpoint; check checkpoints with "
          "torch.isfinite before saving them",
          tuple((p, "forward", "transformer.wte", "EmbeddingBackward0")
                for p in ("fp32", "bf16", "fp16"))),
    Fault("gelu_backward", "gpt",
          (Write("transformer.h.0.mlp.c_fc.bias", (0,), -1e30),),
          "one bias of the first block's c_fc set to -1e30: in float32 and bfloat16 the "
          "tanh-GELU of -1e30 is -0 (x^3 overflows, tanh(-inf) = -1, 0.5 x (1 + -1) = -0), so "
          "the forward is finite; its derivative is 0.5 x (1 - tanh^2) (1 + 3 k x^2) = "
          "-5e29 * 0 * inf = NaN: the first invalid value is in the backward (first "
          "parameter transformer.h.0.mlp.c_fc.bias, replay GeluBackward0 in "
          "transformer.h.0.mlp.gelu). Under fp16 autocast the bias casts to -inf and the "
          "GELU's output is already NaN in the forward.",
          "bound the pre-activations (weight decay, clipping the update); a gradient "
          "check (this detector) at the first NaN, because the loss stays finite",
          (("fp32", "backward", "transformer.h.0.mlp.c_fc.bias", ""),
           ("bf16", "backward", "transformer.h.0.mlp.c_fc.bias", ""),
           ("fp16", "forward", "transformer.h.0.mlp.c_fc", "AddmmBackward0"))),
    Fault("residual_overflow", "gpt",
          (Write("transformer.wte.weight", (None, 0), 2e38),
           Write("transformer.wpe.weight", (None, 0), 2e38)),
          "channel 0 of every token and every position embedding set to 2e38, each finite in "
          "float32: their sum, the start of the residual stream (tok + pos, written inline "
          "in GPT.forward, no module of its own), is 4e38, beyond float32's max (forward, "
          "module GPT: the model itself, named by its class, as its path is empty; op "
          "AddBackward0, both inputs finite and in range of float32), in any precision "
          "(autocast leaves the embeddings and the add in float32). The first module to show "
          "it is the embedding dropout; the report names the inline op that made it.",
          "bound the embeddings (weight decay, clipping the update); the residual stream is "
          "float32 under autocast, so the bound is float32's max, not float16's",
          (("fp32", "forward", "GPT", "AddBackward0"),)),
)

FAULTS: dict[str, Fault] = {f.name: f for f in (*MLP_FAULTS, *GPT_FAULTS)}


def fault_named(name: str) -> Fault:
    """FAULTS[name], or a ValueError listing the catalogue."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; the catalogue: {', '.join(FAULTS)}")
    return FAULTS[name]


def check_model(fault: Fault, model: str) -> None:
    """A ValueError when `fault` is written for another model than `model`."""
    if fault.model != model:
        others = ", ".join(n for n, f in FAULTS.items() if f.model == model)
        raise ValueError(f"fault {fault.name} is written for --model {fault.model}, this run "
                         f"trains {model}; its faults: {others}")
