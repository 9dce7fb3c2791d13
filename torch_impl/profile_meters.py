"""The instruments a PhaseTimer (torch_impl/profile.py) calls at each phase boundary, with
PyTorch's own means: the bytes live by category (parameters, grads, optimizer state, the
tensors autograd saved, seen through saved_tensors_hooks; on CUDA the caching allocator's
view), the aten ops each phase dispatches, and the seeded fault of NOTE [ Honest timing ].
reference/profile_meters.py counts the same categories off the reference's tapes (NOTE [
Phase boundaries ] in reference/profile.py).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from torch_impl.accounting import cuda_allocated
from torch_impl.saved_tensors import measure_saved_tensors


# ---------------------------------------------------------------- bytes at the boundaries
class _Held:
    """What the pack hook hands autograd: the saved tensor, behind a weak-referenceable box."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class BoundaryMemory:
    """Bytes by category at every boundary (NOTE [ Phase boundaries ] in reference/profile.py)
    from the tensors themselves: parameters, grads, optimizer state, the saved tensors
    autograd still holds, the loop's batch; distinct (data_ptr, nbytes), parameter storages
    never counted as activations (accounting's notion). On CUDA also each phase's allocator
    view (`cuda`: allocated at start and end, peak, reserved) and, per boundary, the
    allocator's rounding of the storages counted. `with meter:` installs the hooks; use it as
    a PhaseTimer observer."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 device: str | torch.device = "cpu") -> None:
        self.model, self.optimizer, self.device = model, optimizer, torch.device(device)
        self.batch: tuple[torch.Tensor, ...] = ()
        self.boundaries: list[tuple[str, dict[str, int]]] = []
        self.cuda: dict[str, dict[str, int]] = {}
        self._packed: list[weakref.ref] = []
        self._hooks: Any = None

    def _pack(self, t: torch.Tensor) -> _Held:
        held = _Held(t)
        self._packed.append(weakref.ref(held))
        return held

    def __enter__(self) -> BoundaryMemory:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda h: h.tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    def saved(self) -> list[torch.Tensor]:
        """The saved tensors autograd holds now."""
        alive = [(ref, ref()) for ref in self._packed]
        self._packed = [ref for ref, held in alive if held is not None]
        return [held.tensor for _, held in alive if held is not None]

    def __call__(self, name: str, when: str) -> None:
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            torch.cuda.synchronize(self.device)
        if (name, when) == ("step", "begin"):
            self.boundaries.append(("start", self.categories()))
        elif when == "begin" and on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)  # this phase's own peak
            self.cuda[name] = {"start": torch.cuda.memory_allocated(self.device)}
        elif when == "end":
            self.boundaries.append((name, self.categories()))
            if on_cuda:
                self.cuda[name].update(end=torch.cuda.memory_allocated(self.device),
                                       peak=torch.cuda.max_memory_allocated(self.device),
                                       reserved=torch.cuda.memory_reserved(self.device))

    def categories(self) -> dict[str, int]:
        seen: set[tuple[int, int]] = set()
        storages: dict[int, int] = {}  # device storages counted: data_ptr -> allocation
        params = list(self.model.parameters())
        param_storages = {p.untyped_storage().data_ptr() for p in params}

        def take(tensors: Iterable[torch.Tensor]) -> int:
            total = 0
            for t in tensors:
                key = (t.data_ptr(), t.numel() * t.element_size())
                if key[1] and key not in seen:
                    seen.add(key)
                    total += key[1]
                    if t.device == self.device:
                        storage = t.untyped_storage()
                        storages[storage.data_ptr()] = storage.nbytes()
            return total

        state = [v for entries in self.optimizer.state.values() for v in entries.values()
                 if isinstance(v, torch.Tensor)]
        out = {"weights": take(params),
               "grads": take(p.grad for p in params if p.grad is not None),
               "optimizer state": take(state),
               "activations": take(t for t in self.saved()
                                   if t.untyped_storage().data_ptr() not in param_storages),
               "batch": take(self.batch)}
        if self.device.type == "cuda":
            out["allocator rounding"] = sum(cuda_allocated(n) - n for n in storages.values())
        return out


# ---------------------------------------------------------------- ops per phase
class OpCensus(TorchDispatchMode):
    """The aten ops each phase dispatches (what the per-op overhead is paid for); a module
    forward run during the backward is recomputation, counted apart as "recompute". `with
    census:` for the whole step; use it as a PhaseTimer observer."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.phase, self._depth, self._handles = "outside the phases", 0, []
        for module in model.modules():
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post, always_call=True))

    def _pre(self, module: nn.Module, args: tuple) -> None:
        self._depth += 1

    def _post(self, module: nn.Module, args: tuple, out: object) -> None:
        self._depth -= 1

    def __call__(self, name: str, when: str) -> None:
        if name != "step":
            self.phase = name if when == "begin" else "outside the phases"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        key = "recompute" if self.phase == "backward" and self._depth else self.phase
        self.counts[key] = self.counts.get(key, 0) + 1
        return func(*args, **(kwargs or {}))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


# ---------------------------------------------------------------- the seeded fault
@contextlib.contextmanager
def item_in_forward(model: nn.Module) -> Iterator[list[int]]:
    """A forward hook that reads one value of the output with .item() (a debug print): on
    CUDA the host waits there for every kernel queued so far (NOTE [ Honest timing ]). Yields
    the list of calls, so a caller can prove the fault ran."""
    calls: list[int] = []

    def read(module: nn.Module, args: tuple, out: torch.Tensor | tuple) -> None:
        calls.append(1)
        first = out if isinstance(out, torch.Tensor) else out[0]  # GPT: (logits, loss)
        first.detach().abs().max().item()

    handle = model.register_forward_hook(read)
    try:
        yield calls
    finally:
        handle.remove()


# ---------------------------------------------------------------- one module's saves, listed
def saved_by_module(model: nn.Module, *inputs: torch.Tensor) -> list[dict[str, Any]]:
    """Run model(*inputs) and list every tensor autograd saved (torch_impl.saved_tensors.
    measure_saved_tensors): the INNERMOST module running when it was saved (containers
    included: the attention core's matmuls, mask and softmax run in its own forward), the
    node and attribute that hold it, shape, dtype, bytes, and whether it shares a
    parameter's storage, as plain dicts."""
    return [{**asdict(s), "shape": list(s.shape)} for s in measure_saved_tensors(model, *inputs)]
