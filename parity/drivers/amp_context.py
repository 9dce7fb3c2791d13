"""Autocast as a context in both trees: the state it leaves, and what the tape holds under it.

`nested_states` reads both trees' autocast state through the same nest of contexts (claim
amp.state); `saved_signatures` lists, module by module, what the reference's tape and torch's
saved_tensors_hooks hold after one forward of the compact model under autocast (claim
amp.saved_bytes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import torch

from reference import amp as ramp
from reference import nn as rnn
from torch_impl import nn as tnn
from torch_impl import saved_tensors as tsaved
from torch_impl.format_spec import DTYPES as TORCH_DTYPES


# -- what the tape holds under autocast
def saved_signatures(sizes: tuple[int, ...], activation: str, dropout: float, fmt: str,
                     batch: int, device: str = "cpu") -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(module path, reference signature, torch signature) of what each module of make_mlp
    saves during one forward under fmt autocast: the reference's tape against what
    saved_tensors_hooks see torch save (parameter views excluded; under autocast the lp
    weight casts are new tensors, counted on both sides). Dropout only on the CPU, whose
    kernel saves its mask in the input dtype (CUDA's fused kernel saves a bool mask)."""
    from parity.drivers.nn import saved_signature

    model = rnn.make_mlp(sizes, activation, dropout, rng=np.random.default_rng(0))
    twin = tnn.make_mlp(sizes, activation, dropout, generator=torch.Generator().manual_seed(0),
                        device=device)
    x = np.random.default_rng(1).standard_normal((batch, sizes[0])).astype(np.float32)
    with ramp.autocast(fmt):
        model.forward(x)
    tx = torch.from_numpy(x).to(device).requires_grad_()
    with torch.random.fork_rng(devices=[] if device == "cpu" else None):
        torch.manual_seed(0)
        with torch.autocast(torch.device(device).type, dtype=TORCH_DTYPES[fmt]):
            theirs = [s for s in tsaved.measure_saved_tensors(twin, tx) if not s.is_parameter]
    return [(path, saved_signature([s for s in model.tape() if s.module == path]),
             saved_signature([s for s in theirs if s.module == path]))
            for path, _ in model.named_modules()]


# -- the state
def nested_states(contexts: list[tuple[str | None, bool]], device: str = "cpu"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(reference, torch) rows [enabled, enabled in float16] read after entering each of the
    nested contexts (dtype, enabled) for `device`'s type in turn, and once more after
    leaving them all."""
    kind = torch.device(device).type
    from torch_impl import amp as tamp

    def states(enter: Callable, read: Callable) -> np.ndarray:
        seen = []
        with contextlib.ExitStack() as stack:
            for dtype, enabled in contexts:
                stack.enter_context(enter(dtype, enabled))
                seen.append(read())
        seen.append(read())
        return np.array([[s.enabled, s.enabled and s.dtype == "float16"] for s in seen])

    return (states(lambda d, e: ramp.autocast(d, kind, enabled=e), ramp.autocast_state),
            states(lambda d, e: tamp.autocast(TORCH_DTYPES[d] if d else None, kind, enabled=e),
                   lambda: tamp.autocast_state(kind)))
