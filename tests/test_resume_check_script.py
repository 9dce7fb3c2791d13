"""`python -m parity resume-check --script COMMAND` (parity/lab/your_trainer/resume_script.py):
a training script run as it is run, with its own argv, straight, stopped at k and resumed
with its own flag; the two state files compared entry by entry.

The default suite's scripts are plain Python written the way nanoGPT's train.py is (globals
that `--key=value` overrides, any other argument refused, training at import). They save
in torch's legacy file format, written with pickle alone, so each run costs tens of
milliseconds, not a torch import (~1.5 s): three runs a check. The real example,
examples/train_script.py, which imports torch, runs behind `-m slow`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from parity.lab.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main

ROOT = Path(__file__).resolve().parents[1]

# nanoGPT's shape: configuration globals, its configurator over sys.argv (anything not
# --key=value of a known key is refused: resume-check's own argv would be), training at
# import, a checkpoint at the end, --init_from=resume; the "batches" are draws from
# Python's global generator, which the checkpoint holds unless --save_rng=False.
SCRIPT = '''
import os, pickle, random, sys
from ast import literal_eval

out_dir, max_iters, init_from, save_rng, fail_at = "out", 6, "scratch", True, -1
save_config = False  # True: the state records the run's own command line, as nanoGPT's does
for arg in sys.argv[1:]:
    key, _, val = arg[2:].partition("=")
    if not arg.startswith("--") or not val or key not in globals():
        raise SystemExit(f"unknown argument {arg}")
    globals()[key] = literal_eval(val) if key not in ("out_dir", "init_from") else val

MAGIC, VERSION = 0x1950a86a20f9469cfc6c, 1001  # torch.save's legacy format, pickle only
INFO = {"protocol_version": VERSION, "little_endian": True,
        "type_sizes": {"short": 2, "int": 4, "long": 4}}
path = os.path.join(out_dir, "ckpt.pt")
random.seed(1337)
w, iter_num = [0.0] * 4, 0
if init_from == "resume":
    with open(path, "rb") as f:
        [pickle.load(f) for _ in range(3)]
        ckpt = pickle.load(f)
    w, iter_num = ckpt["w"], ckpt["iter_num"]
    if "rng" in ckpt:
        random.setstate(ckpt["rng"])
while iter_num < max_iters:
    if iter_num == fail_at and init_from == "resume":
        raise RuntimeError(f"diverged at {iter_num}")
    batch = [random.gauss(0.0, 1.0) for _ in w]
    w = [wi - 0.25 * (wi - b) for wi, b in zip(w, batch)]
    iter_num += 1
state = {"w": w, "iter_num": iter_num, **({"rng": random.getstate()} if save_rng else {})}
if save_config:
    state["config"] = {"out_dir": out_dir, "init_from": init_from, "max_iters": max_iters}
with open(path, "wb") as f:
    for obj in (MAGIC, VERSION, INFO, state, []):
        pickle.dump(obj, f, protocol=2)
'''


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """train.py in a fresh current folder; the command that runs it, placeholders in it."""
    (tmp_path / "train.py").write_text(SCRIPT, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return f"{shlex.quote(sys.executable)} train.py --out_dir={{dir}} --max_iters={{steps}}"


def check(command: str, *extra: str, flag: str = "--resume-flag=--init_from=resume",
          steps: int = 6, at: int = 3) -> list[str]:
    return ["resume-check", "--script", command, flag, "--steps", str(steps), "--at",
            str(at), *extra]


def test_a_script_reading_its_own_argv_resumes_exactly(
        script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The script refuses any argument but its own --key=value, so resume-check's argv never
    reached it: straight for 6, stopped at 3, resumed to 6, and the states agree."""
    assert main(check(script)) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "resume-check: exact"
    assert any("--max_iters=3" in ln and ln.strip().startswith("stopped:") for ln in out)
    assert any(ln.rstrip().endswith("--max_iters=6 --init_from=resume") for ln in out)


