"""The compact transformer from torch.nn modules. See reference/gpt.py for the math and the tape.

Same classes, names, parameter layouts and statement order as the reference (nanoGPT's
names, so state_dicts convert losslessly with torch_impl.state_mapping's functions). GPTConfig is
the reference's dataclass (plain data). What PyTorch does differently or hides:
- The tape is autograd's. The explicit attention path is written as matmul, a multiplication
  by a Python float, masked_fill and softmax, so saved_tensors_hooks and FlopCounterMode see
  each op; torch's matmul reshapes the strided q, k^T and v into (B nh, T, d) copies before
  its bmm (the reference mirrors those copies).
- attention="sdpa" calls F.scaled_dot_product_attention(is_causal=True) inside the same
  `core` module: a fused kernel that keeps other tensors (on CPU the flash-attention kernel
  saves q, k, v, the output and a log-sum-exp, not the (T, T) probabilities). Its parity and
  its saved-tensor and FLOP differences are separate claims (parity/claims/gpt.py).
- nn.Dropout draws from the device's default generator (NOTE [ Dropout mask ]); sdpa's
  dropout draws differently again, so sdpa is compared with dropout off.
- Initialization: the modules are built on the meta device, materialized on the CPU, drawn
  from the given torch.Generator with GPT-2's init (reference/gpt.py), then moved.
- The causal mask is built for each sequence length in the attention core's forward, as in
  the reference: no buffer, nothing in the state_dict.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from common.gpt_config import GPTConfig  # plain data: the shared config
from torch_impl.attention import CausalSelfAttention
from torch_impl.recompute import Schedule, forward_with_schedule
from torch_impl.saved_tensors import SavedTensor, saved_during


class MLP(nn.Module):
    """dropout(c_proj(gelu(c_fc(x)))), C -> 4C -> C, GPT-2's tanh-approximated GELU."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        C = config.n_embd
        self.c_fc = nn.Linear(C, 4 * C, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * C, C, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)): one checkpointable segment."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _init_gpt_(model: GPT, generator: torch.Generator) -> None:
    """GPT-2's init in the reference's order of draws (module order), from `generator`."""
    n_layer = model.config.n_layer
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02, generator=generator)
        elif isinstance(module, nn.Linear):
            if name == "lm_head" and model.config.tie_weights:
                continue
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj") else 0.02
            nn.init.normal_(module.weight, 0.0, std, generator=generator)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def empty_embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """nn.Embedding with its weight allocated and not initialized, on the current default
    device: under the meta device, Embedding's own init (`normal_`) runs torch's Python
    decomposition of it, about 0.95 s the first time in a process, for weights that
    `_init_gpt_` draws anyway."""
    return nn.Embedding(num_embeddings, embedding_dim,
                        _weight=torch.empty(num_embeddings, embedding_dim))


class GPT(nn.Module):
    """The model: `logits, loss = model(idx, targets)`, then `loss.backward()`."""

    def __init__(self, config: GPTConfig, *, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
                 ) -> None:
        super().__init__()
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"GPT: dtype must be float32 or float64, got {dtype}")
        self.config = config
        with torch.device("meta"):
            self.transformer = nn.ModuleDict(dict(
                wte=empty_embedding(config.vocab_size, config.n_embd),
                wpe=empty_embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.to_empty(device="cpu")
        self.to(dtype)
        for module in self.modules():  # what to_empty left unset: LayerNorm
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        with torch.no_grad():
            _init_gpt_(self, generator)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.to(device)
        # per-block checkpointing (torch_impl/recompute_gpt.py sets it): the blocks run as
        # the layers of this schedule's plan, through torch.utils.checkpoint
        self.schedule: Schedule | None = None

    def check_tokens(self, idx: torch.Tensor, what: str = "idx") -> torch.Tensor:
        """idx as int64 (B, T) tokens in [0, vocab_size) with 1 <= T <= block_size.

        Under torch.compile the range check is an assertion in the graph (NOTE [ The token
        check compiles ] in torch_impl/compile.py): the dtype and shape checks become
        guards, the range cannot be read as Python numbers without breaking the graph."""
        cfg = self.config
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64:
            raise TypeError(f"GPT: {what} must be int64 token ids, got "
                            f"{getattr(idx, 'dtype', type(idx).__name__)}")
        if idx.dim() != 2 or not 1 <= idx.size(1) <= cfg.block_size or idx.size(0) < 1:
            raise ValueError(f"GPT: {what} must have shape (B, T) with B >= 1 and "
                             f"1 <= T <= block_size={cfg.block_size}, got {tuple(idx.shape)}")
        if torch.compiler.is_compiling():
            torch._assert_async(((idx >= 0) & (idx < cfg.vocab_size)).all(),
                                f"GPT: {what} token ids must lie in [0, vocab_size="
                                f"{cfg.vocab_size})")
            return idx
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(f"GPT: {what} token ids must lie in [0, vocab_size="
                             f"{cfg.vocab_size}), got [{lo}, {hi}]")
        return idx

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        idx = self.check_tokens(idx)
        B, T = idx.size()  # batch, time
        tr = self.transformer
        pos = torch.arange(T, dtype=torch.int64, device=idx.device)  # (T,)
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))  # (B, T, C)
        if self.schedule is None:
            for block in tr.h:
                x = block(x)
        else:  # the blocks as the layers of a plan
            x = forward_with_schedule(tr.h, x, self.schedule)
        logits = self.lm_head(tr.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        targets = self.check_tokens(targets, "targets")
        if targets.shape != idx.shape:
            raise ValueError(f"GPT: targets must have idx's shape {tuple(idx.shape)}, "
                             f"got {tuple(targets.shape)}")
        loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss


# -- what autograd saves: the twin of the reference's GPT.tape() and GPT.held_bytes()
def measure_saved(model: GPT, idx: torch.Tensor, targets: torch.Tensor | None = None
                  ) -> tuple[list[SavedTensor], int]:
    """Run model(idx, targets) under saved_tensors_hooks (torch_impl.saved_tensors.saved_during):
    every tensor autograd saved, parameters excluded, as SavedTensor(innermost module path,
    "Node.attr", shape, dtype, bytes), and the bytes held: the DISTINCT storages those
    tensors live in, each counted once at its full size (a view saves no bytes of its own)."""
    _, saved = saved_during(model, idx, targets)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    entries, storages = [], {}
    for path, name, t in saved:
        storage = t.untyped_storage()
        if storage.data_ptr() in param_ptrs:
            continue
        storages[storage.data_ptr()] = storage.nbytes()
        entries.append(SavedTensor(path, name, tuple(t.shape),
                                   str(t.dtype).removeprefix("torch."),
                                   t.numel() * t.element_size()))
    return entries, sum(storages.values())
