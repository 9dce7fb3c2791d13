"""reference/data.py against its own oracles: Python-int hashing, integer teacher, permutations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import data

M32 = 2**32


def mix32_int(x: int) -> int:
    """lowbias32 on a Python int: the docstring's formula with exact big-int arithmetic."""
    x ^= x >> 16
    x = x * data.MIX_MUL1 % M32
    x ^= x >> 15
    x = x * data.MIX_MUL2 % M32
    return x ^ (x >> 16)


def unmix32_int(y: int) -> int:
    """The inverse of mix32_int (xorshift inverses, multiplicative inverses mod 2^32)."""

    def unxorshift(y: int, s: int) -> int:
        x = y
        for _ in range(32 // s + 1):
            x = y ^ (x >> s)
        return x

    y = unxorshift(y, 16)
    y = y * pow(data.MIX_MUL2, -1, M32) % M32
    y = unxorshift(y, 15)
    y = y * pow(data.MIX_MUL1, -1, M32) % M32
    return unxorshift(y, 16)


@given(st.lists(st.integers(0, M32 - 1), min_size=1, max_size=50))
def test_mix32_matches_python_int_formula_and_is_invertible(xs: list[int]) -> None:
    """mix32 equals the big-int formula, and the formula has an inverse (so it is a bijection)."""
    got = data.mix32(np.array(xs, dtype=np.uint64))
    assert got.tolist() == [mix32_int(x) for x in xs]
    assert [unmix32_int(mix32_int(x)) for x in xs] == xs


@given(seed=st.integers(0, M32 - 1), purpose=st.integers(1, 4), sub=st.integers(0, M32 - 1))
def test_hash_words_follow_the_documented_key_schedule(seed: int, purpose: int, sub: int) -> None:
    """word_i = mix32(mix32(i ^ key) ^ key), key = mix32(mix32(mix32(seed) ^ purpose) ^ sub)."""
    key = mix32_int(mix32_int(mix32_int(seed) ^ purpose) ^ sub)
    expected = [mix32_int(mix32_int(i ^ key) ^ key) for i in range(20)]
    assert data.hash_words(seed, purpose, sub, 20).tolist() == expected


@given(seed=st.integers(0, M32 - 1), epoch=st.integers(0, M32 - 1), n=st.integers(1, 500))
def test_epoch_order_is_a_deterministic_permutation_sorted_by_hashed_words(
    seed: int, epoch: int, n: int
) -> None:
    """Each epoch is a permutation of 0..n-1, ascending in its (distinct) words."""
    order = data.epoch_order(seed, epoch, n)
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))
    words = data.hash_words(seed, data.ORDER, epoch, n)[order]
    assert np.all(np.diff(words.astype(np.int64)) > 0)  # strictly: distinct words, unique order
    assert np.array_equal(order, data.epoch_order(seed, epoch, n))


def test_different_epochs_and_seeds_give_different_orders() -> None:
    """Over 5 seeds x 5 epochs, the 25 orders of 64 samples are pairwise different."""
    orders = {tuple(data.epoch_order(seed, epoch, 64)) for seed in range(5) for epoch in range(5)}
    assert len(orders) == 25


def test_epoch_orders_are_uniform_over_permutations() -> None:
    """Orders of 4 samples over 4800 epochs: each of the 24 permutations ~200 times (chi2)."""
    counts = dict.fromkeys(itertools.permutations(range(4)), 0)
    for epoch in range(4800):
        counts[tuple(data.epoch_order(11, epoch, 4).tolist())] += 1
    chi2 = sum((c - 200) ** 2 / 200 for c in counts.values())
    # 23 degrees of freedom: P(chi2 > 60) ~ 3e-5 for a uniform shuffle; deterministic seed.
    assert chi2 < 60, counts


def _integer_teacher(seed: int, n: int, features: int, hidden: int, classes: int) -> np.ndarray:
    """s(x) * 2^23 in exact integer arithmetic (Python ints through object arrays)."""
    w1, b1, w2 = (w.astype(object) for w in data.teacher_weights(seed, features, hidden, classes))
    words = data.hash_words(seed, data.INPUTS, 0, n * features).reshape(n, features)
    k = (words >> np.uint64(8)).astype(np.int64).astype(object) - 2**23  # x = k * 2^-23
    z = k @ w1.T + b1 * 2**23
    return np.maximum(z, 0) @ w2.T


