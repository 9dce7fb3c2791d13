"""MX and NVFP4 in both trees on the same float32 input, and the realistic distributions the
clipping table counts on (`distributions`: normal, Student-t with 3 degrees of freedom, and
the activations of the compact GPT's linear layers); the edge-case blocks are strategies
(parity/strategies/mx.py).

The counts table (`counts`): per distribution, element format and scale mode, how many
blocks clip (reference.mx.clipped_blocks) and, per element format under the floor mode, how
many elements the ties-away rounding sets apart from nearest-even (on the float32 values
and on them rounded to bfloat16), each measured by the reference and by torch_impl.
benchmarks/mx.py writes the full table to docs/data/mx_counts.json; docs/mx.md renders it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from reference import mx as rmx
from torch_impl import mx as tmx

DISTRIBUTIONS = ("normal", "student_t3", "gpt")
# The full table's size (benchmarks/mx.py) and the default tests' (parity/test_mx.py)
FULL_BLOCKS = 8192
QUICK_BLOCKS = 256


def gpt_activations(seed: int = 0, batch: int = 16) -> np.ndarray:
    """The inputs of every Linear of the compact GPT (4 blocks, n_embd 64, at init) on one
    batch of random tokens, cut into blocks of 32: float32 (n, 32). The model runs in
    float64 and its activations are rounded once to float32: a float32 run's last bits
    depend on the BLAS's thread count (its summation order), these do not."""
    from reference import gpt as rgpt
    from reference.module import register_module_forward_hook
    from reference.nn import Linear

    config = rgpt.GPTConfig(n_layer=4, n_embd=64, n_head=4, vocab_size=64)
    model = rgpt.GPT(config, rng=np.random.default_rng(seed), dtype=np.float64)
    seen: list[np.ndarray] = []

    def keep(module: object, args: tuple, output: object) -> None:
        if isinstance(module, Linear):
            seen.append(np.asarray(args[0]).astype(np.float32).reshape(-1, 32))

    idx = np.random.default_rng(seed + 1).integers(0, config.vocab_size,
                                                   (batch, config.block_size))
    handle = register_module_forward_hook(keep)
    try:
        model.forward(idx)
    finally:
        handle.remove()
    return np.concatenate(seen)


def distributions(blocks: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Each distribution as float32 (blocks, 32) (gpt: its first `blocks` blocks)."""
    rng = np.random.default_rng(seed)
    return {
        "normal": rng.standard_normal((blocks, 32)).astype(np.float32),
        "student_t3": rng.standard_t(3, (blocks, 32)).astype(np.float32),
        "gpt": gpt_activations(seed)[:blocks],
    }


def to_torch(x: np.ndarray, device: str = "cpu") -> torch.Tensor:
    """float32 x, or bfloat16 x (ml_dtypes) by its bits, as a torch tensor on `device`."""
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(x).to(device)


def both_to_mx(x: np.ndarray, fmt: str, mode: str, rounding: str = "nearest_even",
               device: str = "cpu", variant: str = "ocp") -> tuple[rmx.MXTensor, tmx.MXTensor]:
    """The reference's and torch_impl's MX tensors of the same float32 (or bfloat16) x."""
    return (rmx.to_mx(x, fmt, mode, rounding=rounding, variant=variant),
            tmx.to_mx(to_torch(x, device), fmt, mode, rounding=rounding, variant=variant))


def both_to_nvfp4(x: np.ndarray, two_level: bool, device: str = "cpu"
                  ) -> tuple[rmx.NVFP4Tensor, tmx.NVFP4Tensor]:
    """torchao's NVFP4 in both trees; two_level: with each tree's own per-tensor scale of the
    finite values."""
    finite = np.where(np.isfinite(x), x, np.float32(0))
    g = rmx.per_tensor_scale(finite) if two_level else None
    gt = tmx.per_tensor_scale(to_torch(finite, device)) if two_level else None
    return (rmx.to_nvfp4(x, g, variant="torchao"),
            tmx.to_nvfp4(to_torch(x, device), gt, variant="torchao"))


def away_differs(x: np.ndarray, fmt: str, torch_side: bool) -> int:
    """How many elements of x the ties-away rounding codes differently from nearest-even
    (floor scale mode), in one tree."""
    if torch_side:
        t = torch.from_numpy(x)
        a = tmx.to_mx(t, fmt, "floor", rounding="nearest_away").elements
        b = tmx.to_mx(t, fmt, "floor").elements
        return int((a != b).sum())
    return int(np.count_nonzero(rmx.to_mx(x, fmt, "floor", rounding="nearest_away").elements
                                != rmx.to_mx(x, fmt, "floor").elements))


def counts(blocks: int, seed: int = 0) -> dict:
    """The counts table in both trees: {"blocks": {dist: n}, "clipped": {dist: {fmt: {mode:
    [reference, torch]}}}, "away" and "away_bf16" (x rounded to bfloat16 first): {dist:
    {fmt: [reference, torch]}}}."""
    data = distributions(blocks, seed)
    table: dict = {"blocks": {d: int(x.shape[0]) for d, x in data.items()},
                   "elements": {d: int(x.size) for d, x in data.items()},
                   "clipped": {}, "away": {}, "away_bf16": {}}
    for d, x in data.items():
        t = torch.from_numpy(x)
        table["clipped"][d] = {
            fmt: {mode: [rmx.clipped_blocks(x, fmt, mode), tmx.clipped_blocks(t, fmt, mode)]
                  for mode in rmx.SCALE_MODES}
            for fmt in rmx.ELEMENT_FORMATS}
        # ties need the dropped bits to be exactly 10...0: rare in float32 data, common in
        # bfloat16 activations (8 significant bits), so both are counted
        b = x.astype(ml_dtypes.bfloat16).astype(np.float32)
        table["away"][d] = {fmt: [away_differs(x, fmt, False), away_differs(x, fmt, True)]
                            for fmt in rmx.ELEMENT_FORMATS}
        table["away_bf16"][d] = {fmt: [away_differs(b, fmt, False), away_differs(b, fmt, True)]
                                 for fmt in rmx.ELEMENT_FORMATS}
    return table
