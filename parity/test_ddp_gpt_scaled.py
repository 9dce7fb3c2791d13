"""The scaled precisions and bf16-sr on N ranks under DDP: the command's own loop replayed
by the reference's simulated ranks (ddp.gpt_scaled), each rank scaling from its own shard
(ddp.gpt_scaled_local), and the run stopped and resumed to the uninterrupted digest with its
random bits (ddp.gpt_resume). NOTE [ Delayed scaling on N ranks ] in reference/ddp_gpt.py,
NOTE [ Random bits on N ranks ] in common/ddp_bits.py; driver: parity/drivers/ddp_gpt.py.

The default run makes ONE launch of 2 gloo processes: the command's recorded job at
fp8-delayed, fp8-rowwise and bf16-sr (2 steps each: DDP's bucket in parameter order, then
in ready order; fp8-delayed's second step casts with the reduced amaxes' scales), then the
command's job at nvfp4 three times in a row (uninterrupted to step 4, recorded; stopped at
2; resumed to 4); the reference's command runs here in this process (resumed at bf16-sr,
resharded at nvfp4 and bf16-sr). Measured: 6.4 to 8 s in all, 4.7 to 6 s of it the launch
(torch 2.13 CPU, 2 cores busy with other work). The other precisions, 3 ranks, torch's
resume at bf16-sr and the reference's at every other precision are slow.
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import numpy as np
import pytest

from ckpt import commit as ckc
from common.ddp_bits import bits_key, rank_bits, shared
from common.fp8_train import GPT_PRECISIONS, RECIPES
from parity.compare import as_numpy, assert_claim
from parity.drivers import ddp_gpt as drv
from parity.drivers import ddp_train as kills
from parity.lab.cli import main

pytest.importorskip("torch.distributed.checkpoint")

RECORDED = ("fp8-delayed", "fp8-rowwise", "bf16-sr")  # recorded 2 steps, without a resume
RESUMED = ("nvfp4",)  # torch's resume, recorded: a scaled precision with per-rank bits
REFERENCE_RESUMED = ("bf16-sr",)  # the reference's resume: bf16-sr's shared bits
DEFAULT = (*RECORDED, *RESUMED)
LOCAL = ("fp8-rowwise", "nvfp4")  # ddp.gpt_scaled_local's default precisions
SEED = 0  # the command's default --seed
Launch = tuple[list[dict], list[list[dict]]]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Launch, Path]:
    """The default launch (2 ranks): ((jobs, results[rank][job]), its folder)."""
    import ranks

    tmp = tmp_path_factory.mktemp("ddp_gpt_scaled")
    jobs = drv.scaled_jobs(tmp / "recorded", 2, RECORDED, steps=2)
    for p in RESUMED:  # the uninterrupted run recorded too
        jobs += drv.resume_jobs(tmp / p, 2, steps=4, stop=2, run=drv.resume_config(p),
                                record=True)
    jobs.append({"kind": "amax-nan", "runner": __name__, "world_size": 2})  # run, below
    return (jobs, ranks.launch(jobs, 2, timeout=300)), tmp


# Each rank's amax vector for the NaN job: a NaN on one rank at places a ring puts in other
# chunks (0, 2, 5, 7, 10), on both (3), an inf, zeros; length 12 over 2 ranks
NAN = float("nan")
AMAX_NAN = ([NAN, 1.0, 2.0, NAN, 0.0, NAN, 4.0, 1.5, 0.0, 3.0, 2.5, 7.0],
            [1.0, 3.0, NAN, NAN, 0.0, 2.0, float("inf"), NAN, 0.0, 1.0, NAN, 6.0])


def run(job: dict, rank: int, group: object) -> dict:
    """A rank of the amax-nan job: torch_impl.ddp_gpt.reduce_amax of its AMAX_NAN row."""
    import torch

    from torch_impl.ddp_gpt import reduce_amax

    assert job["kind"] == "amax-nan"
    return {"reduced": reduce_amax(torch.tensor(AMAX_NAN[rank]), group)}


def _index(jobs: list[dict], precision: str) -> int:
    return next(i for i, j in enumerate(jobs)
                if j.get("record") and j["config"]["precision"] == precision)


def _check_scaled(launch: Launch, precision: str) -> None:
    """ddp.gpt_scaled for the recorded job of `precision`: every step's bucket and reduced
    gradient, every rank's final parameters, optimizer state, buffers and bits against the
    replay, and the ranks against each other."""
    jobs, results = launch
    index = _index(jobs, precision)
    job, ws = jobs[index], jobs[index]["world_size"]
    rp = drv.replay(job, results, index)
    for k in range(job["steps"]):
        for rank in range(ws):
            torch_step = results[rank][index]["steps"][k]
            assert_claim("ddp.gpt_scaled", actual=np.concatenate(rp.buckets[k]),
                         expected=np.concatenate(torch_step["buckets"]),
                         context=f"{precision} step {k + 1} buckets")
            for i, (a, b) in enumerate(zip(rp.reduced[k], torch_step["reduced"], strict=True)):
                assert_claim("ddp.gpt_scaled", actual=a, expected=b,
                             context=f"{precision} ws {ws} step {k + 1} rank {rank} param {i}")
            assert_claim("ddp.gpt_scaled", actual=np.float64(rp.lrs[k]),
                         expected=np.float64(torch_step["lr"]), context=f"lr step {k + 1}")
    for rank in range(ws):
        torch_rank = results[rank][index]
        for i, (a, b) in enumerate(zip(rp.final[rank], torch_rank["final"], strict=True)):
            assert_claim("ddp.gpt_scaled", actual=a, expected=b,
                         context=f"{precision} ws {ws} rank {rank} param {i}")
        for key, value in rp.optimizer[rank].items():
            assert_claim("ddp.gpt_scaled", actual=np.asarray(value),
                         expected=torch_rank["optimizer"][key],
                         context=f"{precision} ws {ws} rank {rank} {key}")
        state = torch_rank["state"]
        for name, value in rp.buffers[rank].items():
            assert_claim("ddp.gpt_scaled", actual=value, expected=state[f"model/{name}"],
                         context=f"{precision} ws {ws} rank {rank} {name}")
        if rp.bits[rank] is not None:
            key = next(k for k in state if k.startswith("bits"))
            assert_claim("ddp.gpt_scaled", actual=_bits(rp.bits[rank]),
                         expected=as_numpy(state[key]).astype(np.uint64),
                         context=f"{precision} rank {rank} {key}")
    _check_replicas(results, index, precision)


def _bits(state: dict) -> np.ndarray:
    """A BitStream state as torch_impl.ddp_gpt.bits_tensor lays it out, as integers."""
    from torch_impl.ddp_gpt import bits_tensor

    return as_numpy(bits_tensor(state)).astype(np.uint64)


def _check_replicas(results: list[list[dict]], index: int, precision: str) -> None:
    """Every rank's final state holds rank 0's bits in every replicated entry; the bits'
    states agree across ranks for bf16-sr (shared) and differ for nvfp4 (per rank)."""
    states = [results[rank][index]["state"] for rank in range(len(results))]
    for rank, state in enumerate(states[1:], start=1):
        for key, value in states[0].items():
            if key.startswith(("model/", "optim/", "sched/", "scaler/", "data/", "bits")) \
                    and not key.startswith("bits/"):
                assert_claim("ddp.gpt_scaled", actual=as_numpy(state[key]),
                             expected=as_numpy(value), context=f"{precision} rank {rank} {key}")
    streams = [as_numpy(s[k]) for s in states for k in s if k.startswith("bits/")]
    if precision == "nvfp4":  # guard: one stream a rank, and they differ
        assert len(streams) == len(states) and not np.array_equal(streams[0], streams[1])


@pytest.mark.parametrize("precision", DEFAULT)
def test_the_scaled_ddp_run_matches_the_simulated_ranks_bitwise(
        launched: tuple[Launch, Path], precision: str) -> None:
    """Two gloo ranks run the command's loop 2 steps at `precision`; the reference's ranks,
    replaying each torch rank's local gradient (and amax vector), reduce to the same bits
    and end with the same parameters, optimizer state, scaling buffers and bits."""
    launch = launched[0]
    _check_scaled(launch, precision)
    if RECIPES.get(precision) is not None and RECIPES[precision].delayed:
        jobs, results = launch  # guard: the ranks' amaxes differed, so the MAX decided
        index = _index(jobs, precision)
        local = [as_numpy(results[r][index]["steps"][-1]["amax"]) for r in range(2)]
        assert not np.array_equal(local[0], local[1])


def test_an_amax_nan_on_any_rank_survives_the_reduction(
        launched: tuple[Launch, Path]) -> None:
    """ddp.gpt_scaled's amaxes where a rank's is NaN: the engine's reduction (gloo's MAX keeps
    or loses a NaN by its place in the ring) against the reference's, NaN-propagating, on
    every rank, bit for bit (NOTE [ Delayed scaling on N ranks ])."""
    from reference.ddp_gpt import reduce_amax

    jobs, results = launched[0]
    index = next(i for i, j in enumerate(jobs) if j["kind"] == "amax-nan")
    expected = reduce_amax([np.array(v, np.float32) for v in AMAX_NAN])
    assert int(np.isnan(expected).sum()) == 6  # guard: each rank's NaNs and the shared one
    for rank in range(2):
        assert_claim("ddp.gpt_scaled", actual=as_numpy(results[rank][index]["reduced"]),
                     expected=expected, context=f"amax NaN, rank {rank}")


@pytest.mark.parametrize("precision", LOCAL)
def test_each_rank_scales_its_gradient_from_its_own_shard(
        launched: tuple[Launch, Path], precision: str) -> None:
    """ddp.gpt_scaled_local: each rank's first local gradient is one process's backward on
    that rank's rows with that rank's bits, bit for bit."""
    jobs, results = launched[0]
    index = _index(jobs, precision)
    for rank in range(jobs[index]["world_size"]):
        oracle = drv.one_rank_grads(jobs[index], results, index, rank)
        local = results[rank][index]["steps"][0]["local"]
        for i, (a, b) in enumerate(zip(oracle, local, strict=True)):
            assert_claim("ddp.gpt_scaled_local", actual=as_numpy(a), expected=b,
                         context=f"{precision} rank {rank} param {i}")
    first = [results[r][index]["steps"][0]["local"] for r in range(2)]
    assert not all(np.array_equal(as_numpy(a), as_numpy(b))  # guard: the shards differ
                   for a, b in zip(*first, strict=True))


def _hex(digest: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(digest), np.uint8)


@pytest.mark.parametrize("precision", RESUMED)
def test_the_scaled_run_stopped_and_resumed_ends_with_the_uninterrupted_digest(
        launched: tuple[Launch, Path], precision: str) -> None:
    """ddp.gpt_resume, torch, 2 ranks, at nvfp4: stopped at the step-2 commit and resumed,
    the run ends with the digest of the one never stopped."""
    jobs, results = launched[0]
    first = _index(jobs, precision)  # the uninterrupted run, then the stopped and resumed
    uninterrupted, stopped, resumed = (results[0][first + j] for j in range(3))
    assert stopped["step"] == 2 and resumed["step"] == uninterrupted["step"] == 4
    assert stopped["digest"] != uninterrupted["digest"], "guard: the stop was before the end"
    assert_claim("ddp.gpt_resume", actual=_hex(resumed["digest"]),
                 expected=_hex(uninterrupted["digest"]), context=f"torch, {precision}")


def _command(directory: Path, steps: int, *extra: str, impl: str = "reference",
             world_size: int = 2) -> list[str]:
    """The command's stdout lines, run here (exit status 0 asserted)."""
    out = io.StringIO()
    argv = kills.argv(impl, directory, world_size, steps, drv.GPT_OPTIONS)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main([*argv, *extra])
    assert status == 0
    return out.getvalue().strip().splitlines()


