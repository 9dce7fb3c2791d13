"""`python -m parity replay FILE`: the anomaly replay of a batch the numerics detector saved.

    python -m parity replay FILE [--impl {reference,torch}] [--device D]

`python -m parity train --check-numerics` writes FILE when it stops at a first invalid value
(the run's state before that step, the random state, the batch). The replay runs that one
step's forward and backward again, stopped before the optimizer: torch under
torch.autograd.detect_anomaly(check_nan=True), the reference with its backward check
(NOTE [ Backward names ] in reference/numerics.py). It prints the first backward node that
returned NaN, as torch names it (`AddmmBackward0`, `LogSoftmaxBackward0`, ...), its module,
the traceback of the forward call that made it, and as its LAST line
`replay-node: {json}` (keys node, module). Either tree replays either tree's file (a
converted file drops the random state: with dropout the masks then differ).
Exit status 3: a NaN-returning backward node was found; 0: the backward made no NaN.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from ckpt import CheckpointError
from parity.lab.cli import EXIT_FOUND, EXIT_OK, UsageError

HELP = "replay a saved batch under anomaly detection; name the backward node that made NaN"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a replay file written by `train --check-numerics`")
    p.add_argument("--impl", choices=("reference", "torch"), default="torch",
                   help="which implementation replays it (default torch)")
    p.add_argument("--device", default=None,
                   help="torch device: cpu, cuda or cuda:N (--impl torch only; default cpu)")


WHY_ANOTHER_NODE = (
    "  (train --check-numerics names the FORWARD op whose output first held an invalid value; "
    "anomaly\n  detection names the first BACKWARD function that returned NaN. An inf made in "
    "the forward\n  flows on to the loss, and the first backward to turn it into NaN is often "
    "downstream:\n  both are right, about different passes.)")

# frames of the command line, the drivers, the loop and torch's module call machinery
_MACHINERY = re.compile(r'File "(<frozen runpy>|[^"]*/parity/(__main__|lab/|drivers/)[^"]*|'
                        r'[^"]*/common/train_loop\.py|[^"]*/(torch_impl|reference)/numerics\.py|'
                        r'[^"]*/torch/nn/modules/module\.py)"')


def model_frames(traceback: str) -> tuple[str, int]:
    """The traceback's frames that are the model's or the step's, and how many were left out
    (anomaly mode records the whole stack: mostly this tool's own frames)."""
    frames: list[list[str]] = []
    for line in traceback.rstrip().splitlines():
        if line.lstrip().startswith("File ") or not frames:
            frames.append([line])
        else:
            frames[-1].append(line)
    kept = [f for f in frames if not _MACHINERY.search(f[0])]
    return "\n".join(line for f in kept for line in f), len(frames) - len(kept)


def run(args: argparse.Namespace) -> int:
    from parity.drivers.numerics import replay
    from parity.lab.cli import torch_device

    path = Path(args.file)
    if not path.is_file():
        what = ("is a folder" if path.is_dir() else "is not a regular file (a pipe, a device "
                "or a socket)" if path.exists() else "no such file")
        raise UsageError(f"{args.file}: {what}; a replay file written by train "
                         "--check-numerics is expected")
    if args.impl == "reference" and args.device is not None:
        raise UsageError("--device applies to --impl torch; the reference runs on NumPy")
    device = "cpu" if args.impl == "reference" else str(torch_device(args.device or "cpu"))
    try:
        result = replay(args.impl, path, device)
    except (CheckpointError, KeyError, ValueError) as e:
        raise UsageError(f"{args.file}: cannot replay it ({e})") from None
    if result.node is None:
        print("the backward made no NaN on this batch (the first invalid value was forward "
              "only, or inf without NaN)")
    else:
        print(f"first NaN in backward: {result.node} (module {result.module!r})")
        print(WHY_ANOTHER_NODE)
        if result.traceback:
            kept, left_out = model_frames(result.traceback)
            print("forward call that made its input (the model's and the step's frames; "
                  f"{left_out} of the command's and torch's module machinery left out):\n"
                  + kept)
    print("replay-node: " + json.dumps({"node": result.node, "module": result.module},
                                       sort_keys=True), flush=True)
    return EXIT_OK if result.node is None else EXIT_FOUND
