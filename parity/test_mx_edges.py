"""Every public function of reference/mx.py and torch_impl/mx.py driven at the edges of each
argument's declared range (common/mx_ranges.py): each member of an enumeration and one
unknown name, the block size at 1, 2, 32, 256 and 0, -1, a float and a bool, an amax or a
scale at 0, inf, NaN, below 0 and of the wrong type, shapes whose last dimension the block
does not divide, 0-d and empty. At every edge both trees give the same result (claim
mx.twins, NaN as a class) or the same error type and line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

from common import mx_ranges
from parity.compare import assert_claim
from reference import mx as rmx
from torch_impl import mx as tmx

UNKNOWN = "unknown_name"
BLOCK_EDGES = (1, 2, 32, 256, 0, -1, 32.0, True)
SHAPES = ((2, 64), (64,), (), (0, 32), (2, 0), (2, 48))
AMAX_EDGES = (0.0, np.inf, np.nan, -1.0, float.fromhex("0x1p-149"), "1.0")
VARIANTS = (*mx_ranges.VARIANTS, UNKNOWN)


def _x(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng(len(shape))
    return np.asarray(rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape),
                      dtype=dtype)


def _cases() -> list[tuple[str, str, dict]]:
    """(function, argument, keyword arguments): every edge of every argument."""
    cases: list[tuple[str, str, dict]] = []
    for variant in VARIANTS:
        for fn in ("to_mx", "scaled_blocks", "clipped_blocks"):
            cases += [(fn, "fmt", dict(fmt=f, variant=variant))
                      for f in (*mx_ranges.ELEMENT_FORMATS, UNKNOWN)]
            cases += [(fn, "mode", dict(mode=m, variant=variant))
                      for m in (None, *mx_ranges.SCALE_MODES, UNKNOWN)]
        cases += [("to_mx", "rounding", dict(rounding=r, variant=variant))
                  for r in (None, *mx_ranges.ROUNDINGS, UNKNOWN)]
        cases += [("scale_codes", "mode", dict(mode=m, variant=variant))
                  for m in (None, *mx_ranges.SCALE_MODES, UNKNOWN)]
    for fn in ("to_mx", "scaled_blocks", "clipped_blocks"):
        cases += [(fn, "block_size", dict(block_size=b)) for b in BLOCK_EDGES]
        cases += [(fn, "x", dict(shape=s)) for s in SHAPES]
        cases += [(fn, "x", dict(dtype="float64"))]
    cases += [("scale_codes", "amax", dict(amax=a)) for a in AMAX_EDGES[:3]]
    cases += [("scale_codes", "amax", dict(dtype="float64"))]
    cases += [("round_elements", "fmt", dict(fmt=f)) for f in (*mx_ranges.ELEMENT_FORMATS, UNKNOWN)]
    cases += [("round_elements", "rounding", dict(rounding=r))
              for r in (*mx_ranges.ROUNDINGS, UNKNOWN)]
    cases += [("round_elements", "q", dict(dtype="float64"))]
    cases += [("per_tensor_scale", "x", dict(shape=s)) for s in SHAPES]
    cases += [("global_scales", "global_amax", dict(amax=a)) for a in AMAX_EDGES]
    for fn in ("to_nvfp4", "nvfp4_scaled"):
        cases += [(fn, "variant", dict(variant=v)) for v in (*mx_ranges.NVFP4_VARIANTS, UNKNOWN)]
        cases += [(fn, "global_amax", dict(global_amax=a)) for a in AMAX_EDGES]
        cases += [(fn, "per_tensor", dict(per_tensor=a, variant="torchao")) for a in AMAX_EDGES]
        cases += [(fn, "x", dict(shape=s)) for s in SHAPES]
    cases += [("pack_fp4", "codes", dict(shape=s)) for s in ((2, 8), (3,), (), (0, 2))]
    cases += [("pack_fp4", "codes", dict(top=16))]
    cases += [("unpack_fp4", "packed", dict(shape=s)) for s in ((2, 8), (), (0, 2))]
    return cases


def _wrap(v: object, tree: str) -> object:
    """A number argument as each tree takes it (a 0-d tensor for torch), others as they are."""
    if tree == "torch" and isinstance(v, float):
        return torch.tensor(v, dtype=torch.float32)
    return np.float32(v) if isinstance(v, float) else v


def _call(fn: str, args: dict, tree: str) -> object:
    m = rmx if tree == "reference" else tmx
    a = {"fmt": "float8_e4m3fn", "mode": None, "rounding": None, "variant": "ocp",
         "block_size": 32, "shape": (2, 64), "dtype": "float32"} | args
    x = _x(a["shape"], a["dtype"])
    t = (lambda v: v) if tree == "reference" else torch.from_numpy
    if fn == "to_mx":
        mx = m.to_mx(t(x), a["fmt"], a["mode"], block_size=a["block_size"],
                     rounding=a["rounding"], variant=a["variant"])
        return mx, m.from_mx(mx)
    if fn in ("scaled_blocks", "clipped_blocks"):
        return getattr(m, fn)(t(x), a["fmt"], a["mode"], block_size=a["block_size"],
                              variant=a["variant"])
    if fn == "scale_codes":
        amax = np.abs(_x((8,), a["dtype"])) if "amax" not in a else \
            np.array([a["amax"]] * 3, np.float32)
        return m.scale_codes(t(amax), a["fmt"], a["mode"], a["variant"])
    if fn == "round_elements":
        top = rmx.FORMATS[a["fmt"]].max if a["fmt"] in rmx.FORMATS else 448
        q = np.clip(x * np.float32(2.0**-20), -top, top).astype(x.dtype)  # within +-max
        return m.round_elements(t(q), a["fmt"], a.get("rounding") or "nearest_even")
    if fn == "per_tensor_scale":
        return m.per_tensor_scale(t(x))
    if fn == "global_scales":
        return m.global_scales(_wrap(a["amax"], tree))
    if fn in ("to_nvfp4", "nvfp4_scaled"):
        variant = a["variant"] if a["variant"] != "ocp" else "transformer_engine"
        out = getattr(m, fn)(t(x), _wrap(a.get("per_tensor"), tree), variant=variant,
                             global_amax=_wrap(a.get("global_amax"), tree))
        return (out, m.from_nvfp4(out)) if fn == "to_nvfp4" else out
    codes = (np.arange(int(np.prod(a["shape"]))) % a.get("top", 16)).astype(np.uint8)
    return getattr(m, fn)(t(codes.reshape(a["shape"])))


def _plain(v: object) -> list[np.ndarray]:
    """A result as a list of arrays (dataclasses and tuples flattened, tensors to NumPy)."""
    if dataclasses.is_dataclass(v):
        return [a for f in dataclasses.fields(v) for a in _plain(getattr(v, f.name))]
    if isinstance(v, tuple):
        return [a for item in v for a in _plain(item)]
    if isinstance(v, torch.Tensor):
        return [v.cpu().numpy()]
    return [np.asarray(v if v is not None else np.nan)]


def _outcome(call: Callable[[], object]) -> tuple[str, object]:
    try:
        return "result", call()
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)


CASES = _cases()


def test_every_public_function_is_driven() -> None:
    """The edge table names every public function of the two trees (from_mx and from_nvfp4
    through the results of to_mx and to_nvfp4)."""
    public = {n for n in dir(rmx) if callable(getattr(rmx, n)) and not n.startswith("_")
              and getattr(getattr(rmx, n), "__module__", "") == "reference.mx"
              and not isinstance(getattr(rmx, n), type)}
    assert public - {fn for fn, _, _ in CASES} == {"from_mx", "from_nvfp4"}


@pytest.mark.parametrize(("fn", "argument", "args"), CASES,
                         ids=[f"{fn}-{arg}-{i}" for i, (fn, arg, _) in enumerate(CASES)])
def test_both_trees_give_the_same_result_or_line_at_the_edge(fn: str, argument: str,
                                                            args: dict) -> None:
    ref = _outcome(lambda: _call(fn, args, "reference"))
    tor = _outcome(lambda: _call(fn, args, "torch"))
    assert ref[0] == tor[0], f"{fn}({argument}={args}): reference {ref}, torch {tor}"
    if ref[0] != "result":
        assert ref[1] == tor[1] and "\n" not in str(ref[1]), (ref, tor)
        return
    for i, (r, t) in enumerate(zip(_plain(ref[1]), _plain(tor[1]), strict=True)):
        if r.dtype.kind in "USO":  # a format's name
            assert r.tolist() == t.tolist(), (fn, args, i)
            continue
        assert_claim("mx.twins", actual=np.asarray(t, dtype=r.dtype), expected=r,
                     context=f"{fn} {args} part {i}")
