"""The compact transformer's activations, exactly: every tensor its training forward saves for
backward (reference/gpt.py and torch_impl/gpt.py save the same ones under torch's node names),
which of them are one storage, and the bytes held under whole-block recomputation; the
reference tape's own GEMM count; and Korthikanti et al. 2022's terms mapped onto ours.

# NOTE [ What the transformer saves ]
B sequences of T tokens, width h, a heads of d = h / a, f = 4h, vocabulary V; m the model's
itemsize (4 float32, 8 float64), e the activations' itemsize: m, or 2 under bf16/fp16
autocast (CPU autocast: Linear and matmul run low precision, LayerNorm and the loss float32,
softmax and GELU in their input's dtype). Parameters are excluded (a GEMM's saved W^T is a
view of one); under autocast each Linear's saved weight is a low-precision cast copy.
    wte, wpe          the token ids idx (B, T) int64 and the positions (T,) int64
    drop (p > 0)      its scaled keep-mask (B, T, h), m bytes (the embeddings stay float32)
  per block (x its input, the residual stream, always m bytes):
    ln_1              input x; mean and rstd (B, T, 1) m each
    attn.c_attn       mat1: ln_1's output (B T, h), e; a cast copy under autocast
    attn.core         q and k^T reshaped into (B a, T, d) and (B a, d, T) COPIES (matmul folds
                      the strided heads into a batch axis), e; the causal mask: a fresh
                      (1, 1, T, T) bool; softmax's result P (B, a, T, T), e; with p > 0 the
                      attention dropout's mask (B, a, T, T), e, and its output, the att @ v
                      operand, e; with p == 0 that operand IS P (one storage); v (B a, T, d)
                      copied, e
    attn.c_proj       mat1: the heads merged, .contiguous() (B T, h), e; then (p > 0) the
                      residual dropout's mask (B, T, h), e
    ln_2              input x + attn (B, T, h) m; mean and rstd
    mlp.c_fc          mat1: ln_2's output (B T, h), e (cast copy under autocast)
    mlp.gelu          self: c_fc's output (B, T, f), e
    mlp.c_proj        mat1: GELU's output (B T, f), e; then (p > 0) the dropout mask (B, T, h)
  after the blocks:
    ln_f              input (B, T, h) m; mean and rstd
    lm_head           mat1: ln_f's output (B T, h), e (cast copy under autocast), and under
                      autocast the cast weight (h, V), 2
    the loss          log_softmax's result (B T, V) float32 under autocast, m otherwise (also
                      nll_loss's self: one tensor), the targets (B, T) int64, nll_loss's
                      0-dim total_weight
With whole-block recomputation (torch.utils.checkpoint per block, non-reentrant) a block
holds only its input x (B, T, h), m bytes; what lies outside the blocks is held as above.
On CUDA (p strictly between 0 and 1) the fused dropout keeps a 1-byte bool mask.
"""

from __future__ import annotations

from reference.accounting import PROJECT_PRECISIONS, Saved, _choice, held_bytes
from reference.flops import check_gpt

GPT_RECOMPUTE = ("none", "full", "full_early_stop")


