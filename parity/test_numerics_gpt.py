"""The numerics detector on the transformer: each transformer fault of the catalogue is found
by both trees at the same step, phase, module (torch's module names), op and index, where the
catalogue says it first shows (numerics.first_invalid); the anomaly replay of a GPT batch
file names the same backward node in both trees (numerics.replay_node). Drivers:
parity/drivers/numerics.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from parity.compare import assert_claim
from parity.drivers.numerics import (
    GPT_FAULTED,
    Found,
    faulted_run,
    json_bytes,
    replay,
    runs_once,
    save_replay,
    seed_directory,
)
from parity.drivers.train import one_thread
from parity.lab import cli
from parity.strategies import examples
from reference.faults import FAULTS
from reference.numerics import NonFinite


@pytest.fixture(autouse=True)
def _torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


# every transformer fault in every precision the catalogue states it for
CASES = [(f.name, shows[0]) for f in FAULTS.values() if f.model == "gpt" for shows in f.shows]


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The common start of the faulted runs, per precision."""
    with one_thread():
        dirs = {}
        for precision in ("fp16", "fp32", "bf16"):
            dirs[precision] = tmp_path_factory.mktemp(f"gpt-{precision}") / "ckpt"
            seed_directory(dirs[precision], {**GPT_FAULTED, "precision": precision})
        return dirs


# the fault strikes the first step from the common start (the checkpoint after step 0):
# one step per tree keeps the transformer's cases cheap
FAULT_STEP = 1


def _found(name: str, fault: str, precision: str, start: Path, work: Path) -> NonFinite:
    _, found = faulted_run(name, {**GPT_FAULTED, "precision": precision}, fault, FAULT_STEP,
                           FAULT_STEP + 2, start,
                           work / name)
    assert found is not None, f"{name} did not find {fault} in {precision}"
    return found


