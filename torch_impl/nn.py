"""The compact model from torch.nn modules. See reference/nn.py for the math and the tape.

What PyTorch does differently or hides:
- The tape is autograd's: each op's grad_fn keeps its saved tensors (`_saved_result`,
  `_saved_self`, ...). `measure_saved_tensors` observes them with
  `torch.autograd.graph.saved_tensors_hooks` and attributes each to the module whose
  forward was running. Linear saves its input as addmm's mat1, flattened to (N, in), AND the
  weight (mat2 = weight.t(), a view of the parameter: flagged `is_parameter`, no new bytes).
  CrossEntropyLoss saves the log-probabilities twice (log_softmax's result and nll_loss's
  self, one storage) plus the int64 target and a 0-dim total_weight.
- Elementwise kernels use SLEEF (vectorized tanh/exp/erf) where NumPy uses its own or libm
  routines: NOTE [ GELU formulas ] in reference/nn.py. Dropout: NOTE [ Dropout mask ].
- nn.Linear's constructor initializes from the global RNG. `make_mlp` builds the layers on
  the "meta" device (no draws), then initializes them from the given torch.Generator with
  torch's own init functions, so no global state is touched.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

ACTIVATIONS = ("relu", "tanh", "gelu", "gelu_tanh")


def _activation(name: str) -> nn.Module:
    table = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU,
             "gelu_tanh": lambda: nn.GELU(approximate="tanh")}
    if name not in table:
        raise ValueError(f"make_mlp: activation must be one of {ACTIVATIONS}, got {name!r}")
    return table[name]()


def init_linear_(layer: nn.Linear, generator: torch.Generator) -> None:
    """torch's Linear.reset_parameters, drawing from `generator` instead of the global RNG."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    if layer.bias is not None:
        bound = 1.0 / math.sqrt(layer.in_features)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)


def make_mlp(sizes: Sequence[int], activation: str = "gelu", dropout: float = 0.0, *,
             generator: torch.Generator, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> nn.Sequential:
    """Sequential(Linear, act, [Dropout], ..., Linear): reference.nn.make_mlp's structure."""
    if len(sizes) < 2:
        raise ValueError(f"make_mlp: sizes needs at least (d_in, d_out), got {tuple(sizes)}")
    _activation(activation)
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(sizes)):
        linear = nn.Linear(d_in, d_out, device="meta", dtype=dtype).to_empty(device=device)
        with torch.no_grad():
            init_linear_(linear, generator)
        layers.append(linear)
        if i < len(sizes) - 2:
            layers.append(_activation(activation))
            if dropout > 0.0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


# -- lossless weight conversion: same keys, same layouts ((out, in) weights), same bits
def state_dict_to_torch(ref_state: Mapping[str, np.ndarray],
                        device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A reference state_dict as torch tensors (copies; bit-exact; keys unchanged)."""
    return {k: torch.from_numpy(np.array(v, copy=True)).to(device) for k, v in ref_state.items()}


def state_dict_from_torch(torch_state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A torch state_dict as NumPy arrays (copies; bit-exact; keys unchanged)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in torch_state.items()}


# -- what autograd keeps for backward
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


def _saved_names(grad_fn: object, stop: set[object]) -> dict[tuple[int, tuple], str]:
    """(data_ptr, shape) -> "Node._saved_x" for the nodes a module's forward created."""
    names: dict[tuple[int, tuple], str] = {}
    todo, seen = [grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in stop or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if attr.startswith("_saved_"):
                value = getattr(node, attr)
                if isinstance(value, torch.Tensor):
                    key = (value.data_ptr(), tuple(value.shape))
                    names.setdefault(key, f"{node.name()}.{attr}")
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def measure_saved_tensors(model: nn.Module, *inputs: torch.Tensor) -> list[SavedTensor]:
    """Run model(*inputs) and list every tensor autograd saved, attributed to leaf modules.

    The pack hook of `saved_tensors_hooks` sees each saved tensor as it is saved; forward
    pre/post hooks keep track of which (innermost) module is running. Names come from
    walking that module's new grad_fn nodes. Tensors sharing storage with a parameter are
    flagged `is_parameter` (torch holds a view of the weight; the reference reads it instead).
    """
    stack: list[str] = []
    packed: list[tuple[str, torch.Tensor]] = []
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    outputs: dict[str, tuple[object, set[object]]] = {}
    handles = []
    for path, module in model.named_modules():
        if next(module.children(), None) is not None:
            continue  # containers: their leaves get the tensors

        def pre(mod: nn.Module, args: tuple, path: str = path) -> None:
            stack.append(path)

        def post(mod: nn.Module, args: tuple, out: torch.Tensor, path: str = path) -> None:
            stack.pop()
            stop = {a.grad_fn for a in args if isinstance(a, torch.Tensor)}
            outputs[path] = (out.grad_fn, stop)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append((stack[-1] if stack else "", t))
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    names: dict[str, dict[tuple[int, tuple], str]] = {
        path: _saved_names(fn, stop) for path, (fn, stop) in outputs.items()}
    result = []
    for path, t in packed:
        name = names.get(path, {}).get((t.data_ptr(), tuple(t.shape)), "?")
        result.append(SavedTensor(path, name, tuple(t.shape), _dtype_name(t.dtype),
                                  t.numel() * t.element_size(),
                                  t.untyped_storage().data_ptr() in param_ptrs))
    return result
