"""FLOPs of one training step, counted exactly in Python integers: the GPT-2 style decoder and
the compact MLP. The published approximations beside the exact count (Kaplan, PaLM,
Chinchilla) are reference/flops_published.py's, which imports this module.

# NOTE [ FLOP conventions ]
    matmul FLOPs only      a GEMM (m x k) @ (k x n) costs 2 m n k (a multiply and an add per
                           term); a batched GEMM costs that times its batch count
    backward = 2x forward  per GEMM Y = X W:  dX = dY W^T and dW = X^T dY cost 2 m n k each;
                           a GEMM whose input X does not require grad (the MLP's first Linear,
                           fed data) skips dX: its backward is 1x
    counted as 0           biases, LayerNorm, GELU, softmax, dropout, the causal mask, the
                           embedding gather, the loss, the optimizer (elementwise work:
                           memory-bound, and torch's FlopCounterMode does not count it either)
    attention is dense     q k^T and att @ v cost s x s per head, not halved for causality
                           (the masked half is computed, then overwritten with -inf)
    the head is counted    Linear(h, V) whether or not its weight is tied to the embedding
    recompute              what torch.utils.checkpoint(use_reentrant=False) re-runs in backward

# NOTE [ The GPT-2 style decoder ]
The model these formulas describe (both trees build it with exactly these shapes; torch's
parameter names are nanoGPT's):

    transformer.wte   Embedding(V, h)            token embedding (a gather: 0 FLOPs)
    transformer.wpe   Embedding(block_size, h)   learned positions; then dropout
    transformer.h.i   for i < L, pre-LN:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
        ln_1, ln_2    LayerNorm(h)               weight, bias (bias only if `bias`)
        attn.c_attn   Linear(h, 3h)              q, k, v; heads split: a heads of d = h / a
                      scores = q k^T / sqrt(d), causal mask (masked_fill -inf), softmax,
                      attention dropout, y = att @ v, heads merged
        attn.c_proj   Linear(h, h)               then residual dropout
        mlp.c_fc      Linear(h, f)               f = d_ff = 4h by default; GELU
        mlp.c_proj    Linear(f, h)               then dropout
    transformer.ln_f  LayerNorm(h)
    lm_head           Linear(h, V), no bias      untied unless tie_weights (then lm_head.weight
                                                 IS wte.weight: one parameter)
    loss              cross-entropy over the next tokens

Forward GEMMs of one layer (B sequences of s tokens):

    c_attn        (B s x h) @ (h x 3h)                     2 B s h 3h
    scores        B a times (s x d) @ (d x s)              2 B s^2 h
    att @ v       B a times (s x s) @ (s x d)              2 B s^2 h
    attn.c_proj   (B s x h) @ (h x h)                      2 B s h^2
    mlp.c_fc      (B s x h) @ (h x f)                      2 B s h f
    mlp.c_proj    (B s x f) @ (f x h)                      2 B s f h
and once, the head (B s x h) @ (h x V): 2 B s h V. With f = 4h, one step without recompute is

    3 [L (24 B s h^2 + 4 B s^2 h) + 2 B s h V] = 72 B s L h^2 (1 + s/(6h) + V/(12 L h)).

# NOTE [ Early stop in the block recompute ]
torch.utils.checkpoint (non-reentrant) counts the tensors the block saved in forward; in the
recompute its pack hook raises _StopRecomputationError as soon as that many are saved again
(torch/utils/checkpoint.py, _recomputation_hook). An autograd op saves its INPUTS before its
kernel runs (addmm: mat1 and mat2) and its outputs after. The block's last saves are therefore:
    dropout p == 0   (nn.Dropout returns its input and saves nothing): mlp.c_proj's addmm
                     saves (mat1, mat2) -> the recompute stops BEFORE that GEMM: every forward
                     GEMM of the block is re-run except mlp.c_proj;
    dropout p > 0    the residual dropout's mask, saved after mlp.c_proj ran: all re-run.
So per layer, "full" re-runs c_attn, scores, att @ v, attn.c_proj, mlp.c_fc, mlp.c_proj and
"full_early_stop" the same without mlp.c_proj when dropout == 0 (closed forms: transformer_flops).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RECOMPUTE = ("none", "full", "full_early_stop")
BLOCK_GEMMS = ("attn.c_attn", "attn.scores", "attn.values", "attn.c_proj", "mlp.c_fc",
               "mlp.c_proj")


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_gpt(*, n_layer: int, d_model: int, n_head: int, seq_len: int, vocab: int,
              batch: int, d_ff: int | None = None, recompute: str = "none",
              dropout: float = 0.0) -> int:
    """Validate a decoder configuration; return d_ff (4 d_model when None)."""
    for name, value in (("n_layer", n_layer), ("d_model", d_model), ("n_head", n_head),
                        ("seq_len", seq_len), ("vocab", vocab), ("batch", batch)):
        _positive(name, value)
    if d_model % n_head:
        raise ValueError(f"n_head must divide d_model: {d_model} is not a multiple of "
                         f"{n_head}; accepted: n_head in the divisors of d_model")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if not isinstance(dropout, int | float) or not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1], got {dropout!r}")
    return 4 * d_model if d_ff is None else _positive("d_ff", d_ff)


# ---------------------------------------------------------------- parameters
def gpt_param_shapes(n_layer: int, d_model: int, vocab: int, block_size: int,
                     d_ff: int | None = None, bias: bool = True, tie_weights: bool = False
                     ) -> dict[str, tuple[int, ...]]:
    """Every parameter of the decoder by torch's name, as nn.Module.named_parameters() lists
    them (a tied lm_head.weight is wte.weight and is not listed again)."""
    f = check_gpt(n_layer=n_layer, d_model=d_model, n_head=1, seq_len=1, vocab=vocab,
                  batch=1, d_ff=d_ff)
    h = d_model
    _positive("block_size", block_size)
    shapes: dict[str, tuple[int, ...]] = {"transformer.wte.weight": (vocab, h),
                                          "transformer.wpe.weight": (block_size, h)}

    def linear(name: str, n_in: int, n_out: int) -> None:
        shapes[f"{name}.weight"] = (n_out, n_in)
        if bias:
            shapes[f"{name}.bias"] = (n_out,)

    def norm(name: str) -> None:
        shapes[f"{name}.weight"] = (h,)
        if bias:
            shapes[f"{name}.bias"] = (h,)

    for i in range(n_layer):
        p = f"transformer.h.{i}"
        norm(f"{p}.ln_1")
        linear(f"{p}.attn.c_attn", h, 3 * h)
        linear(f"{p}.attn.c_proj", h, h)
        norm(f"{p}.ln_2")
        linear(f"{p}.mlp.c_fc", h, f)
        linear(f"{p}.mlp.c_proj", f, h)
    norm("transformer.ln_f")
    if not tie_weights:
        shapes["lm_head.weight"] = (vocab, h)
    return shapes


def gpt_param_tensors(n_layer: int, bias: bool = True, tie_weights: bool = False) -> int:
    """len(gpt_param_shapes(...)) without listing them (its cost grows with depth): the two
    embeddings, per layer two LayerNorms and four Linears of one or two tensors each, ln_f,
    and lm_head.weight unless it is tied."""
    _positive("n_layer", n_layer)
    per = 2 if bias else 1
    return 2 + n_layer * 6 * per + per + (0 if tie_weights else 1)


def gpt_param_count(n_layer: int, d_model: int, vocab: int, block_size: int,
                    d_ff: int | None = None, bias: bool = True, tie_weights: bool = False) -> int:
    """(V + block_size) h + L (4h^2 + 2hf + 2h + [7h + f]) + (h + [h]) + (V h unless tied).

    Per layer: c_attn 3h^2 (+3h), c_proj h^2 (+h), c_fc h f (+f), mlp.c_proj f h (+h), two
    LayerNorms 2h (+2h); the brackets are the biases. GPT-2 small (L 12, h 768, V 50257,
    block 1024, tied) has 124,439,808.
    """
    f = check_gpt(n_layer=n_layer, d_model=d_model, n_head=1, seq_len=1, vocab=vocab,
                  batch=1, d_ff=d_ff)
    _positive("block_size", block_size)
    h = d_model
    per_layer = 4 * h * h + 2 * h * f + 2 * h + (7 * h + f if bias else 0)
    final_norm = 2 * h if bias else h
    head = 0 if tie_weights else vocab * h
    return (vocab + block_size) * h + n_layer * per_layer + final_norm + head


# ---------------------------------------------------------------- the decoder's GEMMs
@dataclass(frozen=True)
class Gemm:
    """One matrix product: `count` independent (m x k) @ (k x n) products (a bmm's batch)."""

    name: str
    phase: str  # "forward", "backward", "recompute"
    count: int
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.count * self.m * self.n * self.k


def _block_forward(i: int, phase: str, B: int, s: int, h: int, a: int, f: int) -> list[Gemm]:
    d, p = h // a, f"transformer.h.{i}"
    return [
        Gemm(f"{p}.attn.c_attn", phase, 1, B * s, 3 * h, h),
        Gemm(f"{p}.attn.scores", phase, B * a, s, s, d),  # q (s x d) @ k^T (d x s)
        Gemm(f"{p}.attn.values", phase, B * a, s, d, s),  # att (s x s) @ v (s x d)
        Gemm(f"{p}.attn.c_proj", phase, 1, B * s, h, h),
        Gemm(f"{p}.mlp.c_fc", phase, 1, B * s, f, h),
        Gemm(f"{p}.mlp.c_proj", phase, 1, B * s, h, f),
    ]


def _backward_of(g: Gemm) -> list[Gemm]:
    """Y (m x n) = X (m x k) @ W (k x n):  dX = dY (m x n) @ W^T (n x k),  dW = X^T (k x m) @ dY."""
    return [Gemm(f"{g.name}.grad_input", "backward", g.count, g.m, g.k, g.n),
            Gemm(f"{g.name}.grad_weight", "backward", g.count, g.k, g.n, g.m)]


def transformer_gemms(*, n_layer: int, d_model: int, n_head: int, seq_len: int, vocab: int,
                      batch: int, d_ff: int | None = None, recompute: str = "none",
                      dropout: float = 0.0) -> list[Gemm]:
    """Every GEMM of one training step with its m, n, k, in execution order per phase.

    Attention's second operand also gets a gradient (k from the scores, v from att @ v): both
    operands of a bmm require grad, so each of its backward products plays "grad_weight".
    """
    f = check_gpt(n_layer=n_layer, d_model=d_model, n_head=n_head, seq_len=seq_len,
                  vocab=vocab, batch=batch, d_ff=d_ff, recompute=recompute, dropout=dropout)
    B, s, h, a, V = batch, seq_len, d_model, n_head, vocab
    forward = [g for i in range(n_layer) for g in _block_forward(i, "forward", B, s, h, a, f)]
    forward.append(Gemm("lm_head", "forward", 1, B * s, V, h))
    backward = [b for g in reversed(forward) for b in _backward_of(g)]
    again: list[Gemm] = []
    if recompute != "none":
        for i in range(n_layer):
            block = _block_forward(i, "recompute", B, s, h, a, f)
            if recompute == "full_early_stop" and dropout == 0:
                block = block[:-1]  # NOTE [ Early stop in the block recompute ]
            again += block
    return forward + again + backward


# ---------------------------------------------------------------- closed forms
def transformer_forward_flops(*, n_layer: int, d_model: int, n_head: int, seq_len: int,
                              vocab: int, batch: int, d_ff: int | None = None
                              ) -> dict[str, int]:
    """The forward pass by part (NOTE [ FLOP conventions ]):

        blocks     L 2 B s h (4h + 2f)     the four Linear layers of every block
        attention  L 4 B s^2 h             scores q k^T and att @ v, dense
        head       2 B s h V
        total      their sum (24 B s L h^2 + 4 B s^2 L h + 2 B s h V for f = 4h)
    """
    f = check_gpt(n_layer=n_layer, d_model=d_model, n_head=n_head, seq_len=seq_len,
                  vocab=vocab, batch=batch, d_ff=d_ff)
    B, s, h, L = batch, seq_len, d_model, n_layer
    parts = {"blocks": L * 2 * B * s * h * (4 * h + 2 * f),
             "attention": L * 4 * B * s * s * h,
             "head": 2 * B * s * h * vocab}
    return {**parts, "total": sum(parts.values())}


def transformer_phase_flops(*, n_layer: int, d_model: int, n_head: int, seq_len: int,
                            vocab: int, batch: int, d_ff: int | None = None,
                            recompute: str = "none", dropout: float = 0.0) -> dict[str, int]:
    """forward, backward (= 2 forward), recompute, optimizer (0) and total of one step."""
    f = check_gpt(n_layer=n_layer, d_model=d_model, n_head=n_head, seq_len=seq_len,
                  vocab=vocab, batch=batch, d_ff=d_ff, recompute=recompute, dropout=dropout)
    fwd = transformer_forward_flops(n_layer=n_layer, d_model=d_model, n_head=n_head,
                                    seq_len=seq_len, vocab=vocab, batch=batch, d_ff=f)
    blocks = fwd["blocks"] + fwd["attention"]
    skipped = n_layer * 2 * batch * seq_len * f * d_model  # every mlp.c_proj
    again = {"none": 0, "full": blocks,
             "full_early_stop": blocks - (skipped if dropout == 0 else 0)}[recompute]
    phases = {"forward": fwd["total"], "backward": 2 * fwd["total"], "recompute": again,
              "optimizer": 0}
    return {**phases, "total": sum(phases.values())}


def transformer_flops(*, n_layer: int, d_model: int, n_head: int, seq_len: int, vocab: int,
                      batch: int, d_ff: int | None = None, recompute: str = "none",
                      dropout: float = 0.0) -> int:
    """Training FLOPs of one step (NOTE [ FLOP conventions ], NOTE [ The GPT-2 style decoder ]).

    With f = d_ff = 4h (h = d_model, L layers, B sequences of s tokens, vocabulary V):
        none             72 B s L h^2 (1 + s/(6h) + V/(12 L h))    3 forward passes
        full             96 B s L h^2 (1 + s/(6h) + V/(16 L h))    + the blocks once more
        full_early_stop  88 B s L h^2 (1 + 2s/(11h) + 3V/(44 L h)) without mlp.c_proj
    `dropout` matters only for full_early_stop: with p > 0 the residual dropout's mask is the
    block's last save, so mlp.c_proj is re-run too (NOTE [ Early stop in the block recompute ]).
    """
    return transformer_phase_flops(n_layer=n_layer, d_model=d_model, n_head=n_head,
                                   seq_len=seq_len, vocab=vocab, batch=batch, d_ff=d_ff,
                                   recompute=recompute, dropout=dropout)["total"]


# ---------------------------------------------------------------- the compact MLP
MLP_ACTIVATIONS = ("relu", "tanh", "gelu", "gelu_tanh")


def mlp_layers(sizes: Sequence[int], activation: str = "gelu", dropout: float = 0.0
               ) -> tuple[str, ...]:
    """make_mlp's modules in order: "linear", the activation, "dropout" (when dropout > 0)."""
    if len(sizes) < 2:
        raise ValueError(f"sizes needs at least (d_in, d_out), got {tuple(sizes)}")
    for i, width in enumerate(sizes):
        _positive(f"sizes[{i}]", width)
    if activation not in MLP_ACTIVATIONS:
        raise ValueError(f"activation must be one of {MLP_ACTIVATIONS}, got {activation!r}")
    if not isinstance(dropout, int | float) or not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1], got {dropout!r}")
    layers: list[str] = []
    for i in range(len(sizes) - 1):
        layers.append("linear")
        if i < len(sizes) - 2:
            layers += [activation, "dropout"] if dropout > 0 else [activation]
    return tuple(layers)


