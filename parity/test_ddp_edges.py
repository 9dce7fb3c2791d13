"""ddp's pure function of a world, `shard`, at each edge of its declared ranges
(common/arg_ranges.py: WORLD_SIZES, and a rank in [0, world_size)) and one past each: both
trees give the same rows or the same one-line error (claim ddp.shards), and a value outside
its range is refused (world size 0 divided by zero, a rank past the world gave rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.arg_ranges import WORLD_SIZES
from parity.drivers.edges import judge, outcome
from parity.strategies.edges import edges
from reference import ddp as rddp
from torch_impl import ddp as tddp

X = np.arange(24, dtype=np.float32).reshape(12, 2)
CASES = {f"world size {label}": (ws, 0, inside) for label, ws, inside in edges(WORLD_SIZES)}
CASES.update({f"rank {label} of 3": (3, rank, inside) for label, rank, inside in edges(range(3))})
CASES["a world that does not divide the batch"] = (5, 0, False)


@pytest.mark.parametrize("case", list(CASES))
def test_shard_at_each_declared_edge_is_the_same_in_both_trees(case: str, device: str) -> None:
    """World sizes 1 and 2^31 - 1, 0 and 2^31; ranks 0 and ws - 1, -1 and ws."""
    ws, rank, inside = CASES[case]
    ref = outcome(lambda: rddp.shard(X, rank, ws))
    tor = outcome(lambda: tddp.shard(torch.from_numpy(X).to(device), rank, ws))
    assert inside or ref.error is not None, f"{case}: accepted outside its declared range"
    if ws == WORLD_SIZES[-1]:  # 12 rows do not split into 2^31 - 1 shards: refused, alike
        assert ref.error is not None
    judge("ddp.shards", ref, tor, case)
