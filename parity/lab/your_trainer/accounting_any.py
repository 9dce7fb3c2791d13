"""Memory and FLOPs of one training step of ANY nn.Module, per module path, and the structural
recognition of a GPT-2-shaped decoder (torch_impl/accounting.py measures this project's own
models; the closed forms are reference/accounting*.py's and reference/flops.py's, set beside
these measurements by parity/lab/account_any.py).

    account_module(model, example_batch, loss_fn=None, optimizer=None) -> ModuleAccount

runs one step (gradients cleared first; forward, backward, and optimizer.step() when an
optimizer is given: its state exists only after a step; the model's weights change, so pass
a copy if they matter) and reads, per module path ("" is the root):
- params, buffers: the module's own tensors (recurse=False; a parameter shared by two
  modules, a tied embedding, counts once, at the first path named_modules() lists);
- grads, optimizer_state: the same split, for the gradients and the optimizer's tensors;
- activations: what autograd packs during the forward (saved_tensors_hooks), attributed to
  the innermost module running when it is packed, each distinct (data_ptr, nbytes) counted
  once at its first saver (accounting.distinct_bytes' notion), parameters and buffers
  excluded; "(outside)" for saves made outside every module (a loss function);
- flops_forward, flops: FlopCounterMode's per-module totals (the forward; forward and
  backward), which include the module's children, as FlopCounterMode reports them. The
  forward's are exact per module; the backward's are attributed by FlopCounterMode's module
  tracker to whichever module's backward hooks are pending (on transformers' GPT-2 a p = 0
  Dropout is charged the GEMMs of the blocks before it): trust the step's total_flops, and
  the per-module forward.

The batch goes in as model(*batch) for a tuple or list, model(**batch) for a dict,
model(batch) otherwise. The loss: loss_fn(output, batch) when given; else output.loss (a
transformers ModelOutput), output itself when it is a 0-dim tensor, or the one 0-dim floating
tensor of a tuple output (this project's GPT returns (logits, loss)); anything else is a
ValueError asking for loss_fn.

# NOTE [ Recognizing a GPT-2-shaped decoder ]
gpt2_shape(model, example_batch) reads the structure only (types, shapes, attributes), never
the class names, and returns a GPT2Shape or raises NotGPT2 with the first rule broken:
  1. the blocks: the model's one nn.ModuleList of n >= 1 children of one type;
  2. a projection is a leaf with a 2-d weight: nn.Linear (weight (out, in)) or a layer with
     an `nf` attribute and weight (in, nf) (transformers' Conv1D layout); each block holds,
     in registration order, exactly [d -> 3d, d -> d, d -> f, f -> d] (fused q, k, v) or
     [d -> d, d -> d, d -> d, d -> d, d -> f, f -> d] (separate q, k, v), and two
     LayerNorm(d): nn.LayerNorm, or a leaf of a class named *LayerNorm whose only
     parameters are weight (d,) and maybe bias (d,) (nanoGPT's, over F.layer_norm);
  3. the attention module (the parent of the first projection) names its head count in
     `n_head`, `num_heads` or `num_attention_heads`, and it divides d;
  4. outside the blocks: two nn.Embedding of width d (the token table is the one with as
     many rows as the head has outputs; the other is the learned positions), one
     LayerNorm(d), one bias-free projection d -> V (the head), and no other parameter;
  5. every block's projections and LayerNorms have biases, or none has;
  6. the batch holds one 2-d integer tensor: the token ids (B, T), T at most the positions.
Refused, each by the rule it breaks: encoder-decoders and cross-attention (extra
projections), grouped-query attention (k, v narrower than d), rotary or ALiBi positions (no
position table), RMSNorm, gated MLPs (three MLP projections), untied heads with a bias,
classification heads (an extra parameter outside the blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

OUTSIDE = "(outside)"
HEAD_COUNT = ("n_head", "num_heads", "num_attention_heads")


@dataclass(frozen=True)
class SavedEntry:
    """One distinct tensor autograd packed in the forward."""

    module: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


@dataclass
class ModuleAccount:
    """Bytes and FLOPs of one step, per module path (module docstring)."""

    params: dict[str, int] = field(default_factory=dict)
    buffers: dict[str, int] = field(default_factory=dict)
    grads: dict[str, int] = field(default_factory=dict)
    optimizer_state: dict[str, int] = field(default_factory=dict)
    activations: dict[str, int] = field(default_factory=dict)
    saved: list[SavedEntry] = field(default_factory=list)
    flops_forward: dict[str, int] = field(default_factory=dict)
    flops: dict[str, int] = field(default_factory=dict)
    ops: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> aten op -> flops
    n_params: int = 0
    total_flops_forward: int = 0
    total_flops: int = 0

    def totals(self) -> dict[str, int]:
        """Bytes per category summed over modules, FLOPs of the whole step."""
        out = {k: sum(getattr(self, k).values())
               for k in ("params", "buffers", "grads", "optimizer_state", "activations")}
        return {**out, "memory": sum(out.values()), "n_params": self.n_params,
                "flops_forward": self.total_flops_forward, "flops": self.total_flops}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _owners(model: nn.Module, tensors: Callable[[nn.Module], Iterator[torch.Tensor]]
            ) -> dict[int, str]:
    """id(tensor) -> the first module path holding it (a shared tensor: once)."""
    owner: dict[int, str] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        for t in tensors(module):
            owner.setdefault(id(t), path)
    return owner


def _by_owner(pairs: Iterator[tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for path, nbytes in pairs:
        out[path] = out.get(path, 0) + nbytes
    return out


def default_loss(output: Any, batch: Any) -> torch.Tensor:
    """output.loss, a 0-dim output, or the one 0-dim float tensor of a tuple output."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    if isinstance(output, tuple | list):
        scalars = [o for o in output if isinstance(o, torch.Tensor) and o.dim() == 0
                   and o.is_floating_point()]
        if len(scalars) == 1:
            return scalars[0]
    raise ValueError(f"account_module: cannot find the loss in the model's output "
                     f"({type(output).__name__}); accepted: an output with .loss, a 0-dim "
                     "tensor, a tuple holding one, or pass loss_fn(output, batch)")