def recompute_runs(plan: Sequence[object], saves: Sequence[bool], early_stop: bool = True
                   ) -> tuple[dict[int, int], dict[int, int]]:
    """(started, cut): per layer, the forwards started during backward under a checkpoint plan
    (reference/recompute.py's Schedule.plan), and how many of them torch's early stop cuts.

    Backward walks the plan from the end; a Segment recomputes its body once, then backward
    goes through the body (its nested Segments recompute again). With early stop the recompute
    ends at the body's last saving item (a layer with saves[i], or a nested Segment: its input
    is saved by _NoopSaveInputs before its body runs, so that body is not entered): that
    layer is started but cut after its saves, which for a Linear is before its GEMM.
    """
    from reference.recompute import Segment

    n = len(saves)
    started, cut = dict.fromkeys(range(n), 0), dict.fromkeys(range(n), 0)

    def forward(items: Sequence[object]) -> None:
        for item in items:
            if isinstance(item, Segment):
                forward(item.body)
            else:
                started[item] += 1  # type: ignore[index]

    def recompute(segment: Segment) -> None:
        body = segment.body
        saving = [k for k, item in enumerate(body)
                  if isinstance(item, Segment) or saves[item]]  # type: ignore[index]
        if not saving:
            return  # nothing was saved: backward never unpacks, nothing is recomputed
        last = saving[-1] if early_stop else len(body) - 1
        for k, item in enumerate(body[:last + 1]):
            stop_here = early_stop and k == last
            if isinstance(item, Segment):
                if not stop_here:
                    forward(item.body)
            else:
                started[item] += 1
                cut[item] += int(stop_here)

    def backward(items: Sequence[object]) -> None:
        for item in reversed(items):
            if isinstance(item, Segment):
                recompute(item)
                backward(item.body)

    backward(plan)
    return started, cut


