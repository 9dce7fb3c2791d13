"""The audit's verdict on a Lightning `.ckpt` held to Lightning's own resume, with the real
library (lightning 2.6.6): a tiny LightningModule (an MLP with dropout 0.2, AdamW, a cosine lr
stepped each batch) fit on the CPU for 3 epochs of 6 shuffled batches, straight, and again
with the real ModelCheckpoint writing after every 4 steps and at each epoch's end; each file
resumed by `Trainer.fit(ckpt_path=...)`, its final weights against the straight run's; and
`audit FILE` must say what the comparison proves. The RNG is saved the way
parity/lab/audit_lightning.py names (the module's on_save_checkpoint/on_load_checkpoint
hooks storing torch.get_rng_state() as "torch_rng_state"); the DataLoader's own generator,
where it has one, by the Callback audit_lightning.FIX names. The max |Δw| and the tensors
differing are audit_lightning.MEASURED, which the audit prints: asserted here.

Cost: importing lightning (about 3 s) and 18 fits of 18 steps (5 s together) on a busy 2-core
machine: over the default suite's few seconds, so `slow` (measured 10 s in all here);
tests/test_audit_lightning.py checks the verdicts by default on files written by torch.save
with the keys these runs wrote.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from parity.lab.audit_lightning import MEASURED
from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN
from tests.test_audit import audit as audit_json
from tests.test_audit import rows

pytestmark = [pytest.mark.slow,  # the reason: the module docstring's Cost
              # Lightning's advice on a CPU run (few workers, a small batch count, "your
              # dataloader is not resumable"): PossibleUserWarning, a UserWarning
              pytest.mark.filterwarnings("ignore::UserWarning"),
              # lightning 2.6.6 on torch 2.13's pytree
              pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.` is "
                                         "deprecated:FutureWarning")]

PER_EPOCH, BATCH, EPOCHS, EVERY = 6, 4, 3, 4  # step 4 is mid-epoch 0, step 12 epoch 1's last


@pytest.fixture(autouse=True)
def _global_rngs() -> Iterator[None]:
    """The runs seed and draw from the global generators: put them back for other tests.
    Lightning's info lines ("GPU available", tips) go to a handler on the stdout it was
    imported under, which capsys closes: kept quiet."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # noqa: NPY002
    log = logging.getLogger("lightning.pytorch")
    level = log.level
    log.setLevel(logging.WARNING)
    yield
    log.setLevel(level)
    random.setstate(states[0])
    np.random.set_state(states[1])  # noqa: NPY002
    torch.set_rng_state(states[2])


def lightning() -> Any:
    return pytest.importorskip("lightning", reason="lightning is an optional oracle (the "
                                                   "oracles extra)")


def module_class(save_rng: bool) -> Any:
    """The LightningModule, with the RNG hooks or without."""
    L = lightning()

    class TinyMLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 8)
            self.drop = torch.nn.Dropout(0.2)  # draws from the torch CPU RNG
            self.out = torch.nn.Linear(8, 1)

        def training_step(self, batch: list[torch.Tensor], i: int) -> torch.Tensor:
            x, y = batch  # (B, 4), (B,)
            pred = self.out(self.drop(torch.tanh(self.fc(x)))).squeeze(-1)  # (B,)
            return ((pred - y) ** 2).mean()

        def configure_optimizers(self) -> dict[str, Any]:
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, PER_EPOCH * EPOCHS)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": cosine,
                                                       "interval": "step"}}

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            if save_rng:
                checkpoint["torch_rng_state"] = torch.get_rng_state()

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            if save_rng:
                torch.set_rng_state(checkpoint["torch_rng_state"])

    return TinyMLP


def plain_loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(BATCH * PER_EPOCH, 4, generator=g),
                                          torch.randn(BATCH * PER_EPOCH, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)


def generator_loader() -> torch.utils.data.DataLoader:
    """The plain loader given a generator of its own, which Lightning saves nowhere."""
    return torch.utils.data.DataLoader(plain_loader().dataset, batch_size=BATCH, shuffle=True,
                                       generator=torch.Generator().manual_seed(0))


def loader_generator(generator: torch.Generator) -> Any:
    """The fix audit_lightning.FIX names: a Callback saving the DataLoader's generator
    (Lightning keeps a callback's state_dict() under "callbacks/LoaderGenerator")."""
    L = lightning()

    class LoaderGenerator(L.pytorch.Callback):
        @property
        def state_key(self) -> str:  # the class's qualname names a local class otherwise
            return "LoaderGenerator"

        def state_dict(self) -> dict[str, torch.Tensor]:
            return {"generator": generator.get_state()}

        def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
            generator.set_state(state["generator"])

    return LoaderGenerator()


def stateful_loader() -> Any:
    stateful = pytest.importorskip("torchdata.stateful_dataloader",
                                   reason="torchdata's StatefulDataLoader is not installed")
    return stateful.StatefulDataLoader(plain_loader().dataset, batch_size=BATCH, shuffle=True)