@pytest.fixture(scope="module")
def found(start: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Found:
    """found(tree, fault, precision): that tree's faulted run from the common start, so the
    catalogue test and the replay test read the same runs."""
    return runs_once(lambda name, fault, precision, work:
                     _found(name, fault, precision, start[precision], work), tmp_path_factory)


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize(("fault", "precision"), CASES)
def test_both_trees_name_the_catalogued_first_invalid_value_on_the_transformer(
        fault: str, precision: str, found: Found) -> None:
    """Same step, phase, module, op, index and value in both trees, and the (phase, module,
    op) the catalogue states (the regression guard); the same inputs out of range."""
    ref, got = found("reference", fault, precision), found("torch", fault, precision)
    shown = {p: rest for p, *rest in FAULTS[fault].shows}[precision]
    assert [ref.report.phase, ref.report.module, ref.report.op] == shown
    assert ref.report.step == FAULT_STEP
    assert_claim("numerics.first_invalid", actual=json_bytes(got.report.identity()),
                 expected=json_bytes(ref.report.identity()), context=f"{fault} {precision}")
    assert_claim("numerics.first_invalid",
                 actual=json_bytes({k: v[:3] for k, v in got.report.counts.items()}),
                 expected=json_bytes({k: v[:3] for k, v in ref.report.counts.items()}),
                 context="non-finite counts")
    out = [r.name for r in ref.report.inputs if r.out_of_range()]
    assert out == [r.name for r in got.report.inputs if r.out_of_range()]


@settings(examples(6), deadline=None)
@given(seed=st.integers(0, 2**16), batch_size=st.integers(1, 12),
       case=st.sampled_from(CASES), fault_step=st.integers(0, 2))
def test_both_trees_name_the_same_first_invalid_value_on_the_transformer_for_any_seed(
        seed: int, batch_size: int, case: tuple[str, str], fault_step: int,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random seeds, batch sizes and fault steps: whenever one tree finds a first invalid
    value, the other finds the same one (layernorm_eps0 strikes only a batch holding token
    0, so "nothing found" is a possible, and shared, outcome)."""
    name, precision = case
    config = {**GPT_FAULTED, "seed": seed, "batch_size": batch_size, "precision": precision}
    root = tmp_path_factory.mktemp("any")
    seed_directory(root / "start", config)
    found = [faulted_run(impl, config, name, fault_step + 1, fault_step + 2, root / "start",
                         root / impl)[1] for impl in ("reference", "torch")]
    event(f"{name} {precision}: found {found[0] is not None}")
    assert (found[0] is None) == (found[1] is None)
    if found[0] is not None:
        assert_claim("numerics.first_invalid", actual=json_bytes(found[1].report.identity()),
                     expected=json_bytes(found[0].report.identity()), context=f"{config} {name}")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_attention_overflow_is_found_only_in_fp16(precision: str, start: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """Scores of 2^24 times their size are finite in float32 and bfloat16: neither tree
    finds anything in the 2 steps from the fault on."""
    for name in ("reference", "torch"):
        run, found = faulted_run(name, {**GPT_FAULTED, "precision": precision},
                                 "attention_overflow", FAULT_STEP, FAULT_STEP + 2,
                                 start[precision], tmp_path / name)
        assert found is None and len(run.numerics.history) == 2


# the node each replay names: the forward faults' NaN reaches the loss first; the GELU's
# backward-only fault is the GELU's; eps is no state, so layernorm_eps0's replay (eps back at
# 1e-5) finds nothing, in both trees: the cause lies outside the saved state
REPLAYED = {("attention_overflow", "fp16"): ("LogSoftmaxBackward0", "loss"),
            ("poisoned_embedding", "bf16"): ("LogSoftmaxBackward0", "loss"),
            ("gelu_backward", "fp32"): ("GeluBackward0", "transformer.h.0.mlp.gelu"),
            ("layernorm_eps0", "fp32"): (None, None)}


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize(("fault", "precision"), list(REPLAYED))
def test_replay_of_a_gpt_batch_names_the_same_node_whichever_tree_wrote_it(
        fault: str, precision: str, found: Found, tmp_path: Path) -> None:
    """Each tree's GPT replay file (from the catalogue test's runs), replayed by each tree:
    the same node and module."""
    names = {}
    for writer in ("reference", "torch"):
        path = tmp_path / f"{writer}.replay"
        save_replay(writer, path, found(writer, fault, precision).replay)
        for reader in ("reference", "torch"):
            result = replay(reader, path)
            names[writer, reader] = [result.node, result.module]
    assert names["torch", "torch"] == list(REPLAYED[fault, precision])  # the guard
    for key, value in names.items():
        assert_claim("numerics.replay_node", actual=json_bytes(value),
                     expected=json_bytes(names["torch", "torch"]), context=str(key))


def test_train_model_gpt_stops_at_the_fault_and_replay_names_the_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`train --model gpt --fault gelu_backward --check-numerics` exits 3 with the
    `first-invalid:` line last; its replay file replays (exit 3) in both trees."""
    status = cli.main(["train", "--impl", "torch", "--model", "gpt", "--steps", "3",
                       "--checkpoint-dir", str(tmp_path / "run"), "--check-numerics",
                       "--fault", "gelu_backward", "--fault-step", "1", "--quiet"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert status == cli.EXIT_FOUND and lines[-1].startswith("first-invalid: ")
    identity = json.loads(lines[-1].removeprefix("first-invalid: "))
    assert (identity["step"], identity["phase"], identity["module"]) == (
        1, "backward", "transformer.h.0.mlp.c_fc.bias")
    nodes = []
    for impl in ("reference", "torch"):
        path = tmp_path / "run" / "first-invalid-step1.replay"
        assert cli.main(["replay", str(path), "--impl", impl]) == cli.EXIT_FOUND
        nodes.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert nodes[0] == nodes[1] and "GeluBackward0" in nodes[0]


@pytest.mark.parametrize(("model", "fault"), [("gpt", "inf_weight"), ("mlp", "gelu_backward")])
def test_a_fault_of_the_other_model_is_refused_in_one_line(
        model: str, fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A fault written for the other model: one line naming both models, exit 2, and the
    directory untouched."""
    status = cli.main(["train", "--impl", "reference", "--model", model, "--steps", "3",
                       "--checkpoint-dir", str(tmp_path / "run"), "--fault", fault])
    err = capsys.readouterr().err.strip()
    assert status == cli.EXIT_USAGE and len(err.splitlines()) == 1
    assert f"--model {FAULTS[fault].model}" in err and model in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overflow", [False, True])
def test_a_watched_attention_core_names_only_a_value_made_from_finite_inputs(
        overflow: bool) -> None:
    """Re-running the attention core with its ops watched: on ordinary q, k, v it names
    nothing (masked_fill's -inf are values the op was told to write, not invalid ones);
    with q and k 2^12 times larger under fp16 both trees name the scores' BmmBackward0 at
    the same index."""
    from common.format_spec import get_format
    from reference import amp as r_amp
    from reference import numerics as r_numerics
    from reference import numerics_locate as r_locate
    from reference.attention import AttentionCore as RefCore
    from torch_impl import numerics as t_numerics
    from torch_impl import numerics_locate as t_locate
    from torch_impl.attention import AttentionCore as TorchCore

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 8, 16)).astype(np.float32) for _ in range(3))
    if overflow:
        q, k = q * np.float32(2**12), k * np.float32(2**12)
    fmt = get_format("float16")
    state = r_amp.autocast("float16" if overflow else None).state
    ref = r_locate.watch_ops(RefCore(8, 0.0, rng=rng), (q, k, v), state, fmt,
                             r_numerics.input_range, r_numerics.first_nonfinite)
    import torch

    got = t_locate.watch_ops(TorchCore(8, 0.0), tuple(torch.from_numpy(a) for a in (q, k, v)),
                             ("cpu", overflow, torch.float16), torch.float16,
                             t_numerics.input_range, t_numerics.first_nonfinite)
    if not overflow:
        assert ref is None and got is None
        return
    assert ref is not None and got is not None and ref[0] == "BmmBackward0"
    assert_claim("numerics.first_invalid", actual=json_bytes(list(got[:3])),
                 expected=json_bytes(list(ref[:3])))
