"""Autocast with torch.autocast. See reference/amp.py for what autocast does to each op.

What PyTorch does that the reference spells out:
- The op lists are C++ registrations (aten/src/ATen/autocast_mode.cpp), one set per device
  type: on CPU mv/addmv are not lower_precision_fp, cross_entropy_loss is fp32 and softmax,
  log_softmax and layer_norm are on no list; on CUDA both matrix-vector ops are lp and the
  normalizations fp32. reference/amp.py lists them (and a parity test holds the lists to what
  the installed torch registers and does). `decide` there is the dispatcher's choice here:
  each op's Autocast kernel casts its arguments (cached_cast) and redispatches.
- The state is thread-local, one per device type (NOTE [ Autocast state ] in
  reference/amp.py): `autocast_state` reads torch.is_autocast_enabled / get_autocast_dtype,
  and torch.utils.checkpoint records the same two and re-enters them around a recompute.
- Low-precision tensors are torch.float16 / torch.bfloat16 storage (NOTE [ Low-precision
  arrays ]); casts round to nearest even in C++ (c10::BFloat16, c10::Half).
- Casts of float32 leaf parameters are cached for the life of the outermost autocast region
  (one cast per weight per forward), and the cast's backward (ToCopyBackward0) is where an
  lp gradient becomes the float32 `.grad` of the master weight.
- Matmuls in lp accumulate in float32 inside oneDNN/BLAS and round once; elementwise ops
  on lp tensors compute in float32 ("opmath") and round. On CUDA, cuBLAS may reduce fp16
  and bf16 products in reduced precision unless
  torch.backends.cuda.matmul.allow_{fp16,bf16}_reduced_precision_reduction are False (both
  default True): the parity tests switch them off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """"fp32" -> None (no autocast), "bf16" -> torch.bfloat16, "fp16" -> torch.float16."""
    if precision not in PRECISIONS:
        raise ValueError(f"amp: precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


@dataclass(frozen=True)
class AutocastState:
    """torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type), as
    the fields of the reference's AutocastState (dtype named as a string)."""

    enabled: bool = False
    dtype: str = "bfloat16"
    device_type: str = "cpu"


def autocast_state(device_type: str = "cpu") -> AutocastState:
    """What ops on `device_type` consult now."""
    dtype = torch.get_autocast_dtype(device_type)
    return AutocastState(torch.is_autocast_enabled(device_type),
                         str(dtype).removeprefix("torch."), device_type)


def autocast(dtype: torch.dtype | None, device_type: str = "cpu", *,
             enabled: bool = True) -> torch.autocast:
    """torch.autocast(device_type, dtype, enabled), disabled when dtype is None (fp32)."""
    if dtype not in (None, torch.float16, torch.bfloat16):
        raise ValueError(f"autocast: dtype must be None, torch.float16 or torch.bfloat16, "
                         f"got {dtype!r}")
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16,
                          enabled=enabled and dtype is not None)
