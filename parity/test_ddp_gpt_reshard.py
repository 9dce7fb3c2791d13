"""Resharding the GPT's DDP checkpoint (claim ddp.gpt_reshard, NOTE [ Resharding a DDP
checkpoint ] in torch_impl/sharded_ckpt.py): `train --world-size N --model gpt` committed by
2 ranks at step 2, resumed on 1 to its commit at step 4, resumed on 3 to step 6.

What is held: right after each load (a resumed run asked for no step past its commit ends
there, so what it holds is what it loaded) every rank holds the saved replicated entries
bit for bit, and its stream is the rule's, seeded by ckpt.commit.rank_seed(seed, rank,
step); then, at 3 ranks, a run stopped at a commit and resumed ends with the digest of the
one that went on. Across the change of N no digest is compared with the N run's: a mean over
N' shards rounds otherwise (ddp.gpt_loss_curve).

Default: the reference's simulated ranks, in this process (the command's own run, observed
through rank_state, the function it saves and digests with). Slow: torch's gloo ranks.
"""

from __future__ import annotations

import contextlib
import copy
import io
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt import commit as ckc
from parity.compare import assert_claim
from parity.drivers import ddp_gpt as drv
from parity.drivers import ddp_train as kills
from parity.lab.cli import main

SEED = 0  # the command's default --seed
LEGS = ((2, 2), (1, 4), (3, 6))  # (world size, steps): 2 -> 1 -> 3 ranks


def _command(directory: Path, world_size: int, steps: int, *extra: str,
             impl: str = "reference") -> list[str]:
    """The command's stdout lines (exit status 0 asserted), run in this process."""
    out = io.StringIO()
    argv = kills.argv(impl, directory, world_size, steps, drv.GPT_OPTIONS)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main([*argv, "--horizon", "6", *extra])
    assert status == 0
    return out.getvalue().strip().splitlines()


def _hex(digest: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(digest), np.uint8)


