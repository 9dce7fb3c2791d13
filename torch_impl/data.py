"""Resumable data order over the synthetic teacher task, in PyTorch: see reference/data.py.

The math (hash, order, task) is stated in reference/data.py and recomputed here with torch
ops, giving the same bits (NOTE [ Exact teacher arithmetic ], NOTE [ Counter-based hashing
instead of a Generator ] there). What differs in PyTorch:

- torch has no full uint32/uint64 arithmetic on every device, so words live in int64 and
  the 32x32-bit product mod 2^32 is split in two 32x16-bit products (each < 2^48, exact).
- `ResumableSampler` is a `torch.utils.data.Sampler[int]` and `BatchSampler` is
  torch.utils.data.BatchSampler itself; `Task` is a `torch.utils.data.Dataset`.
- `make_loader` returns a real DataLoader and REQUIRES a torch.Generator: see
  NOTE [ DataLoader base seed ].

# NOTE [ DataLoader base seed ]
Every `iter(DataLoader)` draws a 64-bit "base seed" (for worker seeding) with
`torch.empty((), dtype=torch.int64).random_(generator=loader.generator)`, even with
num_workers=0 and even when nothing uses it. With generator=None that draw advances the
GLOBAL torch RNG, so a run that calls iter(loader) at different moments (a resumed run
starts its first epoch mid-way) sees different dropout masks or initializations afterwards.
Giving the loader its own generator confines the draw to a stream that the checkpoint can
save; the sampler itself draws nothing.

# NOTE [ Workers run ahead of the sampler state ]
With num_workers > 0 a DataLoader pulls up to prefetch_factor * num_workers batches of
indices ahead of the batches the loop has consumed, so the state of the sampler it iterates
counts indices handed to workers, not batches trained on: a checkpoint of it skips the
prefetched batches on resume. make_loader therefore uses num_workers=0, where every
next(loader) pulls exactly one batch and state_dict() is what was consumed; with workers,
torch_impl/data_workers.py (WorkerLoader) lets the DataLoader iterate a copy of the
sampler and moves the run's sampler only when a batch reaches the loop, and seeds each
batch's randomness from (seed, epoch, batch index) (NOTE [ Consumed position ] in
reference/data.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from common import arg_ranges as ar
from common.arg_ranges import check_int

MASK32 = 0xFFFF_FFFF
MIX_MUL1 = 0x7FEB_352D
MIX_MUL2 = 0x846C_A68B
# Purposes: independent streams from one seed, each its own number (reference/data.py).
ORDER, INPUTS, TEACHER, CALIBRATION, SEQUENCES = 1, 2, 3, 4, 5
LOADER = 6  # torch_impl/train.py's DataLoader base seed of each epoch (NOTE [ DataLoader
#   base seed ] above)
BATCH = 7  # the seed of one batch's randomness (batch_seed; NOTE [ Consumed position ])
PURPOSES = (ORDER, INPUTS, TEACHER, CALIBRATION, SEQUENCES, LOADER, BATCH)
CALIBRATION_SIZE = 1024
INPUT_STEP = float.fromhex("0x1p-23")  # 1.1920928955078125e-07: the input grid
VALUE_SCALE = float.fromhex("0x1p-4")  # 0.0625
STATE_KEYS = ("seed", "num_samples", "epoch", "position")

__all__ = ["BatchSampler", "ResumableSampler", "Task", "batch_seed", "epoch_order",
           "hash_words", "make_loader", "make_task", "mix32", "teacher_logits", "teacher_weights"]


def _check_int(where: str, name: str, value: object, declared: range) -> int:
    """`value` as an int in its declared range (common/arg_ranges.py), or one line; a
    one-element integer tensor is taken as its value."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    return check_int(where, name, value, declared)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2^32 for 0 <= x, c < 2^32 in int64: x*c_lo + ((x*c_hi) mod 2^16) * 2^16."""
    lo = x * (c & 0xFFFF)  # < 2^48
    hi = ((x * (c >> 16)) & 0xFFFF) << 16  # < 2^32
    return (lo + hi) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on 32-bit words held in int64 (non-negative, so >> is a logical shift)."""
    x = x.to(torch.int64)
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_MUL2)
    return x ^ (x >> 16)


def hash_words(
    seed: int, purpose: int, sub: int, count: int, device: torch.device | str = "cpu", *,
    start: int = 0
) -> torch.Tensor:
    """word_i(seed, purpose, sub) for i = start..start+count-1, as int64 holding 32-bit
    values."""
    seed = _check_int("hash_words", "seed", seed, ar.SEEDS)
    purpose = _check_int("hash_words", "purpose", purpose, ar.HASH_PURPOSES)
    sub = _check_int("hash_words", "sub", sub, ar.HASH_SUBS)
    start = _check_int("hash_words", "start", start, ar.HASH_SUBS)
    count = _check_int("hash_words", "count", count, range(ar.HASH_COUNTS.stop - start))
    key = mix32(mix32(mix32(torch.tensor([seed], device=device)) ^ purpose) ^ sub)
    i = torch.arange(start, start + count, dtype=torch.int64, device=device)
    return mix32(mix32(i ^ key) ^ key)


def epoch_order(
    seed: int, epoch: int, num_samples: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The order of epoch `epoch`: a permutation of 0..num_samples-1 (int64), unique sort."""
    _check_int("epoch_order", "seed", seed, ar.SEEDS)
    _check_int("epoch_order", "epoch", epoch, ar.EPOCHS)
    _check_int("epoch_order", "num_samples", num_samples, ar.HASH_COUNTS)
    words = hash_words(seed, ORDER, epoch, num_samples, device)
    return torch.argsort(words, stable=True)


