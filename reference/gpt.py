"""The compact transformer (a GPT-style decoder) on the tape, in NumPy.

    idx (B, T) int64 tokens, T <= block_size
    x = drop(wte[idx] + wpe[0..T-1])                              (B, T, C)
    for each of n_layer blocks:
        x = x + attn(ln_1(x));   x = x + mlp(ln_2(x))             pre-LayerNorm residuals
    logits = lm_head(ln_f(x))                                     (B, T, V)
    loss = mean over the B T positions of -log softmax(logits)[target]

    attn(x):  q, k, v = split(c_attn(x)) into n_head heads of d = C / n_head   (B, nh, T, d)
              y = core(q, k, v);  return resid_dropout(c_proj(merge heads of y))
    core:     s = (q k^T) * (1 / sqrt d);  s = masked_fill(s, future, -inf)
              p = attn_dropout(softmax(s));  y = p v                      (B, nh, T, d)
    mlp(x):   dropout(c_proj(gelu(c_fc(x))))                      C -> 4C -> C
              gelu: GPT-2's tanh approximation (NOTE [ GELU formulas ] in reference/nn.py;
              the erf form would cost a Python call per element in NumPy)

Parameter names and layouts are nanoGPT's (transformer.wte, transformer.h.0.attn.c_attn,
lm_head, ...), so a state_dict converts to torch_impl/gpt.py losslessly. Initialization is
GPT-2's: N(0, 0.02^2) for Linear and Embedding weights, N(0, (0.02 / sqrt(2 n_layer))^2)
for the residual projections (c_proj), zero biases, LayerNorm weight 1 and bias 0.

Backward of the attention core (NOTE [ Softmax backward ] in reference/layers.py for the
softmax step), with g the gradient of y:
    dp = g v^T,   dv = p^T g                 (p after dropout; dropout: dp <- dp * mask)
    ds = p (dp - sum_j p_j dp_j)             softmax's vector-Jacobian product
    ds <- 0 where masked;  ds <- ds / sqrt d
    dq = ds k,   dk = ds^T q

The tape. Every op saves, under torch's node and attribute names, the tensors torch's
autograd saves for it (reference/layers.py), so that the tape's bytes are autograd's bytes,
view sharing included: the core reshapes q, k^T and v into (B nh, T, d) COPIES (torch's
matmul folds the head axis into a batch axis, and the heads are strided views), the mask is
a fresh (1, 1, T, T) bool array, and p v saves p itself when there is no dropout (the same
storage as the softmax's result). NOTE [ The scale is not on the tape ]: torch wraps the
Python float 1/sqrt(d) as a 0-d float64 "wrapped number"; its MulBackward0 shows it as
`_saved_other` when read, but keeps it as a scalar that never passes through
saved_tensors_hooks (torch 2.6, 2.11 and 2.13 alike), so the reference keeps it beside the
tape (`_scale`), not on it. The product itself is computed in the input dtype.
The attention core is its own module (`core`, no parameters), so that it can be recomputed
on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from reference.layers import (
    Embedding,
    LayerNorm,
    bmm,
    masked_fill,
    softmax,
    softmax_backward,
)
from reference.losses import CrossEntropyLoss
from reference.module import FLOAT_DTYPES, Module, Node, Parameter, SavedTensor, check_grad
from reference.nn import GELU, Dropout, Linear

ATTENTION = ("explicit", "sdpa")


@dataclass(frozen=True)
class GPTConfig:
    """The transformer's shape; the same fields in torch_impl (which alone runs "sdpa")."""

    vocab_size: int = 12
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = False
    attention: str = "explicit"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_head={self.n_head} must divide "
                             f"n_embd={self.n_embd}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ATTENTION:
            raise ValueError(f"GPTConfig: attention must be one of {ATTENTION}, "
                             f"got {self.attention!r}")


def _init_normal(p: Parameter, rng: np.random.Generator, std: float) -> None:
    p.data = rng.normal(0.0, std, size=p.data.shape).astype(p.data.dtype)


