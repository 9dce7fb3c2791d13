"""The resume check's callback for Lightning's fit (resume_fit.py says what it records and
when; transformers' is in callbacks.py).

    trainer = L.Trainer(max_steps=run.steps, default_root_dir=run.dir,
                        callbacks=[ResumeCheckLightning(run)])
    trainer.fit(model, data, ckpt_path=run.resume_from)

The state it digests after each optimizer step is what `fit(ckpt_path=...)` must bring back:

    model        the LightningModule's state_dict()
    optimizers   each optimizer's state_dict();  schedulers: each LR scheduler's
    global_step  trainer.global_step;  epoch: trainer.current_epoch
and, observed beside it, the global generators: Lightning's checkpoint holds none of them
unless the module's on_save_checkpoint puts them there. The save at `run.at` is Lightning's
own `trainer.save_checkpoint` (what ModelCheckpoint calls), into run.dir.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import Callback

from parity.lab.your_trainer.resume_fit import FitRun

__all__ = ["ResumeCheckLightning"]


def fit_state(trainer: Any, module: Any) -> dict[str, Any]:
    """What Lightning's resume must restore (module docstring)."""
    return {"model": module.state_dict(),
            "optimizers": [o.state_dict() for o in trainer.optimizers],
            "schedulers": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
            "global_step": int(trainer.global_step), "epoch": int(trainer.current_epoch)}


class ResumeCheckLightning(Callback):
    """Records the digests of a Lightning fit for `python -m parity resume-check --fit`:
    after each optimizer step, the save at run.at, the stop at run.steps, the final state."""

    def __init__(self, run: FitRun) -> None:
        self.run = run
        self._last = 0  # the global step last recorded (accumulating batches take none)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        self.run.before(int(trainer.global_step), fit_state(trainer, pl_module))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step == self._last:
            return
        self._last = step
        self.run.record(step, fit_state(trainer, pl_module))
        if self.run.should_save(step):
            path = os.path.join(self.run.dir, f"resume-check-step-{step}.ckpt")
            trainer.save_checkpoint(path)
            self.run.saved(path)
        if step >= self.run.steps:
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.run.finish(fit_state(trainer, pl_module))
