"""The compact model from torch.nn modules. See reference/nn.py for the math and the tape.

The layers are torch.nn's own; this file holds only what the reference's nn.py has and
torch.nn lacks, in the reference's order:

    reference/nn.py               here (torch)
    Linear (its initialization)   init_linear_: nn.Linear's init, from a given generator
    ReLU, Tanh, GELU, Dropout     nn.ReLU, nn.Tanh, nn.GELU, nn.Dropout (no code here)
    Sequential                    nn.Sequential
    ACTIVATIONS, make_mlp         ACTIVATIONS, make_mlp (same names, same structure)

What PyTorch does differently or hides:
- Elementwise kernels use SLEEF (vectorized tanh/exp/erf) where NumPy uses its own or libm
  routines: NOTE [ GELU formulas ] in reference/nn.py. Dropout: NOTE [ Dropout mask ].
- nn.Dropout takes no generator: it draws from torch's default generator of the device.
- nn.Linear's constructor initializes from the global RNG. `make_mlp` builds the layers on
  the "meta" device (no draws), initializes them on the CPU from the given torch.Generator
  with torch's own init functions (no global state touched), then moves them to `device`:
  the same generator gives the same weights on every device.
- The tape (autograd's saved tensors) and the state_dict conversion are in
  torch_impl/module.py, the twin of reference/module.py (re-exported here).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

from torch_impl.module import (  # noqa: F401  (re-exported: the old import path)
    SavedTensor,
    measure_saved_tensors,
    state_dict_from_torch,
    state_dict_to_torch,
)


def init_linear_(layer: nn.Linear, generator: torch.Generator) -> None:
    """torch's Linear.reset_parameters, drawing from `generator` instead of the global RNG."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    if layer.bias is not None:
        bound = 1.0 / math.sqrt(layer.in_features)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)


ACTIVATIONS = ("relu", "tanh", "gelu", "gelu_tanh")


def _activation(name: str) -> nn.Module:
    table = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU,
             "gelu_tanh": lambda: nn.GELU(approximate="tanh")}
    if name not in table:
        raise ValueError(f"make_mlp: activation must be one of {ACTIVATIONS}, got {name!r}")
    return table[name]()


def make_mlp(sizes: Sequence[int], activation: str = "gelu", dropout: float = 0.0, *,
             generator: torch.Generator, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> nn.Sequential:
    """Sequential(Linear, act, [Dropout], ..., Linear): reference.nn.make_mlp's structure.

    `generator` is a CPU generator (the weights are drawn on the CPU, then moved). On the
    meta device nothing is drawn or allocated: shapes only (for FLOP counting).
    """
    if len(sizes) < 2:
        raise ValueError(f"make_mlp: sizes needs at least (d_in, d_out), got {tuple(sizes)}")
    _activation(activation)
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(sizes)):
        linear = nn.Linear(d_in, d_out, device="meta", dtype=dtype)
        if torch.device(device).type != "meta":
            linear = linear.to_empty(device="cpu")
            with torch.no_grad():
                init_linear_(linear, generator)
            linear = linear.to(device)
        layers.append(linear)
        if i < len(sizes) - 2:
            layers.append(_activation(activation))
            if dropout > 0.0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)
