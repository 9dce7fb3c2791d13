"""The scaled precisions under FSDP2: the torch ranks' steps replayed by the reference's
simulated ranks (fsdp.gpt_scaled), each rank casting the gathered weight and its own shard
(fsdp.gpt_scaled_local), and the run stopped and resumed to the uninterrupted digest, or
resharded, with its buffers and bits (fsdp.gpt_scaled_resume). NOTE [ Scaled GEMMs under
FSDP2 ] in reference/fsdp_gpt.py; driver: parity/drivers/fsdp_gpt.py.

The default run makes ONE launch of 2 gloo processes: the recorded job at DEFAULT (2 steps
each), then the command's job at each of RESUMED three times in a row (uninterrupted to
step 4, stopped at 2, resumed to 4); the reference's command runs here in this process.
Every other precision, 3 ranks and torch's reshard are slow.
"""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import numpy as np
import pytest

from common.ddp_bits import bits_key, rank_bits
from common.fp8_train import DELAYED_TENSORS, SCALED_PRECISIONS
from parity.compare import as_numpy, assert_claim
from parity.drivers import fsdp_gpt as drv
from parity.drivers.ddp_gpt import one_rank_grads
from parity.lab.cli import main

pytest.importorskip("torch.distributed.checkpoint.state_dict")

DEFAULT = ("fp8-delayed", "nvfp4", "fp8-rowwise")  # recorded, 2 steps
RESUMED = ("nvfp4", "fp8-delayed")  # the reference's command stopped and resumed
TORCH_RESUMED = ("nvfp4",)  # torch's (fp8-delayed's: slow, 1.5 s more launch)
Launch = tuple[list[dict], list[list[dict]]]


def _jobs(directory: Path, world_size: int, recorded: tuple[str, ...],
          resumed: tuple[str, ...]) -> list[dict]:
    jobs = drv.gpt_jobs(world_size, recorded, steps=2)
    for p in resumed:
        jobs += drv.resume_jobs(directory, world_size, config=drv.scaled_config(p))
    return jobs


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Launch, Path]:
    """The default launch (2 ranks): ((jobs, results[rank][job]), the resume jobs' folder).
    Measured: 4.7 s (torch 2.13 CPU, 2 busy cores), about 2.5 s of it starting the
    ranks; with fp8-delayed's torch resume too, 6.2 to 6.5 s."""
    import ranks

    tmp = tmp_path_factory.mktemp("fsdp_gpt_scaled")
    jobs = _jobs(tmp, 2, DEFAULT, TORCH_RESUMED)
    return (jobs, ranks.launch(jobs, 2, timeout=300)), tmp


def _index(jobs: list[dict], precision: str) -> int:
    return next(i for i, j in enumerate(jobs)
                if j["kind"] == "fsdp-gpt" and j["config"]["precision"] == precision)


def _bits(state: dict) -> np.ndarray:
    """A BitStream state as torch_impl.ddp_gpt.bits_tensor lays it out, as integers."""
    from torch_impl.ddp_gpt import bits_tensor

    return as_numpy(bits_tensor(state)).astype(np.uint64)


def _check_scaled(launch: Launch, precision: str) -> None:
    """fsdp.gpt_scaled for the recorded job of `precision` (the claim's statement)."""
    jobs, results = launch
    index = _index(jobs, precision)
    job, ws = jobs[index], jobs[index]["world_size"]
    rp = drv.replay(job, results, index)
    for k in range(job["steps"]):
        for rank in range(ws):
            torch_step = results[rank][index]["steps"][k]
            for i in range(len(torch_step["grads"])):
                where = f"{precision} ws {ws} step {k + 1} rank {rank} param {i}"
                assert_claim("fsdp.gpt_scaled", actual=rp.gathered[k][i],
                             expected=torch_step["gathered"][i], context=where)
                assert_claim("fsdp.gpt_scaled", actual=rp.grads[k][rank][i],
                             expected=torch_step["grads"][i], context=where)
                assert_claim("fsdp.gpt_scaled", actual=rp.params[k][rank][i],
                             expected=torch_step["params"][i], context=where)
            assert_claim("fsdp.gpt_scaled", actual=np.float64(rp.lrs[k]),
                         expected=np.float64(torch_step["lr"]), context=f"lr step {k + 1}")
    for rank in range(ws):
        torch_rank, where = results[rank][index], f"{precision} ws {ws} rank {rank}"
        for key, value in torch_rank["state"].items():
            if key.startswith("bits"):  # as integers, on both sides
                actual, value = _bits(rp.bits[rank]), as_numpy(value).astype(np.uint64)
            else:
                actual = np.asarray(rp.optimizer[rank][key])
            assert_claim("fsdp.gpt_scaled", actual=actual, expected=as_numpy(value),
                         context=f"{where} {key}")
        buffers = torch_rank["steps"][-1]["buffers"]
        assert set(buffers) == set(rp.buffers[rank])
        for name, value in buffers.items():  # the same on every rank: rank 0's too
            assert_claim("fsdp.gpt_scaled", actual=rp.buffers[rank][name],
                         expected=as_numpy(value), context=f"{where} {name}")
            assert_claim("fsdp.gpt_scaled", actual=as_numpy(value),
                         expected=results[0][index]["steps"][-1]["buffers"][name],
                         context=f"{where} {name} against rank 0")
    if precision == "nvfp4":  # guard: one stream a rank, and they differ
        streams = [results[r][index]["state"][bits_key(precision, r)] for r in range(ws)]
        assert not np.array_equal(as_numpy(streams[0]), as_numpy(streams[1]))
    if precision == "fp8-delayed":  # guard: the ranks' amaxes differ, the scales moved
        amax = [as_numpy(results[r][index]["steps"][0]["amax"]) for r in range(ws)]
        assert not np.array_equal(amax[0], amax[1])
        assert any(not np.all(b == 1) for n, b in rp.buffers[0].items() if "scale" in n)


