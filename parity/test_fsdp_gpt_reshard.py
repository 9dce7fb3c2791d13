"""Resharding the GPT's FSDP2 checkpoint (claim fsdp.gpt_reshard, NOTE [ Resharding an FSDP
checkpoint ] in reference/fsdp_gpt_ckpt.py): `train --world-size N --model gpt --parallel
fsdp` (fp16, dropout) committed by 2 ranks at step 2, resumed on 1 to its commit at step 4,
resumed on 3 to step 6, where the GPT's rows 16, 32 and 128 fall into uneven chunks.

What is held: right after each load (a resumed run asked for no step past its commit ends
there, so what it holds is what it loaded) every rank holds its chunk, by the rule at the
new N, of every sharded entry of the saved full state (the saved ranks' rows joined in rank
order), every replicated entry as saved, bit for bit, and the stream the rule seeds by
ckpt.commit.rank_seed(seed, rank, step); its digest of the joined state is the saving run's.
Then, at 3 ranks, a run stopped at a commit and resumed ends with the digest of the one that
went on. Across the change of N no digest is compared with the N run's: a mean over N'
shards rounds otherwise (fsdp.gpt_loss_curve).

Default: the reference's simulated ranks in this process (the command's own run, observed
through rank_state, the function it saves and digests with), and one torch load 2 -> 3.
Slow: torch's gloo ranks 2 -> 1 -> 3. The 1-rank leg is the command's `--world-size 1
--resume` in a directory of commit records, which continues them on one rank.
"""

from __future__ import annotations

import contextlib
import copy
import io
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt import commit as ckc
from parity.compare import as_numpy, assert_claim
from parity.drivers import fsdp_gpt as drv
from parity.lab.cli import main
from torch_impl import fsdp as tfsdp

if not tfsdp.RULE_STATED:
    pytest.skip(tfsdp.NOT_STATED, allow_module_level=True)

SEED = 0  # the command's default --seed
LEGS = ((2, 2), (1, 4), (3, 6))  # (world size, steps): 2 -> 1 -> 3 ranks
BACK = 2  # then the 3 ranks' commit (uneven chunks saved) loaded on 2
HORIZON = 6
OPTIONS = (*drv.RESUME_FP16_OPTIONS, "--horizon", str(HORIZON))  # the last --horizon holds
# The entries the claim calls sharded (a rank's rows): the parameters and AdamW's moments
ROWS = ("model/", "optim/exp_avg/", "optim/exp_avg_sq/")


def _command(directory: Path, world_size: int, steps: int, *extra: str) -> list[str]:
    """The reference's command's stdout lines (exit status 0 asserted), run here."""
    argv = ["train", "--impl", "reference", "--world-size", str(world_size), "--steps",
            str(steps), "--checkpoint-dir", str(directory), "--resume", *OPTIONS, *extra]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(argv)
    assert status == 0
    return out.getvalue().strip().splitlines()


def _digest(lines: list[str]) -> np.ndarray:
    assert lines and lines[-1].startswith("state-sha256: "), lines[-3:]
    return np.frombuffer(bytes.fromhex(lines[-1].removeprefix("state-sha256: ")), np.uint8)


def _held_after_load(directory: Path, world_size: int, step: int,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[str]]:
    """Every rank's state as the command holds it right after resuming `step` at
    `world_size` (a run to `step`: no step taken), read through rank_state; its lines."""
    from reference import fsdp_gpt

    held: dict[int, dict[str, Any]] = {}
    real = fsdp_gpt.rank_state

    def spy(ranks: Any, rank: int, at: int, skipped: int = 0) -> dict[str, Any]:
        state = real(ranks, rank, at, skipped)
        held[rank] = copy.deepcopy(state)
        return state

    with monkeypatch.context() as m:
        m.setattr(fsdp_gpt, "rank_state", spy)
        lines = _command(directory, world_size, step)
    assert lines[0].startswith("state-sha256: "), "guard: no step was taken"
    return [held[r] for r in range(world_size)], lines


