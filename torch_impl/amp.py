"""Autocast with torch.autocast. See reference/amp.py for what autocast does to each op.

What PyTorch does that the reference spells out:
- The op lists are C++ registrations (aten/src/ATen/autocast_mode.cpp), one set per device
  type: on CPU mv/addmv are not lower_precision_fp and cross_entropy_loss is fp32; on CUDA
  both matrix-vector ops are lp. reference/amp.py lists them (and a parity test holds the
  lists to what the installed torch registers and does).
- Autocast is a dispatch key, not a wrapper (NOTE [ Autocast as a wrapper ] in
  reference/amp.py): `autocast` below is the whole mechanism, and the model is unchanged.
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

import torch

PRECISIONS: dict[str, torch.dtype | None] = {
    "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """"fp32" -> None (no autocast), "bf16" -> torch.bfloat16, "fp16" -> torch.float16."""
    if precision not in PRECISIONS:
        raise ValueError(f"amp: precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def autocast(dtype: torch.dtype | None, device_type: str = "cpu") -> torch.autocast:
    """torch.autocast(device_type, dtype), disabled when dtype is None (fp32)."""
    if dtype not in (None, torch.float16, torch.bfloat16):
        raise ValueError(f"autocast: dtype must be None, torch.float16 or torch.bfloat16, "
                         f"got {dtype!r}")
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