def batch_seed(seed: int, epoch: int, batch: int) -> int:
    """The seed of batch `batch` of epoch `epoch` (NOTE [ Consumed position ] in
    reference/data.py): word_batch(seed, BATCH, epoch), 32 bits, as a Python int."""
    seed = _check_int("batch_seed", "seed", seed, ar.SEEDS)
    epoch = _check_int("batch_seed", "epoch", epoch, ar.EPOCHS)
    batch = _check_int("batch_seed", "batch", batch, ar.BATCH_INDICES)
    return int(hash_words(seed, BATCH, epoch, 1, start=batch)[0])  # word_batch alone


# ---------------------------------------------------------------- the task


@dataclass(frozen=True, eq=False)
class Task(Dataset):
    """A dataset of n samples: inputs (n, d) float, labels (n,) int64, values (n, c) float."""

    inputs: torch.Tensor
    labels: torch.Tensor
    values: torch.Tensor

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.labels[i], self.values[i]

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(inputs, labels, values) of these samples, in this order."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self.inputs.device)
        return self.inputs[idx], self.labels[idx], self.values[idx]


def _inputs(seed: int, purpose: int, num_samples: int, features: int,
            device: torch.device | str) -> torch.Tensor:
    words = hash_words(seed, purpose, 0, num_samples * features, device)
    words = words.reshape(num_samples, features)
    return (words >> 8).to(torch.float64) * INPUT_STEP - 1.0  # exact: 24 bits