def mlp_flops(sizes: Sequence[int], batch: int, *, activation: str = "gelu",
              dropout: float = 0.0, recompute: str = "none", early_stop: bool = True,
              input_requires_grad: bool = False) -> dict[str, int]:
    """One step of make_mlp(sizes) on `batch` rows (NOTE [ FLOP conventions ]):

        forward    sum over Linear layers of 2 B in out
        backward   2 B in out (dW) + 2 B in out (dx), but no dx for the first Linear unless
                   its input requires grad (training data does not)
        recompute  sum over Linear layers of (started - cut) 2 B in out, from recompute_runs
                   on the schedule `recompute` ("none", "sqrt", "uniform:K", "optimal:S"):
                   every MLP layer saves something, so each segment's last layer is cut
        optimizer  0
    """
    from reference.recompute import parse_schedule

    layers = mlp_layers(sizes, activation, dropout)
    _positive("batch", batch)
    plan = parse_schedule(recompute, len(layers)).plan
    started, cut = recompute_runs(plan, [True] * len(layers), early_stop)
    linears = [i for i, kind in enumerate(layers) if kind == "linear"]
    gemm = {i: 2 * batch * sizes[j] * sizes[j + 1] for j, i in enumerate(linears)}
    forward = sum(gemm.values())
    backward = 2 * forward - (0 if input_requires_grad else gemm[linears[0]])
    again = sum((started[i] - cut[i]) * gemm[i] for i in linears)
    phases = {"forward": forward, "backward": backward, "recompute": again, "optimizer": 0}
    return {**phases, "total": sum(phases.values())}