def _held_after_load(directory: Path, world_size: int, step: int,
                     monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every rank's state as the command holds it right after resuming `step` at
    `world_size` (a run to `step`: no step taken), read through rank_state."""
    from reference import ddp_train

    held: dict[int, dict[str, Any]] = {}
    real = ddp_train.rank_state

    def spy(r: Any, sampler: Any, at: int, skipped: int, rank: int) -> dict[str, Any]:
        state = real(r, sampler, at, skipped, rank)
        held[rank] = copy.deepcopy(state)
        return state

    with monkeypatch.context() as m:
        m.setattr(ddp_train, "rank_state", spy)
        lines = _command(directory, world_size, step)
    assert lines[0].startswith("state-sha256: "), "guard: no step was taken"
    return [held[r] for r in range(world_size)]


def _saved(directory: Path, step: int, world_size: int) -> list[dict[str, Any]]:
    """Every rank's file of the commit of `step`, read back (its digest verified)."""
    from reference import resume

    return [resume.load_checkpoint(ckc.step_dir(directory, step) / f"rank-{r}.ckpt")
            for r in range(world_size)]


def _check_held(held: list[dict[str, Any]], saved: list[dict[str, Any]], step: int,
                context: str) -> None:
    """ddp.gpt_reshard at one load: the saved ranks agree on every replicated entry; every
    resumed rank holds rank 0's, bit for bit, and the stream rank_seed(seed, rank, step)."""
    replicated = [k for k in saved[0] if not k.startswith("rng/")]
    for r, state in enumerate(saved[1:], 1):  # DDP kept the saved replicas equal
        assert [k for k in state if not k.startswith("rng/")] == replicated
        for k in replicated:
            assert_claim("ddp.gpt_reshard", actual=np.asarray(state[k]),
                         expected=np.asarray(saved[0][k]), context=f"{context} saved rank {r} {k}")
    assert int(np.asarray(saved[0]["step"])) == step
    assert float(np.asarray(saved[0]["optim/step/0"])) > 0, "guard: AdamW had stepped"
    for rank, state in enumerate(held):
        assert sorted(state) == sorted([*replicated, f"rng/rank{rank}"]), context
        for k in replicated:
            assert_claim("ddp.gpt_reshard", actual=np.asarray(state[k]),
                         expected=np.asarray(saved[0][k]), context=f"{context} rank {rank} {k}")
        rule = np.random.default_rng(ckc.rank_seed(SEED, rank, step)).bit_generator.state
        assert state[f"rng/rank{rank}"] == rule, f"{context} rank {rank}: not the rule's stream"
        assert all(state[f"rng/rank{rank}"] != s[f"rng/rank{r}"] for r, s in enumerate(saved))


def test_the_reference_gpt_resharded_two_one_three_holds_the_saved_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ddp.gpt_reshard, the reference's simulated ranks: 2 ranks to the commit at 2; on 1
    rank every entry as saved and the rule's stream, then on to the commit at 4; on 3 ranks
    the same; then at 3 ranks, stopped at 5 and resumed to 6, the digest of 4 to 6 in one
    run."""
    run = tmp_path / "run"
    (n0, s0), (n1, s1), (n2, s2) = LEGS
    _command(run, n0, s0)
    _check_held(_held_after_load(run, n1, s0, monkeypatch), _saved(run, s0, n0), s0,
                f"{n0} -> {n1} ranks")
    lines = _command(run, n1, s1)
    assert lines[0].startswith(f"step {s0 + 1} "), "guard: it resumed, not started afresh"
    _check_held(_held_after_load(run, n2, s1, monkeypatch), _saved(run, s1, n1), s1,
                f"{n1} -> {n2} ranks")
    split = tmp_path / "split"
    shutil.copytree(run, split)
    whole = _command(run, n2, s2, "--checkpoint-every", "1")
    _command(split, n2, s1 + 1, "--checkpoint-every", "1")
    rest = _command(split, n2, s2, "--checkpoint-every", "1")
    assert rest[0].startswith(f"step {s1 + 2} "), "guard: it resumed at the same N"
    assert any(" skipped 0 " in line for line in rest[:-1]), "guard: an applied update"
    assert_claim("ddp.gpt_reshard", actual=_hex(kills.digest(rest)),
                 expected=_hex(kills.digest(whole)), context=f"{n2} ranks, stopped at {s1 + 1}")


# ------------------------------------------------------------------------- slow

def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """A torch rank's job of the slow test: the command's (torch_impl/ddp_train.py's run),
    then the state of torch's default generator, the rank's dropout stream."""
    import torch

    from torch_impl import ddp_train

    out = ddp_train.run(job, rank, group)
    return {**out, "generator": torch.default_generator.get_state()}


@pytest.mark.slow
def test_the_torch_gpt_resharded_two_one_three_holds_the_saved_entries(tmp_path: Path) -> None:
    """ddp.gpt_reshard, torch's gloo ranks (the command's job, torch_impl/ddp_train.py):
    resumed at 1 and then 3 ranks asking for no step, every rank prints the state digest of
    the run that saved (the parameters, AdamW's state, the scaler, the data position) and
    holds the stream torch.manual_seed(rank_seed(seed, rank, step)) gives; at 3 ranks,
    stopped at 5 and resumed, the digest of 4 to 6 in one run. Measured: 10 to 17 s (three
    launches; torch 2.13 CPU, 2 busy cores)."""
    import torch

    import ranks
    from torch_impl.ddp_train import train_job

    def job(directory: Path, world_size: int, steps: int, every: int, resume: int | None
            ) -> dict[str, Any]:
        return {**train_job(drv.RESUME, steps, world_size, directory, every, keep=10,
                            resume=resume, log=tmp_path / "rank0.log"), "runner": __name__}

    run_dir, split = tmp_path / "run", tmp_path / "split"
    run_dir.mkdir()
    (n0, s0), (n1, s1), (n2, s2) = LEGS
    saved0 = ranks.launch([job(run_dir, n0, s0, 2, None)], n0, timeout=300)
    one = ranks.launch([job(run_dir, n1, s0, 2, s0), job(run_dir, n1, s1, 2, s0)], n1,
                       timeout=300)
    shutil.copytree(run_dir, split)
    three = ranks.launch([job(run_dir, n2, s1, 1, s1), job(run_dir, n2, s2, 1, s1),
                          job(split, n2, s1 + 1, 1, s1), job(split, n2, s2, 1, s1 + 1)], n2,
                         timeout=300)
    for results, before, at, n in ((one, saved0[0][0], s0, n1), (three, one[0][1], s1, n2)):
        for rank in range(n):
            held = results[rank][0]
            assert held["step"] == at
            assert_claim("ddp.gpt_reshard", actual=_hex(held["digest"]),
                         expected=_hex(before["digest"]), context=f"-> {n} ranks, rank {rank}")
            rule = torch.Generator().manual_seed(ckc.rank_seed(SEED, rank, at)).get_state()
            assert_claim("ddp.gpt_reshard", actual=held["generator"], expected=rule,
                         context=f"-> {n} ranks, rank {rank}'s stream")
    whole, rest = three[0][1], three[0][3]
    assert whole["step"] == rest["step"] == s2 and three[0][2]["step"] == s1 + 1
    assert whole["digest"] != three[0][0]["digest"], "guard: steps were taken after the load"
    assert_claim("ddp.gpt_reshard", actual=_hex(rest["digest"]), expected=_hex(whole["digest"]),
                 context=f"torch, {n2} ranks, stopped at {s1 + 1}")
