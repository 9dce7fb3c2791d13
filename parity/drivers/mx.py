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

from common.mx_ranges import VARIANT_RANGES
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


def settings(fmt: str, modes: tuple[str, ...] = rmx.SCALE_MODES
             ) -> list[tuple[str, str, str]]:
    """(variant, mode, rounding): every variant that takes the element format `fmt`, with each
    of its scale modes among `modes` and each of its roundings (common/mx_ranges.py)."""
    return [(variant, mode, rounding) for variant, taken in VARIANT_RANGES.items()
            if fmt in taken.formats for mode in taken.modes if mode in modes
            for rounding in taken.roundings]


def to_torch(x: np.ndarray, device: str = "cpu") -> torch.Tensor:
    """float32 x, or bfloat16 x (ml_dtypes) by its bits, as a torch tensor on `device`."""
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(x).to(device)


def both_to_mx(x: np.ndarray, fmt: str, mode: str | None, rounding: str | None = None,
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


# The classes of block the variants' table counts, in the order a block is classed (the first
# that holds): reference/mx_variants.py says who departs where
CLASSES = ("NaN in the block", "inf in the block", "-0 elements", "zero block",
           "code 0 (scale 2^-127)", "float32 log2 near 2^k", "ties", "any other")
PAIR_MODES = ("floor", "rceil")


def _classes(x: np.ndarray, fmt: str, mode: str) -> np.ndarray:
    """The class (an index into CLASSES) of each block of x (rows of one block), read off
    the specification's conversion under `mode`."""
    from reference import mx_variants

    spec = rmx.to_mx(x, fmt, mode)
    amax = np.max(np.abs(x), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = np.floor(np.log2(amax.astype(np.float64)))
    code, q = rmx.scaled_blocks(x, fmt, mode)
    top = np.float32(rmx.FORMATS[fmt].max)
    q = np.clip(q, -top, top)[:, 0]
    ties = (rmx.round_elements(q, fmt) != rmx.round_elements(q, fmt, "nearest_away")).any(-1)
    tests = (np.isnan(x).any(-1), np.isinf(x).any(-1),
             (spec.elements == 1 << (rmx.FORMATS[fmt].bits - 1)).any(axis=-1), ~x.any(-1),
             code[:, 0] == 0, (mx_variants.log2_floor_f32(amax) != exact) & (amax > 0), ties)
    cls = np.full(len(x), len(CLASSES) - 1)
    for i, holds in reversed(list(enumerate(tests))):
        cls = np.where(holds, i, cls)
    return cls


def variant_disagreements(per_kind: int = 16) -> dict[tuple[str, str], dict[str, list[int]]]:
    """{(pair "a vs b", mode): {class: [blocks whose decoded values differ (NaN as one
    value), blocks of the class]}}: every pair of variants, at floor and rceil where both
    take the mode (else each at its own), over the element formats both take, on
    edge_array(fmt, seed=0, per_kind) blocks."""
    from parity.strategies.mx import edge_array

    data = {fmt: edge_array(fmt, seed=0, per_kind=per_kind) for fmt in rmx.ELEMENT_FORMATS}
    values: dict[tuple[str, str, str], np.ndarray] = {}
    classes: dict[tuple[str, str], np.ndarray] = {}

    def decoded(variant: str, mode: str, fmt: str) -> np.ndarray:
        if (variant, mode, fmt) not in values:
            mx = rmx.to_mx(data[fmt], fmt, mode, variant=variant)
            values[(variant, mode, fmt)] = rmx.from_mx(mx)
        return values[(variant, mode, fmt)]

    table: dict[tuple[str, str], dict[str, list[int]]] = {}
    for i, a in enumerate(rmx.VARIANTS):
        for b in rmx.VARIANTS[i + 1:]:
            ra, rb = VARIANT_RANGES[a], VARIANT_RANGES[b]
            common = [m for m in PAIR_MODES if m in ra.modes and m in rb.modes]
            for ma, mb in [(m, m) for m in common] or [(ra.modes[0], rb.modes[0])]:
                row = {c: [0, 0] for c in CLASSES}
                for fmt in (f for f in rmx.ELEMENT_FORMATS if f in ra.formats and f in rb.formats):
                    va, vb = decoded(a, ma, fmt), decoded(b, mb, fmt)
                    same = (va.view(np.uint32) == vb.view(np.uint32)) | (np.isnan(va)
                                                                           & np.isnan(vb))
                    differ = ~same.all(axis=-1)
                    if (fmt, ma) not in classes:
                        classes[(fmt, ma)] = _classes(data[fmt], fmt, ma)
                    for k, name in enumerate(CLASSES):
                        row[name][0] += int((differ & (classes[(fmt, ma)] == k)).sum())
                        row[name][1] += int((classes[(fmt, ma)] == k).sum())
                table[(f"{a} vs {b}", ma if ma == mb else f"{ma} vs {mb}")] = row
    return table
