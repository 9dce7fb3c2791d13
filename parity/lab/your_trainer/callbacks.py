"""The resume check's callback for transformers' Trainer (resume_fit.py says what it records
and when); Lightning's is in callbacks_lightning.py, so importing one loads one library.

    trainer = Trainer(..., callbacks=[ResumeCheckCallback(run)])
    trainer.train(resume_from_checkpoint=run.resume_from)

The state it digests after each optimizer step is what Trainer's resume must bring back:

    model        model.state_dict()
    optimizer    optimizer.state_dict() (Accelerate's wrapper hands over the inner one's)
    scheduler    lr_scheduler.state_dict()
    global_step  TrainerState.global_step;  epoch: TrainerState.epoch
and, observed beside it, the global generators (Trainer's rng_state.pth restores them).
The save at `run.at` is Trainer's own (`control.should_save`): checkpoint-<at> in the
output_dir, written as the user's TrainingArguments say (save_only_model included).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from parity.lab.your_trainer.resume_fit import FitRun

__all__ = ["ResumeCheckCallback"]


def trainer_state(state: Any, model: Any, optimizer: Any, lr_scheduler: Any
                  ) -> dict[str, Any]:
    """What Trainer's resume must restore (module docstring)."""
    return {"model": model.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else {},
            "scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else {},
            "global_step": int(state.global_step), "epoch": float(state.epoch or 0.0)}


class ResumeCheckCallback(TrainerCallback):
    """Records the digests of a Trainer run for `python -m parity resume-check --fit`: after
    each step, the save at run.at, the stop at run.steps, the final state."""

    def __init__(self, run: FitRun) -> None:
        self.run = run

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> Any:
        step = int(state.global_step)
        self.run.record(step, trainer_state(state, model, optimizer, lr_scheduler))
        if self.run.should_save(step):
            control.should_save = True
        if step >= self.run.steps:
            control.should_training_stop = True
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                      optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> Any:
        self.run.before(int(state.global_step),
                        trainer_state(state, model, optimizer, lr_scheduler))
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.run.should_save(int(state.global_step)):
            self.run.saved(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None,
                     optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> Any:
        self.run.finish(trainer_state(state, model, optimizer, lr_scheduler))
        return control
