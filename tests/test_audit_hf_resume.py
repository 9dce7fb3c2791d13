"""The audit's verdict on a Hugging Face Trainer checkpoint held to Trainer's own resume, with
the real library: a tiny PreTrainedModel (an MLP with dropout, built from its config, no
download) trained on the CPU N steps straight, and again with `save_steps` = k; resumed from
checkpoint-k by `trainer.train(resume_from_checkpoint=...)`, its final weights against the
straight run's, bit for bit; and `audit checkpoint-k` must say exactly that. Then a copy
of the folder without rng_state.pth, and one without optimizer.pt: the resume no longer
matches, and the audit must name the piece missing and call the resume not exact.

Cost: importing transformers (about 3 s) and six Trainer runs of 10 steps (well under 1 s
each) on a busy 2-core machine: over the default suite's few seconds, so `slow`;
tests/test_audit_hf.py checks the recognition by default on a folder written by hand.
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

from parity.lab.cli import EXIT_FAILED, EXIT_OK
from tests.test_audit import audit as audit_json
from tests.test_audit import rows

pytestmark = pytest.mark.slow  # the reason: the module docstring's Cost

STEPS, SAVE, PER_EPOCH, BATCH = 10, 4, 6, 4  # 24 samples: checkpoint-4 is inside epoch 0


@pytest.fixture(autouse=True)
def _global_rngs() -> Iterator[None]:
    """Trainer seeds and draws from the global generators: put them back for other tests."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # noqa: NPY002
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])  # noqa: NPY002
    torch.set_rng_state(states[2])


def _model_classes() -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers", reason="transformers is an optional "
                                                              "oracle (the oracles extra)")
    pytest.importorskip("accelerate", reason="Trainer needs accelerate (the oracles extra)")

    class TinyConfig(transformers.PretrainedConfig):
        model_type = "mirrortrain_tiny_mlp"

        def __init__(self, n_in: int = 4, hidden: int = 8, dropout: float = 0.2,
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.n_in, self.hidden, self.dropout = n_in, hidden, dropout

    class TinyMLP(transformers.PreTrainedModel):
        config_class = TinyConfig

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.fc = torch.nn.Linear(config.n_in, config.hidden)
            self.drop = torch.nn.Dropout(config.dropout)  # draws from the torch CPU RNG
            self.out = torch.nn.Linear(config.hidden, 1)
            self.post_init()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            pred = self.out(self.drop(torch.tanh(self.fc(x)))).squeeze(-1)  # (B,)
            return {"loss": ((pred - y) ** 2).mean()}

    return TinyConfig, TinyMLP


class Pairs(torch.utils.data.Dataset):
    """24 fixed (x, y) pairs: a map-style dataset, so Trainer's own RandomSampler."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(BATCH * PER_EPOCH, 4, generator=g)
        self.y = torch.randn(BATCH * PER_EPOCH, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


def train(out: Path, save_steps: int, resume: Path | None = None) -> dict[str, torch.Tensor]:
    """STEPS Trainer steps (AdamW, cosine lr, dropout 0.2), from checkpoint `resume` if given;
    the final weights."""
    import transformers

    config_class, model_class = _model_classes()
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH,
        learning_rate=1e-2, lr_scheduler_type="cosine", save_strategy="steps",
        save_steps=save_steps, logging_strategy="no", report_to=[], seed=0, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    torch.manual_seed(0)
    model = model_class(config_class())
    transformers.Trainer(model=model, args=args, train_dataset=Pairs()).train(
        resume_from_checkpoint=str(resume) if resume else None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def audit(target: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any],
                                                                    str]:
    """The audit's --json report, Trainer's own prints (its metrics line) cleared first."""
    capsys.readouterr()
    return audit_json(target, capsys)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_the_audit_of_a_trainer_checkpoint_is_what_trainers_resume_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """checkpoint-4 audited exact, and Trainer's resume from it is bit-exact; without
    rng_state.pth, and without optimizer.pt, the audit names the piece and says not exact,
    and the resume does differ."""
    straight = train(tmp_path / "straight", save_steps=STEPS * 10)
    saved = train(tmp_path / "saved", save_steps=SAVE)
    assert max_diff(saved, straight) == 0  # guard: saving does not perturb the run
    checkpoint = tmp_path / "saved" / f"checkpoint-{SAVE}"
    status, report, err = audit(checkpoint, capsys)
    assert (status, report["kind"]) == (EXIT_OK, "Hugging Face Trainer checkpoint"), err
    assert rows(report)["data position"]["detail"] == \
        f"the resume skips the first {SAVE} batches of epoch 0"
    resumed = train(tmp_path / "resumed", save_steps=STEPS * 10, resume=checkpoint)
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)

    for cut, item in (("rng_state.pth", "torch CPU RNG"), ("optimizer.pt", "optimizer")):
        copy = tmp_path / f"without-{cut}"
        shutil.copytree(checkpoint, copy)
        (copy / cut).unlink()
        status, report, _ = audit(copy, capsys)
        assert (status, report["exact"]) == (EXIT_FAILED, False)
        assert rows(report)[item]["status"] == "missing"
        assert report["verdict"].startswith("exact resume impossible") and item in \
            report["verdict"]
        other = train(tmp_path / f"resumed-{cut}", save_steps=STEPS * 10, resume=copy)
        assert max_diff(other, straight) > 0, cut


def test_a_checkpoint_past_an_epoch_resumes_exactly_and_is_audited_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """checkpoint-8 is 2 steps into epoch 1: the audit says the resume skips 2 batches of
    epoch 1, exact, and Trainer's resume from it is bit-exact."""
    straight = train(tmp_path / "straight", save_steps=STEPS * 10)
    train(tmp_path / "saved", save_steps=SAVE)
    checkpoint = tmp_path / "saved" / f"checkpoint-{2 * SAVE}"
    status, report, _ = audit(checkpoint, capsys)
    assert status == EXIT_OK
    assert rows(report)["data position"]["detail"] == \
        f"the resume skips the first {2 * SAVE - PER_EPOCH} batches of epoch 1"
    resumed = train(tmp_path / "resumed", save_steps=STEPS * 10, resume=checkpoint)
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
