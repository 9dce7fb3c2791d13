"""Hypothesis strategies for resume and train (the conventions: parity/strategies/__init__.py)."""

from __future__ import annotations

from hypothesis import strategies as st

# A training run interrupted once: a small config (the compact model on the teacher task),
# the total steps, the step the checkpoint is written at, and how often the interrupted
# half checkpoints (`every`; its last checkpoint is at `interrupt`). fp16 runs draw a huge
# initial loss scale half the time, so overflow-skipped steps fall before the interruption.
TRAIN_PRECISIONS = ("fp32", "bf16", "fp16")
TRAIN_RECOMPUTE = ("none", "sqrt", "uniform:2", "optimal:2")


@st.composite
def train_configs(draw: st.DrawFn, max_total: int = 10) -> dict:
    """{config (TrainConfig keywords), total, interrupt (1..total-1), every}."""
    precision = draw(st.sampled_from(TRAIN_PRECISIONS))
    config = {
        "seed": draw(st.integers(0, 2**16)),
        "sizes": (8, 16, 3),
        "dropout": draw(st.sampled_from([0.0, 0.25])),
        "precision": precision,
        "recompute": draw(st.sampled_from(TRAIN_RECOMPUTE)),
        "schedule": draw(st.sampled_from(["constant", "cosine", "step"])),
        "optimizer": draw(st.sampled_from(["SGD", "Adam", "AdamW"])),
        "horizon": 10,
        "batch_size": 8,
        "num_samples": 24,  # 3 batches an epoch: interruptions fall mid-epoch and on edges
        "init_scale": draw(st.sampled_from([2.0**16, 2.0**22])) if precision == "fp16"
        else 2.0**16,
        "growth_interval": 3,
    }
    total = draw(st.integers(2, max_total))
    interrupt = draw(st.integers(1, total - 1))
    every = draw(st.integers(1, interrupt))
    return {"config": config, "total": total, "interrupt": interrupt, "every": every}


# The same for the transformer (--model gpt, 4 blocks): block schedules, the selective
# attention core and both; 3 batches of 4 copy-task sequences an epoch.
GPT_TRAIN_RECOMPUTE = ("none", "sqrt", "uniform:2", "optimal:1", "selective",
                       "optimal:2+selective")


@st.composite
def gpt_train_configs(draw: st.DrawFn, max_total: int = 8) -> dict:
    """{config (TrainConfig keywords, model "gpt"), total, interrupt, every}."""
    precision = draw(st.sampled_from(TRAIN_PRECISIONS))
    config = {
        "model": "gpt",
        "seed": draw(st.integers(0, 2**16)),
        "dropout": draw(st.sampled_from([0.0, 0.2])),
        "precision": precision,
        "recompute": draw(st.sampled_from(GPT_TRAIN_RECOMPUTE)),
        "schedule": draw(st.sampled_from(["constant", "cosine", "step"])),
        "optimizer": draw(st.sampled_from(["SGD", "Adam", "AdamW"])),
        "horizon": max_total,
        "batch_size": 4,
        "num_samples": 12,
        "init_scale": draw(st.sampled_from([2.0**16, 2.0**24])) if precision == "fp16"
        else 2.0**16,
        "growth_interval": 3,
    }
    total = draw(st.integers(2, max_total))
    interrupt = draw(st.integers(1, total - 1))
    every = draw(st.integers(1, interrupt))
    return {"config": config, "total": total, "interrupt": interrupt, "every": every}
