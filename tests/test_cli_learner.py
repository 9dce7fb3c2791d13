"""What a learner reads: the --check-numerics table says which steps it counts and keeps its
columns aligned for any module name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from parity.lab.runners import train_output
from tests.test_cli import assert_one_line_error, run_cli


def test_the_numerics_table_names_the_steps_this_process_ran(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = ["train", "--impl", "reference", "--checkpoint-dir", str(tmp_path), "--horizon", "5",
           "--check-numerics"]
    assert run_cli([*run, "--steps", "3"], capsys)[0] == 0
    status, out, _ = run_cli([*run, "--steps", "5", "--resume"], capsys)
    assert status == 0
    head = [line for line in out.splitlines() if line.startswith("counts")]
    assert len(head) == 1 and head[0].split()[:6] == ["counts", "over", "2", "steps", "(4",
                                                      "to"], head


def test_the_numerics_table_aligns_long_module_names() -> None:
    names = ["act:a", "grad:transformer.h.11.attn.c_attn.weight_with_a_long_suffix"]
    text = train_output.counts_table([{n: [1, 22, 333, 4444, 5, 6] for n in names}],
                                     "counts of step 7")
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1, text  # every column ends where the head's
    ends = [line.index(" 1 ") if " 1 " in line else None for line in lines[1:]]
    assert ends[0] == ends[1], text


@pytest.mark.parametrize("kind", ["folder", "fifo", "missing"])
def test_replay_says_what_the_path_is(kind: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import os

    path = tmp_path / "x"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs on this platform")
        os.mkfifo(path)
    status, _, err = run_cli(["replay", str(path), "--impl", "reference"], capsys)
    word = {"folder": "is a folder", "fifo": "not a regular file", "missing": "no such file"}
    assert_one_line_error(status, err, str(path), word[kind])


@pytest.mark.parametrize("command", [["account", "--model", "mlp"],
                                     ["profile", "--impl", "reference"]])
def test_a_negative_looking_value_is_named_not_called_missing(
        command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli([*command, "--sizes", "-3,4,5"], capsys)
    assert_one_line_error(status, err, "'-3,4,5' starts with '-'", "--sizes=-3,4,5")
    status, _, err = run_cli([*command, "--sizes=-3,4,5"], capsys)  # then its own check
    assert_one_line_error(status, err, "positive")


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_report_table_fits_the_terminal_and_folds_without_losing_a_word(width: int
                                                                             ) -> None:
    from parity.lab import report
    from parity.tolerances import CLAIMS

    rows = [report.Row(c, report.Observation(0.5, 10, "", None), "ok", 0.1) for c in CLAIMS]
    lines = report.render(report.Result(rows, [], 1.0), width=width).splitlines()
    start, end = lines[0].index("tolerance"), lines[0].index("observed") - 2
    narrowest = max(report.MIN_TOLERANCE_WIDTH, *(len(w) for c in CLAIMS
                                                  for w in c.tolerance.split()))
    floor = len(lines[1]) - (end - start) + narrowest  # the narrowest table
    assert max(map(len, lines)) <= max(width, floor)
    folded: dict[str, list[str]] = {}
    for line in lines[2:]:
        if not line.startswith(" "):
            claim = line.split()[0]
        folded.setdefault(claim, []).append(line[start:end].strip())
    assert {c.id: " ".join(c.tolerance.split()) for c in CLAIMS} == {
        k: " ".join(" ".join(v).split()) for k, v in folded.items()}
    if width == 80:
        assert any(len(v) > 1 for v in folded.values()), "nothing was folded at 80 columns"


def _stub(fn: object, drawn: list[str], name: str) -> object:
    def draw(path: Path) -> None:
        drawn.append(name)
        path.write_text("x")
    draw.__module__ = fn.__module__  # type: ignore[attr-defined]
    return draw


def test_report_topic_draws_only_its_own_pictures_one_path_a_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib", reason="pictures need the 'plot' extra")
    from parity.lab import pictures, report

    registry = dict(pictures.load())
    drawn: list[str] = []
    monkeypatch.setattr(pictures, "PICTURES",
                        {n: _stub(fn, drawn, n) for n, fn in registry.items()})
    def run(topic: str, meanwhile: Callable[[], object] | None = None) -> report.Result:
        if meanwhile is not None:  # the pictures, drawn while the tests would run
            meanwhile()
        return report.Result([report.Row(c, report.Observation(0.0, 1, "", None), "ok", 0.0)
                              for c in report.CLAIMS if c.topic == topic], [], 0.0)

    monkeypatch.setattr(report, "run", run)
    status, out, _ = run_cli(["report", "--topic", "formats", "--out", str(tmp_path)], capsys)
    assert status == 0
    mine = sorted(n for n, fn in registry.items() if fn.__module__.endswith(".formats"))
    assert mine and sorted(drawn) == mine and len(mine) < len(registry)
    listed = [line.strip() for line in out.splitlines() if line.endswith(".png")]
    assert listed == [str(tmp_path / n) for n in mine]


def test_replay_keeps_the_models_frames_and_counts_the_rest() -> None:
    from parity.lab.cli.replay import model_frames

    def frame(path: str, code: str) -> str:
        return f'  File "{path}", line 1, in f\n    {code}'

    ours = ["<frozen runpy>", "/x/parity/__main__.py", "/x/parity/lab/cli/replay.py",
            "/x/parity/drivers/numerics.py", "/x/common/train_loop.py",
            "/x/torch_impl/numerics.py", "/s/torch/nn/modules/module.py"]
    model = ["/x/torch_impl/train.py", "/home/me/my_model.py", "/s/torch/nn/functional.py"]
    text = "\n".join(frame(p, f"call_{i}()") for i, p in enumerate([*ours[:4], model[0],
                                                                   ours[4], model[1],
                                                                   *ours[5:], model[2]]))
    kept, left_out = model_frames(text)
    assert left_out == len(ours)
    assert [line.split('"')[1] for line in kept.splitlines() if "File" in line] == model
    assert "call_4()" in kept and "call_6()" in kept  # each kept frame keeps its code line
