"""The numerics Detector on models that are not this project's (torch_impl/numerics.py,
checked_step): a conv net with a seeded NaN, containers called with keyword arguments or
returning tuples (where the watched re-run must see what the forward saw), and transformers'
GPT2LMHeadModel under fp16 autocast with a seeded overflow; each names the step, module path
and op where the value was planted, and a clean run of each reports nothing.

transformers is an optional oracle (the `oracles` extra, which CI installs): its tests skip,
saying so, without it. Its import (about 2 s once torch is loaded) is paid once per run."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from examples.models import convnet
from torch_impl.numerics import Detector, FirstInvalid, NonFinite, checked_step, replay_step

STEPS = 3


def _run(model: nn.Module, loss_of: Callable[[], torch.Tensor], *, fault_step: int | None,
         fault: Callable[[], None], fmt: str = "float16") -> tuple[FirstInvalid | None, int]:
    """STEPS steps of SGD under a Detector, `fault()` just before step fault_step: (the
    report or None, the steps counted)."""
    detector = Detector(model, None, fmt, scaler_enabled=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        if step == fault_step:
            fault()
        try:
            checked_step(detector, step, loss_of, optimizer)
        except NonFinite as e:
            return e.report, len(detector.history)
    return None, len(detector.history)


def _set(tensor: torch.Tensor, index: tuple[int, ...], value: float) -> Callable[[], None]:
    def fault() -> None:
        with torch.no_grad():
            tensor[index] = value
    return fault


def test_a_seeded_nan_in_the_conv_net_is_named_at_its_step_module_and_op() -> None:
    """Conv2d -> BatchNorm -> ReLU -> Linear; a NaN written into conv.weight before step 1:
    the report is step 1, forward, 'conv', ConvolutionBackward0, its weight flagged."""
    model, x, loss_fn = convnet()
    report, counted = _run(model, lambda: loss_fn(model(x), x), fault_step=1,
                           fault=_set(model.conv.weight, (0, 0, 0, 0), float("nan")))
    assert report is not None and counted == 2
    assert (report.step, report.phase, report.module, report.op, report.value) == (
        1, "forward", "conv", "ConvolutionBackward0", "nan")
    assert [r.name for r in report.inputs if r.nonfinite] == ["weight"]


def test_a_clean_run_of_the_conv_net_reports_nothing() -> None:
    model, x, loss_fn = convnet()
    report, counted = _run(model, lambda: loss_fn(model(x), x), fault_step=None,
                           fault=lambda: None)
    assert report is None and counted == STEPS


class _Scaled(nn.Module):
    """A container whose inline op needs a keyword argument: exp(lin(x) * scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.lin(x) * scale)


class _Pair(nn.Module):
    """A container returning a tuple: (exp(lin(x)), x)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.exp(self.lin(x)), x


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scaled, self.pair, self.head = _Scaled(), _Pair(), nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.head(self.pair(self.scaled(x, scale=scale))[0]).mean()


@pytest.mark.parametrize(("where", "maker"), [("scaled", "scaled"), ("pair", "pair")])
def test_an_inline_overflow_is_named_in_its_container_with_the_op(where: str, maker: str
                                                                   ) -> None:
    """exp overflows float32 inside a container: `scaled` is re-run with its keyword argument
    `scale` (without it the re-run raises and the op is lost); `pair` returns a tuple (its
    non-finite first element marks it as the maker, not the root). Op: ExpBackward0."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = _Net()
    x, scale = torch.rand(3, 4, generator=g), torch.tensor(0.5)
    lin = getattr(model, where).lin
    report, _ = _run(model, lambda: model(x, scale), fault_step=1,
                     fault=_set(lin.bias, (0,), 1e3), fmt="float32")
    assert report is not None
    assert (report.step, report.module, report.op, report.value) == (
        1, maker, "ExpBackward0", "inf")


def test_the_detector_rejects_a_loss_that_is_not_a_module() -> None:
    model, _, loss_fn = convnet()
    with pytest.raises(TypeError, match=r"loss_fn must be an nn\.Module"):
        Detector(model, loss_fn, "float16", scaler_enabled=False)


# ---------------------------------------------------------------- transformers' GPT-2
@pytest.fixture(scope="module")
def hf() -> object:
    return pytest.importorskip("transformers", reason="transformers is an optional oracle")


def _gpt2_run(module: str, scale: float, fault_step: int | None
              ) -> tuple[FirstInvalid | None, nn.Module, Callable[[], torch.Tensor]]:
    from examples.models import tiny_gpt2

    model, batch = tiny_gpt2((2, 8))

    def loss_of() -> torch.Tensor:
        with torch.autocast("cpu", torch.float16):
            return model(**batch).loss

    def fault() -> None:
        with torch.no_grad():
            model.get_submodule(module).weight.mul_(scale)

    report, _ = _run(model, loss_of, fault_step=fault_step, fault=fault)
    return report, model, loss_of


@pytest.mark.parametrize(("module", "scale", "maker", "op"), [
    ("transformer.h.1.mlp.c_fc", 3e5, "transformer.h.1.mlp.c_fc", "AddmmBackward0"),
    ("transformer.h.1.attn.c_attn", 5e3, "transformer.h.1.attn", "BmmBackward0"),
])
def test_a_seeded_fp16_overflow_in_gpt2_is_named(hf: object, module: str, scale: float,
                                                 maker: str, op: str) -> None:
    """fp16 autocast on the CPU; block 1's weight scaled before step 1 (kept inside float16's
    range): c_fc's GEMM overflows (the leaf itself), or q k^T inside the attention module (an
    inline matmul: named by the watched re-run with the call's keyword arguments)."""
    report, _, _ = _gpt2_run(module, scale, fault_step=1)
    assert report is not None
    assert (report.step, report.phase, report.module, report.op) == (1, "forward", maker, op)
    assert report.value in ("inf", "-inf")
    assert not any(r.out_of_range() for r in report.inputs)  # made here, from finite inputs


def test_a_clean_gpt2_run_reports_nothing(hf: object) -> None:
    report, _, _ = _gpt2_run("transformer.h.1.mlp.c_fc", 1.0, fault_step=None)
    assert report is None


def test_a_backward_nan_in_gpt2_is_replayed_to_its_node(hf: object) -> None:
    """c_fc scaled by 1e4: the forward stays finite (tanh saturates the cube), the backward
    of the GELU's pow makes NaN: the report names c_fc's bias gradient (the first parameter
    in backward order with a NaN), the replay under detect_anomaly names PowBackward0 in
    transformer.h.1.mlp.act."""
    report, model, loss_of = _gpt2_run("transformer.h.1.mlp.c_fc", 1e4, fault_step=1)
    assert report is not None
    assert (report.step, report.phase, report.module) == (
        1, "backward", "transformer.h.1.mlp.c_fc.bias")
    model.zero_grad(set_to_none=True)
    replay = replay_step(model, loss_of)
    assert (replay.node, replay.module) == ("PowBackward0", "transformer.h.1.mlp.act")
