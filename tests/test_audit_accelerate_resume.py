"""The audit's verdict on an Accelerate `save_state` folder held to a real resume with the
library (accelerate 1.x, CPU): a user's loop (an MLP with dropout 0.2, AdamW, a cosine lr,
a shuffled loader of 6 batches an epoch, 3 epochs) prepared by an Accelerator, with an
object registered for checkpointing that holds the loop's global_step, epoch and
step_in_epoch (and, for the fix, one holding the DataLoader's generator); save_state after 4
batches (step_4/) and at epoch 0's end (epoch_0/).
Resumed as Accelerate's docs do it: load_state, then skip_first_batches(dl, n) mid-epoch;
with use_stateful_dataloader=True, load_state alone (the loader's state in
dl_state_dict.bin). The final weights against a straight run's; `audit FOLDER` must say
what the comparison proves, and audit_accelerate.MEASURED (which it prints) is asserted here.

Cost: importing accelerate and torchdata (about 2 s) and 34 runs of 18 steps (about 2 s
together): `slow` with the other real-library resumes; tests/test_audit_accelerate.py checks
the verdicts by default on folders written with Accelerate's file names and states.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from parity.lab.audit_accelerate import LOADERS, MEASURED
from parity.lab.audit_recognize import MISSING
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN
from tests.test_audit import audit as audit_json
from tests.test_audit import rows

pytestmark = pytest.mark.slow  # the reason: the module docstring's Cost

PER_EPOCH, BATCH, EPOCHS, MID = 6, 4, 3, 4


@pytest.fixture(autouse=True)
def _global_rngs() -> Iterator[None]:
    """The runs seed and draw from the global generators: put them back for other tests."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # noqa: NPY002
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])  # noqa: NPY002
    torch.set_rng_state(states[2])


class Progress:
    """The loop's own position, registered for checkpointing (custom_checkpoint_0.pkl)."""

    def __init__(self) -> None:
        self.global_step = self.epoch = self.step_in_epoch = 0

    def state_dict(self) -> dict[str, int]:
        return {"global_step": self.global_step, "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.global_step, self.epoch, self.step_in_epoch = (
            state["global_step"], state["epoch"], state["step_in_epoch"])


class GeneratorState:
    """A DataLoader's own generator registered for checkpointing: its state goes to
    custom_checkpoint_<i>.pkl and load_state puts it back (the fix the audit names)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])


def loader_of(kind: str, data: torch.utils.data.Dataset[Any]) -> Any:
    """The loader given to prepare, by audit_accelerate.LOADERS' name."""
    g = torch.Generator().manual_seed(0)
    if kind in ("stateless", "generator"):  # "generator": a DataLoader's own
        return torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                           generator=g if kind == "generator" else None)
    stateful = pytest.importorskip("torchdata.stateful_dataloader",
                                   reason="torchdata's StatefulDataLoader is not installed")
    return {"stateful": lambda: stateful.StatefulDataLoader(data, batch_size=BATCH,
                                                            shuffle=True),
            "shared generator": lambda: stateful.StatefulDataLoader(
                data, batch_size=BATCH, shuffle=True, generator=g),
            "own generator": lambda: stateful.StatefulDataLoader(
                data, batch_size=BATCH, sampler=stateful.sampler.RandomSampler(data),
                generator=g)}[kind]()


