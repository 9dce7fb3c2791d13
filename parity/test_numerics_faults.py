"""The catalogue's faults that are not a value written somewhere, in both trees: a loss
written by hand (log of zero), a learning rate that diverges (its step found by running),
fp16 without a GradScaler (zeros, not NaN: numerics.underflow_counts), and an op written
inline in a container (the residual add, named AddBackward0 by both). Each with its repair.
Drivers: parity/drivers/numerics.py; the value faults: parity/test_numerics.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers.numerics import (
    FAULTED,
    faulted_run,
    json_bytes,
    seed_directory,
    underflow_counts,
)
from parity.drivers.train import one_thread
from parity.strategies import examples
from reference.faults import FAULTS
from reference.numerics import COLUMNS


@pytest.fixture(autouse=True)
def _torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The common start of the faulted runs, per precision (the MLP)."""
    with one_thread():
        dirs = {}
        for precision in ("fp16", "fp32", "bf16"):
            dirs[precision] = tmp_path_factory.mktemp(f"start-{precision}") / "ckpt"
            seed_directory(dirs[precision], {**FAULTED, "precision": precision})
        return dirs


def _found(name: str, fault: str, precision: str, start: Path, work: Path, steps: int
           ) -> object:
    _, found = faulted_run(name, {**FAULTED, "precision": precision}, fault, 3, steps, start,
                           work / name)
    assert found is not None, f"{name} did not find {fault} in {precision}"
    return found


# the faults that are code, not a value: a hand-written loss, a learning rate
CODE_FAULTS = [(f.name, shows[0]) for f in FAULTS.values()
               if f.loss is not None or f.lr is not None for shows in f.shows]


@pytest.mark.parametrize(("fault", "precision"), CODE_FAULTS)
def test_both_trees_name_the_catalogued_first_invalid_value_of_a_loss_or_lr_fault(
        fault: str, precision: str, start: dict[str, Path], tmp_path: Path) -> None:
    """log(0) in the hand-written loss (LogBackward0 in module loss) and the learning rate's
    overflow (its step found by running): same step, phase, module, op, index, value and
    non-finite counts in both trees, where the catalogue says it first shows."""
    f = FAULTS[fault]
    ref, got = (_found(name, fault, precision, start[precision], tmp_path, 5 + f.delay)
                for name in ("reference", "torch"))
    shown = {p: rest for p, *rest in f.shows}[precision]
    assert [ref.report.phase, ref.report.module, ref.report.op] == shown
    assert ref.report.step == 3 + f.delay  # the regression guard's step
    assert_claim("numerics.first_invalid", actual=json_bytes(got.report.identity()),
                 expected=json_bytes(ref.report.identity()), context=f"{fault} {precision}")
    assert_claim("numerics.first_invalid",
                 actual=json_bytes({k: v[:3] for k, v in got.report.counts.items()}),
                 expected=json_bytes({k: v[:3] for k, v in ref.report.counts.items()}),
                 context="non-finite counts")


@pytest.mark.slow
@pytest.mark.parametrize("case", CODE_FAULTS)
@settings(examples(20), deadline=None)
@given(seed=st.integers(0, 2**16), hidden=st.tuples(st.integers(1, 24), st.integers(1, 24)),
       fault_step=st.integers(1, 3))