@pytest.mark.parametrize(("features", "hidden", "classes"), [(8, 16, 3), (64, 256, 16), (1, 1, 2)])
def test_teacher_logits_are_exact_in_float64(features: int, hidden: int, classes: int) -> None:
    """float64 teacher logits equal the exact integer computation times 2^-23 (NOTE exactness)."""
    n = 64
    words = data.hash_words(3, data.INPUTS, 0, n * features).reshape(n, features)
    x = (words >> np.uint64(8)).astype(np.float64) * data.INPUT_STEP - 1.0
    exact = _integer_teacher(3, n, features, hidden, classes)
    got = data.teacher_logits(x, 3, hidden, classes)
    assert all(math.ldexp(float(g), 23) == e for g, e in zip(got.ravel(), exact.ravel(),
                                                             strict=True))
    assert np.max(np.abs(exact)).bit_length() <= 41  # the NOTE's bound on significant bits


def test_task_labels_are_argmax_of_median_centered_exact_logits() -> None:
    """Labels are the first argmax of s(x) - upper median over the calibration set."""
    seed, n, d, h, c = 4, 300, 8, 16, 3
    task = data.make_task(seed, n, dtype=np.float64)
    words = data.hash_words(seed, data.CALIBRATION, 0, data.CALIBRATION_SIZE * d)
    calib_x = (words.reshape(-1, d) >> np.uint64(8)).astype(np.float64) * data.INPUT_STEP - 1
    calib = data.teacher_logits(calib_x, seed, h, c)
    median = np.sort(calib, axis=0)[data.CALIBRATION_SIZE // 2]
    exact = _integer_teacher(seed, n, d, h, c) - (median * 2**23).astype(np.int64)
    assert task.labels.tolist() == [int(np.argmax(row)) for row in exact.astype(np.int64)]
    assert np.array_equal(task.values, exact.astype(np.float64) * 2.0**-23 * data.VALUE_SCALE)


@given(seed=st.integers(0, M32 - 1))
def test_task_inputs_lie_on_the_grid_and_samples_depend_only_on_seed_and_index(seed: int) -> None:
    """Inputs are k * 2^-23 in [-1, 1); make_task(seed, 40) is a prefix of make_task(seed, 90)."""
    small, big = data.make_task(seed, 40), data.make_task(seed, 90)
    assert small.inputs.dtype == np.float32 and small.labels.dtype == np.int64
    x = big.inputs.astype(np.float64)
    assert np.all((x >= -1) & (x < 1))
    assert np.array_equal(x / data.INPUT_STEP, np.round(x / data.INPUT_STEP))
    for a, b in ((small.inputs, big.inputs), (small.labels, big.labels),
                 (small.values, big.values)):
        assert np.array_equal(a, b[:40])


def test_default_task_classes_are_roughly_balanced() -> None:
    """With the median-centred bias each class holds at least 15% of 2048 samples (seeds 0-4)."""
    for seed in range(5):
        counts = np.bincount(data.make_task(seed, 2048).labels, minlength=3)
        assert counts.min() >= 0.15 * 2048, (seed, counts)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [({"num_samples": 0}, ValueError, "num_samples=0"),
     ({"seed": -1}, ValueError, "seed=-1"),
     ({"classes": 1}, ValueError, "classes=1"),
     ({"dtype": np.float16}, ValueError, "float32 or float64"),
     ({"seed": 1.5}, TypeError, "seed must be an integer")],
)
def test_make_task_rejects_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    """Bad sizes, seeds and dtypes raise errors naming make_task and the value."""
    args = {"seed": 0, "num_samples": 10, **kwargs}
    with pytest.raises(error, match=match):
        data.make_task(**args)


# ---------------------------------------------------------------- sampler


