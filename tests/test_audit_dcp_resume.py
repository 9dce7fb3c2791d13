"""The audit's verdict on a torch.distributed.checkpoint folder held to a resume with
`dcp.load`: a user's loop (an MLP with dropout 0.2, AdamW, a cosine lr, batches drawn as a
pure function of the step: epoch e's order is randperm under seed e) trained 10 steps
straight, and again with `dcp.save` after step 4 of what the user keeps (the model and
optimizer through torch.distributed.checkpoint.state_dict.get_state_dict, the scheduler,
the torch RNG, step, epoch, consumed_samples), one process, `no_dist=True`. Resumed by
dcp.load into the same keys and set_state_dict, its final weights against the straight
run's; `audit FOLDER` must say what the comparison proves, and without the RNG the audit
names it missing and the resume does differ.

Cost: 4 runs of 10 steps and 3 saves, about 0.3 s, but the first optimizer step and
get_state_dict import torch._dynamo (about 1 s here): `slow`, with the other real resumes
(measured 2 s here); tests/test_audit_dcp.py checks the reading by default.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from parity.lab.cli import EXIT_FAILED, EXIT_OK
from tests.test_audit import audit, rows

pytestmark = [pytest.mark.slow,  # the reason: the module docstring's Cost
              # one process, no group: what no_dist=True says it is
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")]

STEPS, SAVE, PER_EPOCH, BATCH = 10, 4, 6, 4


@pytest.fixture(autouse=True)
def _torch_rng() -> Iterator[None]:
    state = torch.get_rng_state()
    yield
    torch.set_rng_state(state)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s batch: epoch e's order is randperm under seed e, so the data position is
    the step itself."""
    epoch, i = divmod(step, PER_EPOCH)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(BATCH * PER_EPOCH, 4, generator=g), torch.randn(BATCH * PER_EPOCH,
                                                                       generator=g)
    order = torch.randperm(BATCH * PER_EPOCH, generator=torch.Generator().manual_seed(epoch))
    picked = order[i * BATCH:(i + 1) * BATCH]
    return x[picked], y[picked]  # (B, 4), (B,)


def train(save: Path | None = None, resume: Path | None = None,
          keep_rng: bool = True) -> dict[str, torch.Tensor]:
    """STEPS steps from seed 0, saving after step SAVE into `save` or resuming from
    `resume`; `keep_rng`: whether the torch RNG is among what is saved and loaded."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                torch.nn.Dropout(0.2),  # draws from the torch CPU RNG
                                torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)

    def state(step: int) -> dict[str, Any]:
        msd, osd = get_state_dict(model, opt)
        kept = {"model": msd, "optim": osd, "sched": cosine.state_dict(), "step": step,
                "epoch": step // PER_EPOCH, "consumed_samples": step * BATCH}
        return {**kept, "rng": torch.get_rng_state()} if keep_rng else kept

    start = 0
    if resume is not None:
        loaded = state(0)
        dcp.load(loaded, checkpoint_id=str(resume), no_dist=True)
        set_state_dict(model, opt, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optim"])
        cosine.load_state_dict(loaded["sched"])
        if keep_rng:
            torch.set_rng_state(loaded["rng"])
        start = loaded["step"]
    for step in range(start, STEPS):
        x, y = batch(step)
        ((model(x).squeeze(-1) - y) ** 2).mean().backward()
        opt.step()
        cosine.step()
        opt.zero_grad()
        if save is not None and step + 1 == SAVE:
            dcp.save(state(SAVE), checkpoint_id=str(save), no_dist=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_the_audit_of_a_dcp_folder_is_what_dcp_load_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the RNG kept: audited exact, and the dcp.load resume is bit-exact. Without it:
    audited impossible (torch CPU RNG missing), and the resume differs."""
    straight = train()
    assert max_diff(train(save=tmp_path / "full"), straight) == 0  # saving: no effect
    status, report, err = audit(tmp_path / "full", capsys)
    assert (status, report["verdict"]) == (EXIT_OK, "exact resume possible"), err
    assert rows(report)["global step"]["detail"] == f"step = {SAVE}"
    assert max_diff(train(resume=tmp_path / "full"), straight) == 0

    train(save=tmp_path / "no-rng", keep_rng=False)
    status, report, _ = audit(tmp_path / "no-rng", capsys)
    assert (status, report["verdict"]) == (EXIT_FAILED,
                                           "exact resume impossible: torch CPU RNG missing")
    assert max_diff(train(resume=tmp_path / "no-rng", keep_rng=False), straight) > 0
