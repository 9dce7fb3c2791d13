"""Resumable data order over a deterministic synthetic task (see docs/data.md).

Everything here is a pure function of integers, so the torch twin (torch_impl/data.py)
recomputes it natively and gets the same bits: the same dataset and the same order of
samples in every epoch, in both implementations, with no generator state to save.

Hashing. `mix32` is a bijection on 32-bit words (the "lowbias32" finalizer, C. Wellons 2018):

    x ^= x >> 16;  x = x * 0x7FEB352D mod 2^32;  x ^= x >> 15;
    x = x * 0x846CA68B mod 2^32;  x ^= x >> 16

    key(seed, purpose, sub) = mix32(mix32(mix32(seed) ^ purpose) ^ sub)
    word_i(seed, purpose, sub) = mix32(mix32(i ^ key) ^ key),   i = 0, 1, ...

i -> word_i is a bijection for i < 2^32, so distinct indices get distinct words.

The order of epoch e is the argsort of the words of (seed, ORDER, e) over i = 0..n-1:
    order_e = argsort_i word_i(seed, ORDER, e)
The words are distinct, so the sorted order is unique: any correct sort gives it.

The task ("a teacher network"). Sample i depends on (seed, i) alone:
    x_ij = (word_{i*d+j}(seed, INPUTS, 0) >> 8) * 2^-23 - 1      uniform on a 2^-23 grid in [-1, 1)
    W1 (h, d), b1 (h), W2 (c, h): integers in [-3, 3], word % 7 - 3 (seed, TEACHER, 0)
    s(x)  = W2 relu(W1 x + b1)                                 teacher logits, shape (c,)
    b2    = -(upper median of s over 1024 calibration inputs (seed, CALIBRATION, 0))
    label = argmax_k (s(x) + b2)_k        (first maximum on ties, as numpy and torch)
    value = (s(x) + b2) * 2^-4            regression target for MSELoss, std ~ 1
b2 makes each class logit have median 0, which keeps the classes roughly balanced.

# NOTE [ Exact teacher arithmetic ]
Every input is k * 2^-23 with |k| <= 2^23 and the weights are small integers, so every
product and every partial sum of W1 x + b1 and of W2 relu(.) + b2 is an integer multiple of
2^-23 below 2^18 in magnitude (d <= 64, h <= 256): at most 41 significant bits, exact in
float64 in ANY summation order. So numpy.matmul and torch.matmul (any BLAS, FMA or not)
return the same float64 bits, and the float32 task is one correctly rounded cast of them
(inputs are exact in float32: 24 bits).

# NOTE [ Counter-based hashing instead of a Generator ]
numpy.random.Generator and torch.Generator give different streams for the same seed, so
an order drawn from either can only be resumed by the same library. A counter-based hash
(the idea behind Philox / Random123) is an explicit, stateless generator: the order of
epoch e is recomputed from (seed, e), so a sampler's whole state is (epoch, position) and
a state saved by one implementation resumes the same stream in the other.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from common import arg_ranges as ar
from common.arg_ranges import check_int

MASK32 = 0xFFFF_FFFF
MIX_MUL1 = 0x7FEB_352D
MIX_MUL2 = 0x846C_A68B
# Purposes: independent streams from one seed, each its own number (PURPOSES).
ORDER, INPUTS, TEACHER, CALIBRATION, SEQUENCES = 1, 2, 3, 4, 5
LOADER = 6  # torch_impl/train.py's DataLoader base seed of each epoch (NOTE [ DataLoader
#   base seed ] in torch_impl/data.py); the reference has no DataLoader, but the purposes
#   are one list in both trees so that no two streams share a number
BATCH = 7  # the seed of one batch's randomness (batch_seed; NOTE [ Consumed position ])
PURPOSES = (ORDER, INPUTS, TEACHER, CALIBRATION, SEQUENCES, LOADER, BATCH)
CALIBRATION_SIZE = 1024
INPUT_STEP = float.fromhex("0x1p-23")  # 1.1920928955078125e-07: the input grid
VALUE_SCALE = float.fromhex("0x1p-4")  # 0.0625: brings the teacher logits to std ~ 1
STATE_KEYS = ("seed", "num_samples", "epoch", "position")


def _check_int(where: str, name: str, value: object, declared: range) -> int:
    """`value` as an int in its declared range (common/arg_ranges.py), or one line."""
    return check_int(where, name, value, declared)


def mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 on 32-bit words held in uint64 (products < 2^64 are exact, then mod 2^32)."""
    x = np.asarray(x, dtype=np.uint64)
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(MIX_MUL1)) & np.uint64(MASK32)
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(MIX_MUL2)) & np.uint64(MASK32)
    return x ^ (x >> np.uint64(16))


