"""Bad input to the bf16 stochastic rounding twins (reference/optim_sr.py,
torch_impl/optim_sr.py): draws of the wrong shape, dtype or range, an unknown variant, and
draws that do not match AdamWSR's parameters each get the same one-line error in both trees
(claim optim.sr_twins; an error line counts one value), naming what was expected and what
came. The torch twin also refuses a non-tensor, where the reference takes any array-like
(np.asarray)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from parity.drivers.edges import judge, outcome, to_torch
from reference import optim_sr as rsr
from reference.module import Parameter
from torch_impl import optim_sr as tsr

X = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)

DRAWS = {  # name -> (draws, what the error line must hold)
    "a wrong shape": (np.zeros((4, 3), np.int32), "draws must have x's shape (3, 4), got (4, 3)"),
    "one draw short": (np.zeros((3, 3), np.int32), "got (3, 3)"),
    "a float dtype": (np.zeros((3, 4), np.float32), "draws must be integers, got float32"),
    "a bool dtype": (np.zeros((3, 4), bool), "draws must be integers, got bool"),
    "a draw of 2^16": (np.full((3, 4), 1 << 16, np.int64), "draws must lie in [0, 2^16)"),
    "a negative draw": (np.full((3, 4), -1, np.int32), "draws must lie in [0, 2^16)"),
}


@pytest.mark.parametrize("case", list(DRAWS))
def test_draws_of_the_wrong_shape_dtype_or_range_name_expected_and_got(device: str,
                                                                       case: str) -> None:
    """One line naming what the draws must be and what came, the same in both trees."""
    draws, expected = DRAWS[case]
    ref = outcome(lambda: rsr.round_bf16_stochastic(X, draws))
    tor = outcome(lambda: tsr.round_bf16_stochastic(to_torch(X, device),
                                                    to_torch(draws, device)))
    assert ref.error is not None, f"{case}: the reference accepted it"
    judge("optim.sr_twins", ref, tor, case)
    assert expected in ref.error, ref.error


@pytest.mark.parametrize("variant", ["IEEE", "llm.c", "nearest"])
def test_an_unknown_variant_lists_the_accepted_ones(device: str, variant: str) -> None:
    draws = np.zeros((3, 4), np.int32)
    ref = outcome(lambda: rsr.round_bf16_stochastic(X, draws, variant=variant))
    tor = outcome(lambda: tsr.round_bf16_stochastic(to_torch(X, device),
                                                    to_torch(draws, device), variant=variant))
    assert ref.error is not None
    judge("optim.sr_twins", ref, tor, variant)
    assert repr(variant) in ref.error and all(v in ref.error for v in rsr.VARIANTS), ref.error


@pytest.mark.parametrize("argument", ["x", "draws"])
def test_the_torch_twin_refuses_a_non_tensor_naming_it(device: str, argument: str) -> None:
    """A list where a tensor belongs: one TypeError line naming the argument and the type
    (not an AttributeError from inside)."""
    args: dict[str, Any] = {"x": to_torch(X, device),
                            "draws": torch.zeros((3, 4), dtype=torch.int32, device=device)}
    args[argument] = args[argument].tolist()
    with pytest.raises(TypeError) as caught:
        tsr.round_bf16_stochastic(args["x"], args["draws"])
    line = str(caught.value)
    assert line == f"round_bf16_stochastic: {argument} must be a torch.Tensor, got list", line


def test_adamwsr_step_with_draws_that_do_not_match_its_parameters(device: str) -> None:
    """Two parameters with gradients, one draws array: one line naming both counts; then
    draws of the wrong shape for a parameter: the rounding's line."""
    w = X.astype(ml_dtypes.bfloat16)
    ref_params = [Parameter(w.copy()), Parameter(w.copy())]
    tor_params = [torch.nn.Parameter(to_torch(w, device)) for _ in range(2)]
    for p in ref_params:
        p.grad = w.copy()
    for p in tor_params:
        p.grad = to_torch(w, device)
    ref_opt, tor_opt = rsr.AdamWSR(ref_params), tsr.AdamWSR(tor_params)
    one = np.zeros((3, 4), np.int32)
    for draws, expected in (([one], "1 draws for 2 parameters"),
                            ([one, one.T.copy()], "draws must have x's shape (3, 4), got (4, 3)")):
        ref = outcome(lambda d=draws: ref_opt.step(d))
        tor = outcome(lambda d=draws: tor_opt.step([to_torch(a, device) for a in d]))
        assert ref.error is not None
        judge("optim.sr_twins", ref, tor, expected)
        assert expected in ref.error, ref.error
