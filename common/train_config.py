"""What defines a training run: TrainConfig, validated field by field, and its fingerprint
(what must not change across a resume). Both trees' Run (reference/train.py,
torch_impl/train.py) train one of this very class (plain data), so a checkpoint's
configuration compares across the two implementations field by field.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from common.fp8_train import GPT_PRECISIONS, SCALED_PRECISIONS, WEIGHT_PRECISIONS

MODELS = ("mlp", "gpt")  # what each tree's train_models.py builds
# the autocast dtypes of each tree's amp.PRECISIONS, then the scaled GEMMs of fp8_train.py,
# then bf16-sr's bfloat16 weights (recipes_train.py)
PRECISIONS = ("fp32", "bf16", "fp16", *SCALED_PRECISIONS, *WEIGHT_PRECISIONS)
OPTIMIZERS = {"SGD": {"momentum": 0.9}, "Adam": {}, "AdamW": {"weight_decay": 0.01}}
SCHEDULES = ("constant", "cosine", "step")
F32_MAX = float.fromhex("0x1.fffffep+127")  # 3.4028235e38, the largest finite float32


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run (and must not change across a resume: the fingerprint);
    both trees' train.py use this very class. A value out of range is a ValueError naming the
    field and what is accepted (fewer samples than a batch would make epochs of 0 batches;
    init_scale must be a finite float32). Run checks the recompute spec against the model."""

    seed: int = 0
    model: str = "mlp"  # or "gpt": each tree's train_models.py
    sizes: tuple[int, ...] = (8, 32, 32, 3)
    activation: str = "tanh"
    dropout: float = 0.0
    precision: str = "fp32"
    recompute: str = "none"
    optimizer: str = "AdamW"
    lr: float = 1e-2
    schedule: str = "cosine"
    horizon: int = 200  # the LR schedule's length (T_max), the steps of the whole run
    batch_size: int = 16
    num_samples: int = 256
    loss: str = "cross_entropy"
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        _whole("seed", self.seed, 0, 2**32)
        _choice("model", self.model, MODELS)
        if len(self.sizes) < 2:
            raise ValueError(f"TrainConfig: sizes needs (d_in, ..., d_out), got {self.sizes!r}")
        for size in self.sizes:
            _whole("sizes", size, 1)
        _real("dropout", self.dropout, 0.0, 1.0, high_open=True)
        _choice("precision", self.precision, PRECISIONS)
        if self.precision in GPT_PRECISIONS and (self.model, self.recompute) != ("gpt", "none"):
            raise ValueError(f"TrainConfig: precision {self.precision!r} trains --model gpt "
                             f"without recomputation (the scaled layers' shapes and random "
                             f"bits are the transformer's), got model {self.model!r}, "
                             f"recompute {self.recompute!r}")
        if self.precision in WEIGHT_PRECISIONS and self.optimizer != "AdamW":
            raise ValueError(f"TrainConfig: precision {self.precision!r} trains with AdamWSR, "
                             f"the AdamW of bfloat16 weights: optimizer must be 'AdamW', got "
                             f"{self.optimizer!r}")
        _choice("optimizer", self.optimizer, tuple(OPTIMIZERS))
        _real("lr", self.lr, 0.0, math.inf, low_open=True)
        _choice("schedule", self.schedule, SCHEDULES)
        _whole("horizon", self.horizon, 1)
        _whole("batch_size", self.batch_size, 1)
        _whole("num_samples", self.num_samples, self.batch_size)
        _choice("loss", self.loss, ("cross_entropy", "mse") if self.model == "mlp"
                else ("cross_entropy",))
        _real("init_scale", self.init_scale, 0.0, F32_MAX, low_open=True)
        _whole("growth_interval", self.growth_interval, 1)
        if self.max_grad_norm is not None:
            _real("max_grad_norm", self.max_grad_norm, 0.0, math.inf, low_open=True)
        object.__setattr__(self, "sizes", tuple(self.sizes))

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def fingerprint(self) -> str:
        """SHA-256 of the configuration as canonical JSON (sorted keys)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def _whole(name: str, value: Any, low: int, high: float = math.inf) -> None:
    """ValueError unless `value` is an int (not a bool) in [low, high)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        accepted = f"an int >= {low}" + (f" and < {high}" if high != math.inf else "")
        raise ValueError(f"TrainConfig: {name} must be {accepted}, got {value!r}")


def _real(name: str, value: Any, low: float, high: float, *, low_open: bool = False,
          high_open: bool = False) -> None:
    """ValueError unless `value` is a finite int or float in the interval given."""
    ok = (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
          and (low < value if low_open else low <= value)
          and (value < high if high_open else value <= high))
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"TrainConfig: {name} must be a finite number in {interval}, "
                         f"got {value!r}")


def _choice(name: str, value: Any, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"TrainConfig: {name} must be one of {accepted}, got {value!r}")