def test_sampler_yields_each_epoch_order_in_turn_and_counts_consumed_indices() -> None:
    """iter() yields order(epoch)[position:]; the state counts each index as it is handed out."""
    s = data.ResumableSampler(7, seed=3)
    for epoch in range(3):
        assert len(s) == 7
        seen = []
        for k, index in enumerate(s):
            seen.append(index)
            expected = (epoch, k + 1) if k + 1 < 7 else (epoch + 1, 0)
            assert (s.epoch, s.position) == expected
        assert seen == s.order(epoch).tolist()


def test_sampler_continues_mid_epoch_after_an_abandoned_iterator() -> None:
    """Breaking out of an epoch and calling iter() again continues, not restarts, the epoch."""
    s = data.ResumableSampler(10, seed=1)
    first = list(itertools.islice(iter(s), 4))
    rest = list(s)
    assert first + rest == s.order(0).tolist()
    assert s.state_dict() == {"seed": 1, "num_samples": 10, "epoch": 1, "position": 0}


def test_live_iterator_raises_when_state_is_loaded_under_it() -> None:
    """A load_state_dict during iteration makes the old iterator raise, not silently mix."""
    s = data.ResumableSampler(10, seed=1)
    it = iter(s)
    next(it)
    s.load_state_dict({"seed": 1, "num_samples": 10, "epoch": 5, "position": 2})
    with pytest.raises(RuntimeError, match="state changed under a live iterator"):
        next(it)
    assert next(iter(s)) == s.order(5)[2]


def test_batch_sampler_groups_and_drops_like_torch_documents() -> None:
    """Batches of 3 over 10 samples: sizes [3,3,3,1], or [3,3,3] with drop_last; epoch advances."""
    for drop_last, sizes in ((False, [3, 3, 3, 1]), (True, [3, 3, 3])):
        s = data.ResumableSampler(10, seed=2)
        bs = data.BatchSampler(s, 3, drop_last)
        assert len(bs) == len(sizes)
        batches = list(bs)
        assert [len(b) for b in batches] == sizes
        assert list(itertools.chain(*batches)) == s.order(0).tolist()[: sum(sizes)]
        assert (s.epoch, s.position) == (1, 0)


BAD_STATES = [
    ({"epoch": 0, "position": 0, "seed": 1}, ValueError, r"missing keys \['num_samples'\]"),
    ({"seed": 1, "num_samples": 10, "epoch": 0, "position": 0, "rng": 3}, ValueError,
     r"unexpected keys \['rng'\]"),
    ({"seed": 1, "num_samples": 10, "epoch": 0, "position": 10}, ValueError, "position=10"),
    ({"seed": 1, "num_samples": 10, "epoch": 0, "position": -1}, ValueError, "position=-1"),
    ({"seed": 1, "num_samples": 10, "epoch": -2, "position": 0}, ValueError, "epoch=-2"),
    ({"seed": 1, "num_samples": 11, "epoch": 0, "position": 0}, ValueError,
     "different dataset length"),
    ({"seed": 2, "num_samples": 10, "epoch": 0, "position": 0}, ValueError, "seed=2"),
    ({"seed": 1, "num_samples": 10, "epoch": 0, "position": 2.0}, TypeError, "position must"),
    ({"seed": 1, "num_samples": 10, "epoch": True, "position": 0}, TypeError, "epoch must"),
]


@pytest.mark.parametrize(("state", "error", "match"), BAD_STATES)
def test_load_state_dict_rejects_bad_state_and_keeps_the_old_one(
    state: dict, error: type, match: str
) -> None:
    """Wrong keys, out-of-range values, another length or seed: a clear error, state unchanged."""
    s = data.ResumableSampler(10, seed=1)
    s.load_state_dict({"seed": 1, "num_samples": 10, "epoch": 3, "position": 4})
    with pytest.raises(error, match=match):
        s.load_state_dict(state)
    assert (s.epoch, s.position) == (3, 4)


def test_state_dict_lists_plain_ints_and_accepts_numpy_ints() -> None:
    """state_dict holds plain ints; NumPy integers (e.g. from an .npz) load as well."""
    s = data.ResumableSampler(10, seed=1)
    state = s.state_dict()
    assert list(state) == list(data.STATE_KEYS)
    assert all(type(v) is int for v in state.values())
    s.load_state_dict({k: np.int64(v + (k == "position") * 3) for k, v in state.items()})
    assert s.position == 3 and type(s.position) is int
