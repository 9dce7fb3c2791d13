"""The numerics detector is the same in both trees: a seeded fault is found at the same
step, module, op and index with the same counts (numerics.first_invalid), and the anomaly
replay names the same backward node (numerics.replay_node). The format view's tests are in
parity/test_numerics_format_view.py, the command line's in parity/test_numerics_cli.py.
Drivers: parity/drivers/numerics.py.
"""

from __future__ import annotations

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
    Found,
    faulted_run,
    json_bytes,
    replay,
    runs_once,
    save_replay,
    seed_directory,
)
from parity.drivers.train import one_thread
from parity.strategies import examples
from reference import amp as ramp
from reference import faults as rfaults
from reference import nn as rnn
from reference import numerics as rnumerics
from reference.faults import fault_named
from reference.numerics import NonFinite
from torch_impl import amp as tamp
from torch_impl import faults as tfaults
from torch_impl import nn as tnn
from torch_impl import numerics as tnumerics
from torch_impl.state_mapping import state_dict_to_torch


@pytest.fixture(autouse=True)
def _torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


# ---------------------------------------------------------------- seeded faults

def test_an_fp16_weight_overflow_is_named_alike_by_both_trees_detectors(device: str) -> None:
    """One MLP, the same weights in each tree, the catalogue's weight_overflow written into
    both (2^17, finite in float32, beyond float16): one step under fp16 autocast and each
    tree's detector stops it naming the same step, phase, module, op, index and value."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)  # (batch, features)
    y = rng.integers(0, 3, 4)  # (batch,) int64 classes
    ref_model = rnn.make_mlp([8, 16, 16, 3], "tanh", rng=rng)  # Linear Tanh Linear Tanh Linear
    torch_model = tnn.make_mlp([8, 16, 16, 3], "tanh", generator=torch.Generator(),
                               device=device)
    torch_model.load_state_dict(state_dict_to_torch(ref_model.state_dict(), device))
    ref_loss_fn, torch_loss_fn = rnn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()
    x, y = rfaults.apply_fault(ref_model, fault_named("weight_overflow"), (x, y))
    tx, ty = tfaults.apply_fault(torch_model, fault_named("weight_overflow"),
                                 (torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)))
    ref_detector = rnumerics.Detector(ref_model, ref_loss_fn, "float16", scaler_enabled=False)
    torch_detector = tnumerics.Detector(torch_model, torch_loss_fn, "float16",
                                        scaler_enabled=False)
    with pytest.raises(NonFinite) as ref_found:
        with ref_detector.phase("forward"), ramp.autocast("float16"):
            ref_loss = ref_loss_fn(ref_model.forward(x), y)
        with ref_detector.phase("backward"), np.errstate(over="ignore", invalid="ignore"):
            ref_model.backward(ref_loss_fn.backward(np.ones_like(ref_loss)))  # dloss/dloss = 1
        with ref_detector.phase("optimizer"):  # the step's counts: NonFinite, before an update
            pass
    with pytest.raises(NonFinite) as torch_found:
        with torch_detector.phase("forward"), tamp.autocast(torch.float16, tx.device.type):
            torch_loss = torch_loss_fn(torch_model(tx), ty)
        with torch_detector.phase("backward"):
            torch_loss.backward()
        with torch_detector.phase("optimizer"):
            pass
    ref, got = ref_found.value.report, torch_found.value.report
    weight = dict(ref_model.named_parameters())["2.weight"].data  # (16, 16) float32
    assert np.isfinite(weight).all() and ref.module == "2"  # the fp16 cast made the inf
    assert [r.name for r in ref.inputs if r.out_of_range()] == ["weight"]  # named as the cause
    assert_claim("numerics.first_invalid", actual=json_bytes(got.identity()),
                 expected=json_bytes(ref.identity()), context=ref.line())


# what each fault writes out of range: the op where it first shows has that as its input
WRITES = {"weight_overflow": "weight", "inf_weight": "weight", "poisoned_batch": "input"}
CASES = [("weight_overflow", "fp16"), ("inf_weight", "fp32"), ("inf_weight", "bf16"),
         ("poisoned_batch", "fp16")]


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The common start of the faulted runs, per precision."""
    with one_thread():
        dirs = {}
        for precision in ("fp16", "fp32", "bf16"):
            dirs[precision] = tmp_path_factory.mktemp(f"start-{precision}")
            seed_directory(dirs[precision] / "ckpt", {**FAULTED, "precision": precision})
        return {k: v / "ckpt" for k, v in dirs.items()}