def teacher_weights(
    seed: int, features: int, hidden: int, classes: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's integer weights W1 (h, d), b1 (h,), W2 (c, h), entries in [-3, 3] (int64)."""
    ints = hash_words(seed, TEACHER, 0, hidden * features + hidden + classes * hidden,
                      device) % 7 - 3
    w1 = ints[: hidden * features].reshape(hidden, features)
    b1 = ints[hidden * features : hidden * features + hidden]
    w2 = ints[hidden * features + hidden :].reshape(classes, hidden)
    return w1, b1, w2


def teacher_logits(x: torch.Tensor, seed: int, hidden: int, classes: int) -> torch.Tensor:
    """s(x) = W2 relu(W1 x + b1) for float64 x (n, d): (n, c), exact (NOTE [ Exact teacher ...])."""
    w1, b1, w2 = (w.to(torch.float64)
                  for w in teacher_weights(seed, x.shape[1], hidden, classes, x.device))
    return torch.relu(x @ w1.T + b1) @ w2.T


def make_task(
    seed: int,
    num_samples: int,
    *,
    features: int = 8,
    hidden: int = 16,
    classes: int = 3,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Task:
    """The teacher task of reference/data.py, with float inputs/values in `dtype`."""
    seed = _check_int("make_task", "seed", seed, ar.SEEDS)
    num_samples = _check_int("make_task", "num_samples", num_samples, ar.TASK_SAMPLES)
    features = _check_int("make_task", "features", features, ar.TASK_FEATURES)
    hidden = _check_int("make_task", "hidden", hidden, ar.TASK_HIDDEN)
    classes = _check_int("make_task", "classes", classes, ar.TASK_CLASSES)
    ar.check_dtype("make_task", "dtype", str(dtype).removeprefix("torch."), ar.TASK_DTYPES,
                   ValueError)
    calib = teacher_logits(_inputs(seed, CALIBRATION, CALIBRATION_SIZE, features, device),
                            seed, hidden, classes)
    b2 = -torch.sort(calib, dim=0).values[CALIBRATION_SIZE // 2]  # (c,) upper median, exact
    x = _inputs(seed, INPUTS, num_samples, features, device)  # (n, d)
    logits = teacher_logits(x, seed, hidden, classes) + b2  # (n, c)
    return Task(
        inputs=x.to(dtype),
        labels=torch.argmax(logits, dim=1),
        values=(logits * VALUE_SCALE).to(dtype),
    )


@dataclass(frozen=True, eq=False)
class SequenceTask(Dataset):
    """Token sequences for the transformer: inputs (n, T) and next-token targets (n, T), int64."""

    inputs: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.labels[i]

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels) of these samples, in this order (fresh tensors)."""
        idx = torch.as_tensor(indices, dtype=torch.int64, device=self.inputs.device)
        return self.inputs[idx], self.labels[idx]


def make_copy_task(seed: int, num_samples: int, *, prefix: int = 8, vocab_size: int = 12,
                   device: torch.device | str = "cpu") -> SequenceTask:
    """The copy task of reference/data.py (make_copy_task), from the same hash words."""
    seed = _check_int("make_copy_task", "seed", seed, ar.SEEDS)
    num_samples = _check_int("make_copy_task", "num_samples", num_samples, ar.TASK_SAMPLES)
    prefix = _check_int("make_copy_task", "prefix", prefix, ar.COPY_PREFIXES)
    vocab_size = _check_int("make_copy_task", "vocab_size", vocab_size, ar.COPY_VOCAB_SIZES)
    words = hash_words(seed, SEQUENCES, 0, num_samples * prefix, device)
    digits = (words % (vocab_size - 1)).reshape(num_samples, prefix)  # (n, P) int64
    sep = torch.full((num_samples, 1), vocab_size - 1, dtype=torch.int64, device=device)
    seq = torch.cat([digits, sep, digits], dim=1)  # (n, 2P + 1)
    return SequenceTask(inputs=seq[:, :-1].clone(), labels=seq[:, 1:].clone())


# ---------------------------------------------------------------- the sampler


class ResumableSampler(Sampler[int]):
    """Yields sample indices epoch after epoch; its whole state is (epoch, position).

    The same contract as reference.data.ResumableSampler (NOTE [ Sampler state is updated
    before an index is yielded ] there); the order is computed on CPU.
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        super().__init__()
        self.num_samples = _check_int("ResumableSampler", "num_samples", num_samples,
                                      ar.SAMPLER_SAMPLES)
        self.seed = _check_int("ResumableSampler", "seed", seed, ar.SEEDS)
        self.epoch = 0
        self.position = 0

    def order(self, epoch: int) -> torch.Tensor:
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
        """{'seed', 'num_samples', 'epoch', 'position'}: plain ints, as in the reference."""
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


def make_loader(
    task: Task | SequenceTask,
    sampler: ResumableSampler,
    batch_size: int,
    *,
    drop_last: bool = False,
    generator: torch.Generator,
) -> DataLoader:
    """A single-process DataLoader over `task` in the sampler's order, resumable mid-epoch.

    `generator` is required: NOTE [ DataLoader base seed ]. num_workers is 0: NOTE [ Workers
    run ahead of the sampler state ].
    """
    if sampler.num_samples != len(task):
        raise ValueError(f"make_loader: sampler has num_samples={sampler.num_samples}, "
                         f"task has {len(task)} samples")
    if not isinstance(generator, torch.Generator):
        raise TypeError("make_loader: generator must be a torch.Generator (the base seed of "
                        f"every iter(loader) is drawn from it), got {type(generator).__name__}")
    batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    return DataLoader(task, batch_sampler=batch_sampler, num_workers=0, generator=generator)
