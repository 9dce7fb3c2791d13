"""The checks a user points at their own trainer (docs/your-trainer.md), one module each:

    scaler_guard.py, scaler_guard_probes.py   ScalerGuard: loss-scaling misuse, at runtime
    resume_check.py, resume_worker.py,        N steps straight against a resume (the check,
    resume_state.py, resume_stale.py          its child process, what it reads of a trainer,
                                              a state that stops following its trainer)
    resume_script.py                          the same for a script run with its own argv
    resume_fit.py, callbacks.py,              ... and for a loop a framework owns, through a
    callbacks_lightning.py                    callback (transformers' Trainer, Lightning)
    host_reads.py                             HostReads: the .item() syncs of a loop, by line
    audit.py                                  loading a checkpoint someone else wrote
    accounting_any.py                         bytes and FLOPs of any nn.Module

They take any nn.Module and loop, so they are no twins: they stand on torch_impl (and the
checkpoint container) and nothing below the lab imports them (tests/test_layout.py).
"""
