"""The declared range of each ranged argument of the twins' public functions, in one place.

Three readers hold each range to one meaning: the argument checks of reference/ and
torch_impl/ (which refuse a value outside it with one line, the same in both trees), the
hypothesis strategies in parity/strategies/ (which draw over the whole range, so the
property tests reach both edges), and the edge tests (parity/test_<topic>*.py: every edge,
one past each, every member of an enumeration and one unknown, both trees the same result
or the same error line).

One module for the topics' ranges rather than one per topic: each range is a line or two,
a reader finds every argument's range in one table, and the test that holds the strategies
to the declared ranges walks one module. Ranges declared before stay where they were, read
from there: fp8 scaling's in common/fp8_recipes.py (MARGINS, AMAX_ALGOS, FP8_FORMATS), the
format names in common/format_spec.py (FORMATS).

A range is one of
    range(lo, hi + 1)      integers lo..hi, both edges accepted (r[0], r[-1])
    a tuple of names       an enumeration: each member accepted, anything else refused
    FloatRange             floats between two bounds, each end open or closed
    IntsFrom               integers lo, lo + 1, ... with no upper edge (where torch checks
                           only the lower one, as its BatchSampler's batch_size)
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from common.fp8_recipes import FP8_FORMATS


@dataclass(frozen=True)
class FloatRange:
    """The floats v with low < v (low <= v if not low_open) and v < high (v <= high if not
    high_open). `nan`: whether NaN passes the check (a check written `v <= low: refuse`,
    as torch's are, lets NaN through)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    nan: bool = False

    def __contains__(self, v: float) -> bool:
        if math.isnan(v):
            return self.nan
        above = v > self.low if self.low_open else v >= self.low
        below = v < self.high if self.high_open else v <= self.high
        return above and below


@dataclass(frozen=True)
class IntsFrom:
    """The integers v >= low, unbounded above: a range whose twin (a torch check written
    `v <= 0: refuse`) has no upper edge to hold the reference to."""

    low: int

    def __contains__(self, v: int) -> bool:
        return v >= self.low


# -- formats (reference/formats.py, torch_impl/formats.py, and the small formats' encoders)
ROUNDING_MODES: tuple[str, ...] = ("nearest_even", "toward_zero", "stochastic")
OVERFLOW_POLICIES: tuple[str, ...] = ("inf", "saturate", "nan", "saturate_finite")
VIAS: tuple[str, ...] = ("float32",)  # via=None (one rounding) or a format to round through
# a stochastic rounding word: 32 random bits (NOTE [ Stochastic rounding with 32-bit words ])
RANDOM_WORDS = range(0, 2**32)
DECODE_DTYPES: tuple[str, ...] = ("float32", "float64")

# -- fp8_blockwise (reference/fp8_blockwise.py)
BLOCKWISE_VARIANTS: tuple[str, ...] = ("deepseek", "torchao", "transformer_engine")
# a tile side: any positive int64 (torch's sizes are int64); a side longer than the matrix
# covers all of it, and only the matrix's own rows and columns are ever allocated
TILE_SIDES = range(1, 2**63)

# -- ddp, fsdp: the pure functions of a world (shard, chunk_rows, divide_factors)
# torch.distributed's world size and rank are C ints (c10d's ProcessGroup::getSize)
WORLD_SIZES = range(1, 2**31)

# -- loss_scaling: torch.amp.GradScaler's constructor refuses exactly these (as `<=` and
# `>=` tests, so NaN passes, and so do a negative backoff and a zero or negative init_scale
# and growth_interval, which torch does not check); the reference refuses the same, with
# torch's AssertionError text, since torch's class is the twin
GROWTH_FACTORS = FloatRange(1.0, math.inf, low_open=True, nan=True)
BACKOFF_FACTORS = FloatRange(-math.inf, 1.0, high_open=True, nan=True)
GROWTH_FACTOR_ERROR = "The growth factor must be > 1.0."
BACKOFF_FACTOR_ERROR = "The backoff factor must be < 1.0."

# -- data (reference/data.py, torch_impl/data.py): hashes of 32-bit words
SEEDS = range(0, 2**32)
EPOCHS = range(0, 2**32)
BATCH_INDICES = range(0, 2**32)
HASH_PURPOSES = range(0, 2**32)  # a purpose and a sub-stream are xored into 32-bit words
HASH_SUBS = range(0, 2**32)
HASH_COUNTS = range(0, 2**32 + 1)  # word_i is a bijection for i < 2^32: at most 2^32 words
SAMPLER_SAMPLES = range(1, 2**32)  # a sampler's num_samples: an index is a 32-bit word
TASK_SAMPLES = range(1, 2**32 // 64)  # a task's rows are drawn 64 words at a time
TASK_FEATURES = range(1, 65)
TASK_HIDDEN = range(1, 257)
TASK_CLASSES = range(2, 17)
COPY_PREFIXES = range(1, 1025)
COPY_VOCAB_SIZES = range(3, 2**16)
TASK_DTYPES: tuple[str, ...] = ("float32", "float64")
# torch_impl/data_workers.py's WorkerLoader (torch only: the reference has no processes)
WORKER_COUNTS = range(0, 257)
WORKER_BATCH_SIZES = range(1, 2**63)
# the batch sampler is torch.utils.data.BatchSampler in the twin, so its checks are torch's
# (torch/utils/data/sampler.py): a Python int above 0 (no upper edge), a bool drop_last,
# each refused with torch's ValueError text, which the reference's BatchSampler gives too
BATCH_SIZES = IntsFrom(1)
BATCH_SIZE_ERROR = "batch_size should be a positive integer value, but got batch_size={}"
DROP_LAST_ERROR = "drop_last should be a boolean value, but got drop_last={}"

# -- ddp_scaler: how found_inf is repaired across ranks (reference/ddp_scaler.py): not at
# all, all-reduced by MAX or SUM by hand, or by torch's ShardedGradScaler (its unscale_'s
# SUM, which the reference runs as its SUM); how a torch rank reports a parted step
SCALER_REPAIRS: tuple[str, ...] = ("none", "max", "sum", "sharded")
SCALER_CHECKS: tuple[str, ...] = ("record", "raise")
# the one line both trees refuse an unknown repair with, wherever it is checked (the
# reference's scaler_step; torch's scaler_step and scaler_job, before any process starts)
SCALER_REPAIR_ERROR = "repair must be one of {}, got {!r}"

# -- fp8_gemm (reference/fp8_gemm.py, torch_impl/fp8_gemm.py): an operand's dtype, a
# scale's (a float32 dequantization scale: torch._scaled_mm's), and a matmul's operands'
GEMM_FORMATS = FP8_FORMATS
SCALE_DTYPES: tuple[str, ...] = ("float32",)
MATMUL_DTYPES: tuple[str, ...] = ("float32",)

# -- optim: torch.optim's own checks (torch/optim/sgd.py, adam.py), which the reference's
# SGD, Adam and AdamW make with torch's messages. SGD writes `lr < 0.0: refuse` (NaN and
# inf pass); Adam writes `not 0.0 <= lr: refuse` (NaN refused, inf passes). Nothing above:
# a momentum of 1.5 or an lr of inf is taken, as torch takes it. dampening is not checked.
SGD_LRS = FloatRange(0.0, math.inf, nan=True)
SGD_MOMENTA = FloatRange(0.0, math.inf, nan=True)
SGD_WEIGHT_DECAYS = FloatRange(0.0, math.inf, nan=True)
ADAM_LRS = FloatRange(0.0, math.inf)
ADAM_EPSILONS = FloatRange(0.0, math.inf)
ADAM_BETAS = FloatRange(0.0, 1.0, high_open=True)  # each of the two
ADAM_WEIGHT_DECAYS = FloatRange(0.0, math.inf)


def check_int(where: str, name: str, value: object, declared: range) -> int:
    """`value` as an int in `declared`, or TypeError (a bool, a non-integer) or ValueError
    (outside), one line naming `where` and `name`."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise TypeError(f"{where}: {name} must be an integer, got a bool")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{where}: {name} must be an integer, got {type(value).__name__}"
                        ) from None
    if v not in declared:
        raise ValueError(f"{where}: {name}={v} is outside [{declared.start}, {declared.stop})")
    return v


def check_choice(where: str, name: str, value: object, declared: tuple[str, ...]) -> str:
    """`value` when it is a member of `declared`, else one ValueError line listing them."""
    if not isinstance(value, str) or value not in declared:
        raise ValueError(f"{where}: {name} must be one of {declared}, got {value!r}")
    return value


def check_flag(where: str, name: str, value: object) -> bool:
    """`value` when it is a bool (True or False, nothing merely truthy), else TypeError."""
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be True or False, got {value!r}")
    return value


def check_dtype(where: str, name: str, dtype: str, declared: tuple[str, ...],
                error: type[Exception] = TypeError) -> str:
    """`dtype` (a dtype's name as both trees write it: "float32", "float8_e4m3fn") when it
    is a member of `declared`, else one `error` line naming the members."""
    if dtype not in declared:
        raise error(f"{where}: {name} must be {' or '.join(declared)}, got {dtype}")
    return dtype


def check_gemm_shapes(where: str, a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """a (M, K) and b (K, N), any sides from 0 on, else one ValueError line."""
    if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
        raise ValueError(f"{where}: a (M, K) and b (K, N) expected, got shapes {tuple(a)} "
                         f"and {tuple(b)}")


def check_scale_shape(where: str, name: str, shape: tuple[int, ...],
                      rowwise: tuple[int, ...]) -> None:
    """A GEMM scale is one value (tensorwise: one element, any shape) or of shape `rowwise`."""
    if math.prod(shape) != 1 and tuple(shape) != tuple(rowwise):
        raise ValueError(f"{where}: {name} is one value (tensorwise) or of shape "
                         f"{tuple(rowwise)} (rowwise), got shape {tuple(shape)}")


def check_broadcast(where: str, name: str, shape: tuple[int, ...], to: tuple[int, ...]) -> None:
    """`shape` broadcasts to `to` and leaves it as it is (NumPy's and torch's rule, one way)."""
    fits = len(shape) <= len(to) and all(
        s in (1, t) for s, t in zip(reversed(shape), reversed(to), strict=False))
    if not fits:
        raise ValueError(f"{where}: {name} of shape {tuple(shape)} does not broadcast to "
                         f"x's shape {tuple(to)}")