def train(save: Path | None = None, resume: Path | None = None, register: bool = True,
          loader: str = "stateless", stateful: bool = False,
          register_generator: bool = False) -> dict[str, torch.Tensor]:
    """EPOCHS epochs from seed 0, saving step_<MID>/ and epoch_0/ under `save`, or resumed
    from `resume` (without `register`, the loop cannot know its step and starts over) by
    skip_first_batches; `stateful`: under use_stateful_dataloader=True, resumed by load_state
    alone; `loader` the loader_of() given to prepare; `register_generator`: its generator
    registered too (GeneratorState); the final weights."""
    accelerate = pytest.importorskip("accelerate", reason="accelerate is an optional oracle "
                                                          "(the oracles extra)")
    torch.manual_seed(0)
    acc = accelerate.Accelerator(cpu=True, dataloader_config=accelerate.DataLoaderConfiguration(
        use_stateful_dataloader=stateful))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                torch.nn.Dropout(0.2),  # draws from the torch CPU RNG
                                torch.nn.Linear(8, 1))
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * PER_EPOCH, 4, generator=g),
                                          torch.randn(BATCH * PER_EPOCH, generator=g))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, PER_EPOCH * EPOCHS)
    unprepared = loader_of(loader, data)
    model, opt, dl, cosine = acc.prepare(model, opt, unprepared, cosine)
    progress = Progress()
    if register:
        acc.register_for_checkpointing(progress)
    if register_generator:
        acc.register_for_checkpointing(GeneratorState(unprepared.generator))
    if resume is not None:
        acc.load_state(str(resume))
    while progress.epoch < EPOCHS:
        skip = 0 if stateful else progress.step_in_epoch  # a stateful loader skips itself
        for x, y in acc.skip_first_batches(dl, skip) if skip else dl:
            loss = ((model(x).squeeze(-1) - y) ** 2).mean()  # x (B, 4), y (B,)
            acc.backward(loss)
            opt.step()
            cosine.step()
            opt.zero_grad()
            progress.global_step += 1
            progress.step_in_epoch += 1
            if save is not None and progress.global_step == MID:
                acc.save_state(str(save / f"step_{MID}"))
        progress.epoch, progress.step_in_epoch = progress.epoch + 1, 0
        if save is not None and progress.epoch == 1:
            acc.save_state(str(save / "epoch_0"))
    return {k: v.detach().clone() for k, v in acc.unwrap_model(model).state_dict().items()}


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, int]:
    """(max |Δw| to MEASURED's 3 digits, tensors differing)."""
    diffs = [(a[k] - b[k]).abs().max().item() for k in a]
    return float(f"{max(diffs):.3g}"), sum(d > 0 for d in diffs)