def _saved(directory: Path, step: int, world_size: int) -> list[dict[str, Any]]:
    """Every rank's file of the commit of `step`, read back (its digest verified)."""
    from reference import resume

    return [resume.load_checkpoint(ckc.step_dir(directory, step) / f"rank-{r}.ckpt")
            for r in range(world_size)]


def _chunk(full: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """torch.chunk's dim-0 chunk `rank` of `world_size`: ceil(d0 / ws) rows each, the last
    short or empty."""
    c = -(-full.shape[0] // world_size)
    return full[rank * c:(rank + 1) * c]


def _check_held(held: list[dict[str, Any]], saved: list[dict[str, Any]], step: int,
                context: str) -> int:
    """fsdp.gpt_reshard's entries at one load (the module docstring; the streams are each
    tree's, checked apart); returns how many held sharded entries were a short chunk."""
    n = len(held)
    keys = [k for k in saved[0] if not k.startswith("rng/")]
    sharded = [k for k in keys if k.startswith(ROWS)]
    for state in saved[1:]:  # the saved ranks agree on the replicated entries
        assert [k for k in state if not k.startswith("rng/")] == keys
        for k in keys:
            if k not in sharded:
                assert_claim("fsdp.gpt_reshard", actual=np.asarray(state[k]),
                             expected=np.asarray(saved[0][k]), context=f"{context} saved {k}")
    assert int(np.asarray(saved[0]["step"])) == step
    assert float(np.asarray(saved[0]["optim/step/0"])) > 0, "guard: AdamW had stepped"
    full = {k: np.concatenate([np.asarray(s[k]) for s in saved]) for k in sharded}
    short = 0
    for rank, state in enumerate(held):
        assert sorted(state) == sorted([*keys, f"rng/rank{rank}"]), context
        for k in keys:
            expected = _chunk(full[k], rank, n) if k in sharded else np.asarray(saved[0][k])
            assert_claim("fsdp.gpt_reshard", actual=np.asarray(state[k]), expected=expected,
                         context=f"{context} rank {rank} {k}")
            short += k in sharded and 0 < len(expected) < -(-len(full[k]) // n)
    return short


def _check_streams(held: list[dict[str, Any]], saved: list[dict[str, Any]], step: int,
                   context: str) -> None:
    """The reference's streams at one load: the rule's PCG64, none of the saved ones."""
    for rank, state in enumerate(held):
        rule = np.random.default_rng(ckc.rank_seed(SEED, rank, step)).bit_generator.state
        assert state[f"rng/rank{rank}"] == rule, f"{context} rank {rank}: not the rule's stream"
        assert all(state[f"rng/rank{rank}"] != s[f"rng/rank{r}"] for r, s in enumerate(saved))


def _check_load(directory: Path, world_size: int, step: int, saved_by: int, lines: list[str],
                monkeypatch: pytest.MonkeyPatch) -> int:
    """The reference's load of the commit of `step` (written by `saved_by` ranks, whose
    command printed `lines`) at `world_size`: entries, streams, the joined state's digest."""
    held, loaded = _held_after_load(directory, world_size, step, monkeypatch)
    saved = _saved(directory, step, saved_by)
    context = f"{saved_by} -> {world_size} ranks"
    short = _check_held(held, saved, step, context)
    _check_streams(held, saved, step, context)
    assert_claim("fsdp.gpt_reshard", actual=_digest(loaded), expected=_digest(lines),
                 context=f"{context}, the joined state's digest")
    return short


def test_the_reference_fsdp_gpt_resharded_two_one_three_holds_the_saved_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsdp.gpt_reshard, the reference's simulated ranks: 2 ranks to the commit at 2; on 1
    rank every rank's chunk of the saved full state, the replicated entries, the rule's
    stream and the saving run's digest, then on to the commit at 4; on 3 ranks the same,
    with uneven chunks; then at 3 ranks, stopped at 5 and resumed to 6, the digest of 4 to 6
    in one run; last, that 3-rank commit (its saved chunks uneven) loaded on 2 ranks."""
    run = tmp_path / "run"
    (n0, s0), (n1, s1), (n2, s2) = LEGS
    first = _command(run, n0, s0)
    _check_load(run, n1, s0, n0, first, monkeypatch)
    second = _command(run, n1, s1)
    assert second[0].startswith(f"step {s0 + 1} "), "guard: it resumed, not started afresh"
    assert _check_load(run, n2, s1, n1, second, monkeypatch) > 0, \
        "guard: an uneven chunk was loaded"
    split = tmp_path / "split"
    shutil.copytree(run, split)
    whole = _command(run, n2, s2, "--checkpoint-every", "1")
    _command(split, n2, s1 + 1, "--checkpoint-every", "1")
    rest = _command(split, n2, s2, "--checkpoint-every", "1")
    assert rest[0].startswith(f"step {s1 + 2} "), "guard: it resumed at the same N"
    assert any(" skipped 0 " in line for line in rest[:-1]), "guard: an applied update"
    assert_claim("fsdp.gpt_reshard", actual=_digest(rest), expected=_digest(whole),
                 context=f"{n2} ranks, stopped at {s1 + 1}")
    _check_load(run, BACK, s2, n2, whole, monkeypatch)  # the saved chunks uneven


# ------------------------------------------------------------------------- torch

def run(job: dict[str, Any], rank: int, group: Any) -> dict[str, Any]:
    """A torch rank's job of these tests: the command's (torch_impl/fsdp_gpt.py's run), then
    the rank's rows of its final state (at a resume to its commit: what it loaded) and the
    state of torch's default generator, the rank's dropout stream."""
    import torch

    from torch_impl import fsdp_gpt, fsdp_gpt_ckpt

    held: dict[str, Any] = {}
    real = fsdp_gpt.digest_state

    def spy(rep: Any, generator: Any, step: int, rank: int) -> dict[str, Any]:
        for k, v in fsdp_gpt_ckpt.rank_state(rep, generator, step, rank).items():
            held[k] = (v.to_local() if hasattr(v, "to_local") else v).detach().clone()
        return real(rep, generator, step, rank)

    fsdp_gpt.digest_state = spy  # this rank's process only, for this job
    try:
        out = fsdp_gpt.run(job, rank, group)
    finally:
        fsdp_gpt.digest_state = real
    held["skipped"] = torch.tensor(out["skipped"])  # the run's count (the digest's has none)
    return {**out, "held": held, "generator": torch.default_generator.get_state()}


def _job(tmp_path: Path, directory: Path, world_size: int, steps: int, every: int,
         resume: int | None) -> dict[str, Any]:
    from torch_impl.fsdp_gpt import train_job

    directory.mkdir(exist_ok=True)
    config = replace(drv.RESUME_FP16, horizon=HORIZON)
    return {**train_job(config, steps, world_size, directory, every, keep=10, resume=resume,
                        log=tmp_path / "rank0.log"), "runner": __name__}


def _check_torch_load(saved: list[dict[str, Any]], loaded: list[dict[str, Any]], step: int,
                      context: str) -> int:
    """fsdp.gpt_reshard at one torch load: `saved`, the saving ranks' results at their
    commit; `loaded`, the resumed ranks' (no step taken). Returns _check_held's count."""
    import torch

    for out in loaded:
        assert out["step"] == step
        assert_claim("fsdp.gpt_reshard", actual=_hex(out["digest"]),
                     expected=_hex(saved[0]["digest"]), context=f"{context} digest")
    for rank, out in enumerate(loaded):
        rule = torch.Generator().manual_seed(ckc.rank_seed(SEED, rank, step)).get_state()
        assert_claim("fsdp.gpt_reshard", actual=as_numpy(out["generator"]),
                     expected=as_numpy(rule), context=f"{context} rank {rank}'s stream")
        assert not any(torch.equal(out["generator"], s["generator"]) for s in saved)
    return _check_held([{k: as_numpy(v) for k, v in out["held"].items()} for out in loaded],
                       [{k: as_numpy(v) for k, v in out["held"].items()} for out in saved],
                       step, context)


def test_the_torch_fsdp_gpt_resharded_two_to_three_holds_the_saved_state(
        tmp_path: Path) -> None:
    """fsdp.gpt_reshard, torch's gloo ranks (the command's job): 2 ranks to the commit at 2,
    resumed on 3 asking for no step: every rank holds its chunk of the 2 ranks' rows (DCP's
    planner across uneven DTensor shards), the replicated entries and the rule's stream,
    and prints the saving run's digest. Measured: 4.3 to 7.1 s (two launches, about 2.5 s
    each to start the ranks; torch 2.13 CPU, 2 busy cores): the one torch run in the
    default suite that sees DCP's reshard of uneven DTensor shards."""
    import ranks

    directory = tmp_path / "run"
    saved = ranks.launch([_job(tmp_path, directory, 2, 2, 2, None)], 2, timeout=300)
    loaded = ranks.launch([_job(tmp_path, directory, 3, 2, 2, 2)], 3, timeout=300)
    assert _check_torch_load([r[0] for r in saved], [r[0] for r in loaded], 2,
                             "torch, 2 -> 3 ranks") > 0, "guard: an uneven chunk was loaded"


# ------------------------------------------------------------------------- slow

@pytest.mark.slow
def test_the_torch_fsdp_gpt_resharded_two_one_three_holds_the_saved_state(
        tmp_path: Path) -> None:
    """fsdp.gpt_reshard, torch's gloo ranks: 2 -> 1 -> 3 as the reference's test, each load
    checked as the default torch test checks 2 -> 3; at 3 ranks, stopped at 5 and resumed,
    the digest of 4 to 6 in one run; that 3-rank commit loaded on 2. Measured: 10.8 to
    11.6 s (four launches; torch 2.13 CPU, 2 busy cores)."""
    import ranks

    run_dir, split = tmp_path / "run", tmp_path / "split"
    (n0, s0), (n1, s1), (n2, s2) = LEGS
    saved = ranks.launch([_job(tmp_path, run_dir, n0, s0, 2, None)], n0, timeout=300)
    one = ranks.launch([_job(tmp_path, run_dir, n1, s0, 2, s0),
                        _job(tmp_path, run_dir, n1, s1, 2, s0)], n1, timeout=300)
    shutil.copytree(run_dir, split)
    three = ranks.launch([_job(tmp_path, run_dir, n2, s1, 1, s1),
                          _job(tmp_path, run_dir, n2, s2, 1, s1),
                          _job(tmp_path, split, n2, s1 + 1, 1, s1),
                          _job(tmp_path, split, n2, s2, 1, s1 + 1)], n2, timeout=300)
    _check_torch_load([r[0] for r in saved], [r[0] for r in one], s0, f"torch, {n0} -> {n1}")
    assert _check_torch_load([r[1] for r in one], [r[0] for r in three], s1,
                             f"torch, {n1} -> {n2}") > 0, "guard: an uneven chunk was loaded"
    whole, rest = three[0][1], three[0][3]
    assert whole["step"] == rest["step"] == s2 and three[0][2]["step"] == s1 + 1
    assert rest["skipped"] == three[0][2]["skipped"], "guard: step 6 applied its update"
    assert whole["digest"] != three[0][0]["digest"], "guard: steps were taken after the load"
    for rank in range(n2):
        assert_claim("fsdp.gpt_reshard", actual=_hex(three[rank][3]["digest"]),
                     expected=_hex(whole["digest"]),
                     context=f"torch, {n2} ranks, stopped at {s1 + 1}, rank {rank}")
    back = ranks.launch([_job(tmp_path, run_dir, BACK, s2, 1, s2)], BACK, timeout=300)
    _check_torch_load([r[1] for r in three], [r[0] for r in back], s2,
                      f"torch, {n2} -> {BACK} (uneven chunks saved)")


def _hex(digest: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(digest), np.uint8)
