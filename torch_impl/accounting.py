"""What one training step holds and computes, measured with PyTorch's own counters. See
reference/accounting.py (bytes) and reference/flops.py (FLOPs) for the formulas.

What PyTorch does differently or hides:
- The training state is read from the real tensors. torch.optim's `state` holds Adam's
  `step` as a float32 0-dim tensor per parameter TENSOR (on the CPU unless capturable or
  fused): the per-parameter formula misses it, so it is its own term, optimizer_step.
- Activations: `saved_tensors_hooks` sees every tensor autograd packs; they are counted as
  distinct (data_ptr, nbytes), parameter storages excluded (torch_impl/recompute.py's notion).
  A checkpointed segment packs its inner saves into its own hooks, so an outer hook sees
  exactly what is HELD between forward and backward.
- FLOPs: torch.utils.flop_counter.FlopCounterMode counts, by shape, the ops in its registry
  (mm, addmm, bmm, baddbmm, convolutions, the CUDA fused attention kernels): 2 m n k each,
  and 0 for everything else (elementwise, softmax, LayerNorm, the optimizer). An attention
  kernel it does not know counts 0: on the CPU, scaled_dot_product_attention runs
  _scaled_dot_product_flash_attention_for_cpu, which is not registered, so SDPA counts 0;
  on the meta device SDPA takes the math path and its bmm's are counted. Meta tensors have
  shapes and no storage, so a model of any size is counted without allocating it.
- Phases: FlopCounterMode keeps one running total; StepMeter reads it at phase boundaries:
  the loss's forward hook ends the forward; during backward a module's forward is a
  recompute (its always_call post-hook closes it even when torch's early stop raises inside,
  NOTE [ Early stop ] in torch_impl/recompute.py); the optimizer's step hooks bound its step.
- CUDA: memory_allocated counts the caching allocator's blocks, each allocation rounded up to
  512 bytes; memory_reserved adds cached segments not handed out (the reserve); the first
  GEMM on a stream allocates cuBLAS's workspace through the same allocator and keeps it; a
  CPU `step` is not on the device. These name the gaps between a formula and the allocator.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

PER_TENSOR_STATE = ("step",)  # optimizer state entries held once per parameter tensor
CUDA_BLOCK = 512  # the caching allocator's rounding (kMinBlockSize)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (each Parameter once: tied weights count once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of the gradients present (None counts 0)."""
    return sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
               if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """State entry name -> bytes summed over parameters (tensors only)."""
    out: dict[str, int] = {}
    for entries in optimizer.state.values():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                out[name] = out.get(name, 0) + value.numel() * value.element_size()
    return out


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer,
                master: Iterable[torch.Tensor] = ()) -> dict[str, int]:
    """weights, grads, optimizer_state (per-element entries), optimizer_step (per-tensor
    entries: Adam's step), total; plus master when float32 master copies are given (a
    low-precision model whose optimizer steps the copies)."""
    entries = optimizer_state_bytes(optimizer)
    out = {"weights": parameter_bytes(model), "grads": gradient_bytes(model),
           "optimizer_state": sum(v for k, v in entries.items() if k not in PER_TENSOR_STATE),
           "optimizer_step": sum(v for k, v in entries.items() if k in PER_TENSOR_STATE)}
    copies = list(master)
    if copies:
        out["master"] = sum(t.numel() * t.element_size() for t in copies)
    out["total"] = sum(out.values())
    return out


def distinct_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of distinct (data_ptr, nbytes) among tensors: the reference's notion."""
    seen = {(t.data_ptr(), t.numel() * t.element_size()) for t in tensors if t.numel()}
    return sum(nbytes for _, nbytes in seen)


def cuda_allocated(nbytes: int) -> int:
    """What the caching allocator hands out for one request: nbytes rounded up to 512."""
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


@dataclass
class FlopCount:
    """FlopCounterMode's total split by phase."""

    forward: int = 0
    backward: int = 0
    recompute: int = 0
    optimizer: int = 0

    @property
    def total(self) -> int:
        return self.forward + self.backward + self.recompute + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {"forward": self.forward, "backward": self.backward,
                "recompute": self.recompute, "optimizer": self.optimizer, "total": self.total}


@dataclass
class Packed:
    """One tensor autograd packed: the region it was saved in and what it holds."""

    region: str  # "model", "loss", "other" (after the loss: a GradScaler's multiply)
    tensor: torch.Tensor
    is_parameter: bool


