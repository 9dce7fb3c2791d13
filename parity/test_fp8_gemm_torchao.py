"""torch_impl's emulated MX GEMM against its oracle, torchao 0.18's MXTensor mm on CPU (the
emulated kernel preference: dequantize both operands, aten.mm), bit for bit (claim
fp8_gemm.mx_torchao). Skipped, saying so, without torchao (pip install -e .[oracles]).
"""

from __future__ import annotations

import logging

import pytest
import torch

from parity.compare import assert_claim
from parity.drivers import fp8_gemm as drv
from parity.extras import import_extra
from reference import mx as rmx
from torch_impl import fp8_gemm as tgemm

torchao = import_extra("torchao", "the MX oracle")
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao's enum notices
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.mx_tensor import MXTensor  # noqa: E402

ELEM = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
        "float6_e2m3fn": "fp6_e2m3", "float6_e3m2fn": "fp6_e3m2",
        "float4_e2m1fn": torch.float4_e2m1fn_x2}
MODES = {"floor": ScaleCalculationMode.FLOOR, "rceil_log2f": ScaleCalculationMode.RCEIL}


@pytest.mark.parametrize("fmt", rmx.ELEMENT_FORMATS)
def test_torch_mx_matmul_gives_torchaos_emulated_mm_bits(fmt: str, device: str) -> None:
    """a as an MXTensor, b^T as one and transposed back (a weight's layout), torch.mm."""
    for mode, ao_mode in MODES.items():
        a, b = (torch.from_numpy(x).to(device) for x in drv.mx_operands(16, 256, 24, seed=3))
        a_mx = MXTensor.to_mx(a, ELEM[fmt], 32, ao_mode)
        bt_mx = MXTensor.to_mx(b.t().contiguous(), ELEM[fmt], 32, ao_mode)
        theirs = torch.mm(a_mx, bt_mx.t())
        assert type(theirs) is torch.Tensor and theirs.dtype == torch.float32
        assert_claim("fp8_gemm.mx_torchao", actual=tgemm.mx_matmul(a, b, fmt, mode, "torchao"),
                     expected=theirs, context=f"{fmt} {mode}")