def hash_words(seed: int, purpose: int, sub: int, count: int, *, start: int = 0
               ) -> np.ndarray:
    """word_i(seed, purpose, sub) for i = start..start+count-1, as uint64 holding 32-bit
    values (i < 2^32: the words are distinct)."""
    seed = _check_int("hash_words", "seed", seed, ar.SEEDS)
    purpose = _check_int("hash_words", "purpose", purpose, ar.HASH_PURPOSES)
    sub = _check_int("hash_words", "sub", sub, ar.HASH_SUBS)
    start = _check_int("hash_words", "start", start, ar.HASH_SUBS)
    count = _check_int("hash_words", "count", count, range(ar.HASH_COUNTS.stop - start))
    # 1-element arrays: NumPy scalars would warn on the (intended) wraparound.
    key = mix32(mix32(mix32(np.array([seed])) ^ np.uint64(purpose)) ^ np.uint64(sub))
    i = np.arange(start, start + count, dtype=np.uint64)
    return mix32(mix32(i ^ key) ^ key)


def epoch_order(seed: int, epoch: int, num_samples: int) -> np.ndarray:
    """The order of epoch `epoch`: a permutation of 0..num_samples-1 (int64), unique sort."""
    _check_int("epoch_order", "seed", seed, ar.SEEDS)
    _check_int("epoch_order", "epoch", epoch, ar.EPOCHS)
    _check_int("epoch_order", "num_samples", num_samples, ar.HASH_COUNTS)
    words = hash_words(seed, ORDER, epoch, num_samples)
    return np.argsort(words, kind="stable").astype(np.int64)


def batch_seed(seed: int, epoch: int, batch: int) -> int:
    """The seed of batch `batch` of epoch `epoch`: word_batch(seed, BATCH, epoch), 32 bits.

    # NOTE [ Consumed position ]
    A checkpoint records the CONSUMED position: the (epoch, position) after the last batch
    the training loop received, never what a loader has fetched ahead of it. Anything random
    about one batch (an augmentation) draws from a generator seeded with
    batch_seed(seed, epoch, batch index), the batch index being position // batch_size at
    the batch's first sample: a pure function of where the batch sits in the order, so the
    draws are the same whichever process fetched the batch, how far ahead it ran, and
    whether the run was resumed. A loader that draws even one extra value from a stream the
    checkpoint saves (a prefetched batch's augmentation, a base seed at a resumed iter())
    makes bit-exact resume impossible: the resumed run starts one draw off and stays off.
    This loader fetches one batch per batch consumed, so its state is the consumed position
    as it stands; torch_impl/data_workers.py keeps the same rule with worker processes.
    """
    seed = _check_int("batch_seed", "seed", seed, ar.SEEDS)
    epoch = _check_int("batch_seed", "epoch", epoch, ar.EPOCHS)
    batch = _check_int("batch_seed", "batch", batch, ar.BATCH_INDICES)
    return int(hash_words(seed, BATCH, epoch, 1, start=batch)[0])  # word_batch alone


# ---------------------------------------------------------------- the task


