"""The tape's base classes: torch's own. See reference/module.py for the tape.

torch itself is the implementation, so each name of reference/module.py that torch has is
bound here to torch's object, in the reference's order (`torch_impl.module.Module is
torch.nn.Module`). The reference's dtype tables and input checks (FLOAT_DTYPES,
INPUT_DTYPES, check_float, check_grad) have no counterpart: torch's layers take any dtype
and its kernels raise their own errors. What PyTorch does differently or hides:
- The tape is autograd's: each op's grad_fn keeps its saved tensors (`_saved_result`,
  `_saved_self`, ...), invisible to the module that ran it, where the reference's Node keeps
  them by name. torch_impl/saved_tensors.py measures them (the counterpart of
  `Module.tape()`); torch_impl/state_mapping.py converts a state_dict, bit for bit.
- torch fires the global hooks inside `Module.__call__` (the reference's `hooked_call`
  wraps `forward` and `backward` instead: NOTE [ Hooks wrap forward and backward ]), and
  its full backward hook is registered on the autograd graph, not on a method.
- A Parameter is a Tensor (its `.grad` a Tensor too); the reference's wraps an array.
"""

from __future__ import annotations

import torch
from torch import nn

# torch's own: the twin of reference.module.Parameter
Parameter = nn.Parameter

# torch's own: the twin of reference.module.RemovableHandle
RemovableHandle = torch.utils.hooks.RemovableHandle

# torch's own: the twin of reference.module.register_module_forward_pre_hook
register_module_forward_pre_hook = nn.modules.module.register_module_forward_pre_hook

# torch's own: the twin of reference.module.register_module_forward_hook
register_module_forward_hook = nn.modules.module.register_module_forward_hook

# torch's own: the twin of reference.module.register_module_full_backward_hook
register_module_full_backward_hook = nn.modules.module.register_module_full_backward_hook

# torch's own: the twin of reference.module.hooked_call (torch runs the hooks in __call__)
hooked_call = nn.Module.__call__

# torch's own: the twin of reference.module.Node (autograd's node: a grad_fn)
Node = torch.autograd.graph.Node

# torch's own: the twin of reference.module.Module
Module = nn.Module
