"""What both trees share and no library computes: plain data and orchestration.

The standard library, NumPy and `ckpt` only: never torch, never `reference`, never `parity`,
so importing a `torch_impl` module loads no reference mechanism, and the two trees read the
same configuration, plan, catalogue and report types (a checkpoint's configuration, a
schedule's plan and a numerics report compare across the implementations with ==).

    common/train_config.py      TrainConfig, validated field by field, and its fingerprint
    common/gpt_config.py        the compact transformer's shape (GPTConfig) and the training one
    common/format_spec.py       a binary floating-point format's ranges from its bit widths
    common/recompute_plans.py   checkpointing plans (Schedule, Segment) and their specs
    common/fault_catalogue.py   the seeded faults a run can be given (plain data)
    common/numerics_report.py   the numerics detector's report types
    common/numerics_detect.py   the numerics detector's control flow (a tree supplies its calls)
    common/state_digest.py      NOTE [ Canonical state digest ], given a tree's tensor bytes
    common/train_loop.py        the loop around the step: checkpoints, resume, faults, numerics

Each tree supplies only what differs (its step, its payload, its random state, how a tensor
becomes bytes); the mechanisms themselves stay parallel twins in reference/ and torch_impl/.
"""