@dataclass
class StepMeter:
    """Measure one step: `with StepMeter(model, loss_fn=..., optimizer=...) as meter:` around
    the step's code. After it: `flops` (FlopCount), `held(region)` (distinct saved bytes,
    parameters excluded), `cuda` (per phase: allocated at start and end, peak, reserved; None
    off CUDA). Without a loss module, call `meter.backward_begins()` between forward and
    backward.
    """

    model: nn.Module
    loss_fn: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    device: str | torch.device = "cpu"
    flops: FlopCount = field(default_factory=FlopCount)
    packed: list[Packed] = field(default_factory=list)
    cuda: dict[str, dict[str, int]] | None = None

    def __post_init__(self) -> None:
        self._phase, self._region, self._depth, self._mark, self._at = "forward", "model", 0, 0, 0
        self._handles: list = []
        self._on_cuda = torch.device(self.device).type == "cuda"

    # -- phase bookkeeping
    def _total(self) -> int:
        return self._counter.get_total_flops()

    def _switch(self, phase: str) -> None:
        now = self._total()
        if self._phase in ("forward", "backward", "optimizer"):
            spent = now - self._at
            setattr(self.flops, self._phase, getattr(self.flops, self._phase) + spent)
        self._at = now
        self._cuda_boundary(phase)
        self._phase = phase

    def backward_begins(self) -> None:
        """Mark the end of the forward (for steps whose loss is not a module)."""
        self._region = "other"
        self._switch("backward")

    def _cuda_boundary(self, phase: str) -> None:
        if not self._on_cuda:
            return
        torch.cuda.synchronize(self.device)
        stats = {"allocated": torch.cuda.memory_allocated(self.device),
                 "peak": torch.cuda.max_memory_allocated(self.device),
                 "reserved": torch.cuda.memory_reserved(self.device)}
        assert self.cuda is not None
        if self._phase in self.cuda:
            self.cuda[self._phase].update(end=stats["allocated"], peak=stats["peak"],
                                          reserved=stats["reserved"])
        torch.cuda.reset_peak_memory_stats(self.device)
        self.cuda.setdefault(phase, {"start": stats["allocated"]})

    # -- hooks
    def _module_pre(self, module: nn.Module, args: tuple) -> None:
        if self._phase == "backward":
            if self._depth == 0:  # a module forward during backward: a recompute begins
                self._mark = self._total()
            self._depth += 1

    def _module_post(self, module: nn.Module, args: tuple, out: object) -> None:
        if self._phase == "backward":
            self._depth -= 1
            if self._depth == 0:
                spent = self._total() - self._mark
                self.flops.recompute += spent
                self.flops.backward -= spent  # it was counted inside the backward phase

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "meta":
            return t  # no storage to tell apart: a meta run counts FLOPs only
        param = t.untyped_storage().data_ptr() in self._param_storages
        self.packed.append(Packed(self._region, t, param))
        return t

    def __enter__(self) -> StepMeter:
        self._param_storages = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        self.cuda = {} if self._on_cuda else None
        for module in self.model.modules():
            self._handles.append(module.register_forward_pre_hook(self._module_pre))
            self._handles.append(module.register_forward_hook(self._module_post,
                                                              always_call=True))
        if self.loss_fn is not None:
            def loss_pre(module: nn.Module, args: tuple) -> None:
                self._region = "loss"

            def loss_post(module: nn.Module, args: tuple, out: object) -> None:
                self.backward_begins()

            self._handles.append(self.loss_fn.register_forward_pre_hook(loss_pre))
            self._handles.append(self.loss_fn.register_forward_hook(loss_post))
        if self.optimizer is not None:
            # An optimizer class whose step calls its base class's (a subclass of SGD that
            # overrides step) fires the hooks twice, nested: torch wraps each class's step
            # once it has built an instance of it. The phase is the outermost step's.
            depth = [0]

            def step_pre(*_: object) -> None:
                depth[0] += 1
                if depth[0] == 1:
                    self._switch("optimizer")

            def step_post(*_: object) -> None:
                depth[0] -= 1
                if depth[0] == 0:
                    self._switch("after")

            self._handles.append(self.optimizer.register_step_pre_hook(step_pre))
            self._handles.append(self.optimizer.register_step_post_hook(step_post))
        self._counter = FlopCounterMode(display=False)
        self._counter.__enter__()
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._saving.__enter__()
        self._cuda_boundary("forward")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._switch("after")
        finally:
            self._saving.__exit__(*exc)
            self._counter.__exit__(*exc)
            for h in self._handles:
                h.remove()
            self._handles = []
            if self.cuda is not None:
                self.cuda.pop("after", None)

    # -- results
    def held(self, *regions: str) -> int:
        """Distinct saved bytes (parameters excluded) of the regions given (all if none);
        0 on the meta device, where nothing is stored."""
        return distinct_bytes(p.tensor for p in self.packed
                              if not p.is_parameter and (not regions or p.region in regions))


@contextlib.contextmanager
def checkpointed(modules: Iterable[nn.Module], early_stop: bool = True) -> Iterator[None]:
    """Inside: each module's forward runs under torch.utils.checkpoint(use_reentrant=False)
    (whole-block recomputation of a model whose code does not checkpoint itself; the class's
    forward is wrapped on the instance and restored on exit), with torch's early stop on or
    off (set_checkpoint_early_stop: NOTE [ Early stop in the block recompute ])."""
    wrapped = list(modules)
    for m in wrapped:
        if "forward" in vars(m):
            raise ValueError(f"checkpointed: {type(m).__name__} already has an instance "
                             "forward; accepted: modules whose forward is their class's")
        m.forward = functools.partial(checkpoint, type(m).forward.__get__(m),  # type: ignore[method-assign]
                                      use_reentrant=False)
    try:
        with contextlib.nullcontext() if early_stop else set_checkpoint_early_stop(False):
            yield
    finally:
        for m in wrapped:
            vars(m).pop("forward", None)
