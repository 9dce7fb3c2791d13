"""The setting the claims are stated in, pinned once for every process that checks them: the
test suite (conftest.py), `python -m parity fuzz`, and the report's pytest run.

    torch    one intra-op thread (torch.set_num_threads(1))
    BLAS     one OpenBLAS thread (OPENBLAS_NUM_THREADS=1, read once when NumPy loads, so it
             is set before NumPy is imported: by conftest.py and parity/__main__.py)

Why it matters: a bit-exact claim compares runs made in the same setting, and one reduction
is bit-exact only on one thread: torch's CPU LayerNorm backward sums the bias gradient over
rows in per-thread chunks, so with two threads `gpt.layer_norm.bias_grad` can differ from
the reference's in-order sum by an ulp (a fuzz run found it). The claims say which of them
hold on one thread only; every command that checks claims runs here, and says so.
"""

from __future__ import annotations

import os

THREADS = 1
DESCRIPTION = (f"claims' setting: torch intra-op threads {THREADS}, "
               f"OPENBLAS_NUM_THREADS={THREADS}")


def pin_blas() -> None:
    """Set OPENBLAS_NUM_THREADS unless the caller set it (effective only before NumPy loads)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))


def pin_torch() -> str:
    """torch on THREADS intra-op threads; returns DESCRIPTION, for a command to print."""
    import torch

    torch.set_num_threads(THREADS)
    return DESCRIPTION