def call_model(model: nn.Module, batch: Any) -> Any:
    """model(*batch) for a tuple or list, model(**batch) for a dict, else model(batch)."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


@contextmanager
def _module_stack(model: nn.Module, stack: list[str]) -> Iterator[None]:
    """Keep `stack` the paths of the modules running now, innermost last."""
    handles = []
    for path, module in model.named_modules():
        def pre(m: nn.Module, args: tuple, path: str = path) -> None:
            stack.append(path)

        def post(m: nn.Module, args: tuple, out: Any) -> None:
            stack.pop()

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _ops_by_path(model: nn.Module, counter: FlopCounterMode) -> dict[str, dict[str, int]]:
    """FlopCounterMode's names ("GPT2LMHeadModel.transformer.h.0") as module paths, each
    with its FLOPs per aten op ("mm", "addmm", "bmm", ...)."""
    root = type(model).__name__
    out = {}
    for name, ops in counter.get_flop_counts().items():
        if name == "Global":
            continue
        path = "" if name == root else name.removeprefix(root + ".")
        out[path] = {str(op).removeprefix("aten."): n for op, n in ops.items()}
    return out


def _flops_by_path(model: nn.Module, counter: FlopCounterMode) -> dict[str, int]:
    return {p: sum(ops.values()) for p, ops in _ops_by_path(model, counter).items()}


def account_module(model: nn.Module, example_batch: Any,
                   loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                   optimizer: torch.optim.Optimizer | None = None) -> ModuleAccount:
    """One step of `model` on `example_batch`, measured per module (module docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"account_module: model must be an nn.Module, got "
                        f"{type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"account_module: optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    params = {id(p): p for p in model.parameters()}
    param_owner = _owners(model, lambda m: m.parameters(recurse=False))
    buffer_owner = _owners(model, lambda m: m.buffers(recurse=False))
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    stack: list[str] = []
    seen: dict[tuple[int, int], SavedEntry] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = (t.data_ptr(), _nbytes(t))
        if t.numel() and t.untyped_storage().data_ptr() not in fixed and key not in seen:
            seen[key] = SavedEntry(stack[-1] if stack else OUTSIDE, tuple(t.shape), t.dtype,
                                   key[1])
        return t

    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    counter = FlopCounterMode(display=False)
    with counter, _module_stack(model, stack):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = call_model(model, example_batch)
            loss = (loss_fn or default_loss)(output, example_batch)
        forward_total, forward = counter.get_total_flops(), _flops_by_path(model, counter)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
            raise ValueError("account_module: the loss must be a 0-dim tensor that requires "
                             f"grad, got {getattr(loss, 'shape', type(loss).__name__)}")
        loss.backward()
        total, both = counter.get_total_flops(), _flops_by_path(model, counter)
        ops = _ops_by_path(model, counter)
    if optimizer is not None:
        optimizer.step()  # FlopCounterMode counts no optimizer op (0 FLOPs by convention)
    state: dict[int, int] = {}
    if optimizer is not None:
        for p, entries in optimizer.state.items():
            state[id(p)] = sum(_nbytes(v) for v in entries.values()
                               if isinstance(v, torch.Tensor))
    account = ModuleAccount(
        params=_by_owner((param_owner[i], _nbytes(p)) for i, p in params.items()),
        buffers=_by_owner((buffer_owner[id(b)], _nbytes(b)) for b in model.buffers()),
        grads=_by_owner((param_owner[i], _nbytes(p.grad)) for i, p in params.items()
                        if p.grad is not None),
        optimizer_state=_by_owner((param_owner[i], n) for i, n in state.items() if i in params),
        activations=_by_owner((e.module, e.nbytes) for e in seen.values()),
        saved=list(seen.values()), flops_forward=forward, flops=both, ops=ops,
        n_params=sum(p.numel() for p in params.values()), total_flops_forward=forward_total,
        total_flops=total)
    return account


# ---------------------------------------------------------------- a GPT-2-shaped decoder
class NotGPT2(ValueError):
    """The model is not GPT-2-shaped: the message names the rule broken (NOTE [ Recognizing
    a GPT-2-shaped decoder ])."""


@dataclass(frozen=True)
class GPT2Shape:
    """What gpt2_shape read off the structure and the batch."""

    n_layer: int
    d_model: int
    n_head: int
    d_ff: int
    vocab: int
    n_positions: int
    batch: int
    seq_len: int
    tied: bool  # the head's weight IS the token table
    bias: bool
    fused_qkv: bool  # one d -> 3d projection (else q, k, v apart)
    layout: str  # "linear" (weight (out, in)) or "conv1d" (weight (in, out))
    blocks: tuple[str, ...]  # block paths
    attention: tuple[str, ...]  # each block's attention module path
    mlp_act: tuple[str, ...]  # each block's MLP activation module path (the MLP's leaf
    #                           between its two projections)
    dtype: torch.dtype  # the parameters'


def projection(module: nn.Module) -> tuple[int, int, str] | None:
    """(n_in, n_out, layout) of a projection leaf (NOTE [ Recognizing ... ] rule 2)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features, "linear"
    weight = getattr(module, "weight", None)
    nf = getattr(module, "nf", None)
    if (isinstance(weight, nn.Parameter) and weight.dim() == 2 and isinstance(nf, int)
            and weight.shape[1] == nf and next(module.children(), None) is None):
        return weight.shape[0], nf, "conv1d"
    return None


def _has_bias(module: nn.Module) -> bool:
    return getattr(module, "bias", None) is not None


def _token_shape(batch: Any) -> tuple[int, int]:
    values = (batch.values() if isinstance(batch, dict)
              else batch if isinstance(batch, tuple | list) else [batch])
    ids = [t for t in values if isinstance(t, torch.Tensor) and t.dim() == 2
           and not t.is_floating_point() and not t.is_complex()]
    if not ids:
        raise NotGPT2("rule 6: the batch holds no 2-d integer tensor of token ids")
    return int(ids[0].shape[0]), int(ids[0].shape[1])


def norm_width(m: nn.Module) -> int | None:
    """d for a LayerNorm over d features (rule 2's), else None."""
    if isinstance(m, nn.LayerNorm):
        shape = tuple(m.normalized_shape)
        return shape[0] if len(shape) == 1 else None
    if not type(m).__name__.endswith("LayerNorm") or next(m.children(), None) is not None:
        return None
    own = dict(m.named_parameters(recurse=False))
    weight = own.pop("weight", None)
    bias = own.pop("bias", None)
    if weight is None or weight.dim() != 1 or own or (
            bias is not None and bias.shape != weight.shape):
        return None
    return int(weight.shape[0])


def gpt2_shape(model: nn.Module, example_batch: Any) -> GPT2Shape:
    """The decoder's shape, or NotGPT2 (NOTE [ Recognizing a GPT-2-shaped decoder ])."""
    lists = [(p, m) for p, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if len(lists) != 1 or len(lists[0][1]) == 0:
        raise NotGPT2(f"rule 1: {len(lists)} nn.ModuleList(s); a GPT-2 decoder has one, "
                      "of its blocks")
    list_path, blocks = lists[0]
    if len({type(b) for b in blocks}) != 1:
        raise NotGPT2("rule 1: the blocks are not all of one type")
    first = list(blocks[0].named_modules())
    projs = [(p, projection(m)) for p, m in first if projection(m) is not None]
    norms = [m for _, m in first if norm_width(m) is not None]
    if not projs:
        raise NotGPT2("rule 2: block 0 holds no projection (nn.Linear or Conv1D layout)")
    d = projs[0][1][0]  # type: ignore[index]
    shapes = [(i, o) for _, (i, o, _) in projs]  # type: ignore[misc]
    f = shapes[-1][0]
    fused = [(d, 3 * d), (d, d), (d, f), (f, d)]
    apart = [(d, d), (d, d), (d, d), (d, d), (d, f), (f, d)]
    if shapes not in (fused, apart):
        raise NotGPT2(f"rule 2: block 0's projections are {shapes}; accepted {fused} (fused "
                      f"q, k, v) or {apart} (q, k, v apart)")
    if len(norms) != 2 or any(norm_width(n) != d for n in norms):
        raise NotGPT2(f"rule 2: block 0 holds {len(norms)} LayerNorm(s); accepted: two of "
                      f"width {d}")
    attn_path = projs[0][0].rpartition(".")[0]
    attn = blocks[0].get_submodule(attn_path)
    heads = [getattr(attn, k) for k in HEAD_COUNT if isinstance(getattr(attn, k, None), int)]
    if not heads or d % heads[0]:
        raise NotGPT2(f"rule 3: the attention module {attn_path!r} names no head count "
                      f"({', '.join(HEAD_COUNT)}) dividing {d}")
    mlp_path = projs[-1][0].rpartition(".")[0]
    mlp = blocks[0].get_submodule(mlp_path) if mlp_path else blocks[0]
    acts = [p for p, m in mlp.named_modules() if p and next(m.children(), None) is None
            and projection(m) is None and not isinstance(m, nn.Dropout)]
    if len(acts) != 1:
        raise NotGPT2(f"rule 2: the MLP {mlp_path!r} holds {len(acts)} activation module(s); "
                      "accepted: one")
    in_blocks = {id(p) for p in blocks.parameters()}
    outside = [(p, m) for p, m in model.named_modules()
               if not p.startswith(list_path + ".") and p != list_path
               and any(True for _ in m.parameters(recurse=False))]
    embeddings = [m for _, m in outside if isinstance(m, nn.Embedding)]
    final_norms = [m for _, m in outside if norm_width(m) is not None]
    heads_out = [(p, m) for p, m in outside if projection(m) is not None]
    others = [p for p, m in outside if not isinstance(m, nn.Embedding) and norm_width(m) is None
              and projection(m) is None]
    if (len(embeddings) != 2 or any(e.embedding_dim != d for e in embeddings)
            or len(final_norms) != 1 or len(heads_out) != 1 or others
            or any(id(p) in in_blocks for _, m in outside for p in m.parameters(False))):
        raise NotGPT2(f"rule 4: outside the blocks: {len(embeddings)} embedding(s), "
                      f"{len(final_norms)} LayerNorm(s), {len(heads_out)} head(s), other "
                      f"parameters in {others}; accepted: two nn.Embedding of width {d}, one "
                      "LayerNorm, one head")
    head = heads_out[0][1]
    n_in, vocab, _ = projection(head)  # type: ignore[misc]
    tokens = [e for e in embeddings if e.num_embeddings == vocab]
    if n_in != d or not tokens or _has_bias(head):
        raise NotGPT2(f"rule 4: the head is {n_in} -> {vocab}; accepted: a bias-free "
                      f"{d} -> V with V the rows of one embedding")
    positions = embeddings[1] if embeddings[0] is tokens[0] else embeddings[0]
    modules = [m for b in blocks for m in b.modules()
               if projection(m) is not None or norm_width(m) is not None] + final_norms
    biases = {_has_bias(m) for m in modules}
    if len(biases) != 1:
        raise NotGPT2("rule 5: some projections or LayerNorms have biases, others not")
    batch, seq_len = _token_shape(example_batch)
    if seq_len > positions.num_embeddings:
        raise NotGPT2(f"rule 6: the batch's {seq_len} tokens exceed the "
                      f"{positions.num_embeddings} positions")
    layouts = {projection(m)[2] for m in modules if projection(m) is not None}  # type: ignore[index]
    prefix = f"{list_path}." if list_path else ""
    return GPT2Shape(
        n_layer=len(blocks), d_model=d, n_head=heads[0], d_ff=f, vocab=vocab,
        n_positions=positions.num_embeddings, batch=batch, seq_len=seq_len,
        tied=head.weight is tokens[0].weight, bias=biases.pop(), fused_qkv=shapes == fused,
        layout="conv1d" if layouts == {"conv1d"} else "linear",
        blocks=tuple(f"{prefix}{i}" for i in range(len(blocks))),
        attention=tuple(f"{prefix}{i}.{attn_path}" for i in range(len(blocks))),
        mlp_act=tuple(f"{prefix}{i}.{mlp_path + '.' if mlp_path else ''}{acts[0]}"
                      for i in range(len(blocks))),
        dtype=head.weight.dtype)
