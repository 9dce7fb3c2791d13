"""Resume is exact: interrupted + resumed == uninterrupted, bit for bit, in each
implementation (train.resume_exact); real processes killed with SIGKILL resume to the same
digest (train.kill_resume); the digest is implementation-independent
(train.digest_cross_impl); and a checkpoint missing any inventory item does NOT resume
exactly (the guard that the exactness tests can fail).

Drivers are in parity/drivers/train.py, shared with the report. The hypothesis tests run the
interrupted and the resumed halves in one process but share nothing but the checkpoint
file: every object is rebuilt from the config, and the torch global RNG is scrambled in
between to show nothing depends on it. Real processes killed with SIGKILL:
parity/test_train_kill.py.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings

from parity.compare import assert_claim, assert_observed
from parity.drivers.resume import flatten
from parity.drivers.train import (
    INVENTORY_CASE,
    SMALL,
    compare_runs,
    interrupted,
    max_param_difference,
    on,
    one_thread,
    resumed_without,
    uninterrupted,
)
from parity.strategies import examples, gpt_train_configs, train_configs
from reference import resume as ref_resume
from reference import train as ref_train
from reference.recompute_plans import binomial_cost
from torch_impl import resume as t_resume
from torch_impl import train as t_train


@pytest.fixture(autouse=True)
def _torch_one_thread() -> Iterator[None]:
    """Tiny models: one torch thread (parity.drivers.train.one_thread says why)."""
    with one_thread():
        yield


def test_a_run_interrupted_at_step_2_of_4_and_resumed_is_the_straight_run_in_each_tree(
        tmp_path: Path, device: str) -> None:
    """Four steps straight, and two steps, a checkpoint file, every object dropped, a restore
    from the file and two more steps: the same complete state, bit for bit, in the reference
    and in torch (each tree against itself: the claim is that resume is exact)."""
    config = ref_train.TrainConfig(sizes=(8, 16, 3), dropout=0.2, batch_size=8, num_samples=40,
                                   horizon=4)  # both trees read this one class; dropout draws
    ref_straight, torch_straight = ref_train.Run(config), t_train.Run(config, device)
    for _ in range(4):
        ref_straight.train_step()
        torch_straight.train_step()
    ref_run, torch_run = ref_train.Run(config), t_train.Run(config, device)
    for _ in range(2):
        ref_run.train_step()
        torch_run.train_step()
    ref_resume.save_checkpoint(tmp_path / "ref.ckpt", ref_run.state_dict())
    t_resume.save_checkpoint(tmp_path / "torch.ckpt", torch_run.state_dict())
    at_2 = ref_run.state_dict()["model"]["0.weight"]  # (16, 8)
    del ref_run, torch_run
    torch.manual_seed(1)  # the global stream moves on: a resumed run must not read it
    ref_run = ref_train.restored(config, ref_resume.load_checkpoint(tmp_path / "ref.ckpt"))
    torch_run = t_train.restored(config, t_resume.load_checkpoint(tmp_path / "torch.ckpt"),
                                 device=device)
    for _ in range(2):
        ref_run.train_step()
        torch_run.train_step()
    assert not np.array_equal(ref_run.state_dict()["model"]["0.weight"], at_2)  # it trained on
    for tree, resumed, straight in (("reference", ref_run, ref_straight),
                                    ("torch", torch_run, torch_straight)):
        actual, expected = flatten(resumed.state_dict()), flatten(straight.state_dict())
        assert sorted(actual) == sorted(expected), tree
        for key, value in expected.items():
            assert_claim("train.resume_exact", actual=actual[key], expected=value,
                         context=f"{tree} {key}")


def _assert_same_run(actual: dict, expected: dict, context: str) -> None:
    worst, n = compare_runs(actual, expected)
    assert n > 0
    if worst != 0:  # let assert_claim show which values differ
        from parity.drivers.resume import flatten

        a, b = flatten(actual), flatten(expected)
        for key, value in b.items():
            assert_claim("train.resume_exact", actual=a[key], expected=value,
                         context=f"{context} {key}")
    assert_observed("train.resume_exact", worst, n, context)


@pytest.mark.parametrize("name", ["reference", "torch"])
@settings(examples(20))
@given(case=train_configs())
def test_interrupted_and_resumed_equals_uninterrupted_bit_for_bit(name: str, case: dict,
                                                                  device: str) -> None:
    """Any interruption step, precision, dropout, schedule and recompute: the same final state."""
    _interrupted_equals_uninterrupted(name, case, device)


@pytest.mark.slow  # the report (the README's first command, CI's install step) runs it
@pytest.mark.report
@pytest.mark.parametrize("name", ["reference", "torch"])
@settings(examples(6))  # 1.3 s each on 2 cores; the fuzz profile runs thousands
@given(case=gpt_train_configs())
def test_gpt_interrupted_and_resumed_equals_uninterrupted_bit_for_bit(name: str, case: dict,
                                                                      device: str) -> None:
    """The transformer on the copy task: any interruption, precision, dropout, block
    schedule or selective recomputation, the same final state, bit for bit."""
    event(f"recompute {case['config']['recompute']}")
    _interrupted_equals_uninterrupted(name, case, device)


def _interrupted_equals_uninterrupted(name: str, case: dict, device: str) -> None:
    config, k, total = case["config"], case["interrupt"], case["total"]
    expected = uninterrupted(name, config, total, device)
    event(f"precision {config['precision']}, skipped steps: {expected['skipped'] > 0}")
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(int(np.random.default_rng(k).integers(2**31)))  # scramble the global RNG
        actual = interrupted(name, config, k, total, Path(tmp), every=case["every"],
                             device=device)
    _assert_same_run(actual, expected, f"{name} {config} interrupted at {k}/{total}")


FP16_SKIPPING = {**SMALL, "precision": "fp16", "init_scale": 2.0**20, "growth_interval": 3}


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_interruption_right_after_a_skipped_fp16_step_resumes_exactly(name: str,
                                                                      device: str) -> None:
    """A checkpoint written just after an overflow-skipped step resumes to the same state."""
    total = 14
    m = ref_train if name == "reference" else t_train
    run = m.Run(m.TrainConfig(**FP16_SKIPPING), **on(name, device))
    skipped = []
    while run.step < total:
        if run.train_step().skipped:
            skipped.append(run.step)
    assert skipped, "guard: the huge initial scale must make some steps overflow"
    expected = run.state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        for k in skipped[:3]:
            actual = interrupted(name, FP16_SKIPPING, k, total, Path(tmp) / str(k),
                                 device=device)
            _assert_same_run(actual, expected, f"{name} interrupted after skipped step {k}")


@pytest.mark.parametrize("name", ["reference", "torch"])
@pytest.mark.parametrize("item", ref_train.INVENTORY)
def test_leaving_out_any_inventory_item_breaks_exactness(name: str, item: str,
                                                         device: str) -> None:
    """Guard: a resume without one item (weights-only included) does NOT match."""
    expected = uninterrupted(name, INVENTORY_CASE, 12, device)
    with tempfile.TemporaryDirectory() as tmp:
        actual = resumed_without(name, INVENTORY_CASE, 5, 12, Path(tmp), (item,), device)
    worst, _ = compare_runs(actual, expected)
    assert worst > 0
    assert max_param_difference(actual, expected) > 0


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_weights_only_resume_does_not_match(name: str, device: str) -> None:
    """Guard: restoring only the parameters (nanoGPT-style) gives different parameters."""
    expected = uninterrupted(name, INVENTORY_CASE, 12, device)
    everything_else = tuple(i for i in ref_train.INVENTORY if i != "model")
    with tempfile.TemporaryDirectory() as tmp:
        actual = resumed_without(name, INVENTORY_CASE, 5, 12, Path(tmp), everything_else,
                                 device)
    assert max_param_difference(actual, expected) > 0


def test_state_digest_is_the_same_for_a_state_and_its_torch_mapping() -> None:
    """reference.train.state_digest(s) == torch_impl.train.state_digest(mapped s)."""
    for precision in ("fp32", "fp16"):
        state = uninterrupted("reference", {**FP16_SKIPPING, "precision": precision}, 6)
        a = bytes.fromhex(t_train.state_digest(t_resume.state_from_reference(state)))
        b = bytes.fromhex(ref_train.state_digest(state))
        assert_claim("train.digest_cross_impl", actual=np.frombuffer(a, np.uint8),
                     expected=np.frombuffer(b, np.uint8))
    # guard: the digest sees a one-bit change of one parameter
    state["model"]["0.weight"].view(np.uint32)[0, 0] ^= np.uint32(1)
    assert ref_train.state_digest(state) != b.hex()


def test_torch_resumes_a_reference_checkpoint_at_the_same_position_and_lr(
        tmp_path: Path, device: str) -> None:
    """A reference checkpoint, mapped, resumes in torch: data position, step and lr continue
    exactly as an all-torch run's (parameters differ: other kernels, other dropout stream)."""
    config = {**SMALL, "dropout": 0.0, "schedule": "cosine", "horizon": 12}
    ref_train.train(ref_train.TrainConfig(**config), 5, tmp_path, 5)
    ref_state = ref_resume.load_checkpoint(ref_resume.CheckpointManager(tmp_path).path(5))
    run = t_train.restored(t_train.TrainConfig(**config), t_resume.state_from_reference(ref_state),
                           device=device)
    while run.step < 12:
        run.train_step()
    expected = t_train.train(t_train.TrainConfig(**config), 12, device=device)
    assert run.sampler.state_dict() == expected.sampler.state_dict()
    assert run.scheduler.get_last_lr() == expected.scheduler.get_last_lr()
    assert run.step == expected.step


