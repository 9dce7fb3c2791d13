"""torch_impl.train against documented torch behaviour: the global RNG is not the run's
state (nn.Dropout's default generator is swapped, not used), and the DataLoader base-seed
draw is a function of the epoch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from torch_impl import train

SMALL = {"sizes": (8, 16, 3), "batch_size": 8, "num_samples": 40, "dropout": 0.3}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """A tiny MLP on a small shared machine: torch's thread pool only adds contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _global_rng(device: str) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.startswith("cuda") else torch.get_rng_state()


def _stream(run: train.Run) -> torch.Generator:
    """The generator the run's dropout draws from (the CUDA one on CUDA)."""
    return run.generator if run.cuda_generator is None else run.cuda_generator


def test_training_leaves_the_global_rng_untouched_and_ignores_it(device: str) -> None:
    """The global RNG of the device is the same before and after, and its value changes
    nothing."""
    torch.manual_seed(1)
    before = _global_rng(device)
    a = train.train(train.TrainConfig(**SMALL), 6, device=device).state_dict()
    assert torch.equal(_global_rng(device), before)
    torch.manual_seed(2)
    b = train.train(train.TrainConfig(**SMALL), 6, device=device).state_dict()
    assert train.state_digest(a) == train.state_digest(b)
    assert torch.equal(a["rng"]["model"], b["rng"]["model"])


def test_nn_dropout_does_draw_from_the_default_generator(device: str) -> None:
    """Premise of NOTE [ Dropout's stream is the default generator ]: nn.Dropout advances
    the global generator of its device (so the run must swap its own stream in)."""
    before = _global_rng(device)
    torch.nn.Dropout(0.5)(torch.ones(16, device=device))
    assert not torch.equal(_global_rng(device), before)


def test_the_dropout_stream_advances_only_when_dropout_draws(device: str) -> None:
    """With dropout the run's generator moves every step; without, it stays put."""
    with_dropout = train.Run(train.TrainConfig(**SMALL), device)
    without = train.Run(train.TrainConfig(**{**SMALL, "dropout": 0.0}), device)
    s1, s2 = _stream(with_dropout).get_state(), _stream(without).get_state()
    with_dropout.train_step()
    without.train_step()
    assert not torch.equal(_stream(with_dropout).get_state(), s1)
    assert torch.equal(_stream(without).get_state(), s2)


def test_loader_base_seed_depends_on_the_epoch_only(device: str) -> None:
    """After a resume mid-epoch the loader generator holds the same state as in an
    uninterrupted run at that point (re-seeded from (seed, epoch) at every iter)."""
    config = train.TrainConfig(**SMALL)
    a = train.Run(config, device)
    for _ in range(7):
        a.train_step()
    b = train.restored(config, a.state_dict(), device=device)
    a.train_step()
    b.train_step()
    assert torch.equal(a.loader_generator.get_state(), b.loader_generator.get_state())
