"""docs/fp8.md: the table of where the blockwise fp8 GEMM's outputs part between the three
quantization variants, computed here (parity/drivers/fp8_blockwise_gemm.py
variant_disagreements; parity/test_fp8_blockwise_gemm.py recomputes it against the page)."""

from __future__ import annotations

from parity.lab.gendocs import section

_NAMES = {"deepseek": "deepseek", "torchao": "torchao", "transformer_engine": "TE"}


@section("fp8.md", "blockwise-gemm")
def _() -> str:
    from parity.drivers.fp8_blockwise_gemm import PAIRS, variant_disagreements

    table = variant_disagreements()
    head = ("| input class | outputs | "
            + " | ".join(f"{_NAMES[a]} vs {_NAMES[b]}" for a, b in PAIRS) + " |")
    lines = [head, "|---|---:|" + "---:|" * len(PAIRS)]
    for name, (outputs, *counts) in table.items():
        lines.append(f"| {name} | {outputs} | " + " | ".join(str(n) for n in counts) + " |")
    return (
        "Outputs of `blockwise_mm` (x (16, 512) in 1x128 tiles times w (512, 256) in 128x128 "
        "blocks, each quantized by the variant named; the operands of "
        "`parity/strategies/fp8_blockwise.py` blockwise_gemm_operands, seed 0) that differ "
        "between two variants, NaN as one value (claim `fp8_blockwise.gemm_disagreements`; "
        "where they agree by construction: `fp8_blockwise.gemm_variants_agree`):\n\n"
        + "\n".join(lines))
