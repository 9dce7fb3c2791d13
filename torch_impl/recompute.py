"""Activation checkpointing with torch.utils.checkpoint. See reference/recompute.py for the math.

The two files read in parallel: a plan (torch_impl/recompute_plans.py, re-exported here) is
run item by item, a Segment through `checkpoint`, then `forward_with_schedule`,
`checkpoint` and `checkpoint_sequential` with the reference's names and arguments. Where
they differ, because autograd does the backward:
- The reference returns a `ScheduledRun` whose backward recomputes and whose tape is the
  memory measurement; here forward_with_schedule returns the output tensor, autograd's
  backward recomputes, and `measure` (the last section) observes the same quantities with
  hooks: saved_tensors_hooks for held bytes, forward pre-/post-hooks for recompute counts.
  So the reference's `track_peak` switch has no twin here, and torch's `use_reentrant`
  (the older variant, below) none there.

What PyTorch does differently or hides:
- `checkpoint(fn, x, use_reentrant=False)` (used here, explicitly) stashes the segment's
  inputs and runs the segment under its own `saved_tensors_hooks`, which keep a placeholder
  instead of each tensor; an OUTER `saved_tensors_hooks` therefore sees exactly what the
  region keeps: its input. Version-gated (CHECKPOINT_PACKS_DUMMY): torch < 2.12 saves the
  inputs through a no-op autograd Function (`_NoopSaveInputs`) whose first input is a
  0-element dummy, which the outer hook also sees packed (0 bytes); torch >= 2.12 (pytorch
  PR 174327) saves them as SavedTensors directly, with no dummy. Backward recomputes on the
  first unpack of a placeholder.
- Early stop (NOTE [ Early stop ]): the non-reentrant recompute raises an internal exception
  as soon as it has re-saved as many tensors as the forward saved, so a segment's last layer
  starts (its forward pre-hook fires) but never returns (its forward hook does not), and
  trailing layers that save nothing are not run at all. forward_with_schedule's `early_stop`
  wraps the forward in set_checkpoint_early_stop(early_stop), which every checkpoint frame
  reads when created (so the argument overrides an enclosing set_checkpoint_early_stop).
- `use_reentrant=True` is the older autograd.Function that runs the segment under no_grad and
  re-enters autograd (`torch.autograd.backward`) inside its own backward: no early stop, no
  nesting of schedules' inner checkpoints into the outer graph, and if no input requires grad
  its output does not either, so the parameters inside get NO gradient (torch only warns
  "None of the inputs have requires_grad=True"). Non-reentrant has none of these traps.
- The RNG replay (NOTE [ RNG replay ] in reference/recompute.py) stashes the global CPU RNG
  and the RNG of each CUDA device the segment's inputs live on, and runs the recompute inside
  `fork_rng` with them; nn.Dropout draws from the generator of its input's device.
- NOTE [ Dropout's saved mask by device ]: on CPU, nn.Dropout multiplies by a float noise
  tensor and saves it (the reference's "mask", in the input dtype); on CUDA (and XPU) it runs
  the fused native_dropout kernel, which saves a torch.bool mask, 1 byte per element
  (ATen's is_fused_kernel_acceptable). The held bytes differ by exactly that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint
from torch.utils.checkpoint import checkpoint_sequential as torch_checkpoint_sequential
from torch.utils.checkpoint import set_checkpoint_early_stop

from common.recompute_plans import SPECS, Schedule, Segment, uniform_plan
from torch_impl import amp
from torch_impl.recompute_plans import parse_schedule, revolve_plan, revolve_split

__all__ = ["CHECKPOINT_PACKS_DUMMY", "SPECS", "Measurement", "Schedule", "Segment", "checkpoint",
           "checkpoint_sequential", "dropout_saves_bool_mask", "forward_with_schedule",
           "measure", "parse_schedule", "revolve_plan", "revolve_split", "uniform_plan"]


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


# torch.utils.checkpoint._NoopSaveInputs exists in 2.6.0 and 2.11.0, not in 2.12.0, 2.12.1
# and 2.13.0 (measured)
CHECKPOINT_PACKS_DUMMY = _torch_version() < (2, 12)


def dropout_saves_bool_mask(device: torch.device | str) -> bool:
    """NOTE [ Dropout's saved mask by device ]: True where nn.Dropout saves a bool mask."""
    return torch.device(device).type in ("cuda", "xpu")


# NOTE [ Early stop ]
# torch.utils.checkpoint (non-reentrant) counts the tensors a segment saved in forward; in the
# recompute, once that many are saved again it raises _StopRecomputationError from inside the
# pack hook, abandoning the rest of the forward. The segment's last saving layer is interrupted
# in the middle (after its saves: for Linear, before the matmul even runs, because addmm saves
# its inputs first), so counting layer forwards by forward hooks (post) misses one per
# recompute, while forward pre-hooks count every layer started. When the last save is a nested
# checkpoint's input (its trailing layers saved nothing), the stop comes as that input is
# saved, before any layer of the nested segment starts. The reference recompute runs
# whole layers and also stops after the last layer that saves (early_stop=True), so its counts
# equal torch's pre-hook counts. torch.utils.checkpoint.set_checkpoint_early_stop(False) turns
# it off: then post-hook counts equal pre-hook counts. Either way the recompute starts at the
# first unpack of a tensor the segment saved, so a segment that saved nothing (an eval-mode
# Dropout alone) is never recomputed; the reference skips such a segment too.
def _run_plan(layers: Sequence[nn.Module], plan: Sequence[int | Segment], x: torch.Tensor,
              use_reentrant: bool, preserve_rng_state: bool) -> torch.Tensor:
    for item in plan:
        if isinstance(item, int):
            x = layers[item](x)
            continue

        def segment(h: torch.Tensor, body: tuple = item.body) -> torch.Tensor:
            return _run_plan(layers, body, h, use_reentrant, preserve_rng_state)

        x = torch_checkpoint(segment, x, use_reentrant=use_reentrant,
                             preserve_rng_state=preserve_rng_state)
    return x


def _checked_schedule(model: nn.Sequential | nn.ModuleList, schedule: Schedule | str
                      ) -> Schedule:
    if not isinstance(model, nn.Sequential | nn.ModuleList):
        raise TypeError(f"forward_with_schedule: model must be a torch.nn.Sequential (or the "
                        f"ModuleList of a transformer's blocks), got {type(model).__name__}")
    if isinstance(schedule, str):
        schedule = parse_schedule(schedule, len(model))
    if schedule.n_layers != len(model):
        raise ValueError(f"forward_with_schedule: schedule {schedule.spec!r} is for "
                         f"{schedule.n_layers} layers, the model has {len(model)}")
    return schedule


def forward_with_schedule(model: nn.Sequential | nn.ModuleList, x: torch.Tensor,
                          schedule: Schedule | str, *,
                          preserve_rng_state: bool = True, early_stop: bool | None = None,
                          use_reentrant: bool = False) -> torch.Tensor:
    """model(x) with the schedule's segments wrapped in torch.utils.checkpoint.checkpoint.

    Returns the output; autograd's backward does the recomputation. Uniform schedules go
    through torch's own checkpoint_sequential, so its segment rule is exercised as written.
    `early_stop` True/False sets torch's early stop for these segments; None (the default)
    leaves whatever is in force (True, unless an enclosing set_checkpoint_early_stop(False)
    says otherwise), so a caller's own setting is never overridden behind its back.
    """
    schedule = _checked_schedule(model, schedule)
    setting = contextlib.nullcontext() if early_stop is None else \
        set_checkpoint_early_stop(early_stop)
    with setting:
        if schedule.spec.startswith("uniform:"):
            return checkpoint_sequential(model, int(schedule.spec.partition(":")[2]), x,
                                         use_reentrant=use_reentrant,
                                         preserve_rng_state=preserve_rng_state)
        return _run_plan(list(model), schedule.plan, x, use_reentrant, preserve_rng_state)


def checkpoint(segment: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *,
               preserve_rng_state: bool = True, use_reentrant: bool = False) -> torch.Tensor:
    """torch.utils.checkpoint.checkpoint with use_reentrant stated (False unless told)."""
    return torch_checkpoint(segment, x, use_reentrant=use_reentrant,
                            preserve_rng_state=preserve_rng_state)


def checkpoint_sequential(model: nn.Sequential | nn.ModuleList, segments: int, x: torch.Tensor,
                          *, preserve_rng_state: bool = True, use_reentrant: bool = False
                          ) -> torch.Tensor:
    """torch.utils.checkpoint.checkpoint_sequential, with the segment count validated first
    (torch indexes a ModuleList as it does the Sequential's children)."""
    if not isinstance(model, nn.Sequential | nn.ModuleList):
        raise TypeError(f"checkpoint_sequential: model must be a torch.nn.Sequential or "
                        f"ModuleList, got {type(model).__name__}")
    if isinstance(segments, bool) or not isinstance(segments, int) \
            or not 1 <= segments <= len(model):
        raise ValueError(f"checkpoint_sequential: segments must be in [1, {len(model)}] (the "
                         f"number of layers), got {segments!r}")
    return torch_checkpoint_sequential(model, segments, x, use_reentrant=use_reentrant,
                                       preserve_rng_state=preserve_rng_state)


# -- measuring what the reference's ScheduledRun reads off its tape
@dataclass
class Measurement:
    """What one scheduled forward + backward did, measured with hooks.

    held: (data_ptr, nbytes, is_parameter) of every tensor the outer saved_tensors_hooks saw
    packed during forward; held_bytes: the distinct non-parameter bytes among them;
    started / finished: layer index -> forwards during backward, from forward pre-hooks and
    forward (post) hooks.
    """

    output: torch.Tensor
    held: list[tuple[int, int, bool]]
    held_bytes: int
    started: dict[int, int] = field(default_factory=dict)
    finished: dict[int, int] = field(default_factory=dict)
    grad_input: torch.Tensor | None = None


def measure(model: nn.Sequential, x: torch.Tensor, grad_output: torch.Tensor,
            schedule: Schedule | str, *, preserve_rng_state: bool = True,
            early_stop: bool = True, use_reentrant: bool = False,
            autocast_dtype: torch.dtype | None = None) -> Measurement:
    """forward_with_schedule + backward(grad_output), with saved-tensor and forward hooks.

    `x` is used as given (it is not made to require grad: that is the caller's choice, and
    the reentrant fault depends on it). `autocast_dtype` runs the forward (only) under
    torch.autocast of x's device type; checkpoint re-enters that state to recompute.
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    held: list[tuple[int, int, bool]] = []
    phase = ["forward"]
    counts: dict[str, dict[int, int]] = {"started": {}, "finished": {}}
    handles = []
    for index, layer in enumerate(model):
        def pre(mod: nn.Module, args: tuple, index: int = index) -> None:
            if phase[0] == "backward":
                counts["started"][index] = counts["started"].get(index, 0) + 1

        def post(mod: nn.Module, args: tuple, out: torch.Tensor, index: int = index) -> None:
            if phase[0] == "backward":
                counts["finished"][index] = counts["finished"].get(index, 0) + 1

        handles += [layer.register_forward_pre_hook(pre), layer.register_forward_hook(post)]

    def pack(t: torch.Tensor) -> torch.Tensor:
        is_param = t.untyped_storage().data_ptr() in param_ptrs
        held.append((t.data_ptr(), t.numel() * t.element_size(), is_param))
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                amp.autocast(autocast_dtype, x.device.type):
            y = forward_with_schedule(model, x, schedule, preserve_rng_state=preserve_rng_state,
                                      early_stop=early_stop, use_reentrant=use_reentrant)
        phase[0] = "backward"
        if y.requires_grad:
            y.backward(grad_output)
    finally:
        for h in handles:
            h.remove()
    distinct = {(ptr, nbytes) for ptr, nbytes, is_param in held if nbytes and not is_param}
    n = len(model)
    return Measurement(y.detach(), held, sum(nbytes for _, nbytes in distinct),
                       {i: counts["started"].get(i, 0) for i in range(n)},
                       {i: counts["finished"].get(i, 0) for i in range(n)}, x.grad)
