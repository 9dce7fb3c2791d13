"""The random bits of a training run that rounds stochastically (nvfp4's gradients, bf16-sr's
weights), drawn once here and fed to both trees, so that the trees round with the same bits.

NOTE [ One bit stream, both trees ]
A run that rounds stochastically owns one BitStream: numpy's PCG64 seeded from the run's
seed and a fixed word (STREAM_WORD), never the weights' or dropout's generator, so adding the
rounding moves no other draw. Every draw is a numpy array, in a fixed order per step:
- nvfp4, per ScaledLinear backward in the order the backward reaches the layers (the last
  block first; in a block mlp.c_proj, c_fc, attn.c_proj, c_attn): grad_bits(N, out), the
  bits of g (N, out) for grad_input, then those of g^T (out, N) for grad_weight, uint8 (TE's
  stochastic rounding reads 8 bits an element: reference/nvfp4.round_fp4_stochastic);
- bf16-sr, per optimizer step: weight_draws, one int32 array in [0, 2^16) per parameter with
  a gradient, in parameter order (AdamWSR's draws: reference/optim_sr.py).
The torch tree turns the same arrays into tensors (torch.from_numpy), so both trees' casts
are bit-identical (claim fp8_train.casts). The stream's state (its bit_generator.state, a
dict of ints) is the checkpoint's rng["bits"]: a resumed run draws the bits the uninterrupted
one drew (claim fp8_train.resume_exact).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

STREAM_WORD = 0x5EED_B175  # the second seed word: this stream, not the weights' generator


class BitStream:
    """A run's random bits (NOTE [ One bit stream, both trees ]): PCG64 of (seed, STREAM_WORD)."""

    def __init__(self, seed: int) -> None:
        self.generator = np.random.Generator(np.random.PCG64([seed, STREAM_WORD]))

    def uint8(self, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform bytes of `shape` (stochastic rounding to fp4: 8 bits an element)."""
        return self.generator.integers(0, 1 << 8, size=shape, dtype=np.uint8)

    def uint16(self, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform integers in [0, 2^16) of `shape`, as int32 (AdamWSR's draws)."""
        return self.generator.integers(0, 1 << 16, size=shape, dtype=np.int32)

    def state(self) -> dict[str, Any]:
        """The generator's state, a fresh dict of str and int (the checkpoint's rng["bits"])."""
        return self.generator.bit_generator.state

    def load(self, state: Mapping[str, Any]) -> None:
        self.generator.bit_generator.state = dict(state)


def grad_bits(bits: BitStream, n: int, d_out: int) -> tuple[np.ndarray, np.ndarray]:
    """One ScaledLinear backward's bits: g's (N, out) for grad_input, then g^T's (out, N)
    for grad_weight, in that order."""
    return bits.uint8((n, d_out)), bits.uint8((d_out, n))


def weight_draws(bits: BitStream, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """One bf16-sr optimizer step's draws: one array per parameter shape, in order."""
    return [bits.uint16(tuple(shape)) for shape in shapes]
