"""parity/lab/your_trainer/host_reads.py: each way of reading a tensor's value to the host
is counted at the line that wrote it; a read torch makes inside GradScaler.step is attributed
to the caller's line and names the torch function; integer reads are kept apart (a bool of
values, `if torch.isnan(loss):`, is a value's read); ScalerGuard's wrappers are looked
through."""

from __future__ import annotations

import inspect

import torch

from parity.lab.your_trainer.host_reads import HostReads


def here() -> str:
    """file:line of the caller's next line (read from the frame, not typed in)."""
    frame = inspect.currentframe().f_back  # type: ignore[union-attr]
    return f"{frame.f_code.co_filename}:{frame.f_lineno + 1}"  # type: ignore[union-attr]


def test_item_float_bool_and_an_index_are_read_at_their_lines() -> None:
    t = torch.tensor([1.5, 2.5])
    with HostReads() as reads:
        at = [here()]
        t.sum().item()
        at.append(here())
        float(t[0])
        at.append(here())
        bool(t[1] > 0)
        at.append(here())
        torch.arange(5)[: torch.tensor(2)]  # a 0-d integer tensor as a slice bound
    assert reads.in_user_code() == {at[0]: 1, at[1]: 1, at[2]: 1}  # the bool a value's
    assert reads.sites[(at[2], "", "bool")] == 1
    assert reads.in_user_code(floating=False) == {at[3]: 1}
    assert reads.in_user_code(at_least=2) == {}


def test_grad_scaler_reads_are_torch_s_and_not_the_loop_s() -> None:
    """GradScaler.step reads its found-inf flags (and single-tensor Adam its step counts):
    at the scaler.step line, `via` grad_scaler.py; none of it counts as the loop's own."""
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    with HostReads() as reads:
        at = here()
        scaler.step(optimizer)
    vias = {via for (where, via, _) in reads.sites if where == at}
    assert vias == {"grad_scaler.py:GradScaler.step"}
    assert reads.in_user_code() == {}


def test_an_isnan_check_is_the_loops_read_and_scaler_guard_is_looked_through() -> None:
    """`if torch.isnan(loss):` counts at its line by default; with ScalerGuard wrapping
    GradScaler.step, the scaler's reads are still at the loop's scaler.step line, via
    grad_scaler.py, not at scaler_guard.py."""
    from parity.lab.your_trainer.scaler_guard import ScalerGuard

    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with ScalerGuard(scaler, optimizer), HostReads() as reads:
        loss = model(torch.ones(2, 3)).sum()
        at = [here()]
        if torch.isnan(loss):
            pass
        scaler.scale(loss).backward()
        at.append(here())
        scaler.step(optimizer)
        scaler.update()
    assert reads.in_user_code() == {at[0]: 1}
    assert {via for (where, via, _) in reads.sites if where == at[1]} == {
        "grad_scaler.py:GradScaler.step"}
    assert not any("scaler_guard" in where for (where, _, _) in reads.sites)