def _found(name: str, fault: str, precision: str, start: Path, work: Path, steps: int = 5
           ) -> NonFinite:
    _, found = faulted_run(name, {**FAULTED, "precision": precision}, fault, 3, steps, start,
                           work / name)
    assert found is not None, f"{name} did not find {fault} in {precision}"
    return found


@pytest.fixture(scope="module")
def found(start: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Found:
    """found(tree, fault, precision): that tree's faulted run from the common start (5
    steps), so the catalogue test and the replay test read the same runs."""
    return runs_once(lambda name, fault, precision, work:
                     _found(name, fault, precision, start[precision], work), tmp_path_factory)


@pytest.mark.parametrize(("fault", "precision"), CASES)
def test_both_trees_name_the_same_first_invalid_value(fault: str, precision: str,
                                                      found: Found) -> None:
    """Same step, phase, module, op, index and value; same non-finite counts per row."""
    ref, got = found("reference", fault, precision), found("torch", fault, precision)
    assert ref.report.step == 3 and ref.report.phase == "forward"  # the seeded step, reached
    assert_claim("numerics.first_invalid", actual=json_bytes(got.report.identity()),
                 expected=json_bytes(ref.report.identity()), context=f"{fault} {precision}")
    nonfinite = {k: v[:3] for k, v in ref.report.counts.items()}
    assert_claim("numerics.first_invalid",
                 actual=json_bytes({k: v[:3] for k, v in got.report.counts.items()}),
                 expected=json_bytes(nonfinite), context="non-finite counts")
    out = [r.name for r in ref.report.inputs if r.out_of_range()]
    assert out == [r.name for r in got.report.inputs if r.out_of_range()]
    assert out == [WRITES[fault]], out  # the one input already out of range: this fault's


@settings(examples(15), deadline=None)
@given(seed=st.integers(0, 2**16), hidden=st.tuples(st.integers(1, 24), st.integers(1, 24)),
       fault=st.sampled_from(CASES), fault_step=st.integers(1, 3))
def test_both_trees_name_the_same_first_invalid_value_for_any_seed_and_size(
        seed: int, hidden: tuple[int, int], fault: tuple[str, str], fault_step: int,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random seeds, widths and fault steps: whenever one tree finds a first invalid value,
    the other finds the same one."""
    name, precision = fault
    config = {**FAULTED, "seed": seed, "sizes": (8, *hidden, 3), "precision": precision}
    root = tmp_path_factory.mktemp("any")
    seed_directory(root / "start", config)
    found = [faulted_run(impl, config, name, fault_step, 4, root / "start", root / impl)[1]
             for impl in ("reference", "torch")]
    event(f"{name}: found {found[0] is not None}")
    assert (found[0] is None) == (found[1] is None)
    if found[0] is not None:
        assert_claim("numerics.first_invalid", actual=json_bytes(found[1].report.identity()),
                     expected=json_bytes(found[0].report.identity()), context=f"{config} {name}")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_weight_overflow_is_found_only_where_the_format_cannot_hold_it(
        precision: str, start: dict[str, Path], tmp_path: Path) -> None:
    """2^17 is finite in float32 and bfloat16: neither tree finds anything in 5 steps."""
    for name in ("reference", "torch"):
        run, found = faulted_run(name, {**FAULTED, "precision": precision},
                                 "weight_overflow", 3, 5, start[precision], tmp_path / name)
        assert found is None and len(run.numerics.history) == 4


@pytest.mark.parametrize(("fault", "precision"), [CASES[0], CASES[1], CASES[3],
                                                  ("log_of_zero", "fp32")])
def test_replay_names_the_same_backward_node_whichever_tree_wrote_the_file(
        fault: str, precision: str, found: Found, tmp_path: Path) -> None:
    """Each tree's replay file (the catalogue test's runs), replayed by each tree: the same
    node and module (torch's from detect_anomaly's own message)."""
    names = {}
    for writer in ("reference", "torch"):
        path = tmp_path / f"{writer}.replay"
        save_replay(writer, path, found(writer, fault, precision).replay)
        for reader in ("reference", "torch"):
            result = replay(reader, path)
            names[writer, reader] = {"node": result.node, "module": result.module}
    expected = names["torch", "torch"]
    assert expected["node"] is not None  # detect_anomaly raised: the replay reached a NaN
    for key, value in names.items():
        assert_claim("numerics.replay_node", actual=json_bytes(value),
                     expected=json_bytes(expected), context=str(key))


# ---------------------------------------------------------------- one sync per step

def test_torch_detector_hooks_read_nothing_back_to_the_host(device: str) -> None:
    """Forward hooks and the step's end make no .item()/bool() read (no
    aten._local_scalar_dense) on a clean step after the first (which derives the view's
    thresholds once per dtype, by bisection on the host, and caches them): the counts reach
    the host only through the one .tolist() of the stacked rows."""
    from parity.lab.your_trainer.host_reads import HostReads
    from torch_impl import numerics as t_numerics
    from torch_impl.nn import make_mlp

    model = make_mlp((8, 16, 3), "tanh", generator=torch.Generator().manual_seed(0),
                     device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    detector = t_numerics.Detector(model, loss_fn, "float16", scaler_enabled=False)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)).to(device)
    y = torch.tensor([0, 1, 2, 0], device=device)
    def step() -> None:
        with detector.phase("forward"):
            loss = loss_fn(model(x), y)
        with detector.phase("backward"):
            loss.backward()
        with detector.phase("optimizer"):
            pass

    step()  # the thresholds' one derivation
    with HostReads() as mode:
        step()
    assert len(detector.history) == 2 and len(detector.history[1]) == 4 + 4  # reached
    assert sum(mode.sites.values()) == 0, mode.sites


# ---------------------------------------------------------------- the hooks themselves

@pytest.mark.parametrize("activation", ["relu", "tanh", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_hooks_see_the_same_leaves_in_the_same_order_with_the_same_op_names(
        activation: str, precision: str, loss: str, device: str) -> None:
    """Every leaf (and the loss) is seen once, in op order, with torch's node name: looked up
    in the reference, read off grad_fn in torch."""
    from reference import numerics as r_numerics
    from reference.train import Run as RefRun
    from reference.train import TrainConfig
    from torch_impl import numerics as t_numerics
    from torch_impl.train import Run as TorchRun

    config = TrainConfig(sizes=(8, 16, 16, 3), activation=activation, dropout=0.25,
                         precision=precision, loss=loss, horizon=4)
    seen = {}
    for name, run, mod in (("reference", RefRun(config), r_numerics),
                           ("torch", TorchRun(config, device), t_numerics)):
        detector = mod.Detector(run.model, run.loss_fn, "float16", scaler_enabled=True)
        order: list[tuple[str, str]] = []

        def record(phase_name: str, detector: object = detector, order: list = order) -> object:
            if phase_name == "optimizer":
                order.extend(detector.ops())
            return detector.phase(phase_name)

        run.train_step(phase=record)
        seen[name] = order
    assert len(seen["reference"]) == 8  # 3 Linear, 2 activations, 2 Dropout, the loss
    assert_claim("numerics.first_invalid", actual=json_bytes(seen["torch"]),
                 expected=json_bytes(seen["reference"]), context=f"{activation} {precision} {loss}")


@pytest.mark.parametrize(("name", "precision"), [("reference", "fp32"), ("torch", "fp16")])
def test_a_recomputed_forward_is_not_counted_twice(name: str, precision: str,
                                                   device: str) -> None:
    """With checkpointed segments the backward re-runs forwards; the detector's rows are
    still one per leaf, the same as without recomputation."""
    from parity.drivers.numerics import numerics_module
    from parity.drivers.train import impl, on

    ops = {}
    for recompute in ("none", "uniform:2"):
        m = impl(name)
        config = m.TrainConfig(sizes=(8, 16, 16, 3), precision=precision,
                               recompute=recompute, horizon=4)
        run = m.Run(config, **on(name, device))
        mod = numerics_module(name)
        detector = mod.Detector(run.model, run.loss_fn, "float16", scaler_enabled=True)
        for _ in range(2):
            run.train_step(phase=detector.phase)
        ops[recompute] = (detector.ops(), list(detector.history[-1]))
    assert len(ops["none"][0]) == 6  # 3 Linear, 2 Tanh, the loss: the detector saw them
    assert ops["uniform:2"] == ops["none"]


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_a_replay_file_reproduces_the_faulty_step_exactly(name: str, tmp_path: Path) -> None:
    """With dropout on, the saved state, random state and batch re-run the faulty step to the
    same counts in every column (the zeros depend on the dropout mask)."""
    from parity.drivers.numerics import load_replay, numerics_module
    from parity.drivers.train import impl

    config = {**FAULTED, "precision": "fp32", "dropout": 0.3, "activation": "relu"}
    root = tmp_path / "start"
    seed_directory(root, config)
    _, found = faulted_run(name, config, "poisoned_batch", 3, 5, root, tmp_path / name)
    assert found is not None
    path = tmp_path / "file.replay"
    save_replay(name, path, found.replay)
    state = load_replay(name, path)
    m = impl(name)
    run = m.restored(m.TrainConfig(**config), state)
    detector = numerics_module(name).Detector(run.model, run.loss_fn, "float16",
                                              scaler_enabled=False)
    detector.step = found.report.step
    with pytest.raises(type(found)) as again:
        run.train_step((state["batch"]["x"], state["batch"]["y"]), detector.phase)
    assert again.value.report.identity() == found.report.identity()
    assert again.value.report.counts == found.report.counts


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("scaler_enabled", [False, True])
def test_a_nonfinite_gradient_stops_only_a_run_without_a_scaler(scaler_enabled: bool,
                                                               bad: float, device: str) -> None:
    """Forward finite, a gradient non-finite (each kind of non-finite alone): without a
    scaler both trees report phase "backward" at the first parameter in backward order (its
    first non-finite element); with one, the step is the scaler's to skip and nothing is
    reported."""
    from reference import numerics as r_numerics
    from reference.nn import CrossEntropyLoss
    from reference.nn import make_mlp as r_make_mlp
    from torch_impl import numerics as t_numerics
    from torch_impl.nn import make_mlp as t_make_mlp

    x = np.linspace(-1, 1, 4 * 8, dtype=np.float32).reshape(4, 8)
    y = np.array([0, 1, 2, 0])
    reports = []
    for mod, model, loss_fn, tensor in (
            (r_numerics, r_make_mlp((8, 16, 3), "tanh", rng=np.random.default_rng(0)),
             CrossEntropyLoss(), np.asarray),
            (t_numerics, t_make_mlp((8, 16, 3), "tanh", generator=torch.Generator(),
                                    device=device), torch.nn.CrossEntropyLoss(),
             lambda a: torch.from_numpy(a).to(device))):
        detector = mod.Detector(model, loss_fn, "float16", scaler_enabled=scaler_enabled)
        with detector.phase("forward"):
            loss = loss_fn(model(tensor(x)), tensor(y))
        with detector.phase("backward"):
            if mod is r_numerics:
                model.backward(loss_fn.backward(1.0))
            else:
                loss.backward()
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, index in (("0.weight", (3, 5)), ("2.bias", (1,))):  # 2.bias: later in
                params[name].grad[index] = bad                              # forward, first back
        try:
            with detector.phase("optimizer"):
                pass
            reports.append(None)
        except r_numerics.NonFinite as e:
            reports.append(e.report.identity())
    if scaler_enabled:
        assert reports == [None, None]
    else:
        assert reports[0] is not None and reports[0]["module"] == "2.bias"  # the rule, reached
        assert_claim("numerics.first_invalid", actual=json_bytes(reports[1]),
                     expected=json_bytes(reports[0]))