def test_a_script_that_does_not_save_its_rng_differs_and_the_entries_are_named(
        script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the generator in its checkpoint the resumed run draws the first batches again:
    every weight differs, named by its path, and the JSON says so; the same script with the
    generator saved (the repair) is exact."""
    assert main(check(script + " --save_rng=False", "--json")) == EXIT_FAILED
    out = capsys.readouterr().out
    body, _, last = out.rstrip("\n").rpartition("\n")
    assert last == "resume-check: differs: first entry w.0"
    report = json.loads(body)
    assert not report["ok"] and report["parted_at"] is None
    assert [d["entry"] for d in report["final"]] == ["w.0", "w.1", "w.2", "w.3"]
    assert main(check(script + " --save_rng=True")) == EXIT_OK


def test_a_script_that_fails_or_saves_what_needs_pickle_is_one_line_and_exit_1(
        script: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A resumed run that raises, a state file holding a range, a --state the script never
    writes: each is `resume-check: failed: ...`, naming the run and the cause."""
    assert main(check(script + " --fail_at=4")) == EXIT_FAILED
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("resume-check: failed: the resumed run (") and last.endswith(
        "RuntimeError: diverged at 4")
    (tmp_path / "train.py").write_text(SCRIPT.replace('{"w": w,',
                                                      '{"w": w, "seen": range(3),'))
    assert main(check(script)) == EXIT_FAILED
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("resume-check: failed: the straight run's ckpt.pt cannot be read "
                           "with torch.load(weights_only=True)")
    assert main(check(script, "--state", "{dir}/elsewhere.pt")) == EXIT_FAILED
    assert "saved no elsewhere.pt" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "words"), [
    (check("python train.py --out_dir={dir}"), "has no {steps}"),
    (check("python train.py --max_iters={steps}"), "has no {dir}"),
    (check("python train.py --out_dir={dir} --max_iters={step}"), "unknown placeholder"),
    (check("python train.py {dir} {steps}", "--state", "out/ckpt.pt"), "has no {dir}"),
    (check("python 'train.py {dir} {steps}"), "cannot split"),
    (check("python train.py {dir} {steps}", flag="--json"), "needs --resume-flag"),
    (["resume-check", "mytrain:make", "--script", "python t.py {dir} {steps}", "--steps", "4",
      "--at", "2"], "got factory and script"),
    (["resume-check", "--steps", "4", "--at", "2"], "give one of"),
    (check("python train.py {dir} {steps}", "--kill"), "--kill: only with module:factory"),
    (["resume-check", "m:f", "--state", "{dir}/x.pt", "--steps", "4", "--at", "2"],
     "--state: only with --script"),
    (["resume-check", "--fit", "m:f", "--resume-flag=--resume", "--steps", "4", "--at", "2"],
     "--resume-flag: only with --script"),
    (["resume-check", "--fit", "nocolon", "--steps", "4", "--at", "2"], "module:function"),
    (check("no-such-program-here {dir} {steps}"), "cannot run 'no-such-program-here'"),
    (check("./train.py {dir} {steps}"), "cannot run './train.py': no such program"),
], ids=["no steps", "no dir", "unknown placeholder", "state without dir", "unbalanced quote",
        "no resume flag", "two modes", "no mode", "kill", "state", "resume flag", "fit path",
        "no program", "no such file"])
def test_bad_script_options_are_one_line_and_exit_2(argv: list[str], words: str,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and words in err, err


# the commands docs/your-trainer.md shows, run from the project's folder, and their last line
DOCS = [
    ('cd examples && python -m parity resume-check --script "python train_script.py '
     '--out_dir={dir} --max_iters={steps}" --resume-flag=--init_from=resume --steps 8 --at 4',
     EXIT_OK, "resume-check: exact"),
    ('cd examples && python -m parity resume-check --script "python train_script.py '
     '--out_dir={dir} --max_iters={steps} --save_rng=False" --resume-flag=--init_from=resume '
     "--steps 8 --at 4", EXIT_FAILED, "resume-check: differs: first entry model.0.weight"),
]


def test_the_page_shows_the_commands_these_tests_run() -> None:
    page = (ROOT / "docs" / "your-trainer.md").read_text(encoding="utf-8")
    for line, _, last in DOCS:
        assert line in page.splitlines(), line
        assert f"`{last}`" in page, last


@pytest.mark.slow  # four torch imports each (the command, its three runs): 18-22 s each
@pytest.mark.parametrize(("line", "status", "last"), DOCS, ids=["rng saved", "rng left out"])
def test_the_example_script_resumes_exactly_only_with_its_rng(line: str, status: int,
                                                              last: str) -> None:
    """examples/train_script.py through the real command line, as the page shows it (the
    script's own `python` is the one on PATH, this interpreter's where the suite runs)."""
    folder, _, command = line.removeprefix("cd ").partition(" && ")
    argv = shlex.split(command)
    done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT / folder, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1",
                                                       "PYTHONPATH": str(ROOT)})
    assert done.returncode == status, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == last


