"""The compact model from torch.nn modules. See reference/nn.py for the math and the tape.

The layers are torch.nn's own: each name of reference/nn.py is bound here to torch's object,
in the reference's order (`torch_impl.nn.Linear is torch.nn.Linear`), with what torch.nn
lacks written beside it: `init_linear_` (Linear's init from a given generator) and
`make_mlp` (the same structure as the reference's, the same ACTIVATIONS).

What PyTorch does differently or hides:
- Elementwise kernels use SLEEF (vectorized tanh/exp/erf) where NumPy uses its own or libm
  routines: NOTE [ GELU formulas ] in reference/nn.py. Dropout: NOTE [ Dropout mask ].
- matmul is the BLAS's, accumulating in its own order; it raises no FPU-flag warnings (the
  reference's matmul sees through the flags: NOTE [ Spurious BLAS flags ]).
- Each layer's backward is autograd's: the saved tensors are its nodes' (grad_fn
  `_saved_mat1`, `_saved_result`, ...), not a tape the layer keeps.
- nn.Dropout takes no generator: it draws from torch's default generator of the device.
- nn.Linear's constructor initializes from the global RNG. `make_mlp` builds the layers on
  the "meta" device (no draws), initializes them on the CPU from the given torch.Generator
  with torch's own init functions (no global state touched), then moves them to `device`:
  the same generator gives the same weights on every device.
- The tape's base classes are torch's too (torch_impl/module.py, the twin of
  reference/module.py); the state_dict conversion and the saved-tensor measurement are
  helpers beside them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

# torch's own: the twin of reference.nn.matmul
matmul = torch.matmul

# torch's own: the twin of reference.nn.Linear (its init from a generator: init_linear_)
Linear = nn.Linear


def init_linear_(layer: Linear, generator: torch.Generator) -> None:
    """torch's Linear.reset_parameters, drawing from `generator` instead of the global RNG."""
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    if layer.bias is not None:
        bound = 1.0 / math.sqrt(layer.in_features)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)


# torch's own: the twin of reference.nn.ReLU
ReLU = nn.ReLU

# torch's own: the twin of reference.nn.Tanh
Tanh = nn.Tanh

# torch's own: the twin of reference.nn.GELU (approximate "none" or "tanh", as there)
GELU = nn.GELU

# torch's own: the twin of reference.nn.Dropout (no generator argument: NOTE [ Dropout mask ])
Dropout = nn.Dropout

# torch's own: the twin of reference.nn.Sequential
Sequential = nn.Sequential

ACTIVATIONS = ("relu", "tanh", "gelu", "gelu_tanh")


def _activation(name: str) -> nn.Module:
    table = {"relu": ReLU, "tanh": Tanh, "gelu": GELU,
             "gelu_tanh": lambda: GELU(approximate="tanh")}
    if name not in table:
        raise ValueError(f"make_mlp: activation must be one of {ACTIVATIONS}, got {name!r}")
    return table[name]()


def make_mlp(sizes: Sequence[int], activation: str = "gelu", dropout: float = 0.0, *,
             generator: torch.Generator, dtype: torch.dtype = torch.float32,
             device: str | torch.device = "cpu") -> Sequential:
    """Sequential(Linear, act, [Dropout], ..., Linear): reference.nn.make_mlp's structure.

    `generator` is a CPU generator (the weights are drawn on the CPU, then moved). On the
    meta device nothing is drawn or allocated: shapes only (for FLOP counting).
    """
    if len(sizes) < 2:
        raise ValueError(f"make_mlp: sizes needs at least (d_in, d_out), got {tuple(sizes)}")
    _activation(activation)
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(sizes)):
        linear = Linear(d_in, d_out, device="meta", dtype=dtype)
        if torch.device(device).type != "meta":
            linear = linear.to_empty(device="cpu")
            with torch.no_grad():
                init_linear_(linear, generator)
            linear = linear.to(device)
        layers.append(linear)
        if i < len(sizes) - 2:
            layers.append(_activation(activation))
            if dropout > 0.0:
                layers.append(Dropout(dropout))
    return Sequential(*layers)
