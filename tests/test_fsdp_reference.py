"""reference.fsdp against torch's own rule (no process group): the chunking and padding of
FSDP2's shards (torch.chunk, _chunk_with_empty, _get_dim0_padded_size), the divide factors
(_get_gradient_divide_factors), the copy-in layout (torch._chunk_cat), and the errors it
names. The trees' agreement on a real run is parity/test_fsdp.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors
from torch.distributed.fsdp._fully_shard._fsdp_common import (
    _chunk_with_empty,
    _get_dim0_padded_size,
    _get_dim_chunked_size,
)

from reference import fsdp as rfsdp
from torch_impl import fsdp as tfsdp


class _Group:
    """What _get_gradient_divide_factors reads of a process group: its size."""

    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8])
def test_chunk_rows_and_padding_are_fsdp2s_for_every_small_dim0(world_size: int) -> None:
    """For d0 in 0..40 the rows of every rank's chunk, its shape (FSDPParam.sharded_size) and
    the padded rows are FSDP2's (_chunk_with_empty of torch.chunk, _get_dim_chunked_size,
    _get_dim0_padded_size); empty chunks reached."""
    empties = 0
    for d0 in range(41):
        x = torch.arange(d0 * 3, dtype=torch.float32).reshape(d0, 3)
        chunks = _chunk_with_empty(x, world_size, dim=0)
        rows = rfsdp.chunk_rows(d0, world_size)
        assert [hi - lo for lo, hi in rows] == [c.shape[0] for c in chunks], (d0, world_size)
        padded = _get_dim0_padded_size(x.size(), world_size)[0]
        assert rfsdp.padded_rows(d0, world_size) * world_size == padded
        for r, c in enumerate(chunks):
            mine = rfsdp.unpadded(rfsdp.shard(x.numpy(), r, world_size), d0, r, world_size)
            assert mine.shape == tuple(_get_dim_chunked_size(c, x.size(), 0))  # (0, 3) if empty
            assert np.array_equal(mine.reshape(-1), c.numpy().reshape(-1))
            empties += c.numel() == 0 and d0 > 0
    assert world_size < 4 or empties > 0, "guard: an empty chunk of a non-empty parameter"


def test_all_gather_inverts_shard_and_rounds_once_to_bf16() -> None:
    """The gathered parameter is the full one cast to bf16 (RNE, as torch's .to)."""
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    for ws in (1, 2, 3, 4):
        shards = [rfsdp.shard(x.numpy(), r, ws) for r in range(ws)]
        gathered = rfsdp.all_gather(shards, (7, 5), ml_dtypes.bfloat16)
        expected = x.to(torch.bfloat16).view(torch.int16).numpy()
        assert np.array_equal(gathered.view(np.int16), expected)


@pytest.mark.skipif(not tfsdp.RULE_STATED, reason=tfsdp.NOT_STATED)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 8, 12])
def test_divide_factors_are_fsdp2s(world_size: int) -> None:
    """None/None/AVG for float32 and bfloat16 (SUM at ws 1); fp16's pre/post split."""
    names = {"SUM": "sum", "AVG": "avg"}
    for np_dtype, dtype in ((np.float32, torch.float32), (ml_dtypes.bfloat16, torch.bfloat16),
                            (np.float16, torch.float16)):
        pre, post, op, _ = _get_gradient_divide_factors(_Group(world_size), None, dtype)
        assert rfsdp.divide_factors(world_size, np_dtype) == (pre, post, names[op.name]), \
            (world_size, dtype)


def test_copy_in_is_chunk_cat() -> None:
    """Each rank's reduce-scatter buffer is torch._chunk_cat's (ws, -1) rows, flattened."""
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(5, 3, generator=g), torch.randn(5, generator=g),
             torch.randn(2, 4, generator=g)]
    for ws in (1, 2, 3, 4):
        out = torch.empty(ws, sum(rfsdp.padded_rows(t.shape[0], ws) * (t.numel() // t.shape[0])
                                  for t in grads))
        torch._chunk_cat(grads, 0, ws, out=out)
        mine = rfsdp.copy_in([t.numpy() for t in grads], ws, np.float32)
        assert np.array_equal(mine, out.reshape(-1).numpy()), ws


def test_one_rank_reduce_scatter_is_the_gradient_itself() -> None:
    """ws 1: no collective, nothing divided; a bf16 gradient cast to float32 exactly."""
    grad = np.array([[1.5, -2.0], [3.0, 0.25]], dtype=ml_dtypes.bfloat16)
    (out,), = rfsdp.reduce_scatter([[grad]], np.float32)
    assert out.dtype == np.float32 and np.array_equal(out, grad.astype(np.float32))


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="world_size >= 1"):
        rfsdp.chunk_rows(4, 0)
    with pytest.raises(ValueError, match="0-d parameter"):
        rfsdp.shard(np.float32(1.0).reshape(()), 0, 2)
    with pytest.raises(ValueError, match=r"rank 2 is not in 0\.\.1"):
        rfsdp.shard(np.zeros(4, np.float32), 2, 2)
    with pytest.raises(ValueError, match="one padded shard per rank"):
        rfsdp.all_gather([np.zeros(2), np.zeros(3)], (4,), np.float32)
    with pytest.raises(ValueError, match="shapes differ across ranks"):
        rfsdp.reduce_scatter([[np.zeros(4)], [np.zeros(5)]], np.float32)
    with pytest.raises(ValueError, match="one list of gradients per rank"):
        rfsdp.reduce_scatter([], np.float32)
    with pytest.raises(ValueError, match="op one of"):
        rfsdp.gloo_reduce_scatter([np.zeros(4)] * 2, "max")
    with pytest.raises(ValueError, match="ws \\* n elements"):
        rfsdp.gloo_reduce_scatter([np.zeros(3)] * 2)


def test_fsdp_job_refuses_what_it_cannot_run() -> None:
    """torch_impl.fsdp's jobs: the model, optimizer, precision, reduce_dtype, batch split,
    the collective's op."""
    from dataclasses import replace

    from parity.drivers.fsdp import config
    from torch_impl.fsdp import fsdp_job, reduce_scatter_job

    c = config()
    with pytest.raises(ValueError, match="optimizer 'AdamW'"):
        fsdp_job(replace(c, optimizer="SGD"), 1, 2, "float32")
    with pytest.raises(ValueError, match="precision must be 'fp32'"):
        fsdp_job(replace(c, precision="bf16"), 1, 2, "float32")
    with pytest.raises(ValueError, match="reduce_dtype one of"):
        fsdp_job(c, 1, 2, "float16")
    with pytest.raises(ValueError, match="does not split into 5"):
        fsdp_job(c, 1, 5, "float32")
    with pytest.raises(ValueError, match="steps and world_size"):
        fsdp_job(c, 0, 2, "float32")
    with pytest.raises(ValueError, match="op 'sum' or 'avg'"):
        reduce_scatter_job("float32", 4, "max", 0, 2)