@pytest.mark.parametrize("precision", DEFAULT)
def test_the_scaled_fsdp_step_matches_the_simulated_ranks_bitwise(
        launched: tuple[Launch, Path], precision: str) -> None:
    """fsdp.gpt_scaled: two gloo ranks take 2 FSDP2 steps of the GPT at a scaled
    precision; the reference's ranks, replaying each torch rank's local gradient (and amax
    vector), gather the same float32 parameters, reduce-scatter to the same gradient shards,
    end every step with the same rows and finish with the same AdamW state, delayed
    buffers and bits, bit for bit."""
    _check_scaled(launched[0], precision)


def _check_local(launch: Launch, precision: str) -> None:
    """fsdp.gpt_scaled_local for the recorded job of `precision` (the claim's statement)."""
    from reference import ddp_gpt as rgpt
    from reference.fsdp import chunk_rows
    from reference.train_models import build

    jobs, results = launch
    index = _index(jobs, precision)
    job, ws = jobs[index], jobs[index]["world_size"]
    for rank in range(ws):
        oracle = one_rank_grads(job, results, index, rank)
        local = results[rank][index]["steps"][0]["local"]
        for i, (a, b) in enumerate(zip(oracle, local, strict=True)):
            assert_claim("fsdp.gpt_scaled_local", actual=as_numpy(a), expected=b,
                         context=f"{precision} ws {ws} rank {rank} param {i}")
    first = [results[r][index]["steps"][0]["local"] for r in range(ws)]
    assert not all(np.array_equal(as_numpy(a), as_numpy(b))  # guard: the shards differ
                   for a, b in zip(first[0], first[1], strict=True))
    if precision != "fp8-delayed":
        return
    c = drv.config(precision, job["steps"])
    model = build(c, np.random.default_rng(c.seed)).model
    where = {id(p): i for i, p in enumerate(model.parameters())}
    weights = [where[id(layer.weight)] for layer in rgpt.defer_scale_updates(model)]
    slot = DELAYED_TENSORS.index("weight")
    for k in range(job["steps"]):
        for rank in range(ws):
            step = results[rank][index]["steps"][k]
            amax = as_numpy(step["amax"]).reshape(len(weights), len(DELAYED_TENSORS))
            for layer, i in enumerate(weights):
                full = as_numpy(step["gathered"][i])  # (out, in): the gathered weight
                assert_claim("fsdp.gpt_scaled_local", actual=np.abs(full).max(),
                             expected=amax[layer, slot],
                             context=f"step {k + 1} rank {rank} layer {layer} weight amax")
    full = np.abs(as_numpy(results[0][index]["steps"][0]["gathered"][weights[0]]))
    shards = [full[lo:hi].max() for lo, hi in chunk_rows(full.shape[0], ws)]
    assert min(shards) < full.max(), "guard: some rank's shard misses its weight's max"


@pytest.mark.parametrize("precision", DEFAULT)
def test_each_fsdp_rank_casts_the_gathered_weight_and_its_own_shard(
        launched: tuple[Launch, Path], precision: str) -> None:
    """fsdp.gpt_scaled_local: each rank's first local gradient is one process's backward on
    that rank's rows with its bits; fp8-delayed's weight amax is the gathered weight's."""
    _check_local(launched[0], precision)


def _hex(digest: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(digest), np.uint8)


