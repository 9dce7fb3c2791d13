"""Current scaling against torchao 0.18.0, its oracle: hp_tensor_to_float8_dynamic's data and
scale (fp8_scaling.torchao_current), and where its power-of-2 scales round up instead of
down (fp8_scaling.torchao_pow2). Skips when torchao is absent; pinned to 0.18.0, the version
whose source the claims read (pyproject's `oracles` extra)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from parity.compare import assert_claim
from parity.drivers import fp8_scaling as drv
from parity.extras import import_extra
from parity.strategies import examples, fp8_tensors
from reference import fp8_scaling as rfp8

torchao = import_extra("torchao", "the oracle of current scaling")

# torchao's own statement of round_scales_to_power_of_2 (float8_utils._round_scale_down_to_
# power_of_2) is the line the claim is about; the expected side is built without it.
FORMATS = ("float8_e4m3fn", "float8_e5m2")


@given(case=fp8_tensors())
@settings(examples(40))
def test_torchao_dynamic_cast_gives_the_torch_trees_data_and_scale(case: tuple) -> None:
    """Any float32 tensor, tensorwise or rowwise (AXISWISE), without power-of-2 scales, and
    with them where no scale rounds up: torchao's Float8TrainingTensor's _data and _scale."""
    x, fmt, axis, power_of_2 = case
    data, scale = drv.torchao_current(x, fmt, axis, power_of_2)
    (_, _), (t_data, t_scale) = drv.current(x, fmt, axis, power_of_2)
    if power_of_2:
        plain = rfp8.amax_to_scale(rfp8.tensor_amax(x, axis), fmt)
        if np.any(drv.log2_rounds_up(plain)):
            return  # torchao's scale rounds up here: the next test's claim
    context = f"{fmt} axis={axis} power_of_2={power_of_2}"
    assert_claim("fp8_scaling.torchao_current", actual=t_scale, expected=scale,
                 context=context + " scale")
    assert_claim("fp8_scaling.torchao_current", actual=t_data, expected=data,
                 context=context + " data")


@pytest.mark.parametrize("fmt", FORMATS)
def test_torchao_rowwise_recipe_on_rows_of_every_magnitude(fmt: str) -> None:
    """One (512, 64) tensor whose rows span 2^-60 .. 2^60 (and a zero row): AXISWISE along
    -1 and 0, and TENSORWISE, without power-of-2 scales: torchao's bits."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((512, 64)) * 2.0 ** rng.integers(-60, 61, (512, 1)))
    x = x.astype(np.float32)
    x[3] = 0
    for axis in (-1, 0, None):
        data, scale = drv.torchao_current(x, fmt, axis, False)
        (_, _), (t_data, t_scale) = drv.current(x, fmt, axis, False)
        assert_claim("fp8_scaling.torchao_current", actual=t_scale, expected=scale,
                     context=f"{fmt} axis={axis}")
        assert_claim("fp8_scaling.torchao_current", actual=t_data, expected=data,
                     context=f"{fmt} axis={axis}")


# (format, scales swept, of them rounded up by torchao): measured, and asserted below
POW2_COUNTS = {"float8_e4m3fn": (684_032, 3_873), "float8_e5m2": (684_032, 3_726)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_torchao_power_of_2_scales_round_up_where_float32_log2_reaches_the_next_integer(
        fmt: str) -> None:
    """The amaxes whose scales lie just below every power of two: torchao's power-of-2 scale
    is the exact round-down (both trees) doubled exactly where the correctly rounded float32
    log2 of the scale is the next integer, and equal to it everywhere else."""
    import torch

    from torch_impl import fp8_scaling as tfp8

    amax = drv.pow2_sweep_amaxes(fmt)
    plain = rfp8.amax_to_scale(amax, fmt)
    down = rfp8.amax_to_scale(amax, fmt, power_of_2=True)
    t_down = tfp8.amax_to_scale(torch.from_numpy(amax), fmt, power_of_2=True).numpy()
    assert_claim("fp8_scaling.current_trees", actual=t_down, expected=down,
                 context=f"{fmt} power-of-2 sweep")
    up = drv.log2_rounds_up(plain)
    expected = np.where(up, down * np.float32(2), down)
    ao = drv.torchao_scale(amax, fmt, power_of_2=True)
    assert_claim("fp8_scaling.torchao_pow2", actual=ao, expected=expected, context=fmt)
    assert_claim("fp8_scaling.torchao_current", actual=plain,
                 expected=drv.torchao_scale(amax, fmt, False), context=f"{fmt} no power-of-2")
    assert (amax.size, int(up.sum())) == POW2_COUNTS[fmt]
    assert np.all(ao[up] > plain[up]), "rounded up: above the scale it should not exceed"
    assert np.all(down <= plain) and np.all(down > plain / 2)
