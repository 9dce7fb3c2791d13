"""Quick checks of the numerics claims for `python -m parity report` (drivers:
parity/drivers/numerics.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from common.format_spec import get_format
from parity.compare import measure
from parity.drivers.numerics import (
    FAULTED,
    count_rows,
    faulted_config,
    faulted_run,
    replay,
    save_replay,
    seed_directory,
    underflow_counts,
)
from parity.drivers.train import one_thread
from parity.report import Observation, check
from parity.tolerances import claim
from reference.faults import FAULTS
from reference.numerics import thresholds

CASES = (("weight_overflow", "fp16"), ("inf_weight", "fp32"), ("poisoned_batch", "bf16"),
         ("log_of_zero", "fp32"), ("lr_divergence", "fp32"),
         ("attention_overflow", "fp16"), ("gelu_backward", "fp32"))


def _text(value: object) -> np.ndarray:
    return np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)


@check("numerics.format_view")
def _() -> Observation:
    worst, n = 0.0, 0
    rng = np.random.default_rng(0)
    for fmt in ("float16", "bfloat16"):
        overflow, underflow = thresholds(get_format(fmt))
        ties = np.repeat(np.array([overflow, underflow], np.float32), 2048)
        steps = rng.integers(-3, 4, size=ties.size, dtype=np.int32)  # float32 ulps away
        near = (ties.view(np.int32) + steps).view(np.float32)
        specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
        x = np.concatenate([near, -near, specials, rng.standard_normal(4096, np.float32)])
        ref, got = count_rows(x, fmt)
        worst += measure(claim("numerics.format_view"), got, ref)
        n += len(x)
    return Observation(worst, n, "float16, bfloat16: +-3 float32 ulps around both ties, "
                                 "specials, normal draws (counted values)")


def _found(name: str, fault: str, precision: str, root: Path) -> object:
    config = faulted_config(fault, precision)
    start = root / f"start-{config.get('model', 'mlp')}-{precision}"
    if not start.exists():
        seed_directory(start, config)
    _, found = faulted_run(name, config, fault, 3, 5 + FAULTS[fault].delay, start,
                           root / f"{name}-{fault}-{precision}")
    return found


@check("numerics.first_invalid")
def _() -> Observation:
    worst, n = 0.0, 0
    with one_thread(), tempfile.TemporaryDirectory() as tmp:
        for fault, precision in CASES:
            ref, got = (_found(name, fault, precision, Path(tmp))
                        for name in ("reference", "torch"))
            if ref is None or got is None:
                return Observation(float("inf"), n, f"{fault} in {precision} not found")
            worst += measure(claim("numerics.first_invalid"), _text(got.report.identity()),
                             _text(ref.report.identity()))
            n += 1
    return Observation(worst, n, ", ".join(f"{f} {p}" for f, p in CASES))


@check("numerics.replay_node")
def _() -> Observation:
    worst, n = 0.0, 0
    with one_thread(), tempfile.TemporaryDirectory() as tmp:
        for fault, precision in CASES:
            for writer in ("reference", "torch"):
                found = _found(writer, fault, precision, Path(tmp))
                path = Path(tmp) / f"{writer}-{fault}.replay"
                save_replay(writer, path, found.replay)
                a, b = (replay(reader, path) for reader in ("reference", "torch"))
                worst += measure(claim("numerics.replay_node"),
                                 _text([a.node, a.module]), _text([b.node, b.module]))
                n += 1
    return Observation(worst, n, f"{len(CASES)} faults (MLP and transformer), each tree's "
                                 "file replayed by both trees")


@check("numerics.underflow_counts")
def _() -> Observation:
    worst, n = 0.0, 0
    with one_thread(), tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for seed in (0, 1):
            seed_directory(root / f"start-{seed}", {**FAULTED, "precision": "fp16",
                                                    "seed": seed})
            for repaired in (False, True):
                ref, got = (underflow_counts(name, seed, root / f"start-{seed}",
                                             root / f"{seed}", repaired=repaired)
                            for name in ("reference", "torch"))
                worst += measure(claim("numerics.underflow_counts"), _text(got), _text(ref))
                n += 1
    return Observation(worst, n, "fp16_without_scaler at seeds 0 and 1, without and with "
                                 "the GradScaler (count rows of every gradient)")