def _linear(d_in: int, d_out: int, bias: bool, std: float, rng: np.random.Generator,
            dtype: type) -> Linear:
    """A Linear with GPT-2's initialization: weight ~ N(0, std^2), bias 0."""
    layer = Linear(d_in, d_out, bias, rng=rng, dtype=dtype)
    _init_normal(layer.weight, rng, std)
    if layer.bias is not None:
        layer.bias.data = np.zeros_like(layer.bias.data)
    return layer


class AttentionCore(Module):
    """y = dropout(softmax(masked_fill(q k^T / sqrt d, future, -inf))) v, per head."""

    def __init__(self, block_size: int, dropout: float, *, rng: np.random.Generator) -> None:
        super().__init__()
        self.block_size = block_size
        self.attn_dropout = self._children["attn_dropout"] = Dropout(dropout, rng=rng)
        self.bias = np.tril(np.ones((block_size, block_size), dtype=bool)).reshape(
            1, 1, block_size, block_size)  # a buffer, not a parameter: True where visible
        self._shape: tuple[int, ...] = ()
        self._scale = 1.0

    def __repr__(self) -> str:
        return "AttentionCore()"

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        B, nh, T, hs = q.shape  # batch, heads, time, head size
        c = q.dtype.type
        self._scale = scale = 1.0 / math.sqrt(hs)  # NOTE [ The scale is not on the tape ]
        q3 = q.reshape(B * nh, T, hs)  # a copy: q is a strided view of the qkv output
        kt3 = k.transpose(0, 1, 3, 2).reshape(B * nh, hs, T)  # a copy, as torch's matmul
        s = bmm(q3, kt3).reshape(B, nh, T, T) * c(scale)
        mask = np.logical_not(self.bias[:, :, :T, :T])  # (1, 1, T, T): True in the future
        p = softmax(masked_fill(s, mask, -math.inf))  # (B, nh, T, T)
        p_drop = self.attn_dropout.forward(p)
        a3 = p_drop.reshape(B * nh, T, T)  # a view
        v3 = v.reshape(B * nh, T, hs)  # a copy
        self.save_for_backward({
            "qk:BmmBackward0.self": q3, "qk:BmmBackward0.mat2": kt3,
            "mask:MaskedFillBackward0.mask": mask,
            "softmax:SoftmaxBackward0.result": p,
            "av:BmmBackward0.self": a3, "av:BmmBackward0.mat2": v3})
        self._shape = q.shape
        return bmm(a3, v3).reshape(B, nh, T, hs)

    def backward(self, grad_output: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        saved = self.pop_saved()
        B, nh, T, hs = self._shape
        g3 = check_grad(self, grad_output, self._shape).reshape(B * nh, T, hs)
        a3, v3 = saved["av:BmmBackward0.self"], saved["av:BmmBackward0.mat2"]
        dv = bmm(a3.transpose(0, 2, 1), g3)  # (B nh, T, hs)
        dp = self.attn_dropout.backward(bmm(g3, v3.transpose(0, 2, 1)).reshape(B, nh, T, T))
        ds = softmax_backward(dp, saved["softmax:SoftmaxBackward0.result"])
        ds = masked_fill(ds, saved["mask:MaskedFillBackward0.mask"], 0.0)
        ds3 = (ds * ds.dtype.type(self._scale)).reshape(B * nh, T, T)
        dq = bmm(ds3, saved["qk:BmmBackward0.mat2"].transpose(0, 2, 1))  # (B nh, T, hs)
        dkt = bmm(saved["qk:BmmBackward0.self"].transpose(0, 2, 1), ds3)  # (B nh, hs, T)
        return (dq.reshape(B, nh, T, hs), dkt.transpose(0, 2, 1).reshape(B, nh, T, hs),
                dv.reshape(B, nh, T, hs))


class CausalSelfAttention(Module):
    """c_attn (C -> 3C), heads split, the core, heads merged, c_proj (C -> C), dropout."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator, dtype: type) -> None:
        super().__init__()
        C, std = config.n_embd, 0.02
        self.n_head = config.n_head
        self.c_attn = self._children["c_attn"] = _linear(C, 3 * C, config.bias, std, rng, dtype)
        self.core = self._children["core"] = AttentionCore(config.block_size, config.dropout,
                                                           rng=rng)
        self.c_proj = self._children["c_proj"] = _linear(
            C, C, config.bias, std / math.sqrt(2 * config.n_layer), rng, dtype)
        self.resid_dropout = self._children["resid_dropout"] = Dropout(config.dropout, rng=rng)

    def __repr__(self) -> str:
        return "CausalSelfAttention()"

    def _needs_tape(self) -> bool:
        return False

    def forward(self, x: np.ndarray) -> np.ndarray:
        B, T, C = x.shape  # batch, time, channels
        nh = self.n_head
        q, k, v = np.split(self.c_attn.forward(x), 3, axis=2)  # 3 x (B, T, C), views
        q, k, v = (t.reshape(B, T, nh, C // nh).transpose(0, 2, 1, 3) for t in (q, k, v))
        y = self.core.forward(q, k, v)  # (B, nh, T, hs)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # a copy: torch's .contiguous()
        return self.resid_dropout.forward(self.c_proj.forward(y))

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        g = self.c_proj.backward(self.resid_dropout.backward(grad_output))  # (B, T, C)
        B, T, C = g.shape
        nh = self.n_head
        grads = self.core.backward(g.reshape(B, T, nh, C // nh).transpose(0, 2, 1, 3))
        dqkv = np.concatenate([d.transpose(0, 2, 1, 3).reshape(B, T, C) for d in grads], 2)
        return self.c_attn.backward(dqkv)


class MLP(Module):
    """dropout(c_proj(gelu(c_fc(x)))), C -> 4C -> C, GPT-2's tanh-approximated GELU."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator, dtype: type) -> None:
        super().__init__()
        C, std = config.n_embd, 0.02
        self.c_fc = self._children["c_fc"] = _linear(C, 4 * C, config.bias, std, rng, dtype)
        self.gelu = self._children["gelu"] = GELU(approximate="tanh")
        self.c_proj = self._children["c_proj"] = _linear(
            4 * C, C, config.bias, std / math.sqrt(2 * config.n_layer), rng, dtype)
        self.dropout = self._children["dropout"] = Dropout(config.dropout, rng=rng)

    def __repr__(self) -> str:
        return "MLP()"

    def _needs_tape(self) -> bool:
        return False

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.dropout.forward(self.c_proj.forward(self.gelu.forward(self.c_fc.forward(x))))

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        g = self.c_proj.backward(self.dropout.backward(grad_output))
        return self.c_fc.backward(self.gelu.backward(g))


class Block(Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)): one checkpointable segment."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator, dtype: type) -> None:
        super().__init__()
        C = config.n_embd
        self.ln_1 = self._children["ln_1"] = LayerNorm(C, dtype=dtype)
        self.attn = self._children["attn"] = CausalSelfAttention(config, rng=rng, dtype=dtype)
        self.ln_2 = self._children["ln_2"] = LayerNorm(C, dtype=dtype)
        self.mlp = self._children["mlp"] = MLP(config, rng=rng, dtype=dtype)

    def __repr__(self) -> str:
        return "Block()"

    def _needs_tape(self) -> bool:
        return False

    def forward(self, x: np.ndarray) -> np.ndarray:
        x = x + self.attn.forward(self.ln_1.forward(x))
        return x + self.mlp.forward(self.ln_2.forward(x))

    def backward(self, grad_output: np.ndarray) -> np.ndarray:
        g = grad_output + self.ln_2.backward(self.mlp.backward(grad_output))
        return g + self.ln_1.backward(self.attn.backward(g))


