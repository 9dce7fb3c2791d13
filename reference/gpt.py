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

The attention (the core's backward, what it saves): reference/attention.py.

The tape. Every op saves, under torch's node and attribute names, the tensors torch's
autograd saves for it (reference/layers.py, reference/attention.py), so that the tape's
bytes are autograd's bytes, view sharing included.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from common.gpt_config import ATTENTION, GPTConfig  # noqa: F401  (re-exported)
from reference.attention import CausalSelfAttention, init_normal, linear
from reference.layers import Embedding, LayerNorm
from reference.losses import CrossEntropyLoss
from reference.module import FLOAT_DTYPES, Module, Node, Parameter, SavedTensor
from reference.nn import GELU, Dropout, Linear, Sequential
from reference.recompute import Checkpoint, Schedule, ScheduledRun, forward_with_schedule


class MLP(Module):
    """dropout(c_proj(gelu(c_fc(x)))), C -> 4C -> C, GPT-2's tanh-approximated GELU."""

    def __init__(self, config: GPTConfig, *, rng: np.random.Generator, dtype: type) -> None:
        super().__init__()
        C, std = config.n_embd, 0.02
        self.c_fc = linear(C, 4 * C, config.bias, std, rng, dtype)
        self.gelu = GELU(approximate="tanh")
        self.c_proj = linear(
            4 * C, C, config.bias, std / math.sqrt(2 * config.n_layer), rng, dtype)
        self.dropout = Dropout(config.dropout, rng=rng)

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
        self.ln_1 = LayerNorm(C, dtype=dtype)
        self.attn = CausalSelfAttention(config, rng=rng, dtype=dtype)
        self.ln_2 = LayerNorm(C, dtype=dtype)
        self.mlp = MLP(config, rng=rng, dtype=dtype)

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
        node, first = ("AddmmBackward0", "mat1") if module.bias is not None else ("MmBackward0",
                                                                                   "self")
        return f"{node}.{'mat2' if name == 'weight' else first}"  # weight: its autocast cast
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
            "NllLossBackward0.total_weight": np.asarray(x.shape[0], dtype=logp.dtype)})
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
        self.wte = Embedding(config.vocab_size, C, rng=rng, dtype=dtype)
        self.wpe = Embedding(config.block_size, C, rng=rng, dtype=dtype)
        self.drop = Dropout(config.dropout, rng=rng)
        self.h = Module()
        for i in range(config.n_layer):
            self.h.add_module(str(i), Block(config, rng=rng, dtype=dtype))
        self.ln_f = LayerNorm(C, dtype=dtype)

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
        self.transformer = Transformer(config, rng=rng,
                                                                       dtype=dtype)
        self.lm_head = Linear(
            config.n_embd, config.vocab_size, bias=False, rng=rng, dtype=dtype)
        if config.tie_weights:  # one Parameter under two names, as torch ties them
            self.lm_head.weight = self.transformer.wte.weight
        else:
            init_normal(self.lm_head.weight, rng, 0.02)
        self.loss_fn = NextTokenLoss()
        self._shape: tuple[int, ...] = ()
        # per-block checkpointing (reference/recompute_gpt.py sets it): the blocks run as a
        # Sequential under this schedule, `trunk` is that forward's ScheduledRun
        self.schedule: Schedule | None = None
        self.trunk: ScheduledRun | None = None

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
        self.trunk = None
        if self.schedule is None:
            for block in tr.h.children():
                x = block.forward(x)
        else:  # the blocks as the layers of a plan
            blocks = Sequential(*tr.h.children())
            self.trunk = forward_with_schedule(blocks, x, self.schedule)
            x = self.trunk.output
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
        if self.trunk is None:
            for block in reversed(list(tr.h.children())):
                g = block.backward(g)
        else:
            g = self.trunk.backward(g)
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
        return entries + self._trunk_tape(prefix) + Node.tape(self.loss_fn, prefix)

    def _trunk_nodes(self) -> list[Checkpoint]:
        """The checkpoints of the per-block schedule (each saves its input), if any."""
        return [] if self.trunk is None else self.trunk.checkpoints

    def _trunk_tape(self, prefix: str) -> list[SavedTensor]:
        path = f"{prefix}.transformer.h" if prefix else "transformer.h"
        return [s for m in self._trunk_nodes() for s in Node.tape(m, f"{path}.{m.name}")]

    def held_bytes(self) -> int:
        """The bytes the tape holds: the DISTINCT buffers its arrays live in, each counted
        once at its full size (a view, like Linear's (N, C) input, holds no bytes of its own;
        autograd's storages are counted the same way)."""
        held: dict[int, int] = {}
        for node in [*self.modules(), *self._trunk_nodes(), self.loss_fn]:
            for a in Node.saved_tensors(node).values():
                while isinstance(a.base, np.ndarray):
                    a = a.base
                held[id(a)] = a.nbytes
        return sum(held.values())

    def free_saved(self) -> None:
        super().free_saved()
        for m in self._trunk_nodes():
            Node.free_saved(m)
        self.loss_fn.free_saved()


def matmuls(config: GPTConfig, batch: int, seq_len: int
            ) -> list[tuple[str, str, int, int, int, int]]:
    """Every matrix product of one forward, in order, as (module path, torch node, batch,
    m, n, k): a (batch x) (m, k) @ (k, n) product costs 2 batch m n k FLOPs forward and twice
    that backward (both operands' gradients). For the accounting of FLOPs."""
    C, V, N = config.n_embd, config.vocab_size, batch * seq_len
    hs, bh = config.n_embd // config.n_head, batch * config.n_head
    mm = "AddmmBackward0" if config.bias else "MmBackward0"
    out = []
    for i in range(config.n_layer):
        p = f"transformer.h.{i}."
        out += [(p + "attn.c_attn", mm, 1, N, 3 * C, C),
                (p + "attn.core", "BmmBackward0", bh, seq_len, seq_len, hs),
                (p + "attn.core", "BmmBackward0", bh, seq_len, hs, seq_len),
                (p + "attn.c_proj", mm, 1, N, C, C),
                (p + "mlp.c_fc", mm, 1, N, 4 * C, C),
                (p + "mlp.c_proj", mm, 1, N, C, 4 * C)]
    return [*out, ("lm_head", "MmBackward0", 1, N, V, C)]

