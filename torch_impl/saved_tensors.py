"""The saved-tensor measurement: what autograd saved during a forward, named and attributed.

Not half of a twin: the tape itself is autograd's (torch_impl/module.py binds the twins of
reference/module.py's Node and Module to torch's own), and this module observes it, the
measurement every comparison with the reference's `Module.tape()` reads. Each op's grad_fn
keeps its saved tensors (`_saved_result`, `_saved_self`, ...), invisible to the module.
`saved_during` observes them with `torch.autograd.graph.saved_tensors_hooks`, attributes
each to the innermost module whose forward was running and names it by the node that holds
it (`AddmmBackward0.mat1`: grad_fn attribute `_saved_mat1`); `measure_saved_tensors` lists
them as the reference's tape lists its entries (SavedTensor: the same fields). Linear saves
its input as addmm's mat1, flattened to (N, in), AND the weight (mat2 = weight.t(), a view
of the parameter: flagged `is_parameter`, no new bytes). CrossEntropyLoss saves the
log-probabilities twice (log_softmax's result and nll_loss's self, one storage) plus the
int64 target and a 0-dim total_weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SavedTensor:
    """One saved tensor as autograd packs it: module path, name, shape, dtype, bytes."""

    module: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    is_parameter: bool = False


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def saved_key(t: torch.Tensor) -> tuple:
    """A saved tensor's layout (pointer, shape, stride, dtype): reading `node._saved_x` gives
    a new Python object each time, so saved tensors are matched by layout, not identity."""
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype


def saved_tensor_names(*roots: object) -> dict[tuple, list[str]]:
    """saved_key -> ["NodeBackward0.attr", ...] for every tensor saved by a node of the graph
    under `roots` (grad_fns; None is skipped), nodes in the order they were created (autograd's
    sequence number), which is the order their tensors were packed. A tensor saved by several
    nodes (cross-entropy's log-probabilities: log_softmax's result, then nll_loss's self) has
    several names, so whoever lists the saves in packing order takes them front first."""
    nodes, todo, seen = [], list(roots), set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    names: dict[tuple, list[str]] = {}
    for node in sorted(nodes, key=lambda n: n._sequence_nr()):
        for attr in dir(node):
            if attr.startswith("_saved_"):
                value = getattr(node, attr)
                if isinstance(value, torch.Tensor):
                    names.setdefault(saved_key(value), []).append(
                        f"{node.name()}.{attr.removeprefix('_saved_')}")
    return names


def _tensors(out: object) -> list[torch.Tensor]:
    """The tensors in a forward's output: a tensor, or a (nested) tuple/list of them."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _tensors(item)]
    return []


def saved_during(model: nn.Module, *inputs: torch.Tensor
                 ) -> tuple[object, list[tuple[str, str, torch.Tensor]]]:
    """Run model(*inputs): its output, and every tensor autograd saved, in the order it was
    saved, as (INNERMOST module running when it was saved, "NodeBackward0.attr", the tensor).

    The pack hook of `saved_tensors_hooks` sees each saved tensor as it is saved; forward
    pre/post hooks on every module (containers too: the attention core's matmuls, mask and
    softmax run in its own forward, between its children) keep the stack of running
    modules; saves made outside every module's forward belong to the root, path "". Names
    come from one walk of the whole graph behind the outputs (`saved_tensor_names`), matched
    by layout, a tensor saved by several nodes taking their names in packing order. The one
    walk every saved-tensor count uses (measure_saved_tensors, GPT's measure_saved, the
    profile's saved_by_module); the tensors themselves let a caller count storages.
    """
    stack: list[str] = []
    packed: list[tuple[str, torch.Tensor]] = []
    handles = []

    def leave(mod: nn.Module, args: tuple, out: object) -> None:
        stack.pop()

    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(
            lambda mod, args, path=path: stack.append(path)))
        handles.append(module.register_forward_hook(leave, always_call=True))

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append((stack[-1] if stack else "", t))
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(*inputs)
    finally:
        for h in handles:
            h.remove()
    names = saved_tensor_names(*(t.grad_fn for t in _tensors(out)))
    saved = []
    for path, t in packed:
        found = names.get(saved_key(t))
        saved.append((path, found.pop(0) if found else "?", t))
    return out, saved


def measure_saved_tensors(model: nn.Module, *inputs: torch.Tensor) -> list[SavedTensor]:
    """Run model(*inputs) and list every tensor autograd saved, in the order it was saved,
    attributed to the INNERMOST module running when it was saved (saved_during). Tensors
    sharing storage with a parameter are flagged `is_parameter` (torch holds a view of the
    weight; the reference reads it instead)."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return [SavedTensor(path, name, tuple(t.shape), _dtype_name(t.dtype),
                        t.numel() * t.element_size(),
                        t.untyped_storage().data_ptr() in param_ptrs)
            for path, name, t in saved_during(model, *inputs)[1]]