def _reference_resume(tmp_path: Path, precision: str, world_size: int = 2,
                      impl: str = "reference") -> None:
    options = ("--precision", precision, "--horizon", "4")
    expected = _command(tmp_path / "uninterrupted", 4, *options, impl=impl,
                        world_size=world_size)
    stopped = _command(tmp_path / "stopped", 2, *options, impl=impl, world_size=world_size)
    lines = _command(tmp_path / "stopped", 4, *options, impl=impl, world_size=world_size)
    assert lines[0].startswith("step 3 "), "guard: it resumed, not started afresh"
    assert kills.digest(stopped) != kills.digest(expected), "guard: stopped before the end"
    assert_claim("ddp.gpt_resume", actual=_hex(kills.digest(lines)),
                 expected=_hex(kills.digest(expected)),
                 context=f"{impl}, {world_size} ranks, {precision}")


@pytest.mark.parametrize("precision", REFERENCE_RESUMED)
def test_the_reference_scaled_run_stopped_and_resumed_ends_with_the_uninterrupted_digest(
        tmp_path: Path, precision: str) -> None:
    """ddp.gpt_resume, the reference's 2 simulated ranks, at bf16-sr."""
    _reference_resume(tmp_path, precision)


@pytest.mark.parametrize("precision", ("nvfp4", "bf16-sr"))
def test_a_resharded_scaled_run_keeps_the_shared_bits_and_rederives_each_ranks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    """ddp.gpt_reshard's rule for the bits, the reference's ranks: committed by 2 ranks at
    step 1 and resumed on 3 (no step taken), bf16-sr's every rank holds the saved shared
    stream, nvfp4's rank r the stream BitStream(rank_seed(seed, r, 1))."""
    from reference import ddp_train, resume

    run, options = tmp_path / "run", ("--precision", precision, "--horizon", "4")
    _command(run, 1, *options)
    saved = resume.load_checkpoint(ckc.step_dir(run, 1) / "rank-0.ckpt")
    held: dict[int, dict] = {}
    real = ddp_train.rank_state

    def spy(r: object, sampler: object, at: int, skipped: int, rank: int) -> dict:
        state = real(r, sampler, at, skipped, rank)
        held[rank] = copy.deepcopy(state)
        return state

    monkeypatch.setattr(ddp_train, "rank_state", spy)
    assert _command(run, 1, *options, world_size=3)[0].startswith("state-sha256: ")
    for rank in range(3):
        key = bits_key(precision, rank)
        rule = saved[key] if shared(precision) else \
            rank_bits(SEED, precision, rank, 1).state()
        assert_claim("ddp.gpt_reshard", actual=_bits(held[rank][key]), expected=_bits(rule),
                     context=f"{precision} 2 -> 3 ranks, rank {rank}")
    if not shared(precision):  # guard: a re-derived stream, not the one rank 0 saved
        assert held[0]["bits/rank0"] != saved["bits/rank0"]