@pytest.mark.parametrize("precision", TORCH_RESUMED)
def test_the_scaled_fsdp_run_stopped_and_resumed_ends_with_the_uninterrupted_digest(
        launched: tuple[Launch, Path], precision: str) -> None:
    """fsdp.gpt_scaled_resume, torch, 2 ranks: the command's job stopped at its step-2
    commit (DCP: nvfp4's bits per rank) and resumed to step 4 ends with the digest and the
    log of the run that never stopped."""
    _check_resume(*launched, precision)


def _check_resume(launch: Launch, folder: Path, precision: str) -> None:
    jobs, results = launch
    first = next(i for i, j in enumerate(jobs) if j["kind"] == "fsdp-gpt-train"
                 and j["config"]["precision"] == precision)
    uninterrupted, stopped, resumed = (results[0][first + j] for j in range(3))
    assert results[1][first + 2]["digest"] == resumed["digest"]
    assert stopped["step"] == 2 and resumed["step"] == uninterrupted["step"] == 4
    assert stopped["digest"] != uninterrupted["digest"], "guard: the stop was before the end"
    logs = [(folder / precision / f"{n}.log").read_text().splitlines()
            for n in ("uninterrupted", "stopped")]
    assert logs[0] == logs[1], "the resumed run logged otherwise"
    assert_claim("fsdp.gpt_scaled_resume", actual=_hex(resumed["digest"]),
                 expected=_hex(uninterrupted["digest"]), context=f"torch, {precision}")


