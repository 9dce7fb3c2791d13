"""torch_impl.fp8_gemm's own contracts: the errors it names, and the probe of the CPU
kernel (the trees' agreement and torch._scaled_mm: parity/test_fp8_gemm.py)."""

from __future__ import annotations

import pytest
import torch

from torch_impl import fp8_gemm as tgemm


def test_bad_input_is_refused_naming_the_problem() -> None:
    a = torch.ones(2, 32).to(torch.float8_e4m3fn)
    b = torch.ones(3, 32).to(torch.float8_e5m2).t()
    one = torch.tensor(1.0)
    with pytest.raises(TypeError, match="a must be float8_e4m3fn or float8_e5m2, got float32"):
        tgemm.scaled_mm(torch.ones(2, 32), b, one, one)
    with pytest.raises(ValueError, match=r"a \(M, K\) and b \(K, N\) expected"):
        tgemm.scaled_mm(a, a, one, one)
    with pytest.raises(ValueError, match=r"scale_a is one value \(tensorwise\) or of shape"):
        tgemm.scaled_mm(a, b, torch.ones(1, 2), one)
    with pytest.raises(TypeError, match="scale_b must be float32, got float64"):
        tgemm.scaled_mm(a, b, one, one.double())
    with pytest.raises(TypeError, match="a must be float32, got float64"):
        tgemm.matmul_f32(torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"matmul_f32: a \(M, K\) and b \(K, N\) expected"):
        tgemm.matmul_f32(torch.ones(2, 3), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"mx_matmul: a \(M, K\)"):
        tgemm.mx_matmul(torch.ones(2, 32), torch.ones(3, 2), "float8_e4m3fn")


def test_the_probe_agrees_with_a_direct_call() -> None:
    """cpu_scaled_mm_support's tensorwise answer is whether _scaled_mm runs on CPU."""
    tensorwise, _ = tgemm.cpu_scaled_mm_support()
    a = torch.ones(4, 16).to(torch.float8_e4m3fn)
    b = torch.ones(8, 16).to(torch.float8_e4m3fn).t()
    try:
        torch._scaled_mm(a, b, scale_a=torch.tensor(2.0), scale_b=torch.tensor(0.5),
                         out_dtype=torch.float32)
        ran = True
    except (RuntimeError, NotImplementedError, ValueError):
        ran = False
    assert tensorwise == ran
