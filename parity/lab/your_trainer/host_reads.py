"""Where a training loop reads a tensor's value back to the host, by line: the `.item()` in
every step (torch only: the reference has no device to wait for).

NOTE [ A host read is a sync ]
`.item()`, `float(t)`, `int(t)`, `bool(t)` and `if t:` all dispatch one aten op,
`_local_scalar_dense`: the host needs the value now. On CUDA that is a synchronize: the CPU
stops queueing kernels until every kernel queued so far has run, so the device idles while
the host catches up (NOTE [ Honest timing ] in torch_impl/profile.py). On the CPU it costs
nothing, which is why the habit goes unnoticed until the run moves to a GPU; counting the
op finds it on either. Some reads are torch's own: GradScaler.step reads its found-inf flags
once a step (torch_impl/loss_scaling.py). Each read is attributed to the innermost frame
outside torch (the line of the user's code), and a read made inside torch also names the
torch function (`via`), so a loop's own `.item()` and the scaler's are told apart.
Not seen: `.tolist()`, `.cpu()`, `.numpy()` and printing a tensor (a copy, not this op).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

TORCH = Path(torch.__file__).resolve().parent
# the checks a user runs around their loop (this one, ScalerGuard's wrappers of GradScaler's
# methods): frames here are neither the user's line nor torch's, and are looked through
CHECKS = Path(__file__).resolve().parent
# between a read and the code that asked for it: torch's dunders (Tensor.__float__, ...), its
# dispatch machinery, and torch._dynamo's wrapper around every __torch_dispatch__
MACHINERY = ("_tensor.py", "overrides.py", "_compile.py", "utils/_python_dispatch.py",
             "_dynamo/")


class HostReads(TorchDispatchMode):
    """`with HostReads() as reads:` around steps; then `reads.sites`: (where, via, dtype) ->
    count, `where` the file:line outside torch, `via` the torch function that read ("" for
    a read in the user's own code), `dtype` the tensor's ("float32", "int64": an index).
    NOTE [ A host read is a sync ]."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[tuple[str, str, str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = str(args[0].dtype).removeprefix("torch.")
            self.sites[(*self._site(), dtype)] += 1
        return func(*args, **(kwargs or {}))

    @staticmethod
    def _site() -> tuple[str, str]:
        """(file:line of the innermost frame outside torch, the torch function it called
        that made the read, "" when it made the read itself)."""
        via = ""
        frame = sys._getframe(2)
        while frame is not None:
            file = Path(frame.f_code.co_filename).resolve()
            if not file.is_relative_to(CHECKS) and not file.is_relative_to(TORCH):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}", via
            inside = file.relative_to(TORCH).as_posix() if file.is_relative_to(TORCH) else ""
            if inside and not inside.startswith(MACHINERY) and not inside.endswith(MACHINERY):
                name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)  # 3.10
                via = f"{file.name}:{name}"  # the outermost so far
            frame = frame.f_back
        return "?", via

    def in_user_code(self, at_least: int = 1, floating: bool = True) -> dict[str, int]:
        """file:line -> count of the reads the user's own code made (not torch's), at least
        `at_least` times (the number of steps: every step); `floating`: of values (a loss, a
        norm, and a bool of them: `if torch.isnan(loss):`), not integers (indexing with a
        tensor, which syncs only where the index lives on the device)."""
        out: Counter[str] = Counter()
        for (where, via, dtype), n in self.sites.items():
            kind = getattr(torch, dtype)
            value = kind.is_floating_point or kind == torch.bool
            if not via and value == floating:
                out[where] += n
        return {where: n for where, n in out.items() if n >= at_least}