def torch_node_name(module: Module, name: str) -> str:
    """The torch node and attribute under which autograd saves what `module` saved as `name`
    (the nn layers keep their short names; the transformer's own ops use torch's)."""
    if isinstance(module, Linear):  # F.linear on (B, T, C): addmm, or mm without a bias
        return "AddmmBackward0.mat1" if module.bias is not None else "MmBackward0.self"
    if isinstance(module, GELU):
        return "GeluBackward0.self"
    if isinstance(module, Dropout):  # NOTE [ Dropout mask ]: the scaled noise, mul's other
        return "MulBackward0.other"
    return name


class NextTokenLoss(CrossEntropyLoss):
    """Cross-entropy over (N, V) logits, mean over N, saving what torch's two nodes save:
    LogSoftmaxBackward0.result and NllLossBackward0.self (one array: the log-probabilities),
    NllLossBackward0.target and NllLossBackward0.total_weight (0-d, the count N)."""

    def forward(self, x: np.ndarray, target: np.ndarray) -> np.ndarray:
        loss = super().forward(x, target)
        logp = self.pop_saved()["result"]
        self.save_for_backward({
            "LogSoftmaxBackward0.result": logp, "NllLossBackward0.self": logp,
            "NllLossBackward0.target": target,
            "NllLossBackward0.total_weight": np.asarray(x.shape[0], dtype=x.dtype)})
        return loss

    def backward(self, grad_output: np.ndarray | float = 1.0) -> np.ndarray:
        saved = self.pop_saved()
        self.save_for_backward({"result": saved["LogSoftmaxBackward0.result"],
                                "target": saved["NllLossBackward0.target"]})
        return super().backward(grad_output)


