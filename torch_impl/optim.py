"""The optimizers: torch.optim's own. See reference/optim.py for the math, rounding for rounding.

torch itself is the implementation, so each name of reference/optim.py is bound here to
torch's object, in the reference's order: `torch_impl.optim.AdamW is torch.optim.AdamW`.
What PyTorch does differently or hides:
- The step is a C++ kernel chosen at run time: the for-loop kernels on CPU (the path the
  reference models), `foreach` (one multi-tensor kernel per op, torch's default on CUDA) or
  `fused` (one kernel for the whole step). The math is the same; the rounding is the
  kernel's. On AVX2/AVX512 builds the CPU kernels fuse a * b + c into one rounding (NOTE
  [ FMA in torch's CPU kernels ] in reference/fma.py); the reference's `fma=` says which.
- Every Python float hyperparameter reaches the kernel cast to the parameter's dtype (NOTE
  [ Scalars are cast to the dtype ] in reference/optim.py).
- Adam's square root is MKL VML's on MKL builds, not IEEE's (NOTE [ torch's CPU sqrt is
  MKL's ]): the reference's Adam takes the sqrt as a parameter.
- AdamW is Adam with `decoupled_weight_decay=True` in torch 2.11.0 and 2.13.0 (its groups
  record the flag), its own class in torch 2.6.0.
- The state_dict's shape (kernel switches, version-dependent keys) differs from the
  reference's; torch_impl/state_mapping.py converts it both ways, bit for bit.
The LR schedules are torch.optim.lr_scheduler's, twins of reference/lr_scheduler.py.
"""

from __future__ import annotations

import torch

# torch's own: the twin of reference.optim.Optimizer (param_groups, state, state_dict)
Optimizer = torch.optim.Optimizer

# torch's own: the twin of reference.optim.SGD
SGD = torch.optim.SGD

# torch's own: the twin of reference.optim.Adam
Adam = torch.optim.Adam

# torch's own: the twin of reference.optim.AdamW
AdamW = torch.optim.AdamW