def test_entries_the_command_lines_make_differ_are_ignored_when_named_and_listed(
        script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A state recording its own command line (nanoGPT's config: the run's folder, the
    resume flag's value) differs by construction; --ignore 'config.*' leaves those entries
    out of the verdict and lists each with what differed; a pattern that matches nothing is
    said, and ignores nothing; --ignore needs --script."""
    command = script + " --save_config=True"
    assert main(check(command)) == EXIT_FAILED
    assert capsys.readouterr().out.splitlines()[-1] == (
        "resume-check: differs: first entry config.out_dir")
    assert main(check(command, "--ignore", "config.out_dir", "--ignore",
                      "config.init_from")) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "resume-check: exact"
    ignored = [ln for ln in out if "ignored (--ignore):" in ln]
    assert len(ignored) == 1 and "config.out_dir (" in ignored[0] and (
        "config.init_from (" in ignored[0]) and "max_iters" not in ignored[0]
    assert main(check(command, "--ignore", "config.*", "--ignore", "confg.out_dir")) == (
        EXIT_OK)
    out = capsys.readouterr().out
    assert "--ignore 'confg.out_dir' matches no entry" in out
    assert main(check(command, "--ignore", "confg.*")) == EXIT_FAILED
    capsys.readouterr()
    assert main(["resume-check", "mod:f", "--ignore", "x", "--steps", "4", "--at", "2"]) == (
        EXIT_USAGE)
    assert "--ignore: only with --script" in capsys.readouterr().err
    assert main(check(command, "--ignore", " ")) == EXIT_USAGE
    assert capsys.readouterr().err.strip().endswith(
        "--ignore ' ': an entry pattern cannot be empty")


def test_a_script_that_ignores_its_resume_flag_is_caught_by_the_probe(
        script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A resume flag the script takes but acts on nowhere (--fail_at=-2: no step is -2): the
    "resumed" run trains 6 steps from its seed and ends where the straight run ends. The
    probe, resumed from the stopped run's file with its floats moved, ends there too: the
    verdict names the file the resumed run does not read. With the real flag the probe ends
    elsewhere (the file is read) and the verdict is exact."""
    assert main(check(script, flag="--resume-flag=--fail_at=-2")) == EXIT_FAILED
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "resume-check: differs: the resumed run does not read ckpt.pt"
    assert any(ln.strip().startswith("probe:") and ln.rstrip().endswith("--fail_at=-2")
               for ln in out)
    assert main(check(script)) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == "resume-check: exact"


def test_a_file_with_no_floating_value_is_not_probed_and_says_so(tmp_path: Path) -> None:
    """The probe moves floating tensors, or where there are none Python floats; a file of
    integers and strings is left as it is (no probe file) and the note says why."""
    import torch

    from parity.lab.your_trainer.resume_script import _moved, _write_probe

    saved = tmp_path / "ckpt.pt"
    torch.save({"iter_num": 3, "tag": "x", "counts": torch.arange(4)}, saved)
    probe = tmp_path / "probe" / "ckpt.pt"
    assert _write_probe(saved, probe) == "not probed: ckpt.pt holds no floating value to move"
    assert not probe.exists()
    state = {"w": [0.0, -2.0], "t": torch.tensor([4.0]), "k": (1, 0.5), "b": True}
    moved, n = _moved(state, floats=False)  # a file with tensors: those, the floats kept
    assert n == 1 and moved["t"].item() == 4.0 + 5 * 2.0**-8 and moved["w"] == [0.0, -2.0]
    moved, n = _moved(state, floats=True)  # without: the Python floats
    assert n == 3 and moved["b"] is True and moved["k"][0] == 1 and moved["t"].item() == 4.0
    assert moved["w"] == [2.0**-8, -2.0 + 3 * 2.0**-8] and moved["k"][1] == 0.5 + 1.5 * 2.0**-8