def _command(directory: Path, steps: int, precision: str, world_size: int = 2,
             impl: str = "reference") -> list[str]:
    """The command's stdout lines, run here (exit status 0 asserted)."""
    out = io.StringIO()
    argv = ["train", "--impl", impl, "--world-size", str(world_size), "--steps", str(steps),
            "--checkpoint-dir", str(directory), "--model", "gpt", "--parallel", "fsdp",
            "--precision", precision, "--horizon", "4", "--checkpoint-every", "2"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main([*argv, *(["--resume"] if directory.exists() else [])])
    assert status == 0
    return out.getvalue().strip().splitlines()


def _reference_resume(tmp_path: Path, precision: str, world_size: int = 2,
                      impl: str = "reference") -> None:
    expected = _command(tmp_path / "uninterrupted", 4, precision, world_size, impl)
    stopped = _command(tmp_path / "stopped", 2, precision, world_size, impl)
    lines = _command(tmp_path / "stopped", 4, precision, world_size, impl)
    assert lines[0].startswith("step 3 "), "guard: it resumed, not started afresh"
    assert stopped[-1] != expected[-1], "guard: stopped before the end"
    assert lines == expected[2:], "the resumed run logged otherwise"
    assert_claim("fsdp.gpt_scaled_resume", actual=_hex(lines[-1].split()[-1]),
                 expected=_hex(expected[-1].split()[-1]),
                 context=f"{impl}, {world_size} ranks, {precision}")


@pytest.mark.parametrize("precision", RESUMED)
def test_the_reference_scaled_fsdp_run_resumes_to_the_uninterrupted_digest(
        tmp_path: Path, precision: str) -> None:
    """fsdp.gpt_scaled_resume, the reference's 2 simulated ranks."""
    _reference_resume(tmp_path, precision)


@pytest.mark.parametrize("precision", RESUMED)
def test_a_resharded_scaled_fsdp_run_keeps_the_buffers_and_rederives_the_bits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    """fsdp.gpt_scaled_resume's reshard, the reference's ranks: committed by 2 ranks at step
    2 and resumed on 3 (no step taken), every rank holds the saved buffers and nvfp4's rank
    r the stream BitStream(rank_seed(seed, r, 2))."""
    from ckpt import commit as ckc
    from reference import fsdp_gpt, fsdp_gpt_ckpt, resume
    from reference.fsdp_gpt_ckpt import BUFFERS

    run = tmp_path / "run"
    _command(run, 2, precision)
    saved = resume.load_checkpoint(ckc.step_dir(run, 2) / "rank-0.ckpt")
    held: dict[int, dict] = {}
    real = fsdp_gpt_ckpt.rank_state

    def spy(ranks: object, rank: int, step: int, skipped: int = 0) -> dict:
        state = real(ranks, rank, step, skipped)
        held[rank] = copy.deepcopy(state)
        return state

    monkeypatch.setattr(fsdp_gpt, "rank_state", spy)
    assert _command(run, 2, precision, world_size=3)[-1].startswith("state-sha256: ")
    buffers = [k for k in saved if k.rsplit(".", 1)[-1] in BUFFERS]
    assert bool(buffers) == (precision == "fp8-delayed")
    for rank in range(3):
        for key in buffers:
            assert_claim("fsdp.gpt_scaled_resume", actual=np.asarray(held[rank][key]),
                         expected=np.asarray(saved[key]), context=f"rank {rank} {key}")
        if precision == "nvfp4":
            rule = rank_bits(0, precision, rank, 2).state()
            assert_claim("fsdp.gpt_scaled_resume", actual=_bits(held[rank][f"bits/rank{rank}"]),
                         expected=_bits(rule), context=f"2 -> 3 ranks, rank {rank}")
    if precision == "nvfp4":  # guard: a re-derived stream, not the one rank 0 saved
        assert held[0]["bits/rank0"] != saved["bits/rank0"]


def test_bf16_sr_under_fsdp_is_refused_in_one_line(tmp_path: Path) -> None:
    """Exit 2, one line on stderr naming --parallel ddp, nothing created."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = main(["train", "--impl", "torch", "--steps", "2", "--checkpoint-dir",
                       str(tmp_path / "run"), "--world-size", "2", "--model", "gpt",
                       "--parallel", "fsdp", "--precision", "bf16-sr"])
    assert status == 2 and "--parallel ddp" in err.getvalue()
    assert err.getvalue().count("\n") == 1 and not (tmp_path / "run").exists()


# ------------------------------------------------------------------------- slow

OTHERS = tuple(p for p in SCALED_PRECISIONS if p not in DEFAULT)
SLOW_RESUMED = tuple(p for p in SCALED_PRECISIONS if p not in TORCH_RESUMED)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_scaled_precision_under_fsdp_matches_the_simulated_ranks(
        tmp_path: Path, world_size: int) -> None:
    """fsdp.gpt_scaled and fsdp.gpt_scaled_local at every scaled precision (the default's
    too at 3 ranks, where wpe's 16 rows split 6, 6, 4). Measured: 4.7 s at 2 ranks, 5.6 s at 3
    (torch 2.13 CPU, 2 busy cores)."""
    import ranks

    precisions = OTHERS if world_size == 2 else SCALED_PRECISIONS
    jobs = drv.gpt_jobs(world_size, precisions, steps=2)
    launch = (jobs, ranks.launch(jobs, world_size, timeout=600))
    for precision in precisions:
        _check_scaled(launch, precision)
        _check_local(launch, precision)


@pytest.mark.slow
@pytest.mark.parametrize("precision", SLOW_RESUMED)
def test_every_scaled_fsdp_run_resumes_to_the_uninterrupted_digest(
        tmp_path: Path, precision: str) -> None:
    """fsdp.gpt_scaled_resume at every precision the default leaves out: torch's gloo ranks
    (one launch of the three runs), the reference's where the default does not run it.
    Measured: 2.0 to 3.7 s each (the blockwise fp8 and mxfp4 the
    slowest), about 24 s in all."""
    import ranks

    jobs = _jobs(tmp_path, 2, (), (precision,))
    _check_resume((jobs, ranks.launch(jobs, 2, timeout=600)), tmp_path, precision)
    if precision not in RESUMED:
        _reference_resume(tmp_path / "reference", precision)


@pytest.mark.slow
@pytest.mark.parametrize("precision", RESUMED)
def test_a_torch_resharded_scaled_fsdp_run_keeps_the_buffers_and_rederives_the_bits(
        tmp_path: Path, precision: str) -> None:
    """The reshard on torch's gloo ranks: the command's job committed by 2 ranks at step 2,
    resumed on 3 asking for no step: the digest of the saved state (every row and the
    buffers, DCP's replicated entries read at 3 ranks), nvfp4's rank r stream re-derived.
    Measured: 2.3 s each."""
    import ranks
    from torch_impl.ddp_gpt import bits_tensor
    from torch_impl.fsdp_gpt import train_job

    run, c = tmp_path / "run", drv.scaled_config(precision)
    run.mkdir()
    saved = ranks.launch([train_job(c, 2, 2, run, 2, keep=2, resume=None,
                                    log=tmp_path / "a.log")], 2, timeout=300)
    held = ranks.launch([train_job(c, 2, 3, run, 2, keep=2, resume=2,
                                   log=tmp_path / "b.log")], 3, timeout=300)
    for rank in range(3):
        assert_claim("fsdp.gpt_scaled_resume", actual=_hex(held[rank][0]["digest"]),
                     expected=_hex(saved[0][0]["digest"]), context=f"torch rank {rank}")
        if precision == "nvfp4":
            rule = bits_tensor(rank_bits(c.seed, precision, rank, 2).state())
            assert_claim("fsdp.gpt_scaled_resume", actual=as_numpy(held[rank][0]["bits"]),
                         expected=as_numpy(rule), context=f"torch bits rank {rank}")
    if precision == "nvfp4":  # guard: re-derived, not the stream rank 0 saved
        assert not np.array_equal(as_numpy(held[0][0]["bits"]), as_numpy(saved[0][0]["bits"]))