@dataclass(frozen=True)
class Task:
    """A dataset of n samples: inputs (n, d) float, labels (n,) int64, values (n, c) float."""

    inputs: np.ndarray
    labels: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batch(self, indices: Iterable[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(inputs, labels, values) of these samples, in this order."""
        idx = np.fromiter(indices, dtype=np.int64)
        return self.inputs[idx], self.labels[idx], self.values[idx]


def _inputs(seed: int, purpose: int, num_samples: int, features: int) -> np.ndarray:
    words = hash_words(seed, purpose, 0, num_samples * features).reshape(num_samples, features)
    return (words >> np.uint64(8)).astype(np.float64) * INPUT_STEP - 1.0  # exact: 24 bits


def teacher_weights(
    seed: int, features: int, hidden: int, classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The teacher's integer weights W1 (h, d), b1 (h,), W2 (c, h), entries in [-3, 3] (int64)."""
    ints = (hash_words(seed, TEACHER, 0, hidden * features + hidden + classes * hidden)
            % np.uint64(7)).astype(np.int64) - 3
    w1 = ints[: hidden * features].reshape(hidden, features)
    b1 = ints[hidden * features : hidden * features + hidden]
    w2 = ints[hidden * features + hidden :].reshape(classes, hidden)
    return w1, b1, w2


def teacher_logits(x: np.ndarray, seed: int, hidden: int, classes: int) -> np.ndarray:
    """s(x) = W2 relu(W1 x + b1) for float64 x (n, d): (n, c), exact (NOTE [ Exact teacher ...])."""
    w1, b1, w2 = (w.astype(np.float64) for w in teacher_weights(seed, x.shape[1], hidden, classes))
    return np.maximum(x @ w1.T + b1, 0.0) @ w2.T


def make_task(
    seed: int,
    num_samples: int,
    *,
    features: int = 8,
    hidden: int = 16,
    classes: int = 3,
    dtype: type | np.dtype = np.float32,
) -> Task:
    """The teacher task of the module docstring, with float inputs/values in `dtype`."""
    seed = _check_int("make_task", "seed", seed, ar.SEEDS)
    num_samples = _check_int("make_task", "num_samples", num_samples, ar.TASK_SAMPLES)
    features = _check_int("make_task", "features", features, ar.TASK_FEATURES)
    hidden = _check_int("make_task", "hidden", hidden, ar.TASK_HIDDEN)
    classes = _check_int("make_task", "classes", classes, ar.TASK_CLASSES)
    dtype = np.dtype(dtype)
    ar.check_dtype("make_task", "dtype", dtype.name, ar.TASK_DTYPES, ValueError)
    calib = teacher_logits(_inputs(seed, CALIBRATION, CALIBRATION_SIZE, features),
                            seed, hidden, classes)
    b2 = -np.sort(calib, axis=0)[CALIBRATION_SIZE // 2]  # (c,) upper median, exact
    x = _inputs(seed, INPUTS, num_samples, features)  # (n, d)
    logits = teacher_logits(x, seed, hidden, classes) + b2  # (n, c)
    return Task(
        inputs=x.astype(dtype),
        labels=np.argmax(logits, axis=1).astype(np.int64),
        values=(logits * VALUE_SCALE).astype(dtype),
    )


@dataclass(frozen=True)
class SequenceTask:
    """Token sequences for the transformer: inputs (n, T) and next-token targets (n, T), int64."""

    inputs: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batch(self, indices: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, labels) of these samples, in this order (fresh arrays)."""
        idx = np.fromiter(indices, dtype=np.int64)
        return self.inputs[idx], self.labels[idx]


def make_copy_task(seed: int, num_samples: int, *, prefix: int = 8, vocab_size: int = 12
                   ) -> SequenceTask:
    """The copy task: P = `prefix` digits, a separator, the same digits again.

        digits  d_j = word_{i P + j}(seed, SEQUENCES, 0) mod (V - 1),  j < P   (V = vocab_size)
        seq     d_0 .. d_{P-1}, SEP, d_0 .. d_{P-1}                     SEP = V - 1
        inputs  seq[:-1],  labels  seq[1:]                              (2P tokens each)
    From the separator on, label t is the input at t - P: only attention to the position P
    back can predict it (the copy positions). The digits before it are uniform and cannot be
    predicted: P - 1 labels, so the mean loss stays >= (P - 1) / (2P) ln(V - 1).
    """
    seed = _check_int("make_copy_task", "seed", seed, ar.SEEDS)
    num_samples = _check_int("make_copy_task", "num_samples", num_samples, ar.TASK_SAMPLES)
    prefix = _check_int("make_copy_task", "prefix", prefix, ar.COPY_PREFIXES)
    vocab_size = _check_int("make_copy_task", "vocab_size", vocab_size, ar.COPY_VOCAB_SIZES)
    words = hash_words(seed, SEQUENCES, 0, num_samples * prefix).reshape(num_samples, prefix)
    digits = (words % np.uint64(vocab_size - 1)).astype(np.int64)  # (n, P)
    sep = np.full((num_samples, 1), vocab_size - 1, dtype=np.int64)
    seq = np.concatenate([digits, sep, digits], axis=1)  # (n, 2P + 1)
    return SequenceTask(inputs=seq[:, :-1].copy(), labels=seq[:, 1:].copy())


# ---------------------------------------------------------------- the sampler


class ResumableSampler:
    """Yields sample indices epoch after epoch; its whole state is (epoch, position).

    `iter(sampler)` yields the rest of the current epoch, epoch_order(seed, epoch, n)[position:],
    then the sampler stands at (epoch + 1, 0), so the next `iter` is the next epoch.

    # NOTE [ Sampler state is updated before an index is yielded ]
    When index k of an epoch is handed out, the state already counts it (position = k + 1,
    or (epoch + 1, 0) after the last one), so state_dict() taken between two draws is exactly
    "what was consumed" and position is always in [0, n). One live iterator at a time: an
    iterator whose state was changed under it (load_state_dict, a second iterator) raises.
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = _check_int("ResumableSampler", "num_samples", num_samples,
                                      ar.SAMPLER_SAMPLES)
        self.seed = _check_int("ResumableSampler", "seed", seed, ar.SEEDS)
        self.epoch = 0
        self.position = 0

    def order(self, epoch: int) -> np.ndarray:
        """The full order of an epoch (int64 permutation of 0..n-1)."""
        return epoch_order(self.seed, epoch, self.num_samples)

    def __len__(self) -> int:
        return self.num_samples - self.position

    def __iter__(self) -> Iterator[int]:
        epoch, start = self.epoch, self.position
        order = self.order(epoch).tolist()
        for k in range(start, self.num_samples):
            if (self.epoch, self.position) != (epoch, k):
                raise RuntimeError(
                    f"ResumableSampler: state changed under a live iterator (expected "
                    f"epoch={epoch}, position={k}, found {self.epoch}, {self.position}); "
                    "call iter() again after load_state_dict"
                )
            if k + 1 < self.num_samples:
                self.position = k + 1
            else:
                self.epoch, self.position = epoch + 1, 0
            yield order[k]

    def state_dict(self) -> dict[str, int]:
        """{'seed', 'num_samples', 'epoch', 'position'}: plain ints, the same in torch_impl.

        seed and num_samples are configuration, kept so a load can refuse a state that
        belongs to another order; epoch and position (samples consumed in this epoch,
        0 <= position < num_samples) are the state.
        """
        return {"seed": self.seed, "num_samples": self.num_samples,
                "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Restore (epoch, position); ValueError on wrong keys, another seed/length, range."""
        where = "ResumableSampler.load_state_dict"
        if not isinstance(state, Mapping):
            raise TypeError(f"{where}: expected a mapping, got {type(state).__name__}")
        missing = [k for k in STATE_KEYS if k not in state]
        unexpected = sorted(str(k) for k in state if k not in STATE_KEYS)
        if missing or unexpected:
            raise ValueError(f"{where}: missing keys {missing}, unexpected keys {unexpected}; "
                             f"expected exactly {list(STATE_KEYS)}")
        seed = _check_int(where, "seed", state["seed"], ar.SEEDS)
        n = _check_int(where, "num_samples", state["num_samples"], ar.SAMPLER_SAMPLES)
        if n != self.num_samples:
            raise ValueError(f"{where}: state is for num_samples={n}, this sampler has "
                             f"{self.num_samples}: a different dataset length, a different order")
        if seed != self.seed:
            raise ValueError(f"{where}: state is for seed={seed}, this sampler has seed="
                             f"{self.seed}: a different order")
        epoch = _check_int(where, "epoch", state["epoch"], ar.EPOCHS)
        position = _check_int(where, "position", state["position"], range(n))
        self.epoch, self.position = epoch, position


class BatchSampler:
    """Groups a sampler's indices into lists of batch_size: torch.utils.data.BatchSampler.

    The last short batch of an epoch is yielded, or dropped when drop_last; either way the
    sampler has then moved to the next epoch. Its checks are torch's, with torch's texts
    (common/arg_ranges.py: BATCH_SIZES): a Python int above 0, a bool drop_last.
    """

    def __init__(self, sampler: ResumableSampler, batch_size: int, drop_last: bool) -> None:
        if (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                or batch_size not in ar.BATCH_SIZES):
            raise ValueError(ar.BATCH_SIZE_ERROR.format(batch_size))
        if not isinstance(drop_last, bool):
            raise ValueError(ar.DROP_LAST_ERROR.format(drop_last))
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        # torch's: batch_size items at a time from one iterator of the sampler (islice;
        # with drop_last, zip of batch_size references to it, which stops at the short one),
        # so a batch size past sys.maxsize, which both checks take, fails here as in torch
        indices = iter(self.sampler)
        if self.drop_last:
            yield from (list(batch) for batch in zip(*[indices] * self.batch_size,
                                                     strict=False))
            return
        batch = list(itertools.islice(indices, self.batch_size))
        while batch:
            yield batch
            batch = list(itertools.islice(indices, self.batch_size))


class Loader:
    """The reference's DataLoader: each iter() is the rest of the sampler's current epoch."""

    def __init__(self, task: Task | SequenceTask, batch_sampler: BatchSampler) -> None:
        self.task = task
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        for indices in self.batch_sampler:
            yield self.task.batch(indices)


def make_loader(
    task: Task | SequenceTask, sampler: ResumableSampler, batch_size: int, *,
    drop_last: bool = False
) -> Loader:
    """Batches (inputs, labels, values), or (inputs, labels) of a SequenceTask, in the
    sampler's order; resumable via the sampler."""
    if sampler.num_samples != len(task):
        raise ValueError(f"make_loader: sampler has num_samples={sampler.num_samples}, "
                         f"task has {len(task)} samples")
    return Loader(task, BatchSampler(sampler, batch_size, drop_last))