def fit(loader: Callable[[], Any], save: Path | None = None, resume: Path | None = None,
        save_rng: bool = True, save_generator: bool = False) -> dict[str, torch.Tensor]:
    """EPOCHS epochs from seed 0 (from checkpoint `resume` if given), writing checkpoints under
    `save` if given (steps/ every EVERY steps, epochs/ at each epoch's end), the loader's
    generator saved by loader_generator() if `save_generator`; the final weights."""
    L = lightning()
    callbacks = [] if save is None else [
        L.pytorch.callbacks.ModelCheckpoint(save / "steps", every_n_train_steps=EVERY,
                                            save_top_k=-1),
        L.pytorch.callbacks.ModelCheckpoint(save / "epochs", every_n_epochs=1, save_top_k=-1,
                                            save_on_train_epoch_end=True)]
    torch.manual_seed(0)
    model = module_class(save_rng)()
    dl = loader()
    if save_generator:
        callbacks.append(loader_generator(dl.generator))
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=False,
                        enable_checkpointing=save is not None, callbacks=callbacks,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, dl, ckpt_path=str(resume) if resume else None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, int]:
    """(max |Δw| to MEASURED's 3 digits, tensors differing)."""
    assert a.keys() == b.keys()
    diffs = [(a[k] - b[k]).abs().max().item() for k in a]
    return float(f"{max(diffs):.3g}"), sum(d > 0 for d in diffs)


def audit(target: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """The audit's --json report, Lightning's own prints cleared first."""
    capsys.readouterr()
    status, report, err = audit_json(target, capsys)
    assert report["kind"] == "Lightning checkpoint", err
    return status, report


def test_lightning_resumes_with_a_plain_dataloader_are_what_the_audit_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the RNG hooks and a plain DataLoader: the epoch-end file and the file written after
    epoch 1's last batch resume bit-exact, but the same loop with DataLoader(shuffle=True,
    generator=g) writes files of the same keys that resume MEASURED["boundary generator"] and
    ["last batch generator"] away (Lightning does not reseed g): all four are audited unknown
    (exit 5) with those numbers; with g saved by a Callback (the fix) they are audited exact
    and resume MEASURED["boundary registered generator"]; the file written after batch 4
    resumes on a restarted epoch (Lightning warns) with MEASURED["plain"], and is audited
    unknown, never possible. Without the hooks the epoch-end file is audited impossible (RNG
    missing) and its resume differs."""
    straight, own = fit(plain_loader), fit(generator_loader)
    saved = tmp_path / "saved"
    assert difference(fit(plain_loader, save=saved), straight) == (0, 0)  # saving: no effect
    assert difference(fit(generator_loader, save=tmp_path / "own"), own) == (0, 0)
    assert difference(fit(generator_loader, save=tmp_path / "fixed", save_generator=True),
                      own) == (0, 0)
    for file, key in ((Path("epochs", "epoch=0-step=6.ckpt"), "boundary generator"),
                      (Path("steps", "epoch=1-step=12.ckpt"), "last batch generator")):
        assert difference(fit(plain_loader, resume=saved / file), straight) == \
            MEASURED["boundary"] == (0, 0)
        assert difference(fit(generator_loader, resume=tmp_path / "own" / file), own) == \
            MEASURED[key]
        for folder in (saved, tmp_path / "own"):
            status, report = audit(folder / file, capsys)
            assert (status, report["exact"]) == (EXIT_UNKNOWN, False), folder / file
            assert f"max |Δw| {MEASURED['boundary'][0]:g})" in report["unknown"]
            assert f"{MEASURED[key][0]:g}, {MEASURED[key][1]} " in report["unknown"]
        status, report = audit(tmp_path / "fixed" / file, capsys)
        assert (status, report["verdict"]) == (EXIT_OK, "exact resume possible"), file
        assert "callbacks/LoaderGenerator/generator" in \
            rows(report)["data position"]["detail"]
        assert difference(fit(generator_loader, resume=tmp_path / "fixed" / file,
                              save_generator=True), own) == \
            MEASURED["boundary registered generator"] == (0, 0)

    mid = saved / "steps" / "epoch=0-step=4.ckpt"
    status, report = audit(mid, capsys)
    assert (status, report["exact"]) == (EXIT_UNKNOWN, False)
    assert "4 batches into epoch 0" in rows(report)["data position"]["detail"]
    with pytest.warns(UserWarning, match="not resumable"):
        resumed = fit(plain_loader, resume=mid)
    assert difference(resumed, straight) == MEASURED["plain"]
    assert f"max |Δw| {MEASURED['plain'][0]:g}, {MEASURED['plain'][1]} tensors" in \
        report["unknown"]

    fit(plain_loader, save=tmp_path / "no-rng", save_rng=False)
    file = tmp_path / "no-rng" / "epochs" / "epoch=0-step=6.ckpt"
    status, report = audit(file, capsys)
    assert (status, report["verdict"]) == (EXIT_FAILED,
                                           "exact resume impossible: torch CPU RNG missing")
    assert difference(fit(plain_loader, resume=file, save_rng=False), straight)[0] > 0


def test_lightning_resumes_with_a_stateful_loader_are_what_the_audit_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torchdata's StatefulDataLoader, whose state Lightning saves: after batch 4 and at the
    end of epoch 0 the resume differs by MEASURED["stateful"] and ["stateful boundary"],
    and the audit says unknown (exit 5) with those numbers, never possible."""
    straight = fit(stateful_loader)
    assert difference(fit(stateful_loader, save=tmp_path), straight) == (0, 0)
    for file, key in ((tmp_path / "steps" / "epoch=0-step=4.ckpt", "stateful"),
                      (tmp_path / "epochs" / "epoch=0-step=6.ckpt", "stateful boundary")):
        status, report = audit(file, capsys)
        assert (status, report["exact"]) == (EXIT_UNKNOWN, False), file
        assert rows(report)["data position"]["where"] == \
            "loops/fit_loop/state_dict/combined_loader"
        assert difference(fit(stateful_loader, resume=file), straight) == MEASURED[key]
        assert f"max |Δw| {MEASURED[key][0]:g}, {MEASURED[key][1]} tensors" in \
            report["unknown"]