@pytest.mark.parametrize(("impl", "written", "asked"), [("reference", "mlp", "gpt"),
                                                        ("torch", "gpt", "mlp")])
def test_a_checkpoint_of_the_other_model_is_refused_naming_both(
        impl: str, written: str, asked: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--resume with --model other than the checkpoint's: one line, exit 2, both models
    named, nothing changed; the library refuses too, naming the field."""
    from ckpt import CheckpointError
    from parity.lab.cli import EXIT_USAGE, main

    base = ["train", "--impl", impl, "--steps", "2", "--checkpoint-dir", str(tmp_path),
            "--quiet"]
    assert main([*base, "--model", written]) == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    assert main([*base, "--model", asked, "--resume"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"of the model {written!r}, this run trains {asked!r}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    m = ref_train if impl == "reference" else t_train
    state = m.resume.load_checkpoint(m.resume.CheckpointManager(tmp_path).path(2))
    with pytest.raises(CheckpointError, match=f"model: {written!r} in the checkpoint, "
                                              f"{asked!r} now"):
        m.restored(m.TrainConfig(model=asked, horizon=2), state)


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_a_gpt_run_recomputes_what_its_config_says(name: str, device: str) -> None:
    """--recompute reaches the transformer: in one step of "optimal:2+selective" the blocks
    re-run R = t(4, 2) forwards (the closed form) and every attention core's dropout runs
    again in backward; "none" re-runs nothing (the digest tests alone could not tell).
    Counted by forward pre-hooks on the blocks and on the cores' dropouts."""
    counts = {}
    for spec in ("none", "optimal:2+selective"):
        m = ref_train if name == "reference" else t_train
        run = m.Run(m.TrainConfig(model="gpt", recompute=spec, dropout=0.1, horizon=2),
                    **on(name, device))
        counts[spec] = _forwards_in_a_step(name, run)
    assert counts["none"] == (4, 4)  # one forward of each of the 4 blocks and core dropouts
    r = binomial_cost(4, 2)
    # a recomputed block runs its core's dropout again, and every core recomputes once more
    assert counts["optimal:2+selective"] == (4 + r, 4 + r + 4)


def _forwards_in_a_step(name: str, run: object) -> tuple[int, int]:
    """(block forwards, attention-dropout forwards) started during one training step."""
    seen = {"block": 0, "drop": 0}
    if name == "reference":
        from reference import module as rmodule

        blocks = list(run.model.transformer.h.children())
        drops = [b.attn.core.attn_dropout for b in blocks]

        def pre(node: object, args: tuple) -> None:
            if any(node is b for b in blocks):
                seen["block"] += 1
            if any(node is d for d in drops):
                seen["drop"] += 1

        handles = [rmodule.register_module_forward_pre_hook(pre)]
    else:
        handles = []
        for block in run.model.transformer.h:
            handles.append(block.register_forward_pre_hook(
                lambda *_: seen.__setitem__("block", seen["block"] + 1)))
            handles.append(block.attn.core.attn_dropout.register_forward_pre_hook(
                lambda *_: seen.__setitem__("drop", seen["drop"] + 1)))
    try:
        run.train_step()
    finally:
        for h in handles:
            h.remove()
    return seen["block"], seen["drop"]


def test_gpt_runs_read_the_same_next_token_batches_in_both_trees(device: str) -> None:
    """--model gpt trains on the copy task: across epochs, both trees' runs draw the same
    (idx, targets) batches, and each target row is its input row shifted by one token."""
    config = ref_train.TrainConfig(model="gpt", batch_size=4, num_samples=12, seed=5)
    ref_run = ref_train.Run(config)
    torch_run = t_train.Run(config, device)
    for _ in range(7):  # 3 batches an epoch: past two epoch boundaries
        (x, y), (tx, ty) = ref_run.next_batch(), torch_run.next_batch()
        assert np.array_equal(x, tx.cpu().numpy()) and np.array_equal(y, ty.cpu().numpy())
        assert np.array_equal(y[:, :-1], x[:, 1:]) and not np.array_equal(x, y)
