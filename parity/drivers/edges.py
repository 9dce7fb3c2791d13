"""Running one call in each tree at an argument's edge and keeping what it gave: its value,
or the one line of the error it raised (type and message). The edge tests
(parity/test_<topic>*.py) judge the two outcomes against the topic's twins claim: the same
error line, or the same value as the claim compares values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from parity.compare import as_numpy, assert_claim, assert_observed


@dataclass(frozen=True)
class Outcome:
    """A call's value, or its error as 'TypeName: message' (value None then)."""

    value: Any = None
    error: str | None = None


def outcome(call: Callable[[], Any]) -> Outcome:
    """What `call()` gives: its value, or its Exception as one 'TypeName: message' string."""
    try:
        return Outcome(value=call())
    except Exception as e:  # the error is the outcome being compared
        return Outcome(error=f"{type(e).__name__}: {e}")


def to_torch(value: Any, device: str = "cpu") -> Any:
    """A NumPy array as a torch tensor on `device` (fp8 and bfloat16 through their bits);
    tuples and lists element by element; anything else as it is."""
    if isinstance(value, (tuple, list)):
        return type(value)(to_torch(v, device) for v in value)
    if not isinstance(value, np.ndarray):
        return value
    lacking = {"float8_e4m3fn": (np.uint8, torch.float8_e4m3fn),
               "float8_e5m2": (np.uint8, torch.float8_e5m2),
               "bfloat16": (np.int16, torch.bfloat16)}
    if value.dtype.name in lacking:
        bits, dtype = lacking[value.dtype.name]
        return torch.from_numpy(value.view(bits).copy()).view(dtype).to(device)
    return torch.from_numpy(value.copy()).to(device)


def _values(v: Any) -> list[Any]:
    """The arrays of a value: a tuple's elements, a dataclass's array fields, or itself."""
    if isinstance(v, (tuple, list)):
        return [x for item in v for x in _values(item)]
    return [v]


def judge(claim_id: str, ref: Outcome, tor: Outcome, context: str,
          value_claim: str | None = None, scale: Any = None) -> None:
    """Both trees raised the same one-line error, or both gave values equal as the claim
    (`value_claim` where values have a claim of their own) compares them, with `scale`
    where the claim is of kind eps; recorded under the claim either way (an error line
    counts one value)."""
    if ref.error is not None or tor.error is not None:
        same = ref.error == tor.error and "\n" not in str(ref.error)
        assert_observed(claim_id, 0.0 if same else float("inf"), 1,
                        f"{context}: reference {ref.error!r}, torch {tor.error!r}")
        return
    ref_values, torch_values = _values(ref.value), _values(tor.value)
    assert len(ref_values) == len(torch_values), (context, ref.value, tor.value)
    for i, (r, t) in enumerate(zip(ref_values, torch_values, strict=True)):
        assert_claim(value_claim or claim_id, actual=as_numpy(t) if isinstance(t, torch.Tensor)
                     else np.asarray(t), expected=np.asarray(r), context=f"{context} [{i}]",
                     scale=scale)
