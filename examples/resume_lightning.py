"""A Lightning fit checked by resume-check: the adapter is `fit`, the lines marked `+` are
all it adds to a fit (the module and data above it are the user's own):

    cd examples && python -m parity resume-check --fit resume_lightning:fit --steps 8 --at 4

Lightning trains, saves with trainer.save_checkpoint at step 4 (the end of the first epoch:
a plain DataLoader restarts an epoch it resumes inside of, so a mid-epoch resume is not
exact) and resumes from it in a fresh process with `fit(ckpt_path=...)`. Its checkpoint
holds no random generator of its own: this module's on_save_checkpoint saves torch's (the
shuffle and the dropout draw from it), and `fit_without_rng` leaves that out.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from parity.lab.your_trainer.callbacks_lightning import ResumeCheckLightning
from parity.lab.your_trainer.resume_fit import FitRun


class Regression(pl.LightningModule):
    """An MLP with dropout, AdamW and a cosine schedule; `save_rng`: its checkpoint holds the
    torch CPU generator."""

    def __init__(self, save_rng: bool = True) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                       torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
        self.save_rng = save_rng

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
                      ) -> torch.Tensor:
        x, y = batch
        return (self.net(x).squeeze(-1) - y).pow(2).mean()

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8)]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.save_rng:
            checkpoint["torch_rng"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "torch_rng" in checkpoint:
            torch.set_rng_state(checkpoint["torch_rng"])


def loader() -> torch.utils.data.DataLoader:
    """16 fixed pairs in shuffled batches of 4: 4 steps an epoch."""
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g),
                                          torch.randn(16, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, num_workers=0)


def train(run: FitRun, save_rng: bool) -> None:
    torch.manual_seed(0)
    model = Regression(save_rng)
    trainer = pl.Trainer(max_steps=run.steps, default_root_dir=run.dir,  # +
                         callbacks=[ResumeCheckLightning(run)],  # +
                         accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader(), ckpt_path=run.resume_from)  # +


def fit(run: FitRun) -> None:  # +
    train(run, save_rng=True)


def fit_without_rng(run: FitRun) -> None:
    train(run, save_rng=False)
