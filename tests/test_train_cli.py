"""`python -m parity train` through the real command line (parity.lab.cli.main, in process):
every bad input is ONE line on stderr and exit status 2, never a traceback; a refused
resume names what differs; --checkpoint-every 0 still writes the final state."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from ckpt import container, digest
from common.train_loop import BaseRun
from parity.lab.cli import EXIT_USAGE, main


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m parity train ARGV`."""
    try:
        status = main(["train", *argv])
    except SystemExit as e:  # argparse's own errors
        status = int(e.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def _bad_cuda() -> str:
    """A CUDA device this machine does not have."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


# (arguments after --impl IMPL --steps 4 --checkpoint-dir DIR, a phrase the error must hold)
BAD = [
    (["--keep", "0"], "--keep: 0 is below the minimum 1"),
    (["--recompute", "bogus"], "unknown schedule 'bogus'"),
    (["--recompute", "uniform:99"], "uniform:K needs 1 <= K"),
    (["--recompute", "optimal:0"], "optimal:S needs S >= 1"),
    (["--dropout", "1"], "--dropout"),
    (["--dropout", "-0.1"], "--dropout"),
    (["--dropout", "nan"], "--dropout"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**32)], "seed must be an int >= 0 and < 4294967296"),
    (["--init-scale", "0"], "--init-scale"),
    (["--init-scale", "-1"], "--init-scale"),
    (["--init-scale", "nan"], "--init-scale"),
    (["--init-scale", "1e39"], "--init-scale"),  # overflows float32
    (["--init-scale", "inf"], "--init-scale"),
    (["--growth-interval", "0"], "--growth-interval"),
    (["--checkpoint-every", "-1"], "--checkpoint-every"),
    (["--horizon", "2"], "--steps 4 is past --horizon 2"),
    (["--resume", "--overwrite"], "choose one"),
    (["--fault-step", "2"], "--fault-step 2 places a seeded fault: it needs --fault NAME"),
]
BAD_STEPS = [(["--steps", "-1"], "--steps"), (["--steps", "0"], "--steps"),
             (["--loader-workers", "-1"], "--loader-workers")]
BAD_MODEL = [
    (["--model", "rnn"], "argument --model: invalid choice: 'rnn'"),
    (["--recompute", "selective"], "unknown schedule 'selective'"),  # the MLP has no core
    (["--model", "gpt", "--recompute", "uniform:5"], "uniform:K needs 1 <= K <= 4"),
    (["--model", "gpt", "--recompute", "sqrt+uniform:2"], "expected SPEC, 'selective'"),
    (["--model", "gpt", "--recompute", "selective+selective"], "expected SPEC, 'selective'"),
    (["--model", "gpt", "--fault", "poisoned_batch"], "poisoned_batch is written for "
                                                      "--model mlp"),
]


@pytest.mark.parametrize("impl", ["reference", "torch"])
@pytest.mark.parametrize(("extra", "phrase"), BAD + BAD_STEPS + BAD_MODEL, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else None)
def test_bad_input_is_one_line_and_exit_2(impl: str, extra: list[str], phrase: str,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Each bad value: exit 2, one line naming it, no traceback, nothing trained."""
    argv = ["--impl", impl, "--steps", "4", "--checkpoint-dir", str(tmp_path / "d"), *extra]
    status, out, err = _cli(capsys, *argv)
    assert status == EXIT_USAGE, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert phrase in err, err
    assert "step 1 " not in out


@pytest.mark.parametrize(("impl", "device", "phrase"), [
    ("torch", "bogus", "is not a device; accepted: cpu, cuda, cuda:N"),
    ("torch", "meta", "runs on cpu or cuda"),
    ("torch", _bad_cuda(), "cuda"),
    ("reference", "cpu", "--device applies to --impl torch"),
])
def test_a_device_that_cannot_be_used_is_one_line_and_exit_2(
        impl: str, device: str, phrase: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown, unsupported or absent devices, and --device for the reference: refused."""
    status, _, err = _cli(capsys, "--impl", impl, "--steps", "2", "--checkpoint-dir",
                          str(tmp_path), "--device", device)
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1 and phrase in err, err


def test_loader_workers_for_the_reference_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reference has no worker processes: --loader-workers N > 0 is refused for it."""
    status, out, err = _cli(capsys, "--impl", "reference", "--steps", "2", "--checkpoint-dir",
                            str(tmp_path / "d"), "--loader-workers", "2")
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert "--loader-workers applies to --impl torch" in err and "step 1 " not in out, err


@pytest.mark.parametrize("what", ["empty", "a file"])
def test_a_checkpoint_dir_that_cannot_be_a_directory_is_refused(
        what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = "" if what == "empty" else str(tmp_path / "f")
    if what == "a file":
        Path(target).write_text("mine")
    status, _, err = _cli(capsys, "--impl", "reference", "--steps", "2", "--checkpoint-dir",
                          target)
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert ("empty path" if what == "empty" else "is not a directory") in err
    if what == "a file":
        assert Path(target).read_text() == "mine"


@pytest.fixture(scope="module")
def no_recompute_digests() -> dict[tuple[str, str], str]:
    """(impl, model) -> the digest of the run without recompute, computed once per module
    (three recompute specs of the transformer compare against the same run)."""
    return {}


@pytest.mark.parametrize(("model", "spec"), [("mlp", "sqrt"), ("gpt", "sqrt"),
                                             ("gpt", "selective"), ("gpt", "optimal:1+selective")])
@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_recompute_with_low_precision_trains_to_the_digest_of_no_recompute(
        impl: str, model: str, spec: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        no_recompute_digests: dict[tuple[str, str], str]) -> None:
    """bf16 autocast with dropout: --recompute SPEC reaches the state-sha256 of no recompute
    (checkpointed segments recompute under the autocast state of their forward), for the
    MLP's layers, the transformer's blocks and its attention core."""

    def digest(recompute: str) -> str:
        status, out, err = _cli(capsys, "--impl", impl, "--model", model, "--steps", "3",
                                "--checkpoint-dir", str(tmp_path / recompute), "--precision",
                                "bf16", "--dropout", "0.3", "--recompute", recompute,
                                "--quiet")
        assert status == 0, err
        return out.split()[-1]

    if (impl, model) not in no_recompute_digests:
        no_recompute_digests[impl, model] = digest("none")
    assert digest(spec) == no_recompute_digests[impl, model]


@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_a_refused_resume_names_the_changed_fields_in_one_line(
        impl: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--precision changed on --resume: 'precision: 'fp32' in the checkpoint, 'bf16' now'."""
    base = ["--impl", impl, "--steps", "2", "--checkpoint-dir", str(tmp_path), "--quiet"]
    assert _cli(capsys, *base)[0] == 0
    status, _, err = _cli(capsys, *base, "--resume", "--precision", "bf16")
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "precision: 'fp32' in the checkpoint, 'bf16' now" in err
    assert "fingerprint" not in err and not re.search(r"[0-9a-f]{64}", err)


@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_checkpoint_every_0_writes_only_the_final_state(
        impl: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _cli(capsys, "--impl", impl, "--steps", "3", "--checkpoint-dir",
                          str(tmp_path), "--checkpoint-every", "0", "--quiet")
    assert status == 0 and out.startswith("state-sha256: ")
    assert os.listdir(tmp_path) == ["ckpt-00000003.ckpt"]


@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_the_horizon_is_steps_for_a_new_run_and_the_runs_own_on_resume(
        impl: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --horizon a new run's schedule lasts --steps; a resume keeps the horizon its
    run started with, so it continues to any --steps up to it (and stops with the digest of
    an uninterrupted run), and past it is refused in one line, naming the horizon."""
    base = ["--impl", impl, "--checkpoint-dir", str(tmp_path / "a"), "--quiet"]
    assert _cli(capsys, *base, "--steps", "2", "--horizon", "6")[0] == 0
    status, out, _ = _cli(capsys, *base, "--steps", "4", "--resume")
    assert status == 0
    other = ["--impl", impl, "--checkpoint-dir", str(tmp_path / "b"), "--quiet"]
    assert _cli(capsys, *other, "--steps", "4", "--horizon", "6")[1] == out
    status, _, err = _cli(capsys, *base, "--steps", "7", "--resume")
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1
    assert "--steps 7 is past the horizon the run started with 6" in err
    status, _, err = _cli(capsys, *base, "--steps", "4", "--resume", "--horizon", "8")
    assert status == EXIT_USAGE and "horizon: 6 in the checkpoint, 8 now" in err
    digests = [_cli(capsys, "--impl", impl, "--checkpoint-dir", str(tmp_path / d), "--quiet",
                    "--steps", "3", *h)[1] for d, h in (("c", []), ("d", ["--horizon", "3"]),
                                                        ("e", ["--horizon", "4"]))]
    assert digests[0] == digests[1] != digests[2]  # a new run's horizon is --steps


def test_a_horizon_shorter_than_steps_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--impl", "reference", "--checkpoint-dir", str(tmp_path), "--quiet"]
    status, _, err = _cli(capsys, *base, "--steps", "4", "--horizon", "2")
    assert status == EXIT_USAGE and "--steps 4 is past --horizon 2" in err


@pytest.mark.parametrize("impl", ["reference", "torch"])
def test_resume_reads_the_directory_once_verifies_the_chosen_file_once_and_builds_one_run(
        impl: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`train --resume` over three checkpoints: the model check, the inherited horizon and
    the policy share one reading of the headers; the newest file alone is mapped and hashed,
    once (its load's own digest check), and one Run is built. Pruning after the next step
    then verifies each older one once, right before it counts or is deleted."""
    base = ["--impl", impl, "--checkpoint-dir", str(tmp_path), "--quiet"]
    assert _cli(capsys, *base, "--steps", "6", "--checkpoint-every", "2", "--horizon", "8"
                )[0] == 0
    mapped: list[str] = []  # every whole-file open: open_checkpoint and load_container
    hashed = [0]
    runs = [0]
    real_mapped, real_hash, real_init = container._mapped, digest.xxh3_128, BaseRun.__init__

    def counting_mapped(path: object, *args: object, **kw: object) -> object:
        mapped.append(Path(path).name)  # type: ignore[arg-type]
        return real_mapped(path, *args, **kw)  # type: ignore[arg-type]

    def counting_hash(data: bytes | memoryview) -> bytes:
        hashed[0] += 1
        return real_hash(data)

    def counting_init(self: BaseRun, *args: object, **kw: object) -> None:
        runs[0] += 1
        real_init(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(container, "_mapped", counting_mapped)
    monkeypatch.setattr(digest, "xxh3_128", counting_hash)
    monkeypatch.setattr(BaseRun, "__init__", counting_init)
    status, out, _ = _cli(capsys, *base, "--steps", "6", "--resume")
    assert status == 0 and out.startswith("state-sha256: ")
    assert (mapped, hashed[0], runs[0]) == (["ckpt-00000006.ckpt"], 1, 1)
    mapped.clear()
    hashed[0] = runs[0] = 0
    assert _cli(capsys, *base, "--steps", "7", "--resume")[0] == 0  # horizon 8, inherited
    assert sorted(mapped) == ["ckpt-00000002.ckpt", "ckpt-00000004.ckpt",
                              "ckpt-00000006.ckpt"] and hashed[0] == 3 and runs[0] == 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000004.ckpt", "ckpt-00000006.ckpt",
                                            "ckpt-00000007.ckpt"]
