"""A Hugging Face Trainer run checked by resume-check: the adapter is `fit`, the lines marked
`+` are all it adds to a Trainer run (the model and data above it are the user's own):

    cd examples && python -m parity resume-check --fit resume_hf:fit --steps 6 --at 3

Trainer trains, saves checkpoint-3 as the TrainingArguments say, and resumes from it in a
fresh process with `train(resume_from_checkpoint=...)`; the callback records the digests.
`fit_model_only` is the same run with `save_only_model=True`: checkpoint-3 holds no
optimizer, scheduler or RNG, and resume-check names what parts.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

from parity.lab.your_trainer.callbacks import ResumeCheckCallback
from parity.lab.your_trainer.resume_fit import FitRun


class TinyConfig(PretrainedConfig):
    model_type = "mirrortrain_example_mlp"

    def __init__(self, n_in: int = 4, hidden: int = 8, dropout: float = 0.2,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n_in, self.hidden, self.dropout = n_in, hidden, dropout


class TinyMLP(PreTrainedModel):
    """A regression MLP with dropout (it draws from torch's CPU generator)."""

    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.fc = torch.nn.Linear(config.n_in, config.hidden)
        self.drop = torch.nn.Dropout(config.dropout)
        self.out = torch.nn.Linear(config.hidden, 1)
        self.post_init()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        pred = self.out(self.drop(torch.tanh(self.fc(x)))).squeeze(-1)  # (B,)
        return {"loss": ((pred - y) ** 2).mean()}


class Pairs(torch.utils.data.Dataset):
    """20 fixed (x, y) pairs, a map-style dataset: Trainer's own shuffling sampler; 5 batches
    of 4 an epoch, so step 3 is inside the first epoch."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(20, 4, generator=g), torch.randn(20, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


def train(run: FitRun, save_only_model: bool) -> None:
    torch.manual_seed(0)
    args = TrainingArguments(run.dir, max_steps=run.steps, per_device_train_batch_size=4,  # +
                             learning_rate=1e-2, lr_scheduler_type="cosine", seed=0,
                             use_cpu=True, report_to=[], logging_strategy="no",
                             save_strategy="no", disable_tqdm=True,
                             save_only_model=save_only_model, dataloader_num_workers=0)
    trainer = Trainer(model=TinyMLP(TinyConfig()), args=args, train_dataset=Pairs(),
                      callbacks=[ResumeCheckCallback(run)])  # +
    trainer.train(resume_from_checkpoint=run.resume_from)  # +


def fit(run: FitRun) -> None:  # +
    train(run, save_only_model=False)


def fit_model_only(run: FitRun) -> None:
    train(run, save_only_model=True)