def gpt_saved(*, n_layer: int, d_model: int, n_head: int, seq_len: int, vocab: int,
              batch: int, dropout: float = 0.0, bias: bool = True, precision: str = "fp32",
              itemsize: int = 4, device: str = "cpu") -> tuple[list[Saved], list[Saved]]:
    """(saved, inputs): every tensor one training forward of the transformer saves (NOTE [
    What the transformer saves ]), module path and torch's node attribute, and each block's
    input (what a checkpoint around the block keeps). Tensors shared by two saves carry one
    `tensor` name; held_bytes counts them once. `bias` changes only torch's node names
    (addmm or mm)."""
    f = check_gpt(n_layer=n_layer, d_model=d_model, n_head=n_head, seq_len=seq_len,
                  vocab=vocab, batch=batch, dropout=dropout)
    _choice("precision", precision, PROJECT_PRECISIONS)
    _choice("device", device, ("cpu", "cuda"))
    if itemsize not in (4, 8):
        raise ValueError(f"itemsize must be 4 (float32) or 8 (float64), got {itemsize!r}")
    if device == "cuda" and precision != "fp32":
        raise ValueError("device 'cuda' with autocast: CUDA's autocast runs softmax in "
                         "float32 and casts its result for att @ v; not modelled (accepted: "
                         "device 'cpu' with any precision, 'cuda' with 'fp32')")
    B, T, h, a, V, m = batch, seq_len, d_model, n_head, vocab, itemsize
    d, low = h // a, precision != "fp32" and itemsize == 4
    e = 2 if low else m
    fused = device == "cuda" and 0 < dropout < 1
    gemm = "AddmmBackward0" if bias else "MmBackward0"
    saved: list[Saved] = []
    inputs: list[Saved] = []

    def save(path: str, name: str, tensor: str, shape: tuple[int, ...], size: int) -> None:
        saved.append(Saved(path, name, tensor, shape, size))

    def layer_norm(path: str, x: str) -> None:
        save(path, "NativeLayerNormBackward0.input", x, (B, T, h), m)
        save(path, "NativeLayerNormBackward0.result1", f"{path}.mean", (B, T, 1), m)
        save(path, "NativeLayerNormBackward0.result2", f"{path}.rstd", (B, T, 1), m)

    def linear(path: str, x: str, n_in: int, n_out: int, cast: bool, node: str) -> None:
        """F.linear saves its 2-d input (addmm's mat1, mm's self); under autocast also the
        weight's cast copy (mat2)."""
        if cast and low:
            x = f"cast({x})"
        save(path, f"{node}.mat1" if node == "AddmmBackward0" else f"{node}.self", x,
             (B * T, n_in), e)
        if low:
            save(path, f"{node}.mat2", f"cast({path}.weight)", (n_in, n_out), 2)

    def drop(path: str, shape: tuple[int, ...], size: int) -> None:
        """nn.Dropout saves its scaled keep-mask in the input's dtype (CUDA: a bool)."""
        if dropout > 0:
            save(path, "MulBackward0.other", f"{path}.mask", shape, 1 if fused else size)

    save("transformer.wte", "EmbeddingBackward0.indices", "idx", (B, T), 8)
    save("transformer.wpe", "EmbeddingBackward0.indices", "pos", (T,), 8)
    drop("transformer.drop", (B, T, h), m)
    x = "transformer.drop.out" if dropout > 0 else "emb"
    for i in range(n_layer):
        p = f"transformer.h.{i}"
        inputs.append(Saved(p, "input", x, (B, T, h), m))
        layer_norm(f"{p}.ln_1", x)
        linear(f"{p}.attn.c_attn", f"{p}.ln_1.out", h, 3 * h, cast=True, node=gemm)
        core = f"{p}.attn.core"
        save(core, "BmmBackward0.self", f"{core}.q", (B * a, T, d), e)
        save(core, "BmmBackward0.mat2", f"{core}.kT", (B * a, d, T), e)
        save(core, "MaskedFillBackward0.mask", f"{core}.mask", (1, 1, T, T), 1)
        save(core, "SoftmaxBackward0.result", f"{core}.P", (B, a, T, T), e)
        drop(f"{core}.attn_dropout", (B, a, T, T), e)
        att = f"{core}.attn_dropout.out" if dropout > 0 else f"{core}.P"
        save(core, "BmmBackward0.self", att, (B * a, T, T), e)
        save(core, "BmmBackward0.mat2", f"{core}.v", (B * a, T, d), e)
        linear(f"{p}.attn.c_proj", f"{p}.attn.y", h, h, cast=False, node=gemm)
        drop(f"{p}.attn.resid_dropout", (B, T, h), e)
        layer_norm(f"{p}.ln_2", f"{p}.mid")
        linear(f"{p}.mlp.c_fc", f"{p}.ln_2.out", h, f, cast=True, node=gemm)
        save(f"{p}.mlp.gelu", "GeluBackward0.self", f"{p}.mlp.c_fc.out", (B, T, f), e)
        linear(f"{p}.mlp.c_proj", f"{p}.mlp.gelu.out", f, h, cast=False, node=gemm)
        drop(f"{p}.mlp.dropout", (B, T, h), e)
        x = f"{p}.out"
    layer_norm("transformer.ln_f", x)
    linear("lm_head", "transformer.ln_f.out", h, V, cast=True, node="MmBackward0")
    loss = 4 if low else m  # autocast's fp32 list: log_softmax, nll_loss
    save("", "LogSoftmaxBackward0.result", "logp", (B * T, V), loss)
    save("", "NllLossBackward0.self", "logp", (B * T, V), loss)
    save("", "NllLossBackward0.target", "targets", (B, T), 8)
    save("", "NllLossBackward0.total_weight", "total_weight", (), loss)
    return saved, inputs