def test_both_trees_name_the_same_first_invalid_value_of_a_code_fault_for_any_seed_and_size(
        case: tuple[str, str], seed: int, hidden: tuple[int, int], fault_step: int,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random seeds, widths and fault steps, run to the horizon: whenever one tree finds a
    first invalid value, the other finds the same one at the same step."""
    name, precision = case
    config = {**FAULTED, "seed": seed, "sizes": (8, *hidden, 3), "precision": precision}
    root = tmp_path_factory.mktemp("any")
    seed_directory(root / "start", config)
    found = [faulted_run(impl, config, name, fault_step, FAULTED["horizon"], root / "start",
                         root / impl)[1] for impl in ("reference", "torch")]
    event(f"{name} {precision}: found {found[0] is not None}")
    assert (found[0] is None) == (found[1] is None)
    if found[0] is not None:
        event(f"{name}: shows {found[0].report.step - fault_step} steps after the fault")
        assert_claim("numerics.first_invalid", actual=json_bytes(found[1].report.identity()),
                     expected=json_bytes(found[0].report.identity()), context=f"{config} {name}")


@pytest.mark.parametrize("fault", ["log_of_zero", "lr_divergence"])
def test_the_catalogued_repair_keeps_every_value_finite_over_the_same_steps(
        fault: str, start: dict[str, Path], tmp_path: Path) -> None:
    """The fix, applied: log_of_zero's over-confident logits under the run's own
    cross_entropy (log_softmax), lr_divergence's run at the configured learning rate. Neither
    tree sees a non-finite activation or gradient on any step up to the one where the fault
    showed."""
    f = FAULTS[fault]
    repaired = dataclasses.replace(f, loss=None, lr=None)
    for name in ("reference", "torch"):
        run, found = faulted_run(name, {**FAULTED, "precision": "fp32"}, repaired, 3,
                                 5 + f.delay, start["fp32"], tmp_path / name)
        assert found is None and len(run.numerics.history) == 4 + f.delay  # every step seen
        assert all(sum(row[:3]) == 0 for counts in run.numerics.history
                   for row in counts.values())


def _zeros_agree(seed: int, start: Path, work: Path) -> tuple[int, int]:
    """Both trees' gradient count rows at fp16_without_scaler's step, faulted and repaired,
    held to numerics.underflow_counts; (zeros counted without the scaler, with it)."""
    totals = []
    for repaired in (False, True):
        ref, got = (underflow_counts(name, seed, start, work, repaired=repaired)
                    for name in ("reference", "torch"))
        assert_claim("numerics.underflow_counts", actual=json_bytes(got), expected=json_bytes(ref),
                     context=f"seed {seed} repaired {repaired}")
        assert all(sum(row[:3]) == 0 for row in ref.values())  # nothing non-finite
        totals.append(sum(row[COLUMNS.index("zero")] for row in ref.values()))
    return totals[0], totals[1]


def test_fp16_without_a_scaler_loses_gradients_to_zero_counted_the_same_by_both_trees(
        start: dict[str, Path], tmp_path: Path) -> None:
    """The underflow is no NaN: both trees count the same zeros per parameter, hundreds of
    them (the fault reached), and keeping the GradScaler brings every count to 0."""
    faulted, repaired = _zeros_agree(FAULTED["seed"], start["fp16"], tmp_path)
    assert faulted > 100 and repaired == 0


@pytest.mark.slow
@settings(examples(30), deadline=None)
@given(seed=st.integers(0, 2**16))
def test_fp16_without_a_scaler_counts_agree_for_any_seed(
        seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("underflow")
    seed_directory(root / "start", {**FAULTED, "precision": "fp16", "seed": seed})
    faulted, repaired = _zeros_agree(seed, root / "start", root)
    event(f"zeros counted: {faulted > 0}")
    assert repaired == 0



def test_an_inline_residual_add_is_named_add_backward_in_both_trees(device: str) -> None:
    """A container whose own body adds its input to its child's output (x + lin(x), the
    transformer block's residual): both finite, the sum beyond float32's max. No leaf of the
    container shows the inf (the next Linear does); both trees name the container and torch's
    AddBackward0 for the inline add, with the same index, value and input ranges."""
    from reference import numerics as r_numerics
    from reference.module import Module
    from reference.nn import CrossEntropyLoss, Linear, Sequential
    from torch_impl import numerics as t_numerics

    class Residual(Module):
        def __init__(self, lin: Module) -> None:
            super().__init__()
            self.lin = lin

        def _needs_tape(self) -> bool:
            return False

        def forward(self, x: np.ndarray) -> np.ndarray:
            return x + self.lin.forward(x)

        def backward(self, g: np.ndarray) -> np.ndarray:
            return g + self.lin.backward(g)

    class TorchResidual(torch.nn.Module):
        def __init__(self, lin: torch.nn.Module) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.lin(x)

    rng = np.random.default_rng(0)
    ref_model = Sequential(Residual(Linear(4, 4, rng=rng)), Linear(4, 3, rng=rng))
    torch_model = torch.nn.Sequential(TorchResidual(torch.nn.Linear(4, 4)),
                                      torch.nn.Linear(4, 3)).to(device)
    with torch.no_grad():
        for (_, p), (_, tp) in zip(ref_model.named_parameters(),
                                   torch_model.named_parameters(), strict=True):
            tp.copy_(torch.from_numpy(p.data))
    params = dict(ref_model.named_parameters())
    params["0.lin.weight"].data[...] = 0.0  # lin(x) = its bias, finite; x + lin(x) is 4e38
    params["0.lin.bias"].data[1] = 3.0e38  # in column 1
    x = np.full((2, 4), 1e38, np.float32)
    y = np.array([0, 2])
    with torch.no_grad():
        torch_params = dict(torch_model.named_parameters())
        torch_params["0.lin.weight"][...] = 0.0
        torch_params["0.lin.bias"][1] = 3.0e38
    reports = []
    for mod, model, loss_fn, tensor in (
            (r_numerics, ref_model, CrossEntropyLoss(), np.asarray),
            (t_numerics, torch_model, torch.nn.CrossEntropyLoss(),
             lambda a: torch.from_numpy(a).to(device))):
        detector = mod.Detector(model, loss_fn, "float16", scaler_enabled=False)
        with pytest.raises(r_numerics.NonFinite) as found, np.errstate(over="ignore",
                                                                       invalid="ignore"):
            with detector.phase("forward"):
                loss_fn(model(tensor(x)), tensor(y))
            with detector.phase("optimizer"):
                pass
        reports.append(found.value.report)
    assert (reports[0].module, reports[0].op) == ("0", "AddBackward0")  # the inline op, named
    assert_claim("numerics.first_invalid", actual=json_bytes(reports[1].identity()),
                 expected=json_bytes(reports[0].identity()))
    assert [r.name for r in reports[0].inputs] == [r.name for r in reports[1].inputs]
