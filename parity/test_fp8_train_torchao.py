"""torchao 0.18's Float8Linear, the oracle of the fp8 recipes: emulated, it gives the torch
tree's bits (fp8_train.torchao_emulated); through CPU torch._scaled_mm, tensorwise, it is
within the bound of a scaled-after-the-sum product (fp8_train.torchao_scaled_mm). Skips when
torchao is absent; pinned to 0.18.0, the version whose source the claims read."""

from __future__ import annotations

import pytest

from parity.compare import assert_claim
from parity.drivers import fp8_train as drv
from parity.extras import import_extra

torchao = import_extra("torchao", "the fp8 oracle (its Float8Linear)")


@pytest.mark.parametrize("recipe_name", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("shape", drv.SHAPES)
def test_emulated_float8linear_gives_the_torch_trees_bits(recipe_name: str,
                                                          shape: tuple) -> None:
    """One forward and backward: output, input, weight and bias gradients bit for bit."""
    for name, (ours, theirs) in drv.torchao_layer(recipe_name, True, shape).items():
        assert_claim("fp8_train.torchao_emulated", actual=ours, expected=theirs,
                     context=f"{recipe_name} {shape} {name}")


@pytest.mark.parametrize("shape", drv.SHAPES)
def test_float8linear_on_cpu_scaled_mm_is_within_the_scaling_bound(shape: tuple) -> None:
    """Tensorwise through torch._scaled_mm: within (k + 3) eps S, the bias gradient exact;
    and not the bits of the emulation (the order really differs)."""
    got = drv.torchao_layer("tensorwise", False, shape)
    scales = drv.torchao_scales(shape)
    for name, (ours, theirs) in got.items():
        if name == "bias":
            assert_claim("fp8_train.torchao_emulated", actual=ours, expected=theirs,
                         context=f"{shape} bias")
        else:
            assert_claim("fp8_train.torchao_scaled_mm", actual=ours, expected=theirs,
                         context=f"{shape} {name}", scale=scales[name])
    assert any((got[k][0] != got[k][1]).any() for k in ("y", "dx", "weight"))