class Transformer(Module):
    """The container nanoGPT calls `transformer`: wte, wpe, drop, h.{i}, ln_f."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator, dtype: type) -> None:
        super().__init__()
        C = config.n_embd
        self.wte = self._children["wte"] = Embedding(config.vocab_size, C, rng=rng, dtype=dtype)
        self.wpe = self._children["wpe"] = Embedding(config.block_size, C, rng=rng, dtype=dtype)
        self.drop = self._children["drop"] = Dropout(config.dropout, rng=rng)
        self.h = self._children["h"] = Module()
        for i in range(config.n_layer):
            self.h._children[str(i)] = Block(config, rng=rng, dtype=dtype)
        self.ln_f = self._children["ln_f"] = LayerNorm(C, dtype=dtype)

    def _needs_tape(self) -> bool:
        return False


class GPT(Module):
    """The model: `logits, loss = model.forward(idx, targets)`, then `model.backward()`."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator,
                 dtype: type = np.float32) -> None:
        super().__init__()
        if config.attention != "explicit":
            raise ValueError(f"GPT: the reference computes attention='explicit' only, got "
                             f"{config.attention!r} (sdpa is torch's fused kernel)")
        if np.dtype(dtype) not in FLOAT_DTYPES:
            raise TypeError(f"GPT: dtype must be float32 or float64, got {np.dtype(dtype)}")
        self.config = config
        self.transformer = self._children["transformer"] = Transformer(config, rng=rng,
                                                                       dtype=dtype)
        self.lm_head = self._children["lm_head"] = Linear(
            config.n_embd, config.vocab_size, bias=False, rng=rng, dtype=dtype)
        if config.tie_weights:  # one Parameter under two names, as torch ties them
            self.lm_head.weight = self.lm_head._params["weight"] = self.transformer.wte.weight
        else:
            _init_normal(self.lm_head.weight, rng, 0.02)
        self.loss_fn = NextTokenLoss()
        self._shape: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"GPT({self.config})"

    def _needs_tape(self) -> bool:
        return False

    def named_parameters(self, prefix: str = "") -> list[tuple[str, Parameter]]:  # type: ignore[override]
        """Each Parameter once, under its first name (torch drops the tied lm_head.weight)."""
        seen: set[int] = set()
        out = []
        for name, p in super().named_parameters(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                out.append((name, p))
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every name, tied ones too (torch's state_dict keeps lm_head.weight when tied)."""
        state = super().state_dict()
        if self.config.tie_weights:
            state["lm_head.weight"] = state["transformer.wte.weight"].copy()
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:  # type: ignore[override]
        if self.config.tie_weights:
            state = dict(state)
            tied = state.pop("lm_head.weight", None)
            if tied is None or not np.array_equal(tied, state.get("transformer.wte.weight")):
                raise ValueError("GPT.load_state_dict: tied weights need lm_head.weight equal "
                                 "to transformer.wte.weight")
        super().load_state_dict(state)

    def check_tokens(self, idx: np.ndarray, what: str = "idx") -> np.ndarray:
        """idx as int64 (B, T) tokens in [0, vocab_size) with 1 <= T <= block_size."""
        idx = np.asarray(idx)
        cfg = self.config
        if idx.dtype != np.int64:
            raise TypeError(f"GPT: {what} must be int64 token ids, got {idx.dtype}")
        if idx.ndim != 2 or not 1 <= idx.shape[1] <= cfg.block_size or idx.shape[0] < 1:
            raise ValueError(f"GPT: {what} must have shape (B, T) with B >= 1 and "
                             f"1 <= T <= block_size={cfg.block_size}, got {idx.shape}")
        if idx.min() < 0 or idx.max() >= cfg.vocab_size:
            raise ValueError(f"GPT: {what} token ids must lie in [0, vocab_size="
                             f"{cfg.vocab_size}), got [{idx.min()}, {idx.max()}]")
        return idx

    def forward(self, idx: np.ndarray, targets: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray | None]:
        idx = self.check_tokens(idx)
        B, T = idx.shape  # batch, time
        tr = self.transformer
        pos = np.arange(T, dtype=np.int64)  # (T,)
        x = tr.drop.forward(tr.wte.forward(idx) + tr.wpe.forward(pos))  # (B, T, C)
        for block in tr.h._children.values():
            x = block.forward(x)
        logits = self.lm_head.forward(tr.ln_f.forward(x))  # (B, T, V)
        self._shape = (B, T)
        if targets is None:
            return logits, None
        targets = self.check_tokens(targets, "targets")
        if targets.shape != idx.shape:
            raise ValueError(f"GPT: targets must have idx's shape {idx.shape}, "
                             f"got {targets.shape}")
        loss = self.loss_fn.forward(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    def backward(self, grad_output: np.ndarray | float = 1.0) -> None:
        """Backpropagate the loss (scaled by grad_output) into every parameter's .grad."""
        B, T = self._shape
        tr = self.transformer
        g = self.loss_fn.backward(grad_output).reshape(B, T, -1)
        g = tr.ln_f.backward(self.lm_head.backward(g))
        for block in reversed(tr.h._children.values()):
            g = block.backward(g)
        g = tr.drop.backward(g)
        tr.wpe.backward(g.sum(axis=0, dtype=g.dtype))
        tr.wte.backward(g)

    def tape(self, prefix: str = "") -> list[SavedTensor]:
        """The modules' tapes, then the loss's (under the model's own path, as torch's
        hooks attribute F.cross_entropy inside GPT.forward), every entry named by torch's
        node and attribute ("AddmmBackward0.mat1" for a Linear's "input")."""
        entries = []
        for path, m in self.named_modules(prefix):
            for s in Node.tape(m, path):
                entries.append(replace(s, name=torch_node_name(m, s.name)))
        return entries + Node.tape(self.loss_fn, prefix)

    def held_bytes(self) -> int:
        """The bytes the tape holds: the DISTINCT buffers its arrays live in, each counted
        once at its full size (a view, like Linear's (N, C) input, holds no bytes of its own;
        autograd's storages are counted the same way)."""
        held: dict[int, int] = {}
        for node in [*self.modules(), self.loss_fn]:
            for a in Node.saved_tensors(node).values():
                while isinstance(a.base, np.ndarray):
                    a = a.base
                held[id(a)] = a.nbytes
        return sum(held.values())

    def free_saved(self) -> None:
        super().free_saved()
        self.loss_fn.free_saved()
