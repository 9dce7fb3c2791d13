"""common.train_loop's batches, which both trees' loops share (so no parity test can see a bug
in it): held to a stated order, epoch after epoch, with the tree's batch_of applied once per
item and each epoch's hook called once as that epoch begins."""

from __future__ import annotations

import itertools

from common.train_loop import Batches, batches


class Epochs:
    """A loader whose epoch e yields (e, 0), (e, 1), ..., (e, n - 1): a new iter() is a new
    epoch, as a sampler that advances its epoch on iter() does."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, -1

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.epoch += 1
        return iter([(self.epoch, i) for i in range(self.n)])


def test_batches_are_every_item_of_each_epoch_in_order_then_the_next_epoch() -> None:
    made = list(itertools.islice(batches("config", Epochs(3), lambda c, x: (c, x)), 8))
    assert made == [("config", (e, i)) for e in range(3) for i in range(3)][:8]


def test_each_epochs_hook_runs_once_as_it_begins_and_an_empty_epoch_is_passed_over() -> None:
    seen: list[str] = []
    loader = Epochs(2)
    items = Batches(loader, new_epoch=lambda: seen.append(f"epoch {loader.epoch + 1}"))
    got = [items.next() for _ in range(5)]
    assert got == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    assert seen == ["epoch 0", "epoch 1", "epoch 2"]
    empty_then_full = iter([[], [("a", 0)]])
    lone = Batches(type("L", (), {"__iter__": lambda self: iter(next(empty_then_full))})())
    assert lone.next() == ("a", 0)