# NOTE [ Depth is affine ]
# Every block saves the same tensors (same shapes, names differing only in the block's
# index), and a block shares a tensor only with its neighbours (its input is the previous
# block's output). So the distinct bytes held are affine in depth from one block on:
# bytes(n) = bytes(3) + (n - 3) (bytes(3) - bytes(2)). Enumerating every save costs time and
# memory in proportion to depth (10^6 layers: 7.8 GB and 158 s for a number that is only
# printed); the extension costs two small enumerations, and a test holds it equal to the
# enumeration at every depth up to 12.
AFFINE_FROM = 3


def gpt_activation_bytes(*, n_layer: int, d_model: int, n_head: int, seq_len: int, vocab: int,
                         batch: int, dropout: float = 0.0, bias: bool = True,
                         precision: str = "fp32", itemsize: int = 4, recompute: str = "none",
                         device: str = "cpu") -> dict[str, int]:
    """Distinct bytes held between forward and backward: `blocks` (every block's saves, or
    with "full"/"full_early_stop" only each block's input), `outside` (embeddings, ln_f, the
    head, the loss) and `total`. Early stop changes the recompute, not what is held."""
    _choice("recompute", recompute, GPT_RECOMPUTE)
    kw = {"d_model": d_model, "n_head": n_head, "seq_len": seq_len, "vocab": vocab,
          "batch": batch, "dropout": dropout, "bias": bias, "precision": precision,
          "itemsize": itemsize, "recompute": recompute, "device": device}
    if isinstance(n_layer, int) and n_layer > AFFINE_FROM:  # NOTE [ Depth is affine ]
        two, three = (gpt_activation_bytes(n_layer=n, **kw)  # type: ignore[arg-type]
                      for n in (AFFINE_FROM - 1, AFFINE_FROM))
        return {k: three[k] + (n_layer - AFFINE_FROM) * (three[k] - two[k]) for k in three}
    saved, inputs = gpt_saved(n_layer=n_layer, d_model=d_model, n_head=n_head,
                              seq_len=seq_len, vocab=vocab, batch=batch, dropout=dropout,
                              bias=bias, precision=precision, itemsize=itemsize, device=device)
    in_block = [s for s in saved if str(s.layer).startswith("transformer.h.")]
    outside = [s for s in saved if not str(s.layer).startswith("transformer.h.")]
    blocks = in_block if recompute == "none" else inputs
    out = {"blocks": held_bytes(blocks), "outside": held_bytes(outside),
           "total": held_bytes(blocks + outside)}
    return out


# ---------------------------------------------------------------- the reference's own count
def gpt_tape_gemms(model: object) -> list[tuple[str, int, int, int, int]]:
    """(module path, count, m, n, k) of every forward GEMM whose operands the reference GPT's
    tape holds now (after forward, before backward): each Linear's saved input (N, in) with
    its weight (in x out), and the attention core's two batched products from the saved
    q (B a, T, d) @ k^T (B a, d, T) and att (B a, T, T) @ v (B a, T, d)."""
    from reference.nn import Linear

    out = []
    for path, mod in model.named_modules():  # type: ignore[attr-defined]
        saved = mod.saved_tensors()
        if isinstance(mod, Linear) and "input" in saved:
            rows = saved["input"].shape[0]
            out.append((path, 1, rows, mod.out_features, mod.in_features))
        for op in ("qk", "av"):
            if f"{op}:BmmBackward0.self" in saved:
                a, b = saved[f"{op}:BmmBackward0.self"], saved[f"{op}:BmmBackward0.mat2"]
                out.append((f"{path}.{op}", a.shape[0], a.shape[1], b.shape[2], a.shape[2]))
    return out


def gpt_tape_flops(model: object) -> int:
    """2 count m n k summed over gpt_tape_gemms: the forward's GEMM FLOPs."""
    return sum(2 * c * m * n * k for _, c, m, n, k in gpt_tape_gemms(model))