@pytest.mark.parametrize(("options", "named"), [
    (("--model", "mlp", "--precision", "nvfp4"), "--model gpt"),
    (("--model", "gpt", "--parallel", "fsdp", "--precision", "bf16-sr"), "--parallel ddp"),
])
def test_a_scaled_precision_outside_the_ddp_gpt_is_refused_in_one_line(
        tmp_path: Path, options: tuple[str, ...], named: str) -> None:
    """Exit 2, one line on stderr saying what takes the precision, nothing created."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = main(["train", "--impl", "torch", "--steps", "2", "--checkpoint-dir",
                       str(tmp_path / "run"), "--world-size", "2", *options])
    assert status == 2 and named in err.getvalue() and err.getvalue().count("\n") == 1
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------- slow

OTHERS = tuple(p for p in GPT_PRECISIONS if p not in DEFAULT)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_scaled_precision_matches_the_simulated_ranks(tmp_path: Path,
                                                            world_size: int) -> None:
    """ddp.gpt_scaled and ddp.gpt_scaled_local at every scaled precision (the default's too
    at 3 ranks, where the ready order decides the ring's chunks). Measured: 4.9 to 8.4 s at 2
    ranks, 7.5 to 14.1 s at 3 (torch 2.13 CPU, 2 busy cores)."""
    import ranks

    precisions = OTHERS if world_size == 2 else GPT_PRECISIONS
    jobs = drv.scaled_jobs(tmp_path, world_size, precisions)
    launch = (jobs, ranks.launch(jobs, world_size, timeout=600))
    for precision in precisions:
        _check_scaled(launch, precision)
        if precision in RECIPES:
            index = _index(jobs, precision)
            for rank in range(world_size):
                oracle = drv.one_rank_grads(jobs[index], launch[1], index, rank)
                for a, b in zip(oracle, launch[1][rank][index]["steps"][0]["local"],
                                strict=True):
                    assert_claim("ddp.gpt_scaled_local", actual=as_numpy(a), expected=b,
                                 context=f"{precision} ws {world_size} rank {rank}")


@pytest.mark.slow
@pytest.mark.parametrize("precision", GPT_PRECISIONS)
def test_every_scaled_run_resumes_to_the_uninterrupted_digest(tmp_path: Path,
                                                              precision: str) -> None:
    """ddp.gpt_resume at every precision: the reference at 2 ranks, torch at 3.
    Measured: 1.5 to 8 s each (mxfp4 the slowest), about 50 s in all."""
    _reference_resume(tmp_path / "reference", precision)
    _reference_resume(tmp_path / "torch", precision, world_size=3, impl="torch")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ("nvfp4", "bf16-sr"))
def test_a_torch_resharded_scaled_run_keeps_the_shared_bits_and_rederives_each_ranks(
        tmp_path: Path, precision: str) -> None:
    """The same rule on torch's gloo ranks: the command's job committed by 2 ranks at step 2,
    resumed on 3 asking for no step (recorded: the state it holds is what it loaded).
    Measured: 0.5 to 3.3 s each."""
    import ranks
    from torch_impl.ddp_gpt import bits_tensor
    from torch_impl.ddp_train import train_job

    run, c = tmp_path / "run", drv.resume_config(precision)
    run.mkdir()
    saved = ranks.launch([train_job(c, 2, 2, run, 2, keep=2, resume=None,
                                    log=tmp_path / "a.log", record=True)], 2, timeout=300)
    held = ranks.launch([train_job(c, 2, 3, run, 2, keep=2, resume=2,
                                   log=tmp_path / "b.log", record=True)], 3, timeout=300)
    for rank in range(3):
        key = bits_key(precision, rank)
        rule = saved[0][0]["state"][key] if shared(precision) else \
            bits_tensor(rank_bits(c.seed, precision, rank, 2).state())
        assert_claim("ddp.gpt_reshard", actual=as_numpy(held[rank][0]["state"][key]),
                     expected=as_numpy(rule), context=f"torch {precision} rank {rank}")
        assert held[rank][0]["digest"] == saved[0][0]["digest"]