def audit(target: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    status, report, err = audit_json(target, capsys)
    assert report["kind"] == "Accelerate save_state folder", err
    return status, report


def test_accelerate_resumes_are_what_the_audit_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """epoch_0/ resumes bit-exact, but the same loop with DataLoader(shuffle=True,
    generator=g) writes a folder of the same keys whose resume is MEASURED["boundary
    generator"] away (g in no file): both are audited unknown (exit 5) with both numbers;
    with g registered for checkpointing (GeneratorState) the folder is audited exact and its
    resume is MEASURED["boundary registered generator"]; step_4/ resumes through
    skip_first_batches on a new shuffled pass, MEASURED["mid-epoch"] away, and is audited
    unknown; epoch_0/'s files under a plain name with no registered step are audited
    impossible (epoch and global step missing, the pickled 'step' named as the accumulation
    counter), and a loop that cannot know its step resumes MEASURED["no step"] away."""
    straight = train()
    assert difference(train(save=tmp_path), straight) == (0, 0)  # saving: no effect
    assert difference(train(resume=tmp_path / "epoch_0"), straight) == \
        MEASURED["boundary"] == (0, 0)
    own = train(loader="generator")  # the same folder's keys, the DataLoader's generator in none
    assert difference(train(save=tmp_path / "own", loader="generator"), own) == (0, 0)
    assert difference(train(resume=tmp_path / "own" / "epoch_0", loader="generator"), own) == \
        MEASURED["boundary generator"]
    boundary, cost = MEASURED["boundary"], MEASURED["boundary generator"]
    for folder in (tmp_path / "epoch_0", tmp_path / "own" / "epoch_0"):
        status, report = audit(folder, capsys)
        assert (status, report["exact"]) == (EXIT_UNKNOWN, False), folder
        assert rows(report)["data position"]["where"] == "custom_checkpoint_0.pkl/step_in_epoch"
        assert f"(measured: max |Δw| {boundary[0]:g})" in report["unknown"]
        assert f"max |Δw| {cost[0]:g}, {cost[1]} tensors differing" in report["unknown"]

    fixed = tmp_path / "registered"
    assert difference(train(save=fixed, loader="generator", register_generator=True),
                      own) == (0, 0)
    status, report = audit(fixed / "epoch_0", capsys)
    r = rows(report)
    assert (status, report["verdict"]) == (EXIT_OK, "exact resume possible")
    assert (r["data position"]["where"], r["torch CPU RNG"]["where"]) == (
        "custom_checkpoint_0.pkl/step_in_epoch, custom_checkpoint_1.pkl/generator",
        "random_states_0.pkl/torch_manual_seed")
    assert difference(train(resume=fixed / "epoch_0", loader="generator",
                            register_generator=True), own) == \
        MEASURED["boundary registered generator"] == (0, 0)

    status, report = audit(tmp_path / f"step_{MID}", capsys)
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    assert difference(train(resume=tmp_path / f"step_{MID}"), straight) == \
        MEASURED["mid-epoch"]
    cost = MEASURED["mid-epoch"]
    assert f"max |Δw| {cost[0]:g}, {cost[1]} tensors" in report["unknown"]

    plain = tmp_path / "checkpoint"
    shutil.copytree(tmp_path / "epoch_0", plain)
    (plain / "custom_checkpoint_0.pkl").unlink()
    status, report = audit(plain, capsys)
    assert (status, report["verdict"]) == (EXIT_FAILED,
                                           "exact resume impossible: epoch, global step missing")
    assert "'step' = 0 is Accelerate's gradient-accumulation counter" in \
        rows(report)["global step"]["detail"]
    assert difference(train(resume=plain, register=False), straight) == MEASURED["no step"]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11
@pytest.mark.parametrize("loader", list(LOADERS))
def test_stateful_loader_resumes_are_what_the_audit_says(
        loader: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """use_stateful_dataloader=True, each loader of LOADERS given to prepare, resumed by
    load_state alone from step_4/ and epoch_0/, each with and without random_states_0.pkl:
    the resume is MEASURED["<loader> <where>[ no rng]"] away, and the audit says impossible
    (a sampler without state; the RNG file gone) or unknown (the DataLoader's generator
    unseen: one folder for the exact loader and the inexact ones), with those numbers, never
    exact."""
    straight = train(loader=loader, stateful=True)
    assert difference(train(save=tmp_path, loader=loader, stateful=True), straight) == (0, 0)
    for folder, where in ((tmp_path / f"step_{MID}", "mid-epoch"),
                          (tmp_path / "epoch_0", "boundary")):
        plain = tmp_path / f"{folder.name}_no_rng"
        shutil.copytree(folder, plain)
        (plain / "random_states_0.pkl").unlink()
        for target, key in ((folder, f"{loader} {where}"), (plain, f"{loader} {where} no rng")):
            assert difference(train(resume=target, loader=loader, stateful=True),
                              straight) == MEASURED[key]
            status, report = audit(target, capsys)
            r = rows(report)
            assert r["data position"]["where"] == "dl_state_dict.bin"
            if target == plain:
                cost = MEASURED[f"own generator {where} no rng"]
                assert status == EXIT_FAILED and r["torch CPU RNG"]["status"] == MISSING
                assert f"max |Δw| {cost[0]:g}, {cost[1]} tensors" in \
                    r["torch CPU RNG"]["detail"]
            elif loader == "stateless":
                assert (status, report["verdict"]) == (
                    EXIT_FAILED, "exact resume impossible: data position incomplete")
                assert f"max |Δw| {MEASURED[key][0]:g}, {MEASURED[key][1]} tensors" in \
                    r["data position"]["detail"]
            else:
                assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
                for k in ("stateful", "shared generator", "own generator"):
                    cost = MEASURED[f"{k} {where}"]
                    assert f"max |Δw| {cost[0]:g}" in report["unknown"]
